// Random Hadamard transform (rht.hpp): the matrix it realises, orthonormality, inversion, sign vectors.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4lab/gemm.hpp"
#include "fp4lab/quantize.hpp"
#include "fp4lab/rht.hpp"
#include "test_util.hpp"

namespace fp4lab::test {
namespace {

// Column j of the transform = rht_block applied to the unit vector e_j. On unit vectors every
// butterfly add is exact (values 0, +-1), so the columns are exactly s_j * H[:, j] * FP32(1/sqrt d).
std::vector<std::vector<double>> matrix_of(int d, const std::vector<float>& signs) {
  std::vector<std::vector<double>> m(d, std::vector<double>(d));
  for (int j = 0; j < d; ++j) {
    std::vector<float> e(d, 0.0f);
    e[j] = 1.0f;
    rht_block(e.data(), d, signs.data());
    for (int i = 0; i < d; ++i) m[i][j] = e[i];
  }
  return m;
}

class RhtSize : public ::testing::TestWithParam<int> {};

// Sylvester's H_d[i][j] = (-1)^popcount(i & j), written independently of the butterfly.
TEST_P(RhtSize, RealisesSylvesterHadamardTimesSigns) {
  const int d = GetParam();
  const auto signs = rht_signs_from_seed(d, 77);
  const auto m = matrix_of(d, signs);
  const double r = double(rht_inv_sqrt(d));
  int checked = 0;
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) {
      const double h = (std::popcount(unsigned(i & j)) & 1) ? -1.0 : 1.0;
      ASSERT_EQ(m[i][j], h * signs[j] * r) << "d " << d << " (" << i << ", " << j << ")";
      ++checked;
    }
  EXPECT_EQ(checked, d * d);
  // 1/sqrt(d) is the FP32 rounding of the exact value (exactly 1/4 and 1/8 for d = 16, 64).
  EXPECT_EQ(rht_inv_sqrt(d), float(1.0 / std::sqrt(double(d))));
  if (d == 16) {
    EXPECT_EQ(rht_inv_sqrt(d), 0.25f);
  }
  if (d == 64) {
    EXPECT_EQ(rht_inv_sqrt(d), 0.125f);
  }
}

// M M^T = I. Entries are +-r with r = FP32(1/sqrt d) = (1 + e)/sqrt(d), |e| <= 2^-24. In double the
// off-diagonal sums have d/2 terms +r^2 and d/2 terms -r^2, so they are exactly 0; the diagonal is
// d r^2 = (1 + e)^2, within 2^-23 + 2^-48 of 1 (exactly 1 for d = 16 and 64).
TEST_P(RhtSize, Orthonormal) {
  const int d = GetParam();
  const auto m = matrix_of(d, rht_signs_from_seed(d, 78));
  for (int i = 0; i < d; ++i)
    for (int k = 0; k < d; ++k) {
      double s = 0;
      for (int j = 0; j < d; ++j) s += m[i][j] * m[k][j];
      if (i != k) {
        ASSERT_EQ(s, 0.0) << "d " << d << " (" << i << ", " << k << ")";
      } else if (d == 16 || d == 64) {
        ASSERT_EQ(s, 1.0) << "d " << d;
      } else {
        ASSERT_LE(std::fabs(s - 1.0), 0x1p-23 + 0x1p-48) << "d " << d;
      }
    }
}

// Inverse: RHT(x) = H S x / sqrt d and H H = d I, so x = S H y / sqrt d = S * RHT_{s=+1}(y).
// Bound: each butterfly output is a depth-log2(d) tree sum, error <= log2(d) u sum|inputs| (u = 2^-24),
// plus the 1/sqrt(d) multiply (u) and its representation error (u): per pass <= (log2 d + 2) u r ||.||_1.
// Forward error pushed through the second pass and the second pass's own rounding give
//   |x'_j - x_j| <= (2 log2 d + 4) u ||x||_1   (first order; asserted with a 1% margin on the constant).
// For d = 16 and 64 (exact 1/sqrt d) and small-integer inputs every step is exact, so x' == x bit for bit.
TEST_P(RhtSize, InverseRestoresTheInput) {
  const int d = GetParam();
  const auto signs = rht_signs_from_seed(d, 79);
  const std::vector<float> plus(d, 1.0f);
  Rng rng(d);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> x = rng.normals(size_t(d), trial % 2 ? 1000.0f : 0.01f), y = x;
    rht_block(y.data(), d, signs.data());
    rht_block(y.data(), d, plus.data());
    double l1 = 0;
    for (float v : x) l1 += std::fabs(v);
    const double bound = 1.01 * (2 * std::log2(d) + 4) * 0x1p-24 * l1;
    for (int j = 0; j < d; ++j) ASSERT_LE(std::fabs(double(y[j] * signs[j]) - double(x[j])), bound) << "d " << d << " j " << j;
  }
  if (d == 16 || d == 64) {
    std::vector<float> x(d);
    for (int j = 0; j < d; ++j) x[j] = float(int(rng.range(-8, 8)));
    std::vector<float> y = x;
    rht_block(y.data(), d, signs.data());
    rht_block(y.data(), d, plus.data());
    for (int j = 0; j < d; ++j) EXPECT_EQ(y[j] * signs[j], x[j]) << "d " << d << " j " << j;
  }
}

