// The quantiser's fast paths against slow references written here from docs/datapath.md section 2 with the
// shared per-element definitions (rht_block, block_scale, scale_element, round_rtne, round_sr):
//  - round_rtne (branch-free) against the walk-up-the-levels form it replaced, around every midpoint;
//  - rotate() (AVX-512 RHT-16 where compiled) against rht_block, block by block;
//  - quantize() (fused per-row pass, compile-time formats, vectorised rounding) against a step-by-step
//    quantiser, for every format, scale kind, block, RHT size, BF16 rotation, tiling and rounding mode.
// Everything is compared as bit patterns.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fp4lab/philox.hpp"
#include "fp4lab/quantize.hpp"
#include "fp4lab/rht.hpp"

namespace fp4lab {
namespace {

// Round to nearest by walking up the levels, ties to the even index (the form round_rtne had before it
// became branch-free). A NaN walks past every midpoint.
uint8_t walk_rtne(const ElemFormat& f, float v) {
  const float u = int_view_of(f, v);
  int i = 0;
  for (; i < f.max_index; ++i) {
    const float mid = 0.5f * float(f.int_level(i) + f.int_level(i + 1));
    if (u < mid) break;
    if (u == mid) {
      if (i & 1) ++i;
      break;
    }
  }
  return make_code(std::signbit(v), i);
}

TEST(RoundRtneBranchFree, MatchesWalkAroundEveryMidpointAndLevel) {
  int64_t checked = 0;
  for (const ElemFormat& f : kAllFormats) {
    std::vector<float> centres;
    const float k = std::ldexp(1.0f, -f.int_shift());  // integer view -> value
    for (int i = 0; i <= f.max_index; ++i) {
      centres.push_back(float(f.int_level(i)) * k);
      if (i < f.max_index) centres.push_back(0.5f * float(f.int_level(i) + f.int_level(i + 1)) * k);
    }
    centres.push_back(2.0f * f.gmax());
    std::vector<float> values = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1e-45f, FLT_MAX};
    for (float c : centres)
      for (float s : {1.0f, -1.0f}) {
        const uint32_t b = f32_bits(c * s);
        for (int d = -300; d <= 300; ++d) values.push_back(f32_from_bits(uint32_t(int64_t(b) + d)));
      }
    std::mt19937 g(11);
    for (int i = 0; i < 200000; ++i) values.push_back(f32_from_bits(g()));
    for (float v : values) {
      ASSERT_EQ(round_rtne(f, v), walk_rtne(f, v)) << f.name << " v = " << v << " bits " << std::hex << f32_bits(v);
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

// round_sr_fixed (the golden quantiser's SR on the named grids) against round_sr, around every level and midpoint
// of the grid (300 ulps either side, both signs), on infinities, NaNs, zeros and 200,000 random bit patterns, each
// at the words that decide it: 0, all ones, the two either side of its threshold (the rounding is a step function
// of r >> 8 at ceil(frac * 2^24)) and a random one.
template <const ElemFormat* F>
int64_t sr_fixed_mismatches(int64_t& checked) {
  constexpr ElemFormat f = *F;
  std::vector<float> values = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1e-45f, FLT_MAX};
  const float k = std::ldexp(1.0f, -f.int_shift());  // integer view -> value
  for (int i = 0; i <= f.max_index; ++i) {
    std::vector<float> c = {float(f.int_level(i)) * k};
    if (i < f.max_index) c.push_back(0.5f * float(f.int_level(i) + f.int_level(i + 1)) * k);
    for (float x : c)
      for (float s : {1.0f, -1.0f})
        for (int d = -300; d <= 300; ++d) values.push_back(f32_from_bits(uint32_t(int64_t(f32_bits(x * s)) + d)));
  }
  std::mt19937 g(13);
  for (int i = 0; i < 200000; ++i) values.push_back(f32_from_bits(g()));
  int64_t bad = 0;
  for (float v : values) {
    // The threshold from the walk up the levels (round_sr's own definition of the level below).
    const float u = int_view_of(f, v);
    int i = 0;
    while (i < f.max_index && float(f.int_level(i + 1)) <= u) ++i;
    double t = 0.0;
    if (i < f.max_index && u == u)
      t = double(u - float(f.int_level(i))) / double(f.int_level(i + 1) - f.int_level(i)) * 16777216.0;
    const uint32_t step = uint32_t(std::min(std::ceil(t), 16777215.0));
    const uint32_t words[] = {0u, 0xFFFFFFFFu, step << 8, step ? ((step - 1) << 8) | 0xFFu : 0u,
                              std::min(step + 1, 16777215u) << 8, uint32_t(g())};
    for (uint32_t r : words) {
      ++checked;
      if (round_sr_fixed<F>(v, r) != round_sr(f, v, r) && bad++ < 5)
        ADD_FAILURE() << f.name << " v = " << v << " bits " << std::hex << f32_bits(v) << " r " << r << std::dec;
    }
  }
  return bad;
}

TEST(RoundSrFixed, MatchesRoundSrAroundEveryLevelAndThreshold) {
  int64_t checked = 0;
  EXPECT_EQ(sr_fixed_mismatches<&kE2M1>(checked), 0);
  EXPECT_EQ(sr_fixed_mismatches<&kE1M2>(checked), 0);
  EXPECT_EQ(sr_fixed_mismatches<&kInt4>(checked), 0);
  EXPECT_EQ(sr_fixed_mismatches<&kE2M1Max2>(checked), 0);
  EXPECT_GT(checked, 4 * 6 * 200000);
}

// quantize()'s block rounding (AVX-512: 16 elements per register) against round_rtne, around every midpoint and
// level of every grid: each block of 16 starts with gmax, so its FP32 scale is gmax / gmax = 1 and the values
// reach the rounding unchanged; the rest are the values within 300 ulps of each level and midpoint, both signs,
// and a few extremes (the clamp above gmax cannot be reached through an FP32 scale of 1).
TEST(QuantizeFast, BlockRoundingMatchesRoundRtneAroundEveryMidpointAndLevel) {
  int64_t checked = 0;
  for (const ElemFormat& f : kAllFormats) {
    std::vector<float> values = {0.0f, -0.0f, 1e-45f, -1e-45f, f.gmax(), -f.gmax()};
    const float k = std::ldexp(1.0f, -f.int_shift());
    for (int i = 0; i <= f.max_index; ++i) {
      std::vector<float> centres = {float(f.int_level(i)) * k};
      if (i < f.max_index) centres.push_back(0.5f * float(f.int_level(i) + f.int_level(i + 1)) * k);
      for (float c : centres)
        for (float s : {1.0f, -1.0f})
          for (int d = -300; d <= 300; ++d) {
            const float v = f32_from_bits(uint32_t(int64_t(f32_bits(c * s)) + d));
            if (std::fabs(v) <= f.gmax()) values.push_back(v);
          }
    }
    std::vector<float> x;
    for (size_t i = 0; i < values.size(); ++i) {
      if (x.size() % 16 == 0) x.push_back(f.gmax());
      x.push_back(values[i]);
    }
    while (x.size() % 32 != 0) x.push_back(x.size() % 16 == 0 ? f.gmax() : 0.0f);
    for (int block : {16, 32}) {
      QuantConfig cfg;
      cfg.format = f;
      cfg.block = block;
      const int64_t cols = 256, rows = int64_t(x.size()) / cols + 1;
      std::vector<float> t(size_t(rows * cols), 0.0f);
      std::copy(x.begin(), x.end(), t.begin());
      for (int64_t i = int64_t(x.size()); i < rows * cols; i += 16) t[size_t(i)] = f.gmax();
      const QTensor q = quantize(t.data(), rows, cols, cfg);
      for (size_t i = 0; i < t.size(); ++i) {
        ASSERT_EQ(q.scales[i / size_t(block)], 1.0f) << f.name << " block " << block;
        ASSERT_EQ(q.codes[i], round_rtne(f, t[i])) << f.name << " block " << block << " v = " << t[i] << " bits "
                                                   << std::hex << f32_bits(t[i]);
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

std::vector<float> test_tensor(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(-20.0f, 20.0f);
  std::vector<float> x(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float mag = std::exp2(ud(g));
    for (int64_t c = 0; c < cols; ++c) x[r * cols + c] = r % 5 == 2 ? 0.0f : nd(g) * mag;
    if (r % 5 == 3) x[r * cols + r % cols] = std::ldexp(1.0f, -140);  // a subnormal
  }
  return x;
}

TEST(RotateFast, MatchesRhtBlockBits) {
  const int64_t rows = 9, cols = 256;
  const auto x = test_tensor(rows, cols, 3);
  int64_t checked = 0;
  for (int d : {16, 32, 64})
    for (bool bf16 : {false, true})
      for (int signs : {0, 1}) {
        QuantConfig cfg;
        cfg.rht = d;
        cfg.rht_bf16 = bf16;
        cfg.rht_signs = signs == 0 && d == 16 ? rht_signs_te(16) : rht_signs_from_seed(d, 77 + uint64_t(signs));
        const auto got = rotate(x.data(), rows, cols, cfg);
        std::vector<float> want = x;
        for (int64_t c = 0; c < rows * cols; c += d) rht_block(want.data() + c, d, cfg.rht_signs.data());
        if (bf16)
          for (float& v : want) v = round_to_bf16(v);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_EQ(f32_bits(got[i]), f32_bits(want[i])) << "d=" << d << " bf16=" << bf16 << " element " << i;
          ++checked;
        }
      }
  EXPECT_GT(checked, 0);
}

// The quantiser written out step by step (docs/datapath.md section 2), one element at a time.
QTensor slow_quantize(const std::vector<float>& x_in, int64_t rows, int64_t cols, const QuantConfig& cfg) {
  std::vector<float> x = x_in;
  if (cfg.rht != 0) {
    for (int64_t c = 0; c < rows * cols; c += cfg.rht) rht_block(x.data() + c, cfg.rht, cfg.rht_signs.data());
    if (cfg.rht_bf16)
      for (float& v : x) v = round_to_bf16(v);
  }
  const int64_t kb = cols / cfg.block;
  std::vector<float> amax(size_t(rows * kb), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float& m = amax[r * kb + c / cfg.block];
      m = std::max(m, std::fabs(x[r * cols + c]));
    }
  if (cfg.tile2d)
    for (int64_t r0 = 0; r0 < rows; r0 += 16)
      for (int64_t b = 0; b < kb; ++b) {
        float m = 0.0f;
        for (int r = 0; r < 16; ++r) m = std::max(m, amax[(r0 + r) * kb + b]);
        for (int r = 0; r < 16; ++r) amax[(r0 + r) * kb + b] = m;
      }
  QTensor q;
  q.rows = rows;
  q.cols = cols;
  float s_enc = 1.0f;
  if (cfg.scale == ScaleKind::ue4m3) {
    s_enc = nvfp4_global_encode(cfg.format, *std::max_element(amax.begin(), amax.end()));
    q.global_dec = 1.0f / s_enc;
  }
  q.codes.resize(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < kb; ++b) {
      const BlockScale bs = block_scale(cfg.format, cfg.scale, amax[r * kb + b], s_enc);
      q.scales.push_back(bs.dec);
      if (cfg.scale != ScaleKind::fp32) q.scale_codes.push_back(bs.code);
      for (int j = 0; j < cfg.block; ++j) {
        const int64_t i = r * cols + b * cfg.block + j;
        const float v = scale_element(cfg.scale, x[i], bs);
        q.codes[i] = cfg.rounding == Rounding::rtne ? round_rtne(cfg.format, v)
                                                    : round_sr(cfg.format, v, sr_word(cfg.sr_draw, cfg.seed, cfg.stream, uint64_t(i)));
      }
    }
  return q;
}

// One configuration, compared field by field; returns the number of codes compared.
int64_t expect_same_quantisation(const std::vector<float>& x, int64_t rows, int64_t cols, const QuantConfig& cfg) {
  const QTensor got = quantize(x.data(), rows, cols, cfg);
  const QTensor want = slow_quantize(x, rows, cols, cfg);
  const std::string what = cfg.label() + (cfg.rht_bf16 ? "_bf16rot" : "");
  EXPECT_EQ(got.codes, want.codes) << what;
  EXPECT_EQ(got.scale_codes, want.scale_codes) << what;
  EXPECT_EQ(got.scales.size(), want.scales.size()) << what;
  for (size_t i = 0; i < std::min(got.scales.size(), want.scales.size()); ++i)
    if (f32_bits(got.scales[i]) != f32_bits(want.scales[i])) {
      ADD_FAILURE() << what << " scale " << i << ": " << got.scales[i] << " vs " << want.scales[i];
      break;
    }
  EXPECT_EQ(f32_bits(got.global_dec), f32_bits(want.global_dec)) << what;
  return int64_t(want.codes.size());
}

TEST(QuantizeFast, MatchesStepByStepQuantiserBits) {
  const int64_t rows = 32, cols = 128;
  const auto x = test_tensor(rows, cols, 5);
  // Hundreds of tiny tensors: a thread team is pure overhead here, and on a loaded 2-core machine each
  // barrier can cost a scheduler tick. The threaded passes are covered by the test below.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  int configs = 0;
  int64_t checked = 0;
  for (const ElemFormat& f : kAllFormats)
    for (ScaleKind s : {ScaleKind::fp32, ScaleKind::ue4m3, ScaleKind::ue8m0, ScaleKind::ue8m0_ceil})
      for (int block : {16, 32})
        for (bool tile : {false, true})
          for (int rht : {0, 16, 64})
            for (bool bf16 : {false, true})
              for (Rounding rnd : {Rounding::rtne, Rounding::sr}) {
                if ((s == ScaleKind::ue4m3 || tile) && block != 16) continue;
                if (bf16 && rht == 0) continue;
                QuantConfig cfg;
                cfg.format = f;
                cfg.scale = s;
                cfg.block = block;
                cfg.tile2d = tile;
                cfg.rht = rht;
                cfg.rht_bf16 = bf16;
                if (rht) cfg.rht_signs = rht == 16 ? rht_signs_te(16) : rht_signs_from_seed(rht, 5);
                cfg.rounding = rnd;
                cfg.seed = 0x1234'5678'9abcull;
                cfg.stream = 3;
                checked += expect_same_quantisation(x, rows, cols, cfg);
                ++configs;
                if (rnd == Rounding::sr)  // the other draws too (philox4 is the default)
                  for (SrDraw d : kSrDraws)
                    if (d != kDefaultSrDraw) {
                      cfg.sr_draw = d;
                      checked += expect_same_quantisation(x, rows, cols, cfg);
                      ++configs;
                    }
              }
  omp_set_num_threads(threads);
  EXPECT_GT(configs, 100);
  EXPECT_GT(checked, 0);
}

// Large enough that every pass runs on the thread team (the fused pass keeps a row buffer per thread).
TEST(QuantizeFast, ThreadedPassesMatchStepByStepQuantiserBits) {
  const int64_t rows = 256, cols = 1024;
  const auto x = test_tensor(rows, cols, 9);
  int64_t checked = 0;
  for (ScaleKind s : {ScaleKind::fp32, ScaleKind::ue4m3}) {
    QuantConfig cfg;
    cfg.format = kE1M2;
    cfg.scale = s;
    cfg.tile2d = s == ScaleKind::ue4m3;
    cfg.rht = 16;
    cfg.rht_signs = rht_signs_te(16);
    checked += expect_same_quantisation(x, rows, cols, cfg);
    cfg.rounding = Rounding::sr;
    checked += expect_same_quantisation(x, rows, cols, cfg);
    cfg.sr_draw = SrDraw::philox1;
    checked += expect_same_quantisation(x, rows, cols, cfg);
    cfg.sr_draw = SrDraw::philox16;
    checked += expect_same_quantisation(x, rows, cols, cfg);
  }
  EXPECT_GT(checked, 0);
}

// scale_fp32_by_reciprocal (the quantiser kernels' fp32-scale step) against scale_element's division, as bit
// patterns. Inside its range the result depends only on the significands of x and the scale (a power-of-two
// scaling of either is exact there), so every significand of x is checked against scales with edge significands
// (all ones, 1, 1 + ulp, the midpoint) and random ones, at both signs; then random bit patterns of x and scale over
// every float (zero, subnormal, huge, infinite, NaN), and the edges of the range.
uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
int64_t step_mismatches(float x, float dec) {
  BlockScale b;
  b.dec = dec;
  const float want = scale_element(ScaleKind::fp32, x, b);
  const float got = scale_fp32_by_reciprocal(x, b, fp32_step_reciprocal(b));
  return bits_of(want) != bits_of(got);
}

TEST(QuantizeStep, ReciprocalStepIsTheDivisionForEverySignificandOfX) {
  std::vector<uint32_t> dec_mant = {0x7FFFFF, 0, 1, 0x400000, 0x7FFFFE, 0x2AAAAB, 0x555555};
  std::mt19937 rng(7);
  while (dec_mant.size() < 16) dec_mant.push_back(rng() >> 9);
  const int exps[] = {127 - 60, 127, 127 + 59};  // the range's ends and 1
  int64_t bad = 0, n = 0;
  for (size_t k = 0; k < dec_mant.size(); ++k) {
    const float dec = float_of(uint32_t(exps[k % 3]) << 23 | dec_mant[k]);
#pragma omp parallel for reduction(+ : bad, n)
    for (int64_t m = 0; m < (int64_t(1) << 23); ++m) {
      const float x = float_of(127u << 23 | uint32_t(m));
      bad += step_mismatches(x, dec) + step_mismatches(-x, dec);
      n += 2;
    }
  }
  EXPECT_EQ(bad, 0) << "of " << n;
}

TEST(QuantizeStep, ReciprocalStepIsTheDivisionOnEveryKindOfFloat) {
  std::mt19937 rng(11);
  int64_t bad = 0;
  for (int i = 0; i < (1 << 22); ++i) bad += step_mismatches(float_of(rng()), float_of(rng() & 0x7FFFFFFFu));
  // The range's edges, with x and the quotient on both sides of them.
  const float edges[] = {0x1p-60f, 0x1p60f, 0x1p-61f, 0x1p61f, -0x1p-60f, -0x1p60f, 0x1p-90f, 0x1p90f, 0.0f, -0.0f,
                         1e-45f, 1.17549435e-38f, 3.40282347e+38f, INFINITY, -INFINITY, NAN, 1.0f, 6.0f, 3.5f};
  for (float x : edges) {
    for (float d : edges) {
      if (!(d >= 0.0f)) continue;  // block scales are amax / gmax: never negative
      for (int ulp = -2; ulp <= 2; ++ulp) {
        bad += step_mismatches(float_of(bits_of(x) + uint32_t(ulp)), d);
        bad += step_mismatches(x, float_of(bits_of(d) + uint32_t(ulp)));
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace fp4lab
