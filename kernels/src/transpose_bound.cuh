// The transposed copy of fake_quantize_both's mirrored pairs (quantize_both.cu), declared apart from
// quantize_kernels.cuh so that quantize.cu alone calls it.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace fp4lab::cuda::detail {
// d_yt [cols, rows] = d_y [rows, cols]^T (BF16 bits), and, where d_bound and d_bound_t are given
// (fake_quantize_both_bound_words(rows, cols) words each), the largest |value| of each 64 x 128 tile of d_y into the
// tile's word of both (NaN where the tile holds one): the values themselves, so a bound with no rounding to allow for.
void launch_transpose_bound(const uint16_t* d_y, int64_t rows, int64_t cols, uint16_t* d_yt, float* d_bound,
                            float* d_bound_t, cudaStream_t s);
}  // namespace fp4lab::cuda::detail
