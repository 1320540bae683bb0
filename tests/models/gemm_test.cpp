// Block-scaled GEMM (gemm.hpp): the fast fp4lab::gemm is bit-exact (FP32 bit patterns) against the
// scalar contract reference::gemm_contract, and within a derived error bound of a float64 product of
// the dequantised operands. Every format x scale kind x block size, every preset recipe and pass.
#include <gtest/gtest.h>
#include <omp.h>

#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4lab/gemm.hpp"
#include "fp4lab/recipe.hpp"
#include "fp4lab/rht.hpp"
#include "reference/contract_gemm.hpp"
#include "test_util.hpp"

namespace fp4lab::test {
namespace {

// Error bound against C_ref = gemm_f64(dequantize(A), dequantize(B)), per output, u = 2^-24, KB = K/B,
// S = sum_j |deqA_j * deqB_j| (float64). Rounding steps on our side (docs/datapath.md section 3), each a
// relative error <= u on a term or partial sum:
//   s = sa * sb                          1 per block term (exact for ue8m0 and ue4m3, counted anyway)
//   x = FP32(p) * s                      1 per block term (FP32(p) itself is exact)
//   acc += x, blocks 1..KB-1             KB - 1 (recursive summation: |err| <= (KB-1) u sum|x_k|)
//   ga * gb, then acc * (ga * gb)        2 (exact powers of two unless ue4m3)
// On the reference side the FP32 dequantised operands carry at most one rounding each
// ((value * dec) rounds for fp32 scales; for ue4m3 value * dec is exact (3 x 4 significant bits) and
// * S_dec rounds; ue8m0 is exact): 2 per element product. The float64 sum adds <= K 2^-53 S.
// Since sum_k |p_k sa sb| <= S (triangle inequality inside each block), to first order
//   |C - C_ref| <= (KB + 5) u S + K 2^-53 S,
// asserted as (KB + 5) u S (1 + 2^-16) + K 2^-52 S (second-order terms are far below 2^-16 relative for
// KB <= 64). Inputs stay clear of FP32 overflow and of subnormal results, where a relative bound fails.
void expect_contract_and_bound(const QTensor& a, const QTensor& b, const std::string& what) {
  const auto c = gemm(a, b);
  const auto ref = reference::gemm_contract(a, b);
  ASSERT_EQ(c.size(), size_t(a.rows * b.rows));
  ASSERT_EQ(ref.size(), c.size());
  const auto da = a.dequantize(), db = b.dequantize();
  const auto c64 = gemm_f64(da.data(), db.data(), a.rows, b.rows, a.cols);
  const int64_t K = a.cols, KB = K / a.block;
  int64_t mismatches = 0, checked = 0, nonzero = 0;
  for (int64_t m = 0; m < a.rows; ++m)
    for (int64_t n = 0; n < b.rows; ++n) {
      const size_t i = size_t(m * b.rows + n);
      if (f32_bits(c[i]) != f32_bits(ref[i]) && ++mismatches <= 5)
        ADD_FAILURE() << what << ": C[" << m << ", " << n << "] gemm " << fbits(c[i]) << " != contract "
                      << fbits(ref[i]) << " (M " << a.rows << " N " << b.rows << " K " << K << ")";
      double S = 0;
      for (int64_t k = 0; k < K; ++k) S += std::fabs(double(da[m * K + k]) * double(db[n * K + k]));
      const double bound = double(KB + 5) * 0x1p-24 * S * (1 + 0x1p-16) + double(K) * 0x1p-52 * S;
      EXPECT_LE(std::fabs(double(ref[i]) - c64[i]), bound)
          << what << ": C[" << m << ", " << n << "] = " << fbits(ref[i]) << " vs float64 " << c64[i] << ", S " << S;
      nonzero += S > 0;
      ++checked;
    }
  EXPECT_EQ(mismatches, 0) << what;
  EXPECT_EQ(checked, a.rows * b.rows);
  EXPECT_GT(nonzero, 0) << what << ": every output was trivially zero";
}

struct GemmParam {
  QuantConfig cfg;
};
void PrintTo(const GemmParam& p, std::ostream* os) { *os << p.cfg.label(); }

std::vector<GemmParam> all_configs() {
  std::vector<GemmParam> out;
  for (const ElemFormat& f : kAllFormats)
    for (ScaleKind s : {ScaleKind::fp32, ScaleKind::ue4m3, ScaleKind::ue8m0, ScaleKind::ue8m0_ceil})
      for (int block : {16, 32}) {
        if (s == ScaleKind::ue4m3 && block != 16) continue;  // NVFP4 scales are per 16
        for (int rht : {0, 16}) {
          QuantConfig c;
          c.format = f;
          c.scale = s;
          c.block = block;
          if (rht) {
            c.rht = rht;
            c.rht_signs = rht_signs_from_seed(rht, 3);
          }
          out.push_back({c});
          if (s == ScaleKind::fp32 && block == 16 && rht == 16) {  // and the UFP4-style SR operand
            c.rounding = Rounding::sr;
            c.seed = 99;
            out.push_back({c});
          }
        }
      }
  return out;
}

class GemmContract : public ::testing::TestWithParam<GemmParam> {
 protected:
  QTensor q(const std::vector<float>& x, int64_t rows, int64_t cols, uint32_t stream) const {
    QuantConfig c = GetParam().cfg;
    c.stream = stream;
    return quantize(x.data(), rows, cols, c);
  }
};

// Random shapes, K = block included; rows of different magnitudes.
TEST_P(GemmContract, RandomShapes) {
  const QuantConfig& cfg = GetParam().cfg;
  Rng rng(0xC0FFEE ^ uint64_t(cfg.block));
  const int kbs[] = {1, 1, 2, 3, 7};
  int runs = 0;
  for (int kb : kbs) {
    const int64_t M = rng.range(1, 40), N = rng.range(1, 40), K = int64_t(kb) * cfg.block;
    std::vector<float> a(size_t(M * K)), b(size_t(N * K));
    for (int64_t r = 0; r < M; ++r) {
      const float row_scale = std::ldexp(1.0f, int(rng.range(-6, 6)));
      for (int64_t k = 0; k < K; ++k) a[r * K + k] = rng.normal() * row_scale;
    }
    for (auto& v : b) v = rng.normal();
    expect_contract_and_bound(q(a, M, K, 1), q(b, N, K, 2),
                              cfg.label() + " M" + std::to_string(M) + " N" + std::to_string(N) + " K" + std::to_string(K));
    ++runs;
  }
  EXPECT_EQ(runs, 5);
}

// Each element 2^e (1 + f), e uniform in [-50, 50]: blocks mix magnitudes 2^100 apart (most elements
// flush to zero next to their block's max). Scales span 2^+-50, products stay finite and normal.
TEST_P(GemmContract, HugeDynamicRange) {
  const QuantConfig& cfg = GetParam().cfg;
  Rng rng(41);
  const int64_t M = 19, N = 23, K = 4 * int64_t(cfg.block);
  auto gen = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = std::ldexp(1.0f + rng.uniform(), int(rng.range(-50, 50))) * (rng.next() & 1 ? -1.0f : 1.0f);
    return v;
  };
  const auto a = gen(M * K), b = gen(N * K);
  expect_contract_and_bound(q(a, M, K, 1), q(b, N, K, 2), cfg.label() + " huge range");
}

// Finite operands whose products sum past FLT_MAX: the output would be Inf, so gemm() refuses it.
TEST(GemmHandWorked, OutputOverflowThrows) {
  QuantConfig cfg;
  cfg.format = kE1M2;
  const std::vector<float> a(2 * 32, 1.0e30f), b(3 * 32, 1.0e30f);
  const QTensor qa = quantize(a.data(), 2, 32, cfg), qb = quantize(b.data(), 3, 32, cfg);
  try {
    gemm(qa, qb);
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("GEMM output overflows FP32 at C[0, 0]"), std::string::npos) << e.what();
  }
}

