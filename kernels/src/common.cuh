// Internal helpers shared by the .cu files of fp4lab_cuda.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "fp4lab/cuda/kernels.hpp"
#include "fp4lab/format.hpp"

namespace fp4lab::cuda::detail {

// Index of f in fp4lab::kAllFormats: kernels are instantiated per format so the rounding loops unroll
// against compile-time levels. Throws for a format the kernels were not built for.
inline int format_index(const ElemFormat& f) {
  const int i = fp4lab::format_index(f);
  if (i < 0) throw std::invalid_argument(std::string("the CUDA kernels are not built for element format '") + f.name + "'");
  return i;
}

inline unsigned blocks_for(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

// E2M3 (sign bit 5, exponent bits 4-3 with bias 1, mantissa bits 2-0) of an integer |v| <= 7: exact.
FP4LAB_HD constexpr uint8_t e2m3_int(int v) {
  const int a = v < 0 ? -v : v;
  int e = 0, m = a;                        // subnormal: value = m / 8 * 2^0 ... only 0 here
  if (a == 0) {
    m = 0;
  } else {
    int p = 0;                             // a = 2^p * (1 + f), p = floor(log2 a)
    while ((a >> (p + 1)) != 0) ++p;
    e = p + 1;                             // biased exponent
    m = (a - (1 << p)) << (3 - p);         // mantissa bits: exact since a < 2^(p+1) and p <= 2
  }
  return uint8_t((v < 0 ? 0x20 : 0) | (e << 3) | m);
}

}  // namespace fp4lab::cuda::detail
