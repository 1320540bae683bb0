// Slow, obviously correct scalar form of the datapath contract: what tests compare every fast path to.
// One output at a time, one block at a time, written straight from docs/datapath.md.
#pragma once

#include <vector>

#include "fp4lab/gemm.hpp"

namespace fp4lab::reference {

inline std::vector<float> gemm_contract(const QTensor& a, const QTensor& b) {
  check_gemm_operands(a, b);
  const int64_t M = a.rows, N = b.rows, K = a.cols, B = a.block, KB = K / B;
  const float ga = tensor_factor(a.format, a.global_dec), gb = tensor_factor(b.format, b.global_dec);
  std::vector<float> c(size_t(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t k = 0; k < KB; ++k) {
        int32_t p = 0;  // step 1: exact integer block dot product
        for (int64_t j = k * B; j < (k + 1) * B; ++j)
          p += decode_int(a.format, a.codes[m * K + j]) * decode_int(b.format, b.codes[n * K + j]);
        acc = contract_step(acc, p, a.scales[m * KB + k], b.scales[n * KB + k]);  // steps 2-5
      }
      c[m * N + n] = contract_finish(acc, ga, gb);  // step 6
    }
  return c;
}

}  // namespace fp4lab::reference