// All-zero rows (+0 and -0) in both operands: their outputs are +0 in both implementations.
TEST_P(GemmContract, AllZeroRows) {
  const QuantConfig& cfg = GetParam().cfg;
  Rng rng(42);
  const int64_t M = 6, N = 5, K = 2 * int64_t(cfg.block);
  auto a = rng.normals(size_t(M * K)), b = rng.normals(size_t(N * K));
  for (int64_t k = 0; k < K; ++k) {
    a[0 * K + k] = 0.0f;
    a[3 * K + k] = -0.0f;
    b[2 * K + k] = 0.0f;
  }
  const QTensor qa = q(a, M, K, 1), qb = q(b, N, K, 2);
  expect_contract_and_bound(qa, qb, cfg.label() + " zero rows");
  const auto c = gemm(qa, qb);
  for (int64_t n = 0; n < N; ++n) {
    EXPECT_EQ(f32_bits(c[0 * N + n]), 0u) << n;
    EXPECT_EQ(c[3 * N + n], 0.0f) << n;
  }
  for (int64_t m = 0; m < M; ++m) EXPECT_EQ(c[m * N + 2], 0.0f) << m;
}

// One outlier (~1000x) per block at a random position; the rest ~1e-3.
TEST_P(GemmContract, OneOutlierPerBlock) {
  const QuantConfig& cfg = GetParam().cfg;
  Rng rng(43);
  const int64_t M = 17, N = 11, K = 3 * int64_t(cfg.block);
  auto gen = [&](int64_t rows) {
    std::vector<float> v(size_t(rows * K));
    for (auto& x : v) x = rng.normal() * 1e-3f;
    for (int64_t i = 0; i < rows * K; i += cfg.block)
      v[size_t(i + rng.range(0, cfg.block - 1))] = (rng.next() & 1 ? -1.0f : 1.0f) * (1000.0f + rng.uniform(0, 500));
    return v;
  };
  const auto a = gen(M), b = gen(N);
  expect_contract_and_bound(q(a, M, K, 1), q(b, N, K, 2), cfg.label() + " outliers");
}

