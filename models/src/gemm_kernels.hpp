// CPU kernels behind fp4lab::gemm (internal to the golden model; tests include it to run every path).
//
// All paths compute the datapath contract of docs/datapath.md bit for bit: the int32 block dot product
// may be summed in any order (integer adds are exact), while every FP32 step is the scalar
// contract_step / contract_finish sequence, done per output in its own SIMD lane, blocks in ascending k.
// Which SIMD paths exist is fixed at compile time by the target macros (__AVX512VNNI__, __AVX2__).
#pragma once

#include <vector>

#include "fp4lab/quantize.hpp"

namespace fp4lab::detail {

enum class GemmPath { scalar, avx2, avx512_vnni };

const char* gemm_path_name(GemmPath p);
// Whether this build compiled the path in (the scalar path always is).
bool gemm_path_compiled(GemmPath p);
// The fastest path compiled in; fp4lab::gemm uses it.
GemmPath gemm_best_path();
// C[M,N] = A . B^T on the given path; operands must already have passed check_gemm_operands.
// Throws std::invalid_argument if the path is not compiled in.
std::vector<float> gemm_on(GemmPath p, const QTensor& a, const QTensor& b);
// The same into a caller's buffer of a.rows * b.rows floats (every element is written). Allocating and
// zero-filling a fresh result costs as much as the product itself for small K on a VM (page faults),
// so repeated products of one shape can reuse a buffer this way.
void gemm_into(GemmPath p, const QTensor& a, const QTensor& b, float* c);

}  // namespace fp4lab::detail
