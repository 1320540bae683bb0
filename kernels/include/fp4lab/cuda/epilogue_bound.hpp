// The block-scaled GEMM's epilogue bound (kernels/README.md, "Block-scaled GEMM"): the rate the contract's FP32
// work per output and block allows on the CUDA cores. `fp4lab cuda bench` and the training-step benchmark
// (fp4lab._core.cuda_gemm_epilogue_bound) both report against it. Host C++; no CUDA needed.
#pragma once

namespace fp4lab::cuda {

// FP32 instructions per output per block in the fast kernel's epilogue: 4 (exact int->float subtraction, two
// multiplies, one add: contract_scale_add after the int32 dot product), or 2 fmas where every scale of both
// operands passes fma_exact_scale (contract_scale_add_magic; its one multiply per row scale is not counted).
constexpr int epilogue_fp32_instructions(bool fused) { return fused ? 2 : 4; }

// Operations per second at that bound (a multiply and an add per product: 2 * block per output and block), on `sms`
// SMs of 128 FP32 lanes at `clock_khz`.
constexpr double epilogue_bound_ops_per_s(int sms, double clock_khz, int block, bool fused) {
  return 128.0 * sms * clock_khz * 1e3 / epilogue_fp32_instructions(fused) * 2.0 * block;
}

}  // namespace fp4lab::cuda