INSTANTIATE_TEST_SUITE_P(AllConfigs, GemmContract, ::testing::ValuesIn(all_configs()),
                         [](const ::testing::TestParamInfo<GemmParam>& i) { return gtest_name(i.param.cfg.label()); });

// ---- every preset recipe, every pass, through Recipe::operand and pass_operands --------------------
class GemmPreset : public ::testing::TestWithParam<std::string> {};

TEST_P(GemmPreset, EveryPassBitExactAndBounded) {
  Recipe r = Recipe::preset(GetParam());
  r.seed = 7;
  Rng rng(51);
  const int64_t tokens = 64, in = 96, out = 32;  // multiples of 32 (mxfp4) and of 16 rows (2-D tiles)
  const auto x = rng.normals(size_t(tokens * in)), w = rng.normals(size_t(out * in), 0.05f),
             dy = rng.normals(size_t(tokens * out), 1e-3f);
  int passes = 0;
  for (Pass p : kPasses) {
    const PassOperands po = pass_operands(p, x.data(), w.data(), dy.data(), tokens, in, out);
    const QTensor qa = quantize(po.a.data(), po.M, po.K, r.operand(p, Operand::a));
    const QTensor qb = quantize(po.b.data(), po.N, po.K, r.operand(p, Operand::b));
    expect_contract_and_bound(qa, qb, GetParam() + " " + pass_name(p));
    ++passes;
  }
  EXPECT_EQ(passes, 3);
}

INSTANTIATE_TEST_SUITE_P(Presets, GemmPreset, ::testing::ValuesIn(Recipe::preset_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return gtest_name(i.param); });

// ---- hand-worked contract cases -------------------------------------------------------------------
// e1m2, fp32 scales, K = 32: block 0 of A and B holds 16 x 3.5 (amax 3.5 -> dec 2, code 7 = int 7),
// block 1 holds 16 x 1.75 (dec 1, int 7). p0 = p1 = 16 * 49 = 784; s0 = 4, s1 = 1;
// acc = 784 * 4 + 784 * 1 = 3920; out = 3920 * (2^-2 * 2^-2) = 245 = 16 * 3.5^2 + 16 * 1.75^2.
TEST(GemmHandWorked, TwoBlocksE1M2) {
  std::vector<float> v(32);
  for (int j = 0; j < 16; ++j) v[j] = 3.5f, v[16 + j] = 1.75f;
  QuantConfig c;
  c.format = kE1M2;
  const QTensor a = quantize(v.data(), 1, 32, c);
  ASSERT_EQ(a.scales, (std::vector<float>{2.0f, 1.0f}));
  EXPECT_EQ(gemm(a, a)[0], 245.0f);
  EXPECT_EQ(reference::gemm_contract(a, a)[0], 245.0f);
}

