#include "fp4lab/gemm.hpp"

#include "gemm_kernels.hpp"

// GCC 12 warns inside its own AVX-512 intrinsics as Eigen inlines them (PR 105593, the
// _mm512_undefined_* passthroughs); the pragma covers the intrinsic headers Eigen pulls in first.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wunused-variable"
#include <Eigen/Dense>
#pragma GCC diagnostic pop
#include <cmath>
#include <stdexcept>
#include <string>

namespace fp4lab {

std::vector<float> gemm(const QTensor& a, const QTensor& b) {
  check_gemm_operands(a, b);
  // The fastest SIMD path this build compiled in (AVX-512 VNNI, AVX2 or scalar); see gemm_kernels.cpp.
  std::vector<float> c = detail::gemm_on(detail::gemm_best_path(), a, b);
  // Finite operands can still accumulate past FLT_MAX; an Inf (or the NaN of Inf - Inf) is no result, so
  // the product is refused here, where every layer (CLI, analyze, sim --check) gets it from.
  const int64_t N = b.rows;
  for (size_t i = 0; i < c.size(); ++i)
    if (!std::isfinite(c[i]))
      throw std::invalid_argument("GEMM output overflows FP32 at C[" + std::to_string(int64_t(i) / N) + ", " +
                                  std::to_string(int64_t(i) % N) + "]");
  return c;
}

std::vector<double> gemm_f64(const float* a, const float* b, int64_t M, int64_t N, int64_t K) {
  using RowMatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using RowMatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Eigen::Map<const RowMatF> A(a, M, K), Bm(b, N, K);
  // Widen once up front: a cast inside the product expression is re-evaluated in every packing pass.
  const RowMatD Ad = A.cast<double>(), Bd = Bm.cast<double>();
  std::vector<double> c(size_t(M * N));
  Eigen::Map<RowMatD> C(c.data(), M, N);
  C.noalias() = Ad * Bd.transpose();
  return c;
}

}  // namespace fp4lab
