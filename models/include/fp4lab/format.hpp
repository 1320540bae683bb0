// fp4lab element formats: the one definition every layer (CLI, SystemC, RTL harness, CUDA) includes.
//
// A 4-bit element is sign-magnitude: bit 3 is the sign, bits 0-2 the magnitude index. A format is the
// tuple (exponent bits, mantissa bits, bias, highest index in use); levels, gmax, the exact integer view
// and the MX emax are all derived from it, so E2M1 and E1M2 are two instantiations of one code path.
// No format has Inf or NaN codes. Pure C++ (no I/O), usable from host and CUDA device code.
#pragma once

#include <cstdint>
#include <cmath>

#if defined(__CUDACC__)
#define FP4LAB_HD __host__ __device__
#else
#define FP4LAB_HD
#endif

namespace fp4lab {

enum class Rounding : uint8_t { rtne, sr };
inline constexpr Rounding kRoundings[] = {Rounding::rtne, Rounding::sr};
FP4LAB_HD constexpr const char* rounding_name(Rounding r) { return r == Rounding::rtne ? "rtne" : "sr"; }

struct ElemFormat {
  const char* name;
  int ebits;
  int mbits;
  int bias;
  int max_index;  // highest magnitude index in use: 7, or 4 for the range-restricted e2m1_max2

  FP4LAB_HD constexpr int num_levels() const { return max_index + 1; }