// The ascending FP32 accumulation is part of the contract. int4 (integer view = value), ue8m0, K = 48:
// block 0: A = B = 2^12 at one element -> X = 12 - 2 = 10, int 4; p = 16, s = 2^20, x = 2^24.
// blocks 1, 2: A = B = 1 -> X = -2, int 4; p = 16, s = 2^-4, x = 1.
// Ascending: (2^24 + 1) ties to even -> 2^24, + 1 -> 2^24 again: C = 2^24 (0x4b800000), although the
// exact sum, 2^24 + 2, is an FP32 number (a tree or reversed order would find it).
TEST(GemmHandWorked, AscendingBlockOrderRounds) {
  std::vector<float> v(48, 0.0f);
  v[0] = 4096.0f;
  v[16] = 1.0f;
  v[32] = 1.0f;
  QuantConfig c;
  c.format = kInt4;
  c.scale = ScaleKind::ue8m0;
  const QTensor a = quantize(v.data(), 1, 48, c);
  ASSERT_EQ(a.scale_codes, (std::vector<uint8_t>{137, 125, 125}));
  EXPECT_EQ(f32_bits(gemm(a, a)[0]), 0x4b800000u);
  EXPECT_EQ(f32_bits(reference::gemm_contract(a, a)[0]), 0x4b800000u);
  EXPECT_EQ(gemm_f64(a.dequantize().data(), a.dequantize().data(), 1, 1, 48)[0], 16777218.0);
}

// A hand-built int4 operand (integer view = value, int_shift 0): codes and decoded scales set directly.
QTensor hand_int4(ScaleKind kind, std::vector<uint8_t> codes, std::vector<float> scales, float global_dec) {
  QTensor q;
  q.format = kInt4;
  q.scale_kind = kind;
  q.block = 16;
  q.rows = 1;
  q.cols = int64_t(codes.size());
  q.codes = std::move(codes);
  q.scales = std::move(scales);
  if (kind != ScaleKind::fp32) q.scale_codes.assign(q.scales.size(), 0x38);  // E4M3 1.0 (not read by the GEMM)
  q.global_dec = global_dec;
  return q;
}

// Separate multiply and add (no FMA). K = 32, int4, fp32 scales: block 0 has p0 = (-3) * 1 with scales
// 1 * 1, so acc = -3. Block 1 has p1 = 3 * 1 with sa = 1 + 2^-23, sb = 1: x = 3 (1 + 2^-23) = 3 + 1.5 ulp
// (ulp 2^-22 in [2, 4)), a tie -> even mantissa: 3 + 2^-21. acc = -3 + 3 + 2^-21 = 2^-21 (0x35000000).
// A fused multiply-add would give the exact 3 * 2^-23 (0x34c00000).
TEST(GemmHandWorked, SeparateMultiplyAndAddNoFma) {
  std::vector<uint8_t> ca(32, 0), cb(32, 0);
  ca[0] = 0b1'011;  // -3
  ca[16] = 0b0'011;  // 3
  cb[0] = cb[16] = 0b0'001;  // 1
  const QTensor a = hand_int4(ScaleKind::fp32, ca, {1.0f, 1.0f + 0x1p-23f}, 1.0f);
  const QTensor b = hand_int4(ScaleKind::fp32, cb, {1.0f, 1.0f}, 1.0f);
  EXPECT_EQ(f32_bits(gemm(a, b)[0]), 0x35000000u);
  EXPECT_EQ(f32_bits(reference::gemm_contract(a, b)[0]), 0x35000000u);
}

