// The block-scaled GEMM's epilogue bound (kernels/README.md, "Block-scaled GEMM"): the rate the contract's FP32
// work per output and block allows on the CUDA cores. `fp4lab cuda bench` and the training-step benchmark
// (fp4lab._core.cuda_gemm_epilogue_bound) both report against it. Host C++; no CUDA needed.
#pragma once

#include "fp4lab/gemm.hpp"

namespace fp4lab::cuda {

// FP32 instructions per output per block in the fast kernel's epilogue: 4 (exact int->float subtraction, two
// multiplies, one add: contract_scale_add after the int32 dot product), or 2 fmas where every scale of both
// operands passes fma_exact_scale (contract_scale_add_magic; its one multiply per row scale is not counted).
constexpr int epilogue_fp32_instructions(bool fused) { return fused ? 2 : 4; }

// Block products (a multiply and an add each, 2 * block operations per output and block) per second at that bound,
// on `sms` SMs of 128 FP32 lanes at `clock_khz`.
constexpr double epilogue_bound_ops_per_s(int sms, double clock_khz, int block, bool fused) {
  return 128.0 * sms * clock_khz * 1e3 / epilogue_fp32_instructions(fused) * 2.0 * block;
}

// The bound of a GEMM whose operands take configs a and b: the fused form where their scale kinds allow it
// (fused_form_kinds; the kernel still checks every scale, so this is the bound's best case).
inline double epilogue_bound_ops_per_s(int sms, double clock_khz, const QuantConfig& a, const QuantConfig& b) {
  return epilogue_bound_ops_per_s(sms, clock_khz, a.block, fused_form_kinds(a.scale, b.scale));
}

}  // namespace fp4lab::cuda
