// Block-scaled GEMM under the fp4lab datapath contract (docs/datapath.md), C[M,N] = A[M,K] . B[N,K]^T.
// Both operands are quantised along K (their rows), so A is "K-major" and so is B.
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4lab/buffer.hpp"
#include "fp4lab/format.hpp"
#include "fp4lab/quantize.hpp"
#include "fp4lab/rht.hpp"
#include "fp4lab/scale.hpp"

namespace fp4lab {

// Elements one block dot-product unit multiplies per beat (the MAC width): the smaller block size, so a
// 32-element block is two beats joined before its scale step. The RTL units' N parameter, the simulator's
// MAC array and its peak rate restate it; tests/rtl (Dot.WidthIsTheMacWidth) and tests/sim
// (Timing.ComputeCyclesAreBlockBeatsOverUnits) hold them to it.
inline constexpr int kMacWidth = 16;

// ---- the contract, one block step at a time (shared by every layer) -------------------------------
// Step 1 (integer block dot product, exact int32) is the caller's; then, for block k in ascending order:
//   2. x  = FP32(p)            exact: |p| <= 32 * 144 < 2^24
//   3. s  = sa * sb            FP32 multiply, round to nearest even
//   4. x  = x * s              FP32 multiply, RNE
//   5. acc = acc + x           FP32 add, RNE (separate multiply and add: an FMA would skip step 4's rounding;
//                              contract_scale_add_fma below fuses them only where that rounding is exact)
// and after the last block:
//   6. out = acc * (ga * gb)   ga = global_dec * 2^-int_shift of A's grid (exact power of two for fp32 and
//                              ue8m0 scales), likewise gb; ga * gb rounded once, then one RNE multiply.
#if defined(__CUDA_ARCH__)
#define FP4LAB_FMUL(a, b) __fmul_rn((a), (b))
#define FP4LAB_FADD(a, b) __fadd_rn((a), (b))
#define FP4LAB_FFMA(a, b, c) __fmaf_rn((a), (b), (c))
#else
#define FP4LAB_FMUL(a, b) ((a) * (b))  // the build sets -ffp-contract=off so nothing fuses
#define FP4LAB_FADD(a, b) ((a) + (b))
#define FP4LAB_FFMA(a, b, c) std::fma((a), (b), (c))  // correctly rounded, one rounding
#endif

// Steps 3-5 for a caller that has done step 2 itself (x = FP32(p), exact). The GPU's fast path gets x
// without an int-to-float conversion instruction (1/8 of the FP32 rate on SM90); the arithmetic is this one.
FP4LAB_HD inline float contract_scale_add(float acc, float x, float sa, float sb) {
  const float s = FP4LAB_FMUL(sa, sb);
  return FP4LAB_FADD(acc, FP4LAB_FMUL(x, s));
}
FP4LAB_HD inline float contract_step(float acc, int32_t p, float sa, float sb) {
  return contract_scale_add(acc, float(p), sa, sb);
}

// Steps 3-5 as one fused multiply-add, fma(x, sa * sb, acc), where that gives the contract's bits: whenever
// both block scales pass fma_exact_scale and |x| < 2^16. Proof: a passing scale is 0 or a normal float with at
// most 4 significant bits and exponent in [-50, 50], so s = sa * sb is exact (<= 8 bits, in [2^-100, 2^102)) and
// so is x * s (<= 16 + 8 bits, in [2^-100, 2^118): no rounding, no underflow, no overflow). Step 4 then rounds
// nothing, and the fma's one rounding is step 5's. Zeros, signed zeros and a non-finite acc agree as well
// (x * s is then exactly 0 or -0, and acc + (+-0) is the same add in both forms). Every E4M3 value passes
// (UE4M3 scales, NVFP4), and every E8M0 power of two within 2^+-50 (UE8M0, MXFP4); FP32 scales mostly do not.
// |x| = |p| <= B * int_max^2 <= 32 * 144. The GPU kernel checks every scale of a GEMM on the device and runs
// this form only when all pass (tests/models: FmaForm.* holds the identity over every E4M3 pair).
FP4LAB_HD inline bool fma_exact_scale(float s) {
  const uint32_t u = f32_bits(s);
  const uint32_t e = (u >> 23) & 0xFFu;                    // biased exponent
  return (u & 0x7FFFFFFFu) == 0 || (e >= 127u - 50u && e <= 127u + 50u && (u & 0xFFFFFu) == 0);  // 3 stored bits
}
inline constexpr int kFmaExactMaxDot = 1 << 16;  // |p| below this, with passing scales: the fused form is exact
// The scale kinds a GEMM tries the fused form for: UE4M3 and UE8M0 (every value, or every one within 2^+-50, passes
// fma_exact_scale); FP32 scales mostly fail it and take the separate form unchecked. The CUDA kernel's device
// check and the simulator's fused-epilogue rate (acc.fused_lanes) both go by this.
FP4LAB_HD constexpr bool fused_form_kinds(ScaleKind a, ScaleKind b) {
  return a != ScaleKind::fp32 && b != ScaleKind::fp32;
}
FP4LAB_HD inline float contract_scale_add_fma(float acc, float x, float sa, float sb) {
  return FP4LAB_FFMA(x, FP4LAB_FMUL(sa, sb), acc);
}

// Step 2 without a conversion: an integer accumulator started at kMagicBits (1.5 * 2^23 as FP32 bits) ends at the
// bits of kMagic + p exactly, while the mantissa field stays in range: |p| < 2^22 (every grid's |p| <= 32 * 144).
// Then FP32(p) = (kMagic + p) - kMagic, one exact subtraction.
inline constexpr int32_t kMagicBits = 0x4B400000;
inline constexpr float kMagic = 12582912.0f;
inline constexpr int kMagicMaxDot = 1 << 22;

// The fused form taking f = kMagic + p as it comes from such an accumulator, with no subtraction: two fmas,
//   fma(fma(f, sa, msa), sb, acc),   msa = magic_scale(sa) = -kMagic * sa (once per scale, not per output).
// Where contract_scale_add_fma is exact (both scales pass fma_exact_scale, |p| < kFmaExactMaxDot) this gives its
// bits, for every acc but -0. Proof: sa is 0 or has at most 4 significant bits and exponent in [-50, 50], so msa
// (2 + 4 bits, exponent <= 75) is exact, and f * sa + msa = p * sa (16 + 4 bits, >= 2^-50 unless 0) is
// representable: the inner fma rounds nothing. (p * sa) * sb = p * (sa * sb) exactly (the proof above), so the
// outer fma is contract_scale_add_fma's one rounding. A zero product may differ only in its sign (+0 here where
// p < 0 and sa = 0 give -0 there), and acc + (+-0) = acc for every acc but -0. The contract's accumulator is never
// -0: it starts at +0, and a round-to-nearest sum is -0 only when both addends are (tests/models: FmaForm.*).
FP4LAB_HD inline float magic_scale(float sa) { return FP4LAB_FMUL(-kMagic, sa); }
FP4LAB_HD inline float contract_scale_add_magic(float acc, float f, float sa, float msa, float sb) {
  return FP4LAB_FFMA(FP4LAB_FFMA(f, sa, msa), sb, acc);
}
FP4LAB_HD inline float tensor_factor(const ElemFormat& f, float global_dec) {
  return FP4LAB_FMUL(global_dec, std::ldexp(1.0f, -f.int_shift()));
}
FP4LAB_HD inline float contract_finish(float acc, float ga, float gb) { return FP4LAB_FMUL(acc, FP4LAB_FMUL(ga, gb)); }

// Throws std::invalid_argument, with the reason, when the contract does not define the product of A and B
// (docs/spec.md §5): K and the block size must agree, and both operands must be rotated by the same RHT (size and
// signs) or neither, as the rotation cancels only then (§3). Grids, scale formats, 2-D tiles, BF16 rounding of the
// rotated values and the rounding mode may differ per operand: each operand's factor is its own (docs/datapath.md
// §3). A template so the host QTensor and the CUDA layer's device tensors share one rule and one message.
template <class Q>
void check_gemm_operands(const Q& a, const Q& b) {
  if (a.cols != b.cols)
    throw std::invalid_argument("GEMM operands disagree on K: A has " + std::to_string(a.cols) + ", B has " +
                                std::to_string(b.cols));
  if (a.block != b.block)
    throw std::invalid_argument("GEMM operands disagree on block size: " + std::to_string(a.block) + " vs " +
                                std::to_string(b.block));
  if (a.rht != b.rht || (a.rht != 0 && a.rht_signs != b.rht_signs)) {
    const std::string why =
        ": the contract multiplies operands quantised under the same rotation, or both unrotated (docs/spec.md §3)";
    if (a.rht == 0 || b.rht == 0) {
      const bool ra = a.rht != 0;
      throw std::invalid_argument(std::string("operand ") + (ra ? "A" : "B") + " was rotated by " +
                                  rht_name(ra ? a.rht : b.rht, ra ? a.rht_signs : b.rht_signs) + " and operand " +
                                  (ra ? "B" : "A") + " was not" + why);
    }
    throw std::invalid_argument("operand A was rotated by " + rht_name(a.rht, a.rht_signs) + " and operand B by " +
                                rht_name(b.rht, b.rht_signs) + why);
  }
}

// Fast CPU implementation (vectorised, both cores); bit-identical to reference::gemm_contract.
std::vector<float> gemm(const QTensor& a, const QTensor& b);

// gemm(a, b) into c (resized to its rows x columns), the same bits.
void gemm(const QTensor& a, const QTensor& b, F32Buffer& c);

// Rows [row0, row0 + rows) of gemm(a, b), the same bits (every output is its own sum), for callers that take a
// large product a panel of rows at a time. An overflow names its row in the whole product.
std::vector<float> gemm_rows(const QTensor& a, int64_t row0, int64_t rows, const QTensor& b);

// A product made a panel at a time: gemm(a, b) written into columns [col0, col0 + b.rows) of c, a.rows rows of n
// floats (rows of a and of b are each a panel of a larger operand; every output is its own sum, so the same bits).
// Not checked for overflow: check_gemm_output checks the whole product once every panel is in, with gemm's message.
void gemm_columns(const QTensor& a, const QTensor& b, float* c, int64_t n, int64_t col0);
void check_gemm_output(const float* c, int64_t M, int64_t N);

// Plain reference product of unquantised operands, C = A . B^T in float64: each output the sum of its exact
// products in ascending k from +0.0, so the same bits on every CPU, build and thread count (docs/spec.md §6).
std::vector<double> gemm_f64(const float* a, const float* b, int64_t M, int64_t N, int64_t K);
// The same product of operands given by strides, A(m, k) = a[m * a_row + k * a_col] and B(n, k) = b[n * b_row +
// k * b_col], so that an operand can be read in place from its untransposed source (row stride 1, column stride
// the source's row length): the same bits.
std::vector<double> gemm_f64(const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t b_row,
                             int64_t b_col, int64_t M, int64_t N, int64_t K);
// The same product into c (resized to M x N), the same bits.
void gemm_f64(const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t b_row, int64_t b_col, int64_t M,
              int64_t N, int64_t K, F64Buffer& c);
// An operand of it given by strides, as FP32 values or as BF16 bit patterns (exact in FP32, so the same product):
// a BF16 tensor can be read where it lies instead of from an FP32 copy twice its size.
struct F64Operand {
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;  // used when set
  int64_t row = 0, col = 1;        // element (r, c) at r * row + c * col
};
void gemm_f64(const F64Operand& a, const F64Operand& b, int64_t M, int64_t N, int64_t K, F64Buffer& c);

}  // namespace fp4lab
