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

template <int F>
__device__ __forceinline__ uint8_t round_rtne_fast(float v) {
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
  return make_code(std::signbit(v), int(idx < unsigned(f.max_index) ? idx : unsigned(f.max_index)));
}

// Stochastic rounding as fp4lab::round_sr computes it, without its walk over the levels (a loop with a branch
// per level) and its division: the level below u is found as round_rtne_fast finds the nearest one (floor at the
// field's spacing sp), and (u - lo) / gap, gap = sp a power of two, is (u - lo) * (1 / sp): both are the exact
// quotient rounded once, so the bits agree. sr_split gives the index below and t = fraction * 2^24 (0 at the top
// level, which never rounds up); the element rounds up iff float(r >> 8) < t. count_sr_fast_mismatches checks it
// against fp4lab::round_sr for all 2^32 FP32 inputs at the random words either side of each input's threshold.
template <int F>
__device__ __forceinline__ void sr_split(float v, int& index, float& t) {
  constexpr ElemFormat f = kAllFormats[F];
  constexpr int M = f.mbits;
  constexpr int KMAX = f.max_index >> M;
  const float u = int_view_of(f, v);
  float sp = 1.0f, inv = 1.0f;  // fields 0 and 1: spacing 1
  int offset = 0;
#pragma unroll
  for (int k = 2; k <= KMAX; ++k) {  // field k holds u in [2^(M+k-1), 2^(M+k)), spacing 2^(k-1)
    const bool in = u >= float(1 << (M + k - 1));
    sp = in ? float(1 << (k - 1)) : sp;
    inv = in ? 1.0f / float(1 << (k - 1)) : inv;
    offset = in ? (k - 1) << M : offset;
  }
  // A grid of one exponent field past the subnormals (KMAX < 2: E1M2, INT4) has sp = inv = 1, and the products
  // by 1 are left out: x * 1 is x for every x but NaN, and a NaN u gives index 0 and a NaN t either way.
  const float q = floorf(KMAX >= 2 ? __fmul_rn(u, inv) : u);  // u / sp is exact: a power-of-two scaling of u >= 1
  const float lo = KMAX >= 2 ? __fmul_rn(q, sp) : q;          // int_level(index), exact
  const int i = int(q) + offset;
  const bool top = i >= f.max_index;
  // NaN (never produced from finite inputs): the golden walk stops at index 0 and never rounds up.
  index = u == u ? (top ? f.max_index : i) : 0;
  const float frac = KMAX >= 2 ? __fmul_rn(__fsub_rn(u, lo), inv) : __fsub_rn(u, lo);
  t = top ? 0.0f : __fmul_rn(frac, 16777216.0f);
}

template <int F>
__device__ __forceinline__ uint8_t round_sr_fast(float v, uint32_t r) {
  int i;
  float t;
  sr_split<F>(v, i, t);
  return make_code(std::signbit(v), i + int(float(r >> 8) < t));
}

// The fake quantiser's levels: what decode(format, code) gives for the code round_rtne_fast / round_sr_fast pick,
// sign included, computed without the code (no index, no packing, no table lookup, no conversion instruction).
// Scaling the integer view's search by 2^-int_shift changes no rounding (powers of two, far from under- and
// overflow), so the level comes out in grid units directly: |v| saturated at gmax, rounded at its field's spacing.
// count_rtne_level_mismatches / count_sr_level_mismatches check them against decode(round_rtne) and
// decode(round_sr) for all 2^32 FP32 inputs (the SR one at the words either side of each threshold).
template <int F>
__device__ __forceinline__ constexpr float grid_unit() {  // the integer view's 1, in grid units: 2^-int_shift
  constexpr int S = kAllFormats[F].int_shift();
  return S >= 0 ? 1.0f / float(1 << S) : float(1 << -S);
}

template <int F>
__device__ __forceinline__ float rtne_level_fast(float v) {
  constexpr ElemFormat f = kAllFormats[F];
  constexpr int M = f.mbits;
  constexpr int KMAX = f.max_index >> M;
  constexpr float unit = grid_unit<F>();
  // fminf takes the number where v is NaN: gmax, where the golden search of a NaN ends (max_index).
  const float a = fminf(fabsf(v), f.gmax());
  float magic = 12582912.0f * unit;  // 1.5 * 2^23 spacings: rounds to the spacing of fields 0 and 1
#pragma unroll
  for (int k = 2; k <= KMAX; ++k) {
    const bool in = a >= float(1 << (M + k - 1)) * unit;
    magic = in ? 12582912.0f * float(1 << (k - 1)) * unit : magic;
  }
  const float lvl = __fsub_rn(__fadd_rn(a, magic), magic);  // exact: both sums stay in magic's binade
  return __uint_as_float(__float_as_uint(lvl) | (__float_as_uint(v) & 0x80000000u));
}

// SR: the level below is a rounded down at its field's spacing (one addition in round-down mode), the fraction of
// the gap times 2^24 is (a - lo) times a power of two (exact, as sr_split's), and the element takes the level
// above iff float(r >> 8) < t, as round_sr_fast decides.
template <int F>
__device__ __forceinline__ float sr_level_fast(float v, uint32_t r) {
  constexpr ElemFormat f = kAllFormats[F];
  constexpr int M = f.mbits;
  constexpr int KMAX = f.max_index >> M;
  constexpr float unit = grid_unit<F>();
  float a = fabsf(v);
  a = a > f.gmax() ? f.gmax() : a;  // a NaN stays NaN: the golden walk stops at index 0 (below)
  float sp = unit, magic = 12582912.0f * unit, scale = 16777216.0f / unit;
#pragma unroll
  for (int k = 2; k <= KMAX; ++k) {  // field k: spacing 2^(k-1) in the integer view
    const bool in = a >= float(1 << (M + k - 1)) * unit;
    sp = in ? float(1 << (k - 1)) * unit : sp;
    magic = in ? 12582912.0f * float(1 << (k - 1)) * unit : magic;
    scale = in ? 16777216.0f / (float(1 << (k - 1)) * unit) : scale;
  }
  const float lo = __fsub_rn(__fadd_rd(a, magic), magic);
  const float t = __fmul_rn(__fsub_rn(a, lo), scale);  // 0 at gmax (a multiple of the top spacing): never up
  const float up = __fadd_rn(lo, sp);
  // fmaxf takes 0 where lo is NaN: the golden level of a NaN (index 0).
  const float lvl = fmaxf(float(r >> 8) < t ? up : lo, 0.0f);
  return __uint_as_float(__float_as_uint(lvl) | (__float_as_uint(v) & 0x80000000u));
}

// Two FP32 values to BF16, RTNE, packed (lo in bits 0-15): one cvt.rn.bf16x2.f32 instead of fp4lab::f32_to_bf16's
// four integer instructions per value. The same bits for every input that is not a NaN (both round the bit pattern
// to nearest, ties to even, overflowing to infinity); for a NaN the instruction gives the canonical NaN where
// f32_to_bf16, defined for finite inputs, may carry into the sign. count_bf16_pack_mismatches checks all 2^32.
__device__ __forceinline__ uint32_t bf16x2_rn(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));  // the first source goes to the upper half
  return r;
}

}  // namespace fp4lab::cuda::detail
