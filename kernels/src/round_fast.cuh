// RTNE onto a 4-bit grid without the golden model's level search, for the quantiser's hot path.
//
// fp4lab::round_rtne compares the integer view u with every midpoint (about 4 instructions per level, 28 per
// element): that made the quantiser issue-bound at half the memory bandwidth. Here the grid's own structure does
// the search: inside exponent field k >= 1 of the format, the integer-view levels are spaced 2^(k-1) apart (the
// subnormal field shares field 1's spacing of 1), so rounding u to the nearest level, ties to the even index, is
// rounding u / 2^(k-1) to the nearest integer, ties to even. One FP32 addition of 1.5 * 2^(23+k-1) does exactly
// that (the sum's ulp is 2^(k-1), and the default rounding is ties-to-even); the integer difference of the bit
// patterns is the rounded multiple, and index = multiple + (k-1) * 2^M. A result that rounds up to the next
// field's first level gets that level's index by the same formula.
//
// The integer view, the saturation and the code are the golden functions (int_view_of, make_code); only the
// search is replaced, and count_rtne_fast_mismatches() checks it against fp4lab::round_rtne for all 2^32 FP32
// inputs of every format (NaN and infinities included) in the cuda tests.
#pragma once

#include <cmath>
#include <cstdint>

#include "fp4lab/format.hpp"

namespace fp4lab::cuda::detail {

// `negative` is the code's sign bit: signbit(v), or (for the hoisted division below) the dividend's.
template <int F>
__device__ __forceinline__ uint8_t round_rtne_fast(float v, bool negative) {
  constexpr ElemFormat f = kAllFormats[F];
  constexpr int M = f.mbits;
  constexpr int KMAX = f.max_index >> M;  // highest exponent field in use
  const float u = int_view_of(f, v);      // |v| saturated at gmax, times 2^int_shift (golden)
  float magic = 12582912.0f;              // 1.5 * 2^23: rounds to integers (fields 0 and 1)
  int offset = 0;
#pragma unroll
  for (int k = 2; k <= KMAX; ++k) {  // field k holds u in [2^(M+k-1), 2^(M+k)), spacing 2^(k-1)
    const bool in = u >= float(1 << (M + k - 1));
    magic = in ? 12582912.0f * float(1 << (k - 1)) : magic;
    offset = in ? (k - 1) << M : offset;
  }
  const float t = __fadd_rn(u, magic);
  // NaN (never produced from finite inputs) makes the difference huge: clamped to max_index, as the golden
  // search also ends there.
  const unsigned idx = unsigned(__float_as_int(t) - __float_as_int(magic) + offset);
  return make_code(negative, int(idx < unsigned(f.max_index) ? idx : unsigned(f.max_index)));
}
template <int F>
__device__ __forceinline__ uint8_t round_rtne_fast(float v) {
  return round_rtne_fast<F>(v, std::signbit(v));
}

// Division by a block's fp32 scale, x / dec, for the whole block at once. __fdiv_rn (what x / dec compiles to
// with -prec-div=true) runs, for every element: an approximate reciprocal of dec refined by one Newton step,
// q0 = RN(x r), one correction q = RN(q0 + (x - q0 dec) r), plus a range check (FCHK) that sends exotic operand
// pairs to a slow path. Here the reciprocal is computed once per block (the same instructions), the per-element
// part is the same three FMAs, and the range check is made once per block: dec within [2^-90, 2^100]. Then any
// quotient that can reach a nonzero magnitude index (|x / dec| >= 2^-3) has |x| >= 2^-93, so the residual
// x - q0 dec is a multiple of 2^-149 and the FMA computes it exactly, as in the fast path proper. Smaller quotients
// may come out a few ulps off when the residual underflows (seen on the H200 for dec near 2^-100), but they
// quantise to index 0 either way; the code's sign is taken from x (the quotient's sign, IEEE) because the
// correction step can turn an underflowed -0 into +0. Opt-in (set_quantize_fast_division); see kernels/README.md.
__device__ __forceinline__ bool div_fast_ok(float dec) { return dec >= 0x1p-90f && dec <= 0x1p100f; }
__device__ __forceinline__ float div_reciprocal(float dec) {
  float r0;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(dec));
  return __fmaf_rn(r0, __fmaf_rn(r0, -dec, 1.0f), r0);
}
__device__ __forceinline__ float div_by(float x, float dec, float r) {
  const float q0 = __fmaf_rn(x, r, 0.0f);
  return __fmaf_rn(r, __fmaf_rn(q0, -dec, x), q0);
}

}  // namespace fp4lab::cuda::detail
