// Scale codecs (scale.hpp): E4M3 (every positive finite code, every midpoint), E8M0 and its log2
// helpers, BF16 rounding.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>

#include "fp4lab/scale.hpp"
#include "test_util.hpp"

namespace fp4lab::test {
namespace {

// OCP FP8 E4M3FN, written from the OCP spec's formula (not from scale.hpp): bias 7, normal
// 2^(E-7) (1 + M/8), subnormal 2^-6 (M/8).
double e4m3_value(int c) {
  const int E = (c >> 3) & 0xF, M = c & 7;
  return E == 0 ? std::ldexp(M / 8.0, -6) : std::ldexp(1.0 + M / 8.0, E - 7);
}

// Hand-picked values (cross-checked against ml_dtypes float8_e4m3fn).
TEST(E4M3, HandPickedCodes) {
  EXPECT_EQ(e4m3_decode(0x00), 0.0f);
  EXPECT_EQ(e4m3_decode(0x01), 0.001953125f);  // 2^-9, smallest subnormal
  EXPECT_EQ(e4m3_decode(0x07), 0.013671875f);  // 7 * 2^-9, largest subnormal
  EXPECT_EQ(e4m3_decode(0x08), 0.015625f);     // 2^-6, smallest normal
  EXPECT_EQ(e4m3_decode(0x38), 1.0f);
  EXPECT_EQ(e4m3_decode(0x3F), 1.875f);
  EXPECT_EQ(e4m3_decode(0x6C), 96.0f);
  EXPECT_EQ(e4m3_decode(0x6E), 112.0f);
  EXPECT_EQ(e4m3_decode(0x7D), 416.0f);
  EXPECT_EQ(e4m3_decode(0x7E), 448.0f);  // largest finite
  EXPECT_EQ(e4m3_decode(0xB8), -1.0f);
}

// All 126 positive finite codes 0x01..0x7E: decode matches the formula, values strictly increase, and
// encode(decode(c)) == c.
TEST(E4M3, EveryPositiveFiniteCodeRoundTrips) {
  int checked = 0;
  for (int c = 0x01; c <= 0x7E; ++c) {
    EXPECT_EQ(double(e4m3_decode(uint8_t(c))), e4m3_value(c)) << "code " << c;
    EXPECT_GT(e4m3_decode(uint8_t(c)), e4m3_decode(uint8_t(c - 1))) << "code " << c;
    EXPECT_EQ(ue4m3_encode(e4m3_decode(uint8_t(c))), c) << "code " << c;
    ++checked;
  }
  EXPECT_EQ(checked, 126);
  EXPECT_EQ(ue4m3_encode(0.0f), 0);
}

// Midpoint of every neighbouring pair (c, c+1), c = 0x00..0x7D: a 5-significant-bit number, exact in
// FP32. Ties go to the even code (even significand); one FP32 ulp either side goes to the nearer code.
// Covers zero/subnormal, subnormal/normal (0x07/0x08) and binade steps (0x0F/0x10, ...).
TEST(E4M3, RtneAtEveryMidpointAndOneUlpEitherSide) {
  int checked = 0;
  for (int c = 0x00; c < 0x7E; ++c) {
    const double mid_d = 0.5 * (e4m3_value(c) + e4m3_value(c + 1));
    const float mid = float(mid_d);
    ASSERT_EQ(double(mid), mid_d);
    const int even = (c % 2 == 0) ? c : c + 1;
    EXPECT_EQ(ue4m3_encode(mid), even) << "midpoint of " << c << " and " << c + 1 << ": " << mid;
    EXPECT_EQ(ue4m3_encode(std::nextafter(mid, 0.0f)), c) << fbits(std::nextafter(mid, 0.0f));
    EXPECT_EQ(ue4m3_encode(std::nextafter(mid, INFINITY)), c + 1) << fbits(std::nextafter(mid, INFINITY));
    checked += 3;
  }
  EXPECT_EQ(checked, 3 * 126);
}

TEST(E4M3, SubnormalsAndTinyInputs) {
  // Below half the smallest subnormal (2^-10) everything flushes to 0; 2^-10 itself is a tie -> 0 (even).
  EXPECT_EQ(ue4m3_encode(std::numeric_limits<float>::denorm_min()), 0);
  EXPECT_EQ(ue4m3_encode(FLT_MIN), 0);
  EXPECT_EQ(ue4m3_encode(0x1p-10f), 0);
  EXPECT_EQ(ue4m3_encode(std::nextafter(0x1p-10f, 1.0f)), 1);
  EXPECT_EQ(ue4m3_encode(3 * 0x1p-10f), 2);  // tie between 1 and 2 subnormal units -> 2 (even)
  EXPECT_EQ(ue4m3_encode(5 * 0x1p-10f), 2);  // tie between 2 and 3 -> 2
  EXPECT_EQ(ue4m3_encode(15 * 0x1p-10f), 8);  // tie between 7 * 2^-9 and 2^-6 -> 0x08
  // Non-positive inputs give 0 (block amax is never negative; callers clamp).
  EXPECT_EQ(ue4m3_encode(-1.0f), 0);
  EXPECT_EQ(ue4m3_encode(-0.0f), 0);
}

TEST(E4M3, SaturatesAt448) {
  for (float x : {448.0f, std::nextafter(448.0f, INFINITY), 464.0f, 479.0f, 480.0f, 1e6f, FLT_MAX})
    EXPECT_EQ(ue4m3_encode(x), 0x7E) << fbits(x);
  EXPECT_EQ(ue4m3_encode(432.0f), 0x7E);  // tie 416 (0x7D, odd) / 448 (0x7E, even)
  EXPECT_EQ(ue4m3_encode(std::nextafter(432.0f, 0.0f)), 0x7D);
}

// E8M0: code = X + 127, value 2^X; X clamped to [-127, 127] (0xFF, the NaN code, never produced).
TEST(E8M0, EveryCodeDecodesToItsPowerOfTwo) {
  for (int c = 0; c <= 254; ++c) EXPECT_EQ(double(e8m0_decode(uint8_t(c))), std::ldexp(1.0, c - 127)) << c;
  for (int X = -127; X <= 127; ++X) EXPECT_EQ(e8m0_encode_exp(X), X + 127) << X;
  EXPECT_EQ(e8m0_encode_exp(-128), 0);
  EXPECT_EQ(e8m0_encode_exp(-1000), 0);
  EXPECT_EQ(e8m0_encode_exp(128), 254);
  EXPECT_EQ(e8m0_encode_exp(1000), 254);
  EXPECT_EQ(e8m0_decode(0), 0x1p-127f);  // an FP32 subnormal
}

// floor/ceil log2 on every power of two of FP32 (subnormals included) and one ulp either side.
TEST(E8M0, FloorCeilLog2OnPowersOfTwoAndNeighbours) {
  int checked = 0;
  for (int k = -149; k <= 127; ++k) {
    const float p = std::ldexp(1.0f, k);
    ASSERT_EQ(double(p), std::ldexp(1.0, k));
    EXPECT_EQ(floor_log2(p), k) << "2^" << k;
    EXPECT_EQ(ceil_log2(p), k) << "2^" << k;
    // One ulp either side (at the bottom of the subnormals those are powers of two themselves); the
    // expectation comes from float64 log2, which resolves a relative step of 2^-23 easily.
    for (float y : {std::nextafter(p, INFINITY), std::nextafter(p, 0.0f)}) {
      if (!(y > 0.0f) || !std::isfinite(y)) continue;
      EXPECT_EQ(floor_log2(y), int(std::floor(std::log2(double(y))))) << fbits(y);
      EXPECT_EQ(ceil_log2(y), int(std::ceil(std::log2(double(y))))) << fbits(y);
    }
    if (k > -148) {  // neighbours that are not powers of two: by hand
      EXPECT_EQ(floor_log2(std::nextafter(p, INFINITY)), k);
      EXPECT_EQ(ceil_log2(std::nextafter(p, INFINITY)), k + 1);
      EXPECT_EQ(floor_log2(std::nextafter(p, 0.0f)), k - 1);
      EXPECT_EQ(ceil_log2(std::nextafter(p, 0.0f)), k);
    }
    ++checked;
  }
  EXPECT_EQ(checked, 277);
  EXPECT_EQ(floor_log2(3 * 0x1p-149f), -148);  // subnormal, not a power of two
  EXPECT_EQ(ceil_log2(3 * 0x1p-149f), -147);
  EXPECT_EQ(floor_log2(FLT_MAX), 127);
  EXPECT_EQ(ceil_log2(FLT_MAX), 128);
  EXPECT_EQ(floor_log2(5.0f), 2);
  EXPECT_EQ(ceil_log2(5.0f), 3);
  EXPECT_EQ(floor_log2(0.75f), -1);
  EXPECT_EQ(ceil_log2(0.75f), 0);
}

// BF16: RTNE on the 16 dropped bits (hand-computed bit patterns).
TEST(Bf16, RoundToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x3F808000)), 0x3F80);  // 1 + 2^-8: tie -> even (0x3F80)
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x3F818000)), 0x3F82);  // 1 + 3 * 2^-8: tie -> even (0x3F82)
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x3F808001)), 0x3F81);  // just above the tie
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x3F807FFF)), 0x3F80);  // just below the tie
  EXPECT_EQ(f32_to_bf16(-2.5f), 0xC020);
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x00008000)), 0x0000);  // subnormal tie -> even 0
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x00018000)), 0x0002);  // subnormal tie -> even 2
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x7F7FFFFF)), 0x7F80);  // FLT_MAX rounds to +Inf (IEEE RTNE)
  EXPECT_EQ(bf16_to_f32(0x3FC0), 1.5f);
  EXPECT_EQ(round_to_bf16(f32_from_bits(0x40490FDB)), f32_from_bits(0x40490000));  // pi -> 3.140625
}

}  // namespace
}  // namespace fp4lab::test
