// 4-bit element formats (format.hpp): every code, every operand pair, every rounding midpoint.
// One parameterised suite; every format in kAllFormats runs the same bodies against its hand table.
#include <gtest/gtest.h>

#include <cstring>

#include <cfloat>
#include <cmath>
#include <limits>
#include <set>
#include <string>

#include "fp4lab/format.hpp"
#include "test_util.hpp"

namespace fp4lab::test {
namespace {

// Every format the model defines has exactly one golden table, in the same order.
TEST(FormatCatalogue, EveryFormatHasAHandWrittenTable) {
  const size_t n = sizeof(kAllFormats) / sizeof(kAllFormats[0]);
  ASSERT_EQ(n, sizeof(kGolden) / sizeof(kGolden[0]));
  std::set<std::string> names;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_STREQ(kAllFormats[i].name, kGolden[i].name);
    EXPECT_STREQ(kGolden[i].f.name, kGolden[i].name);
    names.insert(kAllFormats[i].name);
  }
  EXPECT_EQ(names, (std::set<std::string>{"e2m1", "e1m2", "int4", "e2m1_max2"}));
}

// The OCP/ml_dtypes E2M1 bit patterns, written as binary literals (sign | exponent | mantissa).
TEST(FormatCatalogue, E2M1EncodingsAreOcpFp4) {
  EXPECT_EQ(decode(kE2M1, 0b0'00'0), 0.0f);
  EXPECT_EQ(decode(kE2M1, 0b0'00'1), 0.5f);  // subnormal
  EXPECT_EQ(decode(kE2M1, 0b0'01'0), 1.0f);
  EXPECT_EQ(decode(kE2M1, 0b0'01'1), 1.5f);
  EXPECT_EQ(decode(kE2M1, 0b0'10'0), 2.0f);
  EXPECT_EQ(decode(kE2M1, 0b0'10'1), 3.0f);
  EXPECT_EQ(decode(kE2M1, 0b0'11'0), 4.0f);
  EXPECT_EQ(decode(kE2M1, 0b0'11'1), 6.0f);
  EXPECT_EQ(decode(kE2M1, 0b1'11'1), -6.0f);
  EXPECT_EQ(decode(kE2M1, 0b1'00'1), -0.5f);
}

class FormatTest : public ::testing::TestWithParam<Golden> {};

TEST_P(FormatTest, DerivedPropertiesMatchHandTable) {
  const Golden& g = GetParam();
  const ElemFormat& f = g.f;
  EXPECT_EQ(f.num_levels(), g.num_levels);
  EXPECT_EQ(f.max_index, g.num_levels - 1);
  EXPECT_EQ(f.int_shift(), g.int_shift);
  EXPECT_EQ(double(f.gmax()), g.gmax);
  EXPECT_EQ(f.emax(), g.emax);
  EXPECT_EQ(f.emax(), int(std::floor(std::log2(g.gmax))));  // the MX definition of emax
  EXPECT_EQ(f.int_max(), g.ints[g.num_levels - 1]);
  for (int i = 0; i < g.num_levels; ++i) {
    EXPECT_EQ(double(f.level(i)), g.levels[i]) << "level " << i;
    EXPECT_EQ(f.int_level(i), g.ints[i]) << "level " << i;
    EXPECT_EQ(std::ldexp(double(g.ints[i]), -g.int_shift), g.levels[i]) << "hand table inconsistent at " << i;
  }
}

TEST_P(FormatTest, ValidCodesAreExactlyTheLevelsWithBothSigns) {
  const Golden& g = GetParam();
  int valid = 0;
  for (int c = 0; c < 16; ++c) {
    const bool expect = (c & 0b0'111) < g.num_levels;
    EXPECT_EQ(code_valid(g.f, uint8_t(c)), expect) << "code " << c;
    valid += expect;
  }
  EXPECT_EQ(valid, 2 * g.num_levels);
  EXPECT_FALSE(code_valid(g.f, 16));
}

TEST_P(FormatTest, EveryCodeDecodesToItsHandTableValue) {
  const Golden& g = GetParam();
  int checked = 0;
  for (int c = 0; c < 16; ++c) {
    if (!code_valid(g.f, uint8_t(c))) continue;
    const int i = c & 0b0'111;
    const bool neg = c & 0b1'000;
    const float v = decode(g.f, uint8_t(c));
    EXPECT_EQ(double(v), neg ? -g.levels[i] : g.levels[i]) << "code " << c;
    EXPECT_EQ(std::signbit(v), neg) << "code " << c << " (sign of zero too)";
    EXPECT_EQ(decode_int(g.f, uint8_t(c)), neg ? -g.ints[i] : g.ints[i]) << "code " << c;
    EXPECT_EQ(code_index(uint8_t(c)), i);
    EXPECT_EQ(code_negative(uint8_t(c)), neg);
    EXPECT_EQ(make_code(neg, i), c);
    ++checked;
  }
  EXPECT_EQ(checked, 2 * g.num_levels);
}

TEST_P(FormatTest, EveryCodeSurvivesDecodeThenRtne) {
  const Golden& g = GetParam();
  int checked = 0;
  for (int c = 0; c < 16; ++c) {
    if (!code_valid(g.f, uint8_t(c))) continue;
    EXPECT_EQ(round_rtne(g.f, decode(g.f, uint8_t(c))), c) << "code " << c << " value " << decode(g.f, uint8_t(c));
    ++checked;
  }
  EXPECT_EQ(checked, 2 * g.num_levels);
  // -0 is its own code (0b1'000), +0 is 0.
  EXPECT_EQ(round_rtne(g.f, -0.0f), 0b1'000);
  EXPECT_EQ(round_rtne(g.f, +0.0f), 0b0'000);
}

TEST_P(FormatTest, IntegerViewTimesShiftIsTheValue) {
  const Golden& g = GetParam();
  for (int c = 0; c < 16; ++c) {
    if (!code_valid(g.f, uint8_t(c))) continue;
    const float v = decode(g.f, uint8_t(c));
    EXPECT_EQ(std::ldexp(double(decode_int(g.f, uint8_t(c))), -g.f.int_shift()), double(v)) << "code " << c;
    EXPECT_EQ(std::ldexp(float(decode_int(g.f, uint8_t(c))), -g.f.int_shift()), v) << "code " << c;
  }
}

// Every operand pair multiplies exactly: the integer product scaled by 2^-2*shift is the product of the
// decoded values, both in double and in FP32 (the contract's step 2 relies on it).
TEST_P(FormatTest, EveryOperandPairMultipliesExactly) {
  const Golden& g = GetParam();
  const ElemFormat& f = g.f;
  int pairs = 0, max_abs = 0;
  for (int a = 0; a < 16; ++a)
    for (int b = 0; b < 16; ++b) {
      if (!code_valid(f, uint8_t(a)) || !code_valid(f, uint8_t(b))) continue;
      const int p = decode_int(f, uint8_t(a)) * decode_int(f, uint8_t(b));
      const double exact = double(decode(f, uint8_t(a))) * double(decode(f, uint8_t(b)));
      EXPECT_EQ(std::ldexp(double(p), -2 * f.int_shift()), exact) << "codes " << a << " x " << b;
      EXPECT_EQ(double(decode(f, uint8_t(a)) * decode(f, uint8_t(b))), exact) << "FP32 product, codes " << a << " x " << b;
      max_abs = std::max(max_abs, std::abs(p));
      ++pairs;
    }
  EXPECT_EQ(pairs, 4 * g.num_levels * g.num_levels);
  EXPECT_EQ(max_abs, g.ints[g.num_levels - 1] * g.ints[g.num_levels - 1]);  // 144 for e2m1, 49 for e1m2
  // A 32-element block dot product fits int32 and converts to FP32 exactly (< 2^24).
  EXPECT_LT(32 * max_abs, 1 << 24);
}

// RTNE at every midpoint between neighbouring levels (ties to the even index), one ulp either side,
// and the mirrored negative values.
TEST_P(FormatTest, RtneAtEveryMidpointAndOneUlpEitherSide) {
  const Golden& g = GetParam();
  int checked = 0;
  for (int i = 0; i + 1 < g.num_levels; ++i) {
    const float lo = float(g.levels[i]), hi = float(g.levels[i + 1]);
    const float mid = 0.5f * (lo + hi);  // exact: small dyadic numbers
    ASSERT_EQ(double(mid), 0.5 * (g.levels[i] + g.levels[i + 1]));
    const int even = (i % 2 == 0) ? i : i + 1;
    const float below = std::nextafter(mid, -INFINITY), above = std::nextafter(mid, INFINITY);
    EXPECT_EQ(round_rtne(g.f, mid), make_code(false, even)) << "midpoint " << mid;
    EXPECT_EQ(round_rtne(g.f, below), make_code(false, i)) << "just below " << fbits(below);
    EXPECT_EQ(round_rtne(g.f, above), make_code(false, i + 1)) << "just above " << fbits(above);
    EXPECT_EQ(round_rtne(g.f, -mid), make_code(true, even)) << "midpoint " << -mid;
    EXPECT_EQ(round_rtne(g.f, -below), make_code(true, i)) << fbits(-below);
    EXPECT_EQ(round_rtne(g.f, -above), make_code(true, i + 1)) << fbits(-above);
    // The levels themselves and one ulp off them stay put.
    EXPECT_EQ(round_rtne(g.f, std::nextafter(hi, 0.0f)), make_code(false, i + 1));
    EXPECT_EQ(round_rtne(g.f, std::nextafter(lo, INFINITY)), make_code(false, i));
    checked += 8;
  }
  EXPECT_EQ(checked, 8 * (g.num_levels - 1));
}

TEST_P(FormatTest, TinyValuesRoundToSignedZero) {
  const Golden& g = GetParam();
  const float tiny = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(round_rtne(g.f, tiny), 0b0'000);
  EXPECT_EQ(round_rtne(g.f, -tiny), 0b1'000);
  EXPECT_EQ(round_rtne(g.f, FLT_MIN), 0b0'000);
  EXPECT_EQ(round_rtne(g.f, -FLT_MIN), 0b1'000);
}

TEST_P(FormatTest, SaturatesAboveGmax) {
  const Golden& g = GetParam();
  const int top = g.num_levels - 1;
  const float gm = float(g.gmax);
  for (float x : {gm, std::nextafter(gm, INFINITY), 0.5f * (gm + float(g.gmax + 1.0)), 2.0f * gm, 6.0f, 7.5f,
                  1e30f, FLT_MAX}) {
    if (x < gm) continue;  // 6 and 7.5 lie above gmax only for some formats
    EXPECT_EQ(round_rtne(g.f, x), make_code(false, top)) << fbits(x);
    EXPECT_EQ(round_rtne(g.f, -x), make_code(true, top)) << fbits(-x);
    EXPECT_EQ(round_sr(g.f, x, 0u), make_code(false, top)) << "SR " << fbits(x);
    EXPECT_EQ(round_sr(g.f, -x, 0xFFFFFFFFu), make_code(true, top)) << "SR " << fbits(-x);
  }
}

// SR never moves a value that sits on a level, whatever the random word.
TEST_P(FormatTest, SrKeepsExactLevels) {
  const Golden& g = GetParam();
  for (int i = 0; i < g.num_levels; ++i)
    for (uint32_t r : {0u, 1u, 0x7FFFFFFFu, 0x80000000u, 0xFFFFFF00u, 0xFFFFFFFFu}) {
      EXPECT_EQ(round_sr(g.f, float(g.levels[i]), r), make_code(false, i)) << "level " << i << " r " << hex32(r);
      EXPECT_EQ(round_sr(g.f, -float(g.levels[i]), r), make_code(true, i)) << "level " << i << " r " << hex32(r);
    }
}

// The contract's threshold: round up iff (r >> 8) < T with T = frac * 2^24, frac = (u - lo) / gap in the
// integer view. T is computed here in double from the hand table; the random words just either side of
// ceil(T) must land on either side of the decision. Positions: one ulp above a level, 1/4, 0.3, 1/2 and
// one ulp below the next level (where T = 2^24 - k and even r = 0xFFFFFFFF rounds down).
TEST_P(FormatTest, SrThresholdIsTheTop24Bits) {
  const Golden& g = GetParam();
  int checked = 0;
  for (int i = 0; i + 1 < g.num_levels; ++i) {
    const double lo = g.levels[i], hi = g.levels[i + 1];
    for (float x : {std::nextafter(float(lo), INFINITY), float(lo + 0.25 * (hi - lo)), float(lo + 0.3 * (hi - lo)),
                    float(lo + 0.5 * (hi - lo)), std::nextafter(float(hi), 0.0f)}) {
      const double u = std::ldexp(double(x), g.int_shift);
      const double T = (u - g.ints[i]) / double(g.ints[i + 1] - g.ints[i]) * 16777216.0;
      ASSERT_GT(T, 0.0);
      ASSERT_LT(T, 16777216.0);
      const uint32_t k = uint32_t(std::ceil(T));  // smallest r >> 8 that does not round up
      ASSERT_LT(k, 1u << 24);
      EXPECT_EQ(round_sr(g.f, x, ((k - 1) << 8) | 0xFFu), make_code(false, i + 1)) << fbits(x) << " T " << T;
      EXPECT_EQ(round_sr(g.f, x, (k - 1) << 8), make_code(false, i + 1)) << fbits(x) << " T " << T;
      EXPECT_EQ(round_sr(g.f, -x, (k - 1) << 8), make_code(true, i + 1)) << fbits(-x) << " T " << T;
      EXPECT_EQ(round_sr(g.f, x, k << 8), make_code(false, i)) << fbits(x) << " T " << T;
      EXPECT_EQ(round_sr(g.f, -x, k << 8), make_code(true, i)) << fbits(-x) << " T " << T;
      checked += 5;
    }
    // frac = 1/2: the boundary word is exactly 2^31.
    const float half = float(lo + 0.5 * (hi - lo));
    EXPECT_EQ(round_sr(g.f, half, 0x7FFFFFFFu), make_code(false, i + 1));
    EXPECT_EQ(round_sr(g.f, half, 0x80000000u), make_code(false, i));
    // One ulp below the next level: frac < 1, so the largest word still rounds down.
    EXPECT_EQ(round_sr(g.f, std::nextafter(float(hi), 0.0f), 0xFFFFFFFFu), make_code(false, i));
  }
  EXPECT_EQ(checked, 25 * (g.num_levels - 1));
}

INSTANTIATE_TEST_SUITE_P(AllFormats, FormatTest, ::testing::ValuesIn(kGolden),
                         [](const ::testing::TestParamInfo<Golden>& i) { return gtest_name(i.param.name); });

// The range-restricted ablation saturates at 2, never at E2M1's 3, 4 or 6.
TEST(FormatE2M1Max2, ClipsAtTwo) {
  for (float x : {2.4f, 2.5f, 3.0f, 4.0f, 5.0f, 6.0f})
    EXPECT_EQ(decode(kE2M1Max2, round_rtne(kE2M1Max2, x)), 2.0f) << x;
}

// Ties against hand-picked E2M1 values (no loop): 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2,
// 2.5 -> 2, 3.5 -> 4, 5 -> 4 (the odd-index neighbour always loses).
TEST(FormatE2M1, HandPickedTies) {
  EXPECT_EQ(decode(kE2M1, round_rtne(kE2M1, 0.25f)), 0.0f);
  EXPECT_EQ(decode(kE2M1, round_rtne(kE2M1, 0.75f)), 1.0f);
  EXPECT_EQ(decode(kE2M1, round_rtne(kE2M1, 1.25f)), 1.0f);
  EXPECT_EQ(decode(kE2M1, round_rtne(kE2M1, 1.75f)), 2.0f);
  EXPECT_EQ(decode(kE2M1, round_rtne(kE2M1, 2.5f)), 2.0f);
  EXPECT_EQ(decode(kE2M1, round_rtne(kE2M1, 3.5f)), 4.0f);
  EXPECT_EQ(decode(kE2M1, round_rtne(kE2M1, 5.0f)), 4.0f);
  EXPECT_EQ(decode(kE2M1, round_rtne(kE2M1, -5.0f)), -4.0f);
}

// The quantiser's rounding on the named grids (round_rtne_fixed: rint at the grid's spacing) against the
// definition (round_rtne: counting midpoints): every float whose integer view u lies in [1/16, 2 x the top
// integer] (every midpoint, level and stretch boundary is there; past the top u saturates), one in 4096 of
// the smaller ones (all round to 0), both signs: the 4-bit code must be the same.
template <const ElemFormat* F>
int64_t fixed_rounding_mismatches() {
  const float scale = std::ldexp(1.0f, F->int_shift());  // u = |v| * scale
  const float lo = 0.0625f / scale, top = 2.0f * float(F->int_max()) / scale;
  uint32_t lo_bits, hi_bits;
  std::memcpy(&lo_bits, &lo, 4);
  std::memcpy(&hi_bits, &top, 4);
  const int64_t sparse = int64_t(lo_bits) / 4096, n = sparse + int64_t(hi_bits - lo_bits) + 1;
  int64_t bad = 0;
#pragma omp parallel for reduction(+ : bad) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = uint32_t(i < sparse ? i * 4096 : int64_t(lo_bits) + (i - sparse));
    float v;
    std::memcpy(&v, &u, 4);
    bad += round_rtne_fixed<F>(v) != round_rtne(*F, v);
    bad += round_rtne_fixed<F>(-v) != round_rtne(*F, -v);
  }
  return bad;
}

TEST(FormatRounding, FixedGridRoundingIsRoundRtneOnEveryFloat) {
  EXPECT_EQ(fixed_rounding_mismatches<&kE2M1>(), 0);
  EXPECT_EQ(fixed_rounding_mismatches<&kE1M2>(), 0);
  EXPECT_EQ(fixed_rounding_mismatches<&kInt4>(), 0);
  EXPECT_EQ(fixed_rounding_mismatches<&kE2M1Max2>(), 0);
}

// Formats are identified by their tuple: a renamed copy is the same format, another tuple is none of them.
TEST(FormatIdentity, ByTupleNotName) {
  for (int i = 0; i < int(sizeof(kAllFormats) / sizeof(kAllFormats[0])); ++i) {
    EXPECT_EQ(format_index(kAllFormats[i]), i);
    ElemFormat renamed = kAllFormats[i];
    renamed.name = "custom";
    EXPECT_EQ(format_index(renamed), i);
  }
  ElemFormat other = kE1M2;
  other.bias = 2;
  EXPECT_EQ(format_index(other), -1);
  EXPECT_FALSE(same_grid(kE1M2, kInt4));  // same integer view, other scale: two formats
}

}  // namespace
}  // namespace fp4lab::test