// The fused form of steps 3-5 (contract_scale_add_fma, which the GPU kernel runs where every scale passes
// fma_exact_scale) against the contract, bit for bit. Accumulators: signed zeros, infinities, and values near
// x * s with random low bits, so that step 5's rounding (the one both forms share) is exercised.
void expect_fused_form_exact(const std::vector<float>& scales, const char* what) {
  std::mt19937 rng(7);
  std::vector<float> xs;
  for (int p = -40; p <= 40; ++p) xs.push_back(float(p));
  // Up to the proof's bound (kFmaExactMaxDot = 2^16), past the 32 * 144 that any grid reaches.
  for (int p : {4608, -4608, 4607, 2304, -2303, 777, 1023, -1025, 32767, -32767, 65535, -65535}) xs.push_back(float(p));
  for (int i = 0; i < 16; ++i) xs.push_back(float(int(rng() % 9217) - 4608));
  int64_t checked = 0, mismatched = 0;
  for (const float sa : scales)
    for (const float sb : scales) {
      ASSERT_TRUE(fma_exact_scale(sa) && fma_exact_scale(sb)) << what << ": " << sa << " " << sb;
      const float s = sa * sb;
      for (const float x : xs) {
        const float t = x * s;
        const uint32_t r = rng();
        const float accs[] = {0.0f, -0.0f, INFINITY, -INFINITY, -t, t,
                              t * std::ldexp(1.0f + float(r & 0xFFFFFF) * 0x1p-24f, int(r >> 28) - 8),
                              -t * std::ldexp(1.0f + float((r >> 4) & 0xFFFFF) * 0x1p-20f, int((r >> 24) % 40) - 20),
                              std::ldexp(float(int(r % 2001) - 1000), int(r >> 27) - 16) + s};
        for (const float acc : accs) {
          ++checked;
          const uint32_t want = f32_bits(contract_scale_add(acc, x, sa, sb));
          if (f32_bits(contract_scale_add_fma(acc, x, sa, sb)) != want && ++mismatched <= 5)
            ADD_FAILURE() << what << ": acc " << acc << " x " << x << " sa " << sa << " sb " << sb;
          // The two-fma form on the accumulator's kMagic + p (the GPU's), for every acc the contract can hold.
          const float f = kMagic + x;  // exact: |x| < 2^22
          if (f32_bits(acc) != 0x80000000u &&
              f32_bits(contract_scale_add_magic(acc, f, sa, magic_scale(sa), sb)) != want && ++mismatched <= 5)
            ADD_FAILURE() << what << " (magic form): acc " << acc << " x " << x << " sa " << sa << " sb " << sb;
        }
      }
    }
  EXPECT_EQ(mismatched, 0) << what << " of " << checked;
}

TEST(FmaForm, EqualsTheContractForEveryE4m3ScalePair) {
  std::vector<float> scales;
  for (int c = 0; c < 0x7F; ++c) scales.push_back(e4m3_decode(uint8_t(c)));  // 0x7F is NaN
  expect_fused_form_exact(scales, "ue4m3");
}

// The kinds the fused form is tried for: both operands' scales UE4M3 or UE8M0 (either rounding); any FP32 operand
// keeps the separate form.
TEST(FmaForm, FusedFormKindsExcludeFp32Scales) {
  for (ScaleKind k : kAllScales) {
    EXPECT_FALSE(fused_form_kinds(ScaleKind::fp32, k)) << scale_name(k);
    EXPECT_FALSE(fused_form_kinds(k, ScaleKind::fp32)) << scale_name(k);
  }
  for (ScaleKind a : {ScaleKind::ue4m3, ScaleKind::ue8m0, ScaleKind::ue8m0_ceil})
    for (ScaleKind b : {ScaleKind::ue4m3, ScaleKind::ue8m0, ScaleKind::ue8m0_ceil})
      EXPECT_TRUE(fused_form_kinds(a, b)) << scale_name(a) << " x " << scale_name(b);
}

TEST(FmaForm, EqualsTheContractForE8m0ScalesWithin2To50) {
  std::vector<float> scales;
  for (int e = -50; e <= 50; ++e) scales.push_back(std::ldexp(1.0f, e));
  expect_fused_form_exact(scales, "ue8m0");
}

// fma_exact_scale ignores the sign and takes any 4-bit mantissa within 2^+-50: the forms hold there too, at the
// exponent ends where msa and p * sa are largest and smallest, with negative and signed-zero scales.
TEST(FmaForm, EqualsTheContractAtThePredicatesEdges) {
  std::vector<float> scales = {-0.0f, 0.0f};
  for (int e : {-50, -49, -1, 0, 49, 50})
    for (float m : {1.0f, 1.125f, 1.5f, 1.875f}) {
      scales.push_back(std::ldexp(m, e));
      scales.push_back(-std::ldexp(m, e));
    }
  expect_fused_form_exact(scales, "edges");
}

