// The fast CPU GEMM paths (AVX-512 VNNI, AVX2, scalar; whichever this build compiled in) against the slow
// scalar contract in models/reference/contract_gemm.hpp, compared as FP32 bit patterns.
//
// Shapes include M and N that are not multiples of any tile (6 rows x 32 or 8 columns), K equal to one
// block, blocks of 16 and 32, every element format (also mixed between A and B), every scale kind, and
// operands with extreme scales (subnormal, overflowing products) built directly from codes.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fp4lab/gemm.hpp"
#include "fp4lab/quantize.hpp"
#include "reference/contract_gemm.hpp"
#include "src/gemm_kernels.hpp"

namespace fp4lab {
namespace {

using detail::GemmPath;

std::string safe(std::string s) {
  for (char& c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) c = '_';
  return s;
}

std::string hexf(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  char b[48];
  std::snprintf(b, sizeof b, "%.9g (0x%08x)", double(x), u);
  return b;
}

// Counts outputs compared; every mismatch (up to 5) is reported with its coordinates and both bit patterns.
int64_t expect_bit_equal(const std::vector<float>& want, const std::vector<float>& got, int64_t N,
                         const std::string& what) {
  EXPECT_EQ(want.size(), got.size()) << what;
  if (want.size() != got.size()) return 0;
  int failures = 0;
  for (size_t i = 0; i < want.size() && failures < 5; ++i)
    if (std::memcmp(&want[i], &got[i], 4) != 0) {
      ADD_FAILURE() << what << ": C[" << i / N << ", " << i % N << "] reference " << hexf(want[i]) << ", fast "
                    << hexf(got[i]);
      ++failures;
    }
  return int64_t(want.size());
}

// Realistic operand: normal values with a per-row magnitude over 2^-8..2^8, an all-zero row, and an
// outlier per few blocks, quantised by the golden quantiser.
QTensor make_operand(int64_t rows, int64_t cols, const ElemFormat& f, ScaleKind s, int block, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(-8.0f, 8.0f);
  std::vector<float> x(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float mag = std::exp2(ud(g));
    for (int64_t c = 0; c < cols; ++c) x[r * cols + c] = (r == 1 ? 0.0f : nd(g) * mag);
    if (r != 1 && cols >= 3 * block) x[r * cols + 2 * block + r % block] *= 40.0f;
  }
  QuantConfig cfg;
  cfg.format = f;
  cfg.scale = s;
  cfg.block = block;
  // At these sizes the quantiser's thread team is pure overhead, and on a loaded 2-core machine each of
  // its barriers can cost a scheduler tick; quantise on one thread (the GEMMs keep their own setting).
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  QTensor q = quantize(x.data(), rows, cols, cfg);
  omp_set_num_threads(threads);
  return q;
}

// Operand built straight from codes: all 16 codes (e2m1_max2's unused ones included, decoded as the
// reference decodes them) and block scales of either sign. Rows cycle through tiny scales (subnormal
// products), huge ones (products overflow to inf, and inf - inf gives NaN) and ordinary ones with zeros.
QTensor make_raw_operand(int64_t rows, int64_t cols, const ElemFormat& f, int block, uint32_t seed) {
  std::mt19937 g(seed);
  QTensor q;
  q.format = f;
  q.scale_kind = ScaleKind::fp32;
  q.block = block;
  q.rows = rows;
  q.cols = cols;
  q.codes.resize(size_t(rows * cols));
  for (auto& c : q.codes) c = uint8_t(g() & 15);
  const int64_t kb = cols / block;
  q.scales.resize(size_t(rows * kb));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < kb; ++k) {
      const int lo = r % 3 == 0 ? -149 : r % 3 == 1 ? 100 : -8, hi = r % 3 == 0 ? -120 : r % 3 == 1 ? 127 : 8;
      float s = std::ldexp(1.0f + float(g() % 1024) / 1024.0f, lo + int(g() % uint32_t(hi - lo + 1)));
      if (g() % 7 == 0) s = 0.0f;
      q.scales[r * kb + k] = g() % 4 == 0 ? -s : s;
    }
  q.global_dec = (g() % 2) ? 1.0f : 0.3f;
  return q;
}

struct Case {
  GemmPath path;
  ElemFormat fa, fb;
  ScaleKind scale;
  int block;
};

std::string case_name(const Case& c) {
  return safe(std::string(detail::gemm_path_name(c.path)) + "_" + c.fa.name + "x" + c.fb.name + "_b" +
              std::to_string(c.block) + "_" + scale_name(c.scale) + "scale");
}

void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }

std::vector<Case> all_cases() {
  std::vector<Case> v;
  for (GemmPath p : {GemmPath::scalar, GemmPath::avx2, GemmPath::avx512_vnni}) {
    if (!detail::gemm_path_compiled(p)) continue;
    for (const ElemFormat& fa : kAllFormats)
      for (const ElemFormat& fb : kAllFormats)
        for (ScaleKind s : {ScaleKind::fp32, ScaleKind::ue4m3, ScaleKind::ue8m0, ScaleKind::ue8m0_ceil})
          for (int block : {16, 32}) {
            if (s == ScaleKind::ue4m3 && block != 16) continue;  // NVFP4 is block 16 only
            v.push_back({p, fa, fb, s, block});
          }
  }
  return v;
}

class GemmFast : public ::testing::TestWithParam<Case> {};

// {M, N, K blocks}: M and N off every tile size, K down to a single block.
constexpr int64_t kShapes[][3] = {{1, 1, 1}, {1, 17, 1}, {7, 5, 2}, {6, 32, 3}, {13, 33, 1},
                                  {12, 16, 4}, {31, 47, 5}, {5, 65, 3}, {19, 40, 2}};

TEST_P(GemmFast, BitExactVsReferenceContract) {
  const Case& c = GetParam();
  int64_t checked = 0;
  uint32_t seed = 7;
  for (const auto& s : kShapes) {
    const int64_t M = s[0], N = s[1], K = s[2] * c.block;
    const QTensor a = make_operand(M, K, c.fa, c.scale, c.block, seed++);
    const QTensor b = make_operand(N, K, c.fb, c.scale, c.block, seed++);
    const std::string what = case_name(c) + " M=" + std::to_string(M) + " N=" + std::to_string(N) +
                             " K=" + std::to_string(K);
    checked += expect_bit_equal(reference::gemm_contract(a, b), detail::gemm_on(c.path, a, b), N, what);
  }
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(AllPaths, GemmFast, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return case_name(i.param); });

// Raw codes and extreme scales: every compiled path, both blocks, a few format pairs.
TEST(GemmFastExtremes, RawCodesAndExtremeScalesMatchReferenceBits) {
  int64_t checked = 0, nonfinite = 0, subnormal = 0;
  uint32_t seed = 100;
  for (int block : {16, 32})
    for (const auto& [fa, fb] : {std::pair{kE2M1, kE2M1}, std::pair{kE1M2, kE2M1Max2}, std::pair{kInt4, kE1M2}}) {
      const QTensor a = make_raw_operand(23, 3 * block, fa, block, seed++);
      const QTensor b = make_raw_operand(37, 3 * block, fb, block, seed++);
      const auto ref = reference::gemm_contract(a, b);
      for (float x : ref) {
        nonfinite += !std::isfinite(x);
        subnormal += std::fpclassify(x) == FP_SUBNORMAL;
      }
      for (GemmPath p : {GemmPath::scalar, GemmPath::avx2, GemmPath::avx512_vnni})
        if (detail::gemm_path_compiled(p))
          checked += expect_bit_equal(ref, detail::gemm_on(p, a, b), b.rows,
                                      std::string(detail::gemm_path_name(p)) + " b" + std::to_string(block) + " " +
                                          fa.name + "x" + fb.name);
    }
  EXPECT_GT(checked, 0);
  // The inputs must actually reach the extremes they are meant to test.
  EXPECT_GT(nonfinite, 0);
  EXPECT_GT(subnormal, 0);
}

// A custom grid wider than the byte packing allows (E3M0: integer views up to 64) must still be exact:
// the SIMD paths hand it to the scalar one.
TEST(GemmFastExtremes, WideCustomGridStaysExact) {
  constexpr ElemFormat kE3M0{"e3m0", 3, 0, 1, 7};
  ASSERT_GT(kE3M0.int_max(), 12);
  const QTensor a = make_raw_operand(9, 64, kE3M0, 16, 1), b = make_raw_operand(21, 64, kE2M1, 16, 2);
  const auto ref = reference::gemm_contract(a, b);
  int64_t checked = 0;
  for (GemmPath p : {GemmPath::scalar, GemmPath::avx2, GemmPath::avx512_vnni})
    if (detail::gemm_path_compiled(p))
      checked += expect_bit_equal(ref, detail::gemm_on(p, a, b), b.rows, detail::gemm_path_name(p));
  EXPECT_GT(checked, 0);
}