TEST_P(RhtSize, SeededSignsReproducibleAndMixed) {
  const int d = GetParam();
  const auto a = rht_signs_from_seed(d, 1234), b = rht_signs_from_seed(d, 1234), c = rht_signs_from_seed(d, 1235);
  ASSERT_EQ(a.size(), size_t(d));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  int neg = 0;
  for (int j = 0; j < d; ++j) {
    ASSERT_TRUE(a[j] == 1.0f || a[j] == -1.0f);
    neg += a[j] < 0;
    // The documented generator: s_j = -1 iff bit 0 of random_bits(seed, kRhtStream, j) is set.
    EXPECT_EQ(a[j] < 0, bool(random_bits(1234, kRhtStream, uint64_t(j)) & 1u));
  }
  EXPECT_GT(neg, 0);
  EXPECT_LT(neg, d);
}

INSTANTIATE_TEST_SUITE_P(Sizes, RhtSize, ::testing::Values(16, 32, 64, 128),
                         [](const ::testing::TestParamInfo<int>& i) { return "rht" + std::to_string(i.param); });

// docs/spec.md §3: Transformer Engine's vector, written here from the spec's text.
TEST(RhtSigns, TransformerEngineVectorMatchesSpec) {
  const std::string spec = "+++-+------+-+--";
  const auto s = rht_signs_te(16);
  ASSERT_EQ(s.size(), spec.size());
  for (size_t j = 0; j < spec.size(); ++j) EXPECT_EQ(s[j], spec[j] == '+' ? 1.0f : -1.0f) << "sign " << j;
}

TEST(RhtSigns, TransformerEngineVectorOnlyForSixteen) {
  for (int d : {2, 8, 32, 64, 128}) EXPECT_THROW(rht_signs_te(d), std::invalid_argument) << d;
  try {
    rht_signs_te(32);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("32"), std::string::npos) << e.what();
  }
}

// The rotation cancels in exact arithmetic: (R a) . (R b) = a . b for both operands rotated alike.
// Per d-block, with Ra = R a + da, |da_i| <= (log2 d + 1) u r ||a||_1 and |(R b)_i| <= r ||b||_1:
// |<da, Rb>| <= d (log2 d + 1) u r^2 ||a||_1 ||b||_1 = (log2 d + 1) u ||a||_1 ||b||_1, likewise for b, and
// R^T R = (1 + e)^2 I adds 2u |<a, b>|. So |<Ra,Rb> - <a,b>| <= 2 (log2 d + 2) u ||a||_1 ||b||_1 per block,
// summed over blocks (first order; asserted with a 1% margin; the float64 sums add ~K 2^-53, negligible).
TEST(RhtRotate, RotationCancelsInTheProduct) {
  Rng rng(21);
  const int64_t M = 8, N = 6, K = 128;
  const auto a = rng.normals(size_t(M * K)), b = rng.normals(size_t(N * K));
  for (int d : {16, 32, 64, 128}) {
    QuantConfig cfg;
    cfg.rht = d;
    cfg.rht_signs = rht_signs_from_seed(d, 5);
    const auto ra = rotate(a.data(), M, K, cfg), rb = rotate(b.data(), N, K, cfg);
    const auto c = gemm_f64(a.data(), b.data(), M, N, K), rc = gemm_f64(ra.data(), rb.data(), M, N, K);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double bound = 0;
        for (int64_t k0 = 0; k0 < K; k0 += d) {
          double la = 0, lb = 0;
          for (int j = 0; j < d; ++j) {
            la += std::fabs(a[m * K + k0 + j]);
            lb += std::fabs(b[n * K + k0 + j]);
          }
          bound += 1.01 * 2 * (std::log2(d) + 2) * 0x1p-24 * la * lb;
        }
        EXPECT_LE(std::fabs(rc[m * N + n] - c[m * N + n]), bound) << "d " << d << " (" << m << ", " << n << ")";
      }
  }
}