// The predicate's edges: exponents past +-50, a fourth stored mantissa bit, non-finite values, and an FP32
// scale where the fused form indeed gives other bits (the hand-worked case above: the contract's 2^-21 against
// the fma's 3 * 2^-23), so the kernel must keep the separate form there.
TEST(FmaForm, ScalesOutsideTheProofAreRefused) {
  EXPECT_TRUE(fma_exact_scale(0.0f) && fma_exact_scale(-0.0f) && fma_exact_scale(448.0f) &&
              fma_exact_scale(0x1p-9f) && fma_exact_scale(0x1.ep50f) && fma_exact_scale(0x1p-50f));
  EXPECT_FALSE(fma_exact_scale(0x1p51f) || fma_exact_scale(0x1p-51f) || fma_exact_scale(1.0625f) ||
               fma_exact_scale(1.0f + 0x1p-23f) || fma_exact_scale(INFINITY) || fma_exact_scale(NAN) ||
               fma_exact_scale(0x1p-130f));
  EXPECT_EQ(f32_bits(contract_scale_add(-3.0f, 3.0f, 1.0f + 0x1p-23f, 1.0f)), 0x35000000u);
  EXPECT_EQ(f32_bits(contract_scale_add_fma(-3.0f, 3.0f, 1.0f + 0x1p-23f, 1.0f)), 0x34c00000u);
  // Every grid's largest block dot product stays inside the proof's bound.
  for (const ElemFormat& f : kAllFormats) EXPECT_LT(32 * f.int_level(7) * f.int_level(7), kFmaExactMaxDot) << f.name;
}

// The accumulator trick behind contract_scale_add_magic: an int32 accumulator started at kMagicBits holds the FP32
// bits of kMagic + p for every |p| <= kMagicMaxDot (the mma adds p as an integer), and its edges. The magic form
// differs from the contract only at acc = -0, which the contract's accumulator never holds (a sum from +0 by
// round-to-nearest adds is -0 only when both addends are): p < 0 with a zero scale adds -0 there, +0 here.
TEST(FmaForm, MagicAccumulatorHoldsKMagicPlusP) {
  int64_t bad = 0;
  for (int32_t p = -kMagicMaxDot; p <= kMagicMaxDot; ++p)  // +2^22 still reads right: 0x4B800000 is 2^24
    bad += f32_bits(kMagic + float(p)) != uint32_t(kMagicBits + p) || (kMagic + float(p)) - kMagic != float(p);
  EXPECT_EQ(bad, 0);
  // Past either end the exponent field moves and the bits no longer read as kMagic + p.
  EXPECT_NE(f32_bits(kMagic + float(kMagicMaxDot + 1)), uint32_t(kMagicBits + kMagicMaxDot + 1));
  EXPECT_NE(f32_bits(kMagic - float(kMagicMaxDot + 1)), uint32_t(kMagicBits - kMagicMaxDot - 1));
  EXPECT_EQ(f32_bits(contract_scale_add(-0.0f, -3.0f, 0.0f, 1.0f)), 0x80000000u);
  EXPECT_EQ(f32_bits(contract_scale_add_magic(-0.0f, kMagic - 3.0f, 0.0f, magic_scale(0.0f), 1.0f)), 0u);
  // Every grid's largest block dot product stays inside the trick's bound too.
  for (const ElemFormat& f : kAllFormats) EXPECT_LT(32 * f.int_level(7) * f.int_level(7), kMagicMaxDot) << f.name;
}

// Step 6: out = acc * (ga * gb), the factor rounded first. int4 (2^-int_shift = 1), global_dec 1 + 2^-23
// on both sides, acc = 3 (one block, 3 * 1, scales 1): ga * gb = 1 + 2^-22 + 2^-46 -> 1 + 2^-22;
// 3 (1 + 2^-22) = 3 + 3 ulp exactly -> 0x40400003. The other order, (3 ga) gb, gives (3 + 2 ulp) gb
// = 3 + 3.5 ulp + tiny -> 3 + 4 ulp (0x40400004).
TEST(GemmHandWorked, GlobalFactorsMultipliedFirst) {
  std::vector<uint8_t> ca(16, 0), cb(16, 0);
  ca[0] = 0b0'011;
  cb[0] = 0b0'001;
  const QTensor a = hand_int4(ScaleKind::ue4m3, ca, {1.0f}, 1.0f + 0x1p-23f);
  const QTensor b = hand_int4(ScaleKind::ue4m3, cb, {1.0f}, 1.0f + 0x1p-23f);
  EXPECT_EQ(f32_bits(gemm(a, b)[0]), 0x40400003u);
  EXPECT_EQ(f32_bits(reference::gemm_contract(a, b)[0]), 0x40400003u);
}