// Big enough for several threads, panel groups and full tiles; through the public entry point.
TEST(GemmFastPublic, MultiThreadedShapeMatchesReferenceBits) {
  for (int block : {16, 32}) {
    const QTensor a = make_operand(97, 16 * block, kE2M1, ScaleKind::fp32, block, 1);
    const QTensor b = make_operand(203, 16 * block, kE1M2, ScaleKind::fp32, block, 2);
    EXPECT_GT(expect_bit_equal(reference::gemm_contract(a, b), gemm(a, b), b.rows, "gemm b" + std::to_string(block)),
              0);
  }
}

// Operands packed a chunk of about 4 MB at a time: a long A (rows in chunks, the last one partial) and a long B
// (vector panels in chunks, the last one partial, N not a multiple of the lanes), on every compiled path.
TEST(GemmFastPublic, ChunkedPackingMatchesReferenceBits) {
  const int64_t K = 4096;  // chunks of 1020 rows of A (AVX-512: 6-row tiles), of 42 vector panels of B
  const QTensor long_a = make_operand(1100, K, kE2M1, ScaleKind::fp32, 16, 6);
  const QTensor short_b = make_operand(21, K, kE1M2, ScaleKind::fp32, 16, 7);
  const QTensor short_a = make_operand(7, K, kE2M1, ScaleKind::ue8m0, 16, 8);
  const QTensor long_b = make_operand(700, K, kE2M1, ScaleKind::ue8m0, 16, 9);
  int64_t checked = 0;
  for (GemmPath p : {GemmPath::avx2, GemmPath::avx512_vnni}) {
    if (!detail::gemm_path_compiled(p)) continue;
    checked += expect_bit_equal(reference::gemm_contract(long_a, short_b), detail::gemm_on(p, long_a, short_b),
                                short_b.rows, std::string("long A ") + detail::gemm_path_name(p));
    checked += expect_bit_equal(reference::gemm_contract(short_a, long_b), detail::gemm_on(p, short_a, long_b),
                                long_b.rows, std::string("long B ") + detail::gemm_path_name(p));
  }
  EXPECT_GT(checked, 0);
}

// gemm_into must write every element of the caller's buffer (pre-filled with a NaN sentinel here).
TEST(GemmFastPublic, IntoBufferWritesEveryOutput) {
  const QTensor a = make_operand(25, 96, kE2M1, ScaleKind::ue8m0, 32, 4);
  const QTensor b = make_operand(41, 96, kInt4, ScaleKind::ue8m0, 32, 5);
  const auto ref = reference::gemm_contract(a, b);
  int64_t checked = 0;
  for (GemmPath p : {GemmPath::scalar, GemmPath::avx2, GemmPath::avx512_vnni}) {
    if (!detail::gemm_path_compiled(p)) continue;
    std::vector<float> c(ref.size(), f32_from_bits(0x7FC0'0123u));
    detail::gemm_into(p, a, b, c.data());
    checked += expect_bit_equal(ref, c, b.rows, std::string("gemm_into ") + detail::gemm_path_name(p));
  }
  EXPECT_GT(checked, 0);
}

TEST(GemmFastPublic, RejectsMismatchedOperands) {
  const QTensor a = make_operand(4, 32, kE2M1, ScaleKind::fp32, 16, 1);
  const QTensor b = make_operand(4, 64, kE2M1, ScaleKind::fp32, 16, 2);
  const QTensor c = make_operand(4, 32, kE2M1, ScaleKind::fp32, 32, 3);
  EXPECT_THROW(gemm(a, b), std::invalid_argument);
  EXPECT_THROW(gemm(a, c), std::invalid_argument);
}

TEST(GemmFastPublic, BestPathIsCompiled) {
  EXPECT_TRUE(detail::gemm_path_compiled(detail::gemm_best_path()));
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  EXPECT_EQ(detail::gemm_best_path(), GemmPath::avx512_vnni);
#elif defined(__AVX2__)
  EXPECT_EQ(detail::gemm_best_path(), GemmPath::avx2);
#endif
}

}  // namespace
}  // namespace fp4lab