// rotate() applies the blocks along each row, independently per d consecutive elements.
TEST(RhtRotate, BlocksAlongRows) {
  Rng rng(22);
  const int64_t rows = 3, cols = 64;
  const auto x = rng.normals(size_t(rows * cols));
  QuantConfig cfg;
  cfg.rht = 16;
  cfg.rht_signs = rht_signs_te(16);
  const auto y = rotate(x.data(), rows, cols, cfg);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
      std::vector<float> blk(x.begin() + r * cols + c0, x.begin() + r * cols + c0 + 16);
      rht_block(blk.data(), 16, cfg.rht_signs.data());
      for (int j = 0; j < 16; ++j) EXPECT_EQ(f32_bits(y[r * cols + c0 + j]), f32_bits(blk[j]));
    }
}

// With rht_bf16 (the nvfp4 preset) the rotated values are BF16 (low 16 bits zero), equal to the RTNE
// rounding of the FP32 rotation, and the quantiser's scales are taken from those rounded values:
// quantising the pre-rotated, pre-rounded tensor without RHT gives the same codes and scales.
TEST(RhtRotate, Bf16RoundingBeforeAmax) {
  Rng rng(23);
  const int64_t rows = 32, cols = 64;
  auto x = rng.normals(size_t(rows * cols), 3.0f);
  QuantConfig cfg;
  cfg.format = kE2M1;
  cfg.scale = ScaleKind::ue4m3;
  cfg.rht = 16;
  cfg.rht_signs = rht_signs_te(16);
  QuantConfig plain = cfg;
  plain.rht_bf16 = false;
  cfg.rht_bf16 = true;
  const auto y32 = rotate(x.data(), rows, cols, plain), y16 = rotate(x.data(), rows, cols, cfg);
  for (size_t i = 0; i < y16.size(); ++i) {
    EXPECT_EQ(f32_bits(y16[i]) & 0xFFFFu, 0u) << i;
    EXPECT_EQ(f32_bits(y16[i]), f32_bits(round_to_bf16(y32[i]))) << i;
  }
  QuantConfig norot = cfg;
  norot.rht = 0;
  norot.rht_signs.clear();
  norot.rht_bf16 = false;
  const QTensor a = quantize(x.data(), rows, cols, cfg), b = quantize(y16.data(), rows, cols, norot);
  EXPECT_EQ(a.codes, b.codes);
  EXPECT_EQ(a.scales, b.scales);
  EXPECT_EQ(a.scale_codes, b.scale_codes);
  EXPECT_EQ(f32_bits(a.global_dec), f32_bits(b.global_dec));
}

TEST(RhtValidate, BadSizesAndSignsThrow) {
  std::vector<float> x(64, 1.0f);
  auto cfg_with = [](int d, std::vector<float> s) {
    QuantConfig c;
    c.rht = d;
    c.rht_signs = std::move(s);
    return c;
  };
  EXPECT_THROW(quantize(x.data(), 1, 64, cfg_with(8, std::vector<float>(8, 1.0f))), std::invalid_argument);
  EXPECT_THROW(quantize(x.data(), 1, 64, cfg_with(12, std::vector<float>(12, 1.0f))), std::invalid_argument);
  EXPECT_THROW(quantize(x.data(), 1, 64, cfg_with(256, std::vector<float>(256, 1.0f))), std::invalid_argument);
  EXPECT_THROW(quantize(x.data(), 1, 64, cfg_with(16, std::vector<float>(15, 1.0f))), std::invalid_argument);
  EXPECT_THROW(quantize(x.data(), 1, 64, cfg_with(16, std::vector<float>(16, 0.5f))), std::invalid_argument);
  EXPECT_THROW(quantize(x.data(), 1, 48, cfg_with(32, std::vector<float>(32, 1.0f))), std::invalid_argument);  // 48 % 32
  EXPECT_NO_THROW(quantize(x.data(), 1, 64, cfg_with(64, std::vector<float>(64, -1.0f))));
}

// The quantiser's Hadamard sizes, and its message for any other (the CLI and Python show the same text).
TEST(RhtSize, PowersOfTwoFrom16To128) {
  for (int d = -1; d <= 300; ++d) EXPECT_EQ(rht_size_ok(d), d == 16 || d == 32 || d == 64 || d == 128) << d;
  QuantConfig c;
  c.rht = 8;
  c.rht_signs.assign(8, 1.0f);
  try {
    validate(c, 1, 64);
    ADD_FAILURE() << "RHT-8 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "RHT size must be a power of two from 16 to 128, not 8");
  }
}

}  // namespace
}  // namespace fp4lab::test