// Thread count does not change a single bit.
TEST(GemmThreads, OneVersusTwoThreads) {
  const int saved = omp_get_max_threads();
  Rng rng(61);
  const int64_t M = 64, N = 48, K = 256;
  const auto a = rng.normals(size_t(M * K)), b = rng.normals(size_t(N * K));
  for (int block : {16, 32}) {
    QuantConfig c;
    c.format = kE2M1;
    c.block = block;
    const QTensor qa = quantize(a.data(), M, K, c), qb = quantize(b.data(), N, K, c);
    omp_set_num_threads(1);
    const auto c1 = gemm(qa, qb);
    omp_set_num_threads(2);
    const auto c2 = gemm(qa, qb);
    ASSERT_EQ(c1.size(), c2.size());
    for (size_t i = 0; i < c1.size(); ++i) ASSERT_EQ(f32_bits(c1[i]), f32_bits(c2[i])) << i;
  }
  omp_set_num_threads(saved);
}

TEST(GemmBadInput, MismatchedOperandsThrow) {
  Rng rng(71);
  const auto x = rng.normals(64 * 64);
  QuantConfig c16, c32;
  c32.block = 32;
  const QTensor a32k = quantize(x.data(), 4, 32, c16), b64k = quantize(x.data(), 4, 64, c16);
  const QTensor b32k_blk32 = quantize(x.data(), 4, 32, c32);
  for (auto f : {+[](const QTensor& a, const QTensor& b) { return gemm(a, b); },
                 +[](const QTensor& a, const QTensor& b) { return reference::gemm_contract(a, b); }}) {
    try {
      f(a32k, b64k);
      ADD_FAILURE() << "K mismatch accepted";
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("32"), std::string::npos) << m;
      EXPECT_NE(m.find("64"), std::string::npos) << m;
    }
    EXPECT_THROW(f(a32k, b32k_blk32), std::invalid_argument);
  }
}

// A QTensor carries the rotation it was quantised under, and the GEMM multiplies only operands rotated alike or
// both unrotated (docs/spec.md §5): RHT against none, RHT-16 against RHT-32 and other signs are refused with the
// reason, by the fast path and the reference alike. Grids and scale formats may differ: each operand keeps its own
// factor (docs/datapath.md §3), so e1m2 x e2m1 is the product of the dequantised operands.
TEST(GemmBadInput, OperandsUnderDifferentRotationsThrow) {
  Rng rng(72);
  const auto x = rng.normals(16 * 64);
  auto cfg = [](int d, uint64_t seed) {
    QuantConfig c;
    c.rht = d;
    c.rht_signs = d == 0 ? std::vector<float>() : d == 16 && seed == 0 ? rht_signs_te(16) : rht_signs_from_seed(d, seed);
    return c;
  };
  const QTensor none = quantize(x.data(), 16, 64, cfg(0, 0)), te = quantize(x.data(), 16, 64, cfg(16, 0));
  const QTensor seeded = quantize(x.data(), 16, 64, cfg(16, 5)), r32 = quantize(x.data(), 16, 64, cfg(32, 5));
  EXPECT_EQ(te.rht, 16);
  EXPECT_EQ(te.rht_signs, rht_signs_te(16));
  EXPECT_EQ(none.rht, 0);
  EXPECT_TRUE(none.rht_signs.empty());
  struct Case {
    const QTensor *a, *b;
    std::string want;
  };
  const std::string why = "the contract multiplies operands quantised under the same rotation";
  for (const Case& c : {Case{&te, &none, "operand A was rotated by RHT-16 (signs te) and operand B was not: " + why},
                        Case{&none, &te, "operand B was rotated by RHT-16 (signs te) and operand A was not: " + why},
                        Case{&te, &seeded, "operand A was rotated by RHT-16 (signs te) and operand B by RHT-16 (signs 0x"},
                        Case{&seeded, &r32, "operand A was rotated by RHT-16 (signs 0x"}})
    for (auto f : {+[](const QTensor& a, const QTensor& b) { return gemm(a, b); },
                   +[](const QTensor& a, const QTensor& b) { return reference::gemm_contract(a, b); }}) {
      try {
        f(*c.a, *c.b);
        ADD_FAILURE() << "accepted: " << c.want;
      } catch (const std::invalid_argument& e) {
        const std::string m = e.what();
        EXPECT_EQ(m.rfind(c.want, 0), 0u) << m;
        EXPECT_EQ(m.find('\n'), std::string::npos) << m;
      }
    }
  // Alike: accepted, and bit-identical to the reference.
  EXPECT_EQ(gemm(te, te), reference::gemm_contract(te, te));
  EXPECT_EQ(gemm(seeded, quantize(x.data(), 16, 64, cfg(16, 5))).size(), 16u * 16u);
  QuantConfig e2m1 = cfg(16, 0);
  e2m1.format = kE2M1;
  e2m1.scale = ScaleKind::ue4m3;
  e2m1.rht_bf16 = true;
  const QTensor other_grid = quantize(x.data(), 16, 64, e2m1);
  const std::vector<float> mixed = gemm(te, other_grid);
  EXPECT_EQ(mixed, reference::gemm_contract(te, other_grid));
}