  // Integer view of magnitude index i: level(i) * 2^int_shift(), an exact small integer.
  // Subnormal (exponent field 0): the mantissa itself; normal: (1.m) shifted by exponent-1.
  FP4LAB_HD constexpr int int_level(int i) const {
    const int e = i >> mbits;
    const int m = i & ((1 << mbits) - 1);
    return e == 0 ? m : ((1 << mbits) + m) << (e - 1);
  }
  // log2 of the integer-view factor: e2m1 -> 1 (x2), e1m2 -> 2 (x4), int4 -> 0 (x1).
  FP4LAB_HD constexpr int int_shift() const { return bias + mbits - 1; }
  FP4LAB_HD constexpr float level(int i) const {
    return int_shift() >= 0 ? float(int_level(i)) / float(1 << int_shift())
                            : float(int_level(i)) * float(1 << -int_shift());
  }
  FP4LAB_HD constexpr int int_max() const { return int_level(max_index); }
  FP4LAB_HD constexpr float gmax() const { return level(max_index); }
  // floor(log2(gmax)): the "emax of the element" the OCP MX shared exponent subtracts.
  FP4LAB_HD constexpr int emax() const { return (max_index >> mbits) - bias; }
};

//                                    name        E  M  bias  max index
inline constexpr ElemFormat kE2M1{"e2m1", 2, 1, 1, 7};           // 0 .5 1 1.5 2 3 4 6 (OCP MX FP4)
inline constexpr ElemFormat kE1M2{"e1m2", 1, 2, 1, 7};           // 0 .25 .5 ... 1.75 (uniform)
inline constexpr ElemFormat kInt4{"int4", 1, 2, -1, 7};          // 0 1 2 ... 7 (E1M2 grid x4)
inline constexpr ElemFormat kE2M1Max2{"e2m1_max2", 2, 1, 1, 4};  // 0 .5 1 1.5 2 (paper's ablation)

inline constexpr ElemFormat kAllFormats[] = {kE2M1, kE1M2, kInt4, kE2M1Max2};

// A format is identified by its defining tuple, never by its name (a label): the one test every layer uses.
FP4LAB_HD constexpr bool same_grid(const ElemFormat& a, const ElemFormat& b) {
  return a.ebits == b.ebits && a.mbits == b.mbits && a.bias == b.bias && a.max_index == b.max_index;
}
// Index of f in kAllFormats (the kernels' template argument, the RTL's format id), or -1 for any other tuple.
// Host only: device code takes the index as a template argument instead of reading the table.
constexpr int format_index(const ElemFormat& f) {
  for (int i = 0; i < int(sizeof(kAllFormats) / sizeof(kAllFormats[0])); ++i)
    if (same_grid(kAllFormats[i], f)) return i;
  return -1;
}

// ---- 4-bit codes ---------------------------------------------------------------------------------
FP4LAB_HD constexpr uint8_t make_code(bool negative, int index) {
  return uint8_t((negative ? 0b1'000 : 0) | (index & 0b0'111));
}
FP4LAB_HD constexpr int code_index(uint8_t code) { return code & 0b0'111; }
FP4LAB_HD constexpr bool code_negative(uint8_t code) { return (code & 0b1'000) != 0; }

// Signed integer view of a code (exact; |value| <= 12 for e2m1, <= 7 for e1m2/int4).
FP4LAB_HD constexpr int decode_int(const ElemFormat& f, uint8_t code) {
  const int v = f.int_level(code_index(code));
  return code_negative(code) ? -v : v;
}
FP4LAB_HD constexpr float decode(const ElemFormat& f, uint8_t code) {
  const float v = f.level(code_index(code));
  return code_negative(code) ? -v : v;
}
// Codes whose index exceeds max_index are not part of the format (only e2m1_max2 has such codes).
FP4LAB_HD constexpr bool code_valid(const ElemFormat& f, uint8_t code) {
  return code < 16 && code_index(code) <= f.max_index;
}

// ---- rounding onto the grid ---------------------------------------------------------------------
// Both take v already divided by its block scale (finite). Steps:
//  1. saturate |v| to gmax (blocks are scaled so this only trims the rounding of the scale itself,
//     or clips by design for OCP MX's floor exponent);
//  2. move to the integer view u = |v| * 2^int_shift, an exact power-of-two multiply;
//  3. pick the level; ties (RTNE) go to the even magnitude index, which is the even code.
FP4LAB_HD inline float int_view_of(const ElemFormat& f, float v) {
  float a = std::fabs(v);
  if (a > f.gmax()) a = f.gmax();
  return f.int_shift() >= 0 ? a * float(1 << f.int_shift()) : a / float(1 << -f.int_shift());
}

// The index is the number of midpoints at or below u, less one for a tie on a midpoint whose lower
// neighbour has the even index (a tie keeps the even index). Written without early exit so it runs
// branch-free and vectorises; same result as walking up the levels, NaN included (-> max_index).
FP4LAB_HD inline uint8_t round_rtne(const ElemFormat& f, float v) {
  const float u = int_view_of(f, v);
  int i = 0;
  for (int j = 0; j < f.max_index; ++j) {
    // Midpoint of two small integers: exact in FP32.
    const float mid = 0.5f * float(f.int_level(j) + f.int_level(j + 1));
    i += int(!(u < mid)) - int(u == mid && (j & 1) == 0);
  }
  return make_code(std::signbit(v), i);
}

// round_rtne on a named grid (host), with the level found by rounding u at the grid's spacing instead of by
// counting midpoints (fewer operations in the quantiser's inner loop). Uniform grids (integer view = index:
// e1m2, int4, e2m1_max2) take rint(u); e2m1 (0..4, 6, 8, 12) takes rint at spacing 1 up to 4, 2 up to 8 and 4
// above. rint's ties go to the even multiple of the spacing, which on each stretch is the even index that
// round_rtne keeps. The same code as round_rtne for every finite v (tests/models: every float compared).
template <const ElemFormat* F>
inline uint8_t round_rtne_fixed(float v) {
  constexpr ElemFormat f = *F;
  const float u = int_view_of(f, v);
  if constexpr (f.int_max() == f.max_index) {
    return make_code(std::signbit(v), int(std::nearbyint(u)));
  } else if constexpr (same_grid(f, kE2M1)) {
    const float l1 = std::nearbyint(u), l2 = 2.0f * std::nearbyint(u * 0.5f), l4 = 4.0f * std::nearbyint(u * 0.25f);
    const float lvl = u <= 4.0f ? l1 : u <= 8.0f ? l2 : l4;
    const float idx = lvl <= 4.0f ? lvl : lvl <= 8.0f ? lvl * 0.5f + 2.0f : 7.0f;
    return make_code(std::signbit(v), int(idx));
  } else {
    return round_rtne(f, v);
  }
}

// Stochastic rounding with one 32-bit random word r. Grid gaps are powers of two, so the fraction
// (u - lo) / gap is exact; we round up iff (r >> 8) < frac * 2^24, compared exactly in FP32.
// P(up) = ceil(frac * 2^24) / 2^24: unbiased to within 2^-24 of a gap.
FP4LAB_HD inline uint8_t round_sr(const ElemFormat& f, float v, uint32_t r) {
  const float u = int_view_of(f, v);
  int i = 0;
  while (i < f.max_index && float(f.int_level(i + 1)) <= u) ++i;
  if (i < f.max_index) {
    const float lo = float(f.int_level(i));
    const float gap = float(f.int_level(i + 1) - f.int_level(i));
    const float frac = (u - lo) / gap;
    if (float(r >> 8) < frac * 16777216.0f) ++i;
  }
  return make_code(std::signbit(v), i);
}

// round_sr on a named grid (host), with the level below u found by flooring u at the grid's spacing, as
// round_rtne_fixed finds the nearest one, instead of round_sr's walk up the levels (a loop whose exit the data
// decide). The spacing is the gap and a power of two, so (u - lo) / gap is the exact fraction either way; the
// comparison with r is round_sr's. The same code as round_sr for every v and r (tests/models: around every level
// and midpoint, at the words either side of each threshold).
template <const ElemFormat* F>
inline uint8_t round_sr_fixed(float v, uint32_t r) {
  constexpr ElemFormat f = *F;
  const float u = int_view_of(f, v);
  float lo, gap;
  int i;
  if constexpr (f.int_max() == f.max_index) {
    gap = 1.0f;
    lo = std::floor(u);
    i = u == u ? int(lo) : 0;  // NaN: the walk stops at index 0 and never rounds up
  } else if constexpr (same_grid(f, kE2M1)) {
    gap = u < 4.0f ? 1.0f : u < 8.0f ? 2.0f : 4.0f;  // levels 0..4, 6, 8, 12
    lo = std::floor(u / gap) * gap;
    i = !(u == u) ? 0 : lo <= 4.0f ? int(lo) : lo <= 8.0f ? int(lo * 0.5f + 2.0f) : 7;
  } else {
    return round_sr(f, v, r);
  }
  if (i >= f.max_index) return make_code(std::signbit(v), f.max_index);
  const float frac = (u - lo) / gap;
  return make_code(std::signbit(v), i + int(float(r >> 8) < frac * 16777216.0f));
}

}  // namespace fp4lab
