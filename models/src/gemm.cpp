#include "fp4lab/gemm.hpp"

#include "gemm_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>

namespace fp4lab {

namespace {
// Finite operands can still accumulate past FLT_MAX; an Inf (or the NaN of Inf - Inf) is no result, so
// the product is refused here, where every layer (CLI, analyze, sim --check) gets it from.
template <class Vec>
void check_finite_output(const Vec& c, int64_t N, int64_t row0) {
  // A branch-free scan of the exponent bits first (it vectorises); the element is located only on a fault.
  uint32_t all_ones = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &c[i], 4);
    all_ones |= uint32_t((bits & 0x7F800000u) == 0x7F800000u);
  }
  if (!all_ones) return;
  for (size_t i = 0; i < c.size(); ++i)
    if (!std::isfinite(c[i]))
      throw std::invalid_argument("GEMM output overflows FP32 at C[" + std::to_string(row0 + int64_t(i) / N) + ", " +
                                  std::to_string(int64_t(i) % N) + "]");
}
}  // namespace

std::vector<float> gemm(const QTensor& a, const QTensor& b) {
  check_gemm_operands(a, b);
  // The fastest SIMD path this build compiled in (AVX-512 VNNI, AVX2 or scalar); see gemm_kernels.cpp.
  std::vector<float> c = detail::gemm_on(detail::gemm_best_path(), a, b);
  check_finite_output(c, b.rows, 0);
  return c;
}

void gemm(const QTensor& a, const QTensor& b, F32Buffer& c) {
  check_gemm_operands(a, b);
  c.resize(size_t(a.rows * b.rows));
  detail::gemm_into(detail::gemm_best_path(), a, b, c.data());
  check_finite_output(c, b.rows, 0);
}

void gemm_columns(const QTensor& a, const QTensor& b, float* c, int64_t n, int64_t col0) {
  check_gemm_operands(a, b);
  if (n == b.rows) {
    detail::gemm_into(detail::gemm_best_path(), a, b, c);
    return;
  }
  const std::vector<float> part = detail::gemm_on(detail::gemm_best_path(), a, b);
  for (int64_t m = 0; m < a.rows; ++m)
    std::copy(part.begin() + m * b.rows, part.begin() + (m + 1) * b.rows, c + m * n + col0);
}

void check_gemm_output(const float* c, int64_t M, int64_t N) {
  check_finite_output(std::span<const float>(c, size_t(M * N)), N, 0);
}

std::vector<float> gemm_rows(const QTensor& a, int64_t row0, int64_t rows, const QTensor& b) {
  check_gemm_operands(a, b);
  const QTensor p = a.rows_panel(row0, rows);
  std::vector<float> c = detail::gemm_on(detail::gemm_best_path(), p, b);
  check_finite_output(c, b.rows, row0);
  return c;
}

namespace {
// The float64 reference product is defined by its order (docs/spec.md §6). A product of two floats is exact in
// float64 (24 + 24 significant bits < 53; exponents stay far inside float64's range), so only the additions
// round: each output adds its K products in ascending k, starting from +0.0. Tiles, SIMD lanes and threads run
// across outputs only, never across k, so every build, CPU and thread count gives the same bits (a BLAS picks
// its K blocking from the CPU's cache sizes and vector width, and its last bits with it). For the same reason a
// fused multiply-add, where the compiler forms one, rounds exactly as the separate multiply and add.
constexpr int kLanes = 8;  // output columns per vector: one AVX-512 register, two AVX2 or four SSE2 ones
using Vec = double __attribute__((vector_size(kLanes * sizeof(double))));
#if defined(__AVX512F__)
constexpr int kRows = 8, kVecs = 2;  // 16 accumulator registers of 32
#else
constexpr int kRows = 4, kVecs = 1;  // AVX2: 8 of 16 ymm registers
#endif
constexpr int kPanel = kLanes * kVecs;  // B columns per packed panel

// C[m0.., n0..n0+kPanel) for `rows` rows of A against one packed panel of B (K x kPanel, zero past N).
template <int R>
void f64_tile(const double* a, int64_t K, const Vec* bp, double* c, int64_t N, int64_t n0) {
  Vec acc[R][kVecs];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kVecs; ++v) acc[r][v] = Vec{};  // +0.0
  for (int64_t k = 0; k < K; ++k) {
    Vec b[kVecs];
    for (int v = 0; v < kVecs; ++v) b[v] = bp[k * kVecs + v];
#if defined(__AVX512F__)
    // B's vectors stay in registers for every row (the compiler would otherwise fold a load of them into each
    // multiply, and the loads, not the multiplies, would set the pace).
    for (int v = 0; v < kVecs; ++v) __asm__("" : "+v"(b[v]));
#endif
    for (int r = 0; r < R; ++r) {
      const double x = a[r * K + k];
      for (int v = 0; v < kVecs; ++v) acc[r][v] += x * b[v];
    }
  }
  const int64_t cols = std::min<int64_t>(kPanel, N - n0);
  for (int r = 0; r < R; ++r)
    for (int64_t j = 0; j < cols; ++j) c[r * N + n0 + j] = acc[r][j / kLanes][j % kLanes];
}
}  // namespace