// The float64 reference is defined by its order (docs/spec.md §6.1): each output is the sum of its exact
// products in ascending k from +0.0. Shapes off every tile size, and 1 or 3 threads: bit-identical to the loop.
TEST(GemmF64, EqualsAscendingKSumBitForBit) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (const auto& [M, N, K] : {std::array<int64_t, 3>{1, 1, 1}, {5, 17, 33}, {7, 9, 4097}, {13, 24, 300}}) {
    std::vector<float> a(size_t(M * K)), b(size_t(N * K));
    for (float& x : a) x = d(rng) * std::ldexp(1.0f, int(rng() % 40) - 20);  // wide magnitudes: order matters
    for (float& x : b) x = d(rng);
    for (int threads : {1, 3}) {
      omp_set_num_threads(threads);
      const std::vector<double> c = gemm_f64(a.data(), b.data(), M, N, K);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double s = 0.0;
          for (int64_t k = 0; k < K; ++k) s += double(a[m * K + k]) * double(b[n * K + k]);
          ASSERT_EQ(std::bit_cast<uint64_t>(c[m * N + n]), std::bit_cast<uint64_t>(s))
              << "M " << M << " N " << N << " K " << K << " at " << m << "," << n << ", " << threads << " threads";
        }
    }
  }
  omp_set_num_threads(omp_get_num_procs());
}

// The order is observable: 2^60 + 1 - 2^60 is 0 summed left to right and 1 in any order that adds the small
// term last, so a kernel that reassociated k would fail here.
TEST(GemmF64, OrderIsAscendingK) {
  const std::vector<float> a = {0x1p30f, 1.0f, -0x1p30f, 1.0f}, b = {0x1p30f, 1.0f, 0x1p30f, 0.5f};
  EXPECT_EQ(gemm_f64(a.data(), b.data(), 1, 1, 4)[0], 0.5);  // ((2^60 + 1) - 2^60) + 0.5 = 0 + 0.5
}

// A product made a panel at a time (gemm_columns: panels of A's rows into rows of C, panels of B's rows into its
// columns, panels that do not divide the rows) gives gemm's bits; check_gemm_output raises gemm's overflow message.
TEST(GemmColumns, PanelsGiveTheWholeProductsBits) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  const int64_t M = 37, N = 53, K = 96;
  std::vector<float> a(size_t(M * K)), b(size_t(N * K));
  for (float& v : a) v = nd(rng);
  for (float& v : b) v = nd(rng);
  for (const ElemFormat& f : {kE2M1, kE1M2}) {
    QuantConfig c;
    c.format = f;
    c.block = 32;
    const QTensor qa = quantize(a.data(), M, K, c), qb = quantize(b.data(), N, K, c);
    const std::vector<float> want = gemm(qa, qb);
    std::vector<float> by_rows(size_t(M * N)), by_cols(size_t(M * N));
    for (int64_t r0 = 0; r0 < M; r0 += 10)
      gemm_columns(qa.rows_panel(r0, std::min<int64_t>(10, M - r0)), qb, by_rows.data() + r0 * N, N, 0);
    for (int64_t n0 = 0; n0 < N; n0 += 16)
      gemm_columns(qa, qb.rows_panel(n0, std::min<int64_t>(16, N - n0)), by_cols.data(), N, n0);
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(std::bit_cast<uint32_t>(by_rows[i]), std::bit_cast<uint32_t>(want[i])) << i;
      EXPECT_EQ(std::bit_cast<uint32_t>(by_cols[i]), std::bit_cast<uint32_t>(want[i])) << i;
    }
    EXPECT_NO_THROW(check_gemm_output(want.data(), M, N));
  }
  std::vector<float> c(6, 1.0f);
  c[4] = std::numeric_limits<float>::infinity();
  try {
    check_gemm_output(c.data(), 2, 3);
    ADD_FAILURE() << "no fault";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "GEMM output overflows FP32 at C[1, 1]");
  }
}

}  // namespace
}  // namespace fp4lab::test
