#include "fp4lab/gemm.hpp"

#include <Eigen/Dense>
#include <stdexcept>
#include <string>

namespace fp4lab {

void check_gemm_operands(const QTensor& a, const QTensor& b) {
  if (a.cols != b.cols)
    throw std::invalid_argument("GEMM operands disagree on K: A has " + std::to_string(a.cols) + ", B has " +
                                std::to_string(b.cols));
  if (a.block != b.block)
    throw std::invalid_argument("GEMM operands disagree on block size: " + std::to_string(a.block) + " vs " +
                                std::to_string(b.block));
}

namespace {
// Signed integer views of every code, so the hot loop is a plain int8 dot product.
std::vector<int8_t> int_view(const QTensor& q) {
  int8_t lut[16];
  for (int c = 0; c < 16; ++c) lut[c] = int8_t(code_valid(q.format, uint8_t(c)) ? decode_int(q.format, uint8_t(c)) : 0);
  std::vector<int8_t> v(q.codes.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = lut[q.codes[i] & 15];
  return v;
}

template <int B>
void gemm_rows(const int8_t* ia, const int8_t* ib, const float* sa, const float* sb, int64_t M, int64_t N,
               int64_t K, float ga, float gb, float* c) {
  const int64_t KB = K / B;
#pragma omp parallel for schedule(dynamic, 4)
  for (int64_t m = 0; m < M; ++m) {
    const int8_t* arow = ia + m * K;
    for (int64_t n = 0; n < N; ++n) {
      const int8_t* brow = ib + n * K;
      float acc = 0.0f;
      for (int64_t k = 0; k < KB; ++k) {
        int32_t p = 0;
        for (int j = 0; j < B; ++j) p += int32_t(arow[k * B + j]) * int32_t(brow[k * B + j]);
        acc = contract_step(acc, p, sa[m * KB + k], sb[n * KB + k]);
      }
      c[m * N + n] = contract_finish(acc, ga, gb);
    }
  }
}
}  // namespace

std::vector<float> gemm(const QTensor& a, const QTensor& b) {
  check_gemm_operands(a, b);
  const auto ia = int_view(a), ib = int_view(b);
  std::vector<float> c(size_t(a.rows * b.rows));
  const float ga = tensor_factor(a.format, a.global_dec), gb = tensor_factor(b.format, b.global_dec);
  if (a.block == 16)
    gemm_rows<16>(ia.data(), ib.data(), a.scales.data(), b.scales.data(), a.rows, b.rows, a.cols, ga, gb, c.data());
  else
    gemm_rows<32>(ia.data(), ib.data(), a.scales.data(), b.scales.data(), a.rows, b.rows, a.cols, ga, gb, c.data());
  return c;
}

std::vector<double> gemm_f64(const float* a, const float* b, int64_t M, int64_t N, int64_t K) {
  using RowMatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using RowMatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Eigen::Map<const RowMatF> A(a, M, K), Bm(b, N, K);
  RowMatD C = A.cast<double>() * Bm.cast<double>().transpose();
  return std::vector<double>(C.data(), C.data() + M * N);
}

}  // namespace fp4lab