std::vector<double> gemm_f64(const float* a, const float* b, int64_t M, int64_t N, int64_t K) {
  return gemm_f64(a, K, 1, b, K, 1, M, N, K);
}

namespace {
// An element as a double: FP32 values, or BF16 bit patterns (the same values, exact in FP32).
inline double f64_of(float v) { return double(v); }
inline double f64_of(uint16_t b) { return double(bf16_to_f32(b)); }

// C (M x N), every element written.
template <class TA, class TB>
void f64_product(const TA* a, int64_t a_row, int64_t a_col, const TB* b, int64_t b_row, int64_t b_col,
                 int64_t M, int64_t N, int64_t K, double* c) {
  const int64_t panels = (N + kPanel - 1) / kPanel;
  // Rows [m, m + n) of A as doubles into dst (n x K), read along whichever of A's dimensions is contiguous.
  auto a_rows = [&](int64_t m, int64_t n, double* dst) {
    if (a_col == 1) {
      for (int64_t r = 0; r < n; ++r)
        for (int64_t k = 0; k < K; ++k) dst[r * K + k] = f64_of(a[(m + r) * a_row + k]);
    } else {
      for (int64_t k = 0; k < K; ++k)
        for (int64_t r = 0; r < n; ++r) dst[r * K + k] = f64_of(a[(m + r) * a_row + k * a_col]);
    }
  };
  // A as doubles (the same values), so that the tiles broadcast each one straight from memory instead of
  // converting and broadcasting it in registers beside the multiplies: made once up to 4 MB, else per tile.
  constexpr int64_t kWholeA = int64_t(1) << 19;  // elements
  std::vector<double> whole;
  if (M * K <= kWholeA) {
    whole.resize(size_t(M * K));
    a_rows(0, M, whole.data());
  }
  // One B panel (K x kPanel doubles, about 1 MB at K = 8192) is packed by the thread that uses it, then every
  // row of A streams past it.
#pragma omp parallel for schedule(dynamic, 1) if (double(M) * double(N) * double(K) > (1 << 21))
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t n0 = p * kPanel;
    std::vector<Vec> bp(size_t(K * kVecs));
    if (b_col == 1) {
      for (int64_t k = 0; k < K; ++k)
        for (int j = 0; j < kPanel; ++j)
          bp[k * kVecs + j / kLanes][j % kLanes] = n0 + j < N ? f64_of(b[(n0 + j) * b_row + k]) : 0.0;
    } else {
      for (int64_t k = 0; k < K; ++k)
        for (int j = 0; j < kPanel; ++j)
          bp[k * kVecs + j / kLanes][j % kLanes] = n0 + j < N ? f64_of(b[(n0 + j) * b_row + k * b_col]) : 0.0;
    }
    std::vector<double> rows(whole.empty() ? size_t(kRows * K) : 0);
    auto rows_of = [&](int64_t m, int64_t n) -> const double* {
      if (!whole.empty()) return whole.data() + m * K;
      a_rows(m, n, rows.data());
      return rows.data();
    };
    int64_t m = 0;
    for (; m + kRows <= M; m += kRows) f64_tile<kRows>(rows_of(m, kRows), K, bp.data(), c + m * N, N, n0);
    for (; m < M; ++m) f64_tile<1>(rows_of(m, 1), K, bp.data(), c + m * N, N, n0);
  }
}
}  // namespace

std::vector<double> gemm_f64(const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t b_row,
                             int64_t b_col, int64_t M, int64_t N, int64_t K) {
  std::vector<double> c(size_t(M * N));
  f64_product(a, a_row, a_col, b, b_row, b_col, M, N, K, c.data());
  return c;
}

void gemm_f64(const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t b_row, int64_t b_col, int64_t M,
              int64_t N, int64_t K, F64Buffer& c) {
  c.resize(size_t(M * N));
  f64_product(a, a_row, a_col, b, b_row, b_col, M, N, K, c.data());
}

void gemm_f64(const F64Operand& a, const F64Operand& b, int64_t M, int64_t N, int64_t K, F64Buffer& c) {
  c.resize(size_t(M * N));
  auto with_b = [&](const auto* pa) {
    if (b.bf16) f64_product(pa, a.row, a.col, b.bf16, b.row, b.col, M, N, K, c.data());
    else f64_product(pa, a.row, a.col, b.f32, b.row, b.col, M, N, K, c.data());
  };
  if (a.bf16) with_b(a.bf16);
  else with_b(a.f32);
}

}  // namespace fp4lab
