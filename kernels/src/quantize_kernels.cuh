// The quantise kernels and their launchers, shared by quantize.cu (the host entries, amax and RHT passes) and
// the translation units that instantiate the quantise kernels: one per (input type, format, orientation), generated
// by CMakeLists.txt from quantize_part.cu.in, so that a parallel build compiles them side by side (the one file
// that held all 192 instances took most of the kernel build's wall time).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "common.cuh"
#include "round_fast.cuh"
#include "fp4lab/cuda/kernels.hpp"
#include "fp4lab/philox.hpp"
#include "fp4lab/quantize.hpp"
#include "fp4lab/rht.hpp"
#include "fp4lab/scale.hpp"

namespace fp4lab::cuda::detail {

struct QArgs {
  const void* x;           // float, or BF16 bits (uint16_t): the kernel's T
  int64_t rows, cols;
  uint8_t* codes;          // packed, rows * cols / 2
  float* scales;           // rows * cols / B
  uint8_t* scale_codes;    // null for fp32 scales
  float* global_dec;       // one value, written by thread 0
  const float* block_amax; // tile2d: the tile amax of every block; null = compute in registers
  const unsigned* tensor_amax;  // ue4m3: FP32 bits of amax(tensor); null otherwise
  int* nonfinite;          // bit 0: an input is NaN or Inf; bit 1: its RHT overflowed FP32; null = not checked
  ScaleKind scale;
  Rounding rounding;
  SrDraw sr_draw;          // SR's draw (philox.hpp): one Philox block per 1, 4 or 16 elements
  bool rht_bf16;
  uint64_t seed;
  const uint64_t* seed_dev; // non-null: the seed is read here on the device (a captured step's key)
  uint32_t stream;
  float signs[32];         // RHT signs (D entries)
  uint16_t* deq;           // fake quantisation: the dequantised BF16 values [rows, cols]; null = not written
  float value[16];         // decode(format, code), for deq
  const int64_t* row_index; // output row r is row row_index[r] of a larger tensor (SR draws at its element
                            // indices; a negative one sets bit 2 of nonfinite); null: row r is row r
  float* bound;             // fake quantisation (quantize_both_kernel): per thread block, a bound on the magnitude
                            // of every value it writes (fp4lab::cuda::fake_quantize_both's d_bound); null = none
};

// The quantise kernels' launch for format index F (kAllFormats), input T (float, or BF16 bits as uint16_t) and
// orientation TR (the transposed kernels), over block 16/32 and fused RHT 0/16/32: defined by
// launch_quantize_bd below, instantiated once per combination in its own translation unit.
template <class T, int F, bool TR>
void launch_quantize_fmt(int block, int d, const QArgs& a, cudaStream_t s);

// Both orientations of one BF16 tensor x [ar.rows, ar.cols] from one read (quantize_both.cu): ar describes the
// row-wise pass (output [rows, cols]), at the transposed one (output [cols, rows], at.x == ar.x); block 16, fused
// RHT dr (row-wise) and dt (transposed) each 0 or 16, format index fmt for both.
void launch_quantize_both(int fmt, int dr, int dt, const QArgs& ar, const QArgs& at, cudaStream_t s);
// Its grid over x [rows, cols]: tiles along cols (x) and rows (y), and whether rows fit the y dimension (65535).
dim3 both_grid(int64_t rows, int64_t cols);
bool both_grid_fits(int64_t rows);
// The tensor amaxes both ue4m3 passes of it take, from one read too: FP32 bits of max |RHT-dr(x)| over rows into
// *amax_r and of max |RHT-dt(x^T)| into *amax_t (both zeroed by the caller); signs and BF16 rounding per pass.
void launch_amax_both(const uint16_t* x, int64_t rows, int64_t cols, int dr, int dt, const float* signs_r,
                      bool bf16_r, const float* signs_t, bool bf16_t, unsigned* amax_r, unsigned* amax_t,
                      cudaStream_t s);

// X(T, F, TR) for every instance: extern declarations here, definitions in the generated files.
#define FP4LAB_QUANTIZE_PARTS(X) \
  X(float, 0, false) X(float, 1, false) X(float, 2, false) X(float, 3, false) \
  X(float, 0, true) X(float, 1, true) X(float, 2, true) X(float, 3, true) \
  X(uint16_t, 0, false) X(uint16_t, 1, false) X(uint16_t, 2, false) X(uint16_t, 3, false) \
  X(uint16_t, 0, true) X(uint16_t, 1, true) X(uint16_t, 2, true) X(uint16_t, 3, true)
#define FP4LAB_QUANTIZE_EXTERN(T, F, TR) \
  extern template void launch_quantize_fmt<T, F, TR>(int, int, const QArgs&, cudaStream_t);
FP4LAB_QUANTIZE_PARTS(FP4LAB_QUANTIZE_EXTERN)
#undef FP4LAB_QUANTIZE_EXTERN
// The four format indices of the list above, of quantize.cu's dispatch and of kernels/CMakeLists.txt's `F RANGE 3`.
static_assert(sizeof(kAllFormats) / sizeof(kAllFormats[0]) == 4,
              "one quantise part per format: update the three lists");

}  // namespace fp4lab::cuda::detail

namespace fp4lab::cuda {
namespace {

using detail::QArgs;

constexpr int kThreads = 256;


// Loads the G consecutive inputs of one thread with 16-byte loads (cols is a multiple of 16, so every group
// starts 64-byte (FP32) or 32-byte (BF16) aligned when the tensor does). BF16 inputs widen exactly to FP32, as
// the golden model's reader does, so a BF16 tensor quantises to the bits its FP32 copy would.
template <int G>
__device__ __forceinline__ void load_group(const float* p, float (&y)[G]) {
  const float4* q = reinterpret_cast<const float4*>(p);
#pragma unroll
  for (int i = 0; i < G / 4; ++i) {
    const float4 v = __ldg(q + i);
    y[4 * i] = v.x;
    y[4 * i + 1] = v.y;
    y[4 * i + 2] = v.z;
    y[4 * i + 3] = v.w;
  }
}
template <int G>
__device__ __forceinline__ void load_group(const uint16_t* p, float (&y)[G]) {
  const uint4* q = reinterpret_cast<const uint4*>(p);
#pragma unroll
  for (int i = 0; i < G / 8; ++i) {
    const uint4 v = __ldg(q + i);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      y[8 * i + 2 * j] = bf16_to_f32(uint16_t(w[j] & 0xFFFFu));
      y[8 * i + 2 * j + 1] = bf16_to_f32(uint16_t(w[j] >> 16));
    }
  }
}

// max(a, b) that returns NaN when either is NaN (PTX max.NaN, one instruction like fmaxf): the block amax then
// says, in the same instruction, whether any of its values is NaN or Inf (the fault check of quantize_group).
// On other values it is fmaxf, so the amax is the golden one.
__device__ __forceinline__ float fmax_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// Step 1 of the contract (docs/datapath.md section 2) on the thread's G values: RHT-D per D consecutive
// values with the golden rht_block, then BF16 rounding when the recipe asks (Transformer Engine's order).
template <int G, int D>
__device__ __forceinline__ void rotate_group(float (&y)[G], const float* signs, bool bf16) {
  if constexpr (D > 0) {
#pragma unroll
    for (int s = 0; s < G; s += D) rht_block(y + s, D, signs);
    if (bf16) {
#pragma unroll
      for (int j = 0; j < G; ++j) y[j] = round_to_bf16(y[j]);
    }
  }
}

// The four SR words of elements e0 .. e0 + 3 (e0 a multiple of 4) of the group at element index base.
// WIDE: Philox's products as widening multiplies (philox.hpp); the same bits either way. Under philox4 one Philox
// block gives them; under philox1 (the original draw, one block per element) a rolled loop computes the four blocks
// one after the other, so that the kernel holds one generator body for it and not one per element.
template <bool WIDE>
__device__ __forceinline__ void sr_draw4(const QArgs& a, SrDraw d, uint64_t seed, int64_t base, int e0,
                                         uint32_t (&w)[4]) {
  if (d == SrDraw::philox4) {
    sr_words4<WIDE>(seed, a.stream, uint64_t(base + e0) >> 2, w);
  } else {
    uint32_t w0 = 0, w1 = 0, w2 = 0, w3 = 0;  // shifted in, so that no register array is indexed at run time
#pragma unroll 1
    for (int i = 0; i < 4; ++i) {
      const uint32_t r = random_bits_in_group<WIDE>(seed, a.stream, uint64_t(base), uint32_t(e0 + i));
      w0 = w1;
      w1 = w2;
      w2 = w3;
      w3 = r;
    }
    w[0] = w0;
    w[1] = w1;
    w[2] = w2;
    w[3] = w3;
  }
}

// The SR words of block elements e0 .. e0 + B - 1 (e0 = b * B, the block's first element: a multiple of 16), four
// elements at a time: round4(e, w) rounds elements e .. e + 3 with words w. The draw is chosen once for the block,
// so each path holds its own registers only, at the cost of a copy of round4 per path. Under philox16 one Philox
// block serves sixteen elements, its word q giving elements 4q .. 4q + 3 their bytes (sr_byte_word).
// DRAW: the SrDraw, fixed at compile time, or -1 for a.sr_draw.
template <int B, bool WIDE, int DRAW, class Round4>
__device__ __forceinline__ void sr_block(const QArgs& a, uint64_t seed, int64_t base, int e0, Round4 round4) {
  const SrDraw d = DRAW < 0 ? a.sr_draw : SrDraw(DRAW);
  if (d == SrDraw::philox16) {
#pragma unroll
    for (int j = 0; j < B; j += 16) {
      uint32_t g[4];
      sr_words4<WIDE>(seed, a.stream, uint64_t(base + e0 + j) >> 4, g);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = sr_byte_word(g[q], i);
        round4(e0 + j + 4 * q, w);
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < B; j += 4) {
      uint32_t w[4];
      sr_draw4<WIDE>(a, d, seed, base, e0 + j, w);
      round4(e0 + j, w);
    }
  }
}

// round_block's form of sr_block: the words of elements e0 .. e0 + 3, asked for in order from the block's first
// element (a multiple of 16), with the philox16 block drawn at each multiple of 16 and kept. The rounding code is
// then held once for every draw; the code-forming kernels spill no more for it (ptxas, sm_90a), where the one-read
// fake quantiser, whose levels_of_block takes sr_block, would.
template <bool WIDE>
struct SrWords {
  uint32_t g[4];
  __device__ __forceinline__ void next4(const QArgs& a, uint64_t seed, int64_t base, int e0, uint32_t (&w)[4]) {
    if (a.sr_draw == SrDraw::philox16) {
      if (e0 % 16 == 0) sr_words4<WIDE>(seed, a.stream, uint64_t(base + e0) >> 4, g);
      const uint32_t x = g[(e0 / 4) % 4];
#pragma unroll
      for (int i = 0; i < 4; ++i) w[i] = sr_byte_word(x, i);
    } else {
      sr_draw4<WIDE>(a, a.sr_draw, seed, base, e0, w);
    }
  }
};

// Scales and rounds block b of the thread's values into packed nibbles (element e -> bits 4(e%8) of word e/8): two
// registers for 16 codes (the kernels' speed follows their occupancy, so the registers they hold matter).
template <int F, int B, bool FP32, bool RTNE, bool WIDE, int G>
__device__ __forceinline__ void round_block(const float (&y)[G], int b, const BlockScale& bs, ScaleKind kind,
                                            const QArgs& a, uint64_t seed, int64_t base, uint32_t (&packed)[G / 8]) {
  // fp32 scales: one division per block instead of one per element (scale_fp32_by_reciprocal: the same bits).
  const float recip = FP32 ? fp32_step_reciprocal(bs) : 0.0f;
  if constexpr (RTNE) {
#pragma unroll
    for (int j = 0; j < B; ++j) {
      const int e = b * B + j;
      const float v = FP32 ? scale_fp32_by_reciprocal(y[e], bs, recip) : scale_element(kind, y[e], bs);
      packed[e / 8] |= uint32_t(detail::round_rtne_fast<F>(v)) << (4 * (e % 8));
    }
  } else {
    SrWords<WIDE> words;
#pragma unroll
    for (int j = 0; j < B; j += 4) {
      const int e0 = b * B + j;
      uint32_t w[4];
      words.next4(a, seed, base, e0, w);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int e = e0 + i;
        const float v = FP32 ? scale_fp32_by_reciprocal(y[e], bs, recip) : scale_element(kind, y[e], bs);
        packed[e / 8] |= uint32_t(detail::round_sr_fast<F>(v, w[i])) << (4 * (e % 8));
      }
    }
  }
}

// The fake quantiser's form of round_block: block b of y scaled, rounded to its level (the decode of the code
// round_block would pack: rtne_level_fast / sr_level_fast) and dequantised (deq: level -> value), two values to a
// BF16 pair in w (element e -> half e % 2 of w[e / 2]); no code is formed. Each pair is packed as soon as it is
// known, so the block holds no more registers than its inputs. scaled(x): the element's value in grid units.
template <int F, int B, bool RTNE, bool WIDE, int DRAW, int G, class Scaled, class Deq>
__device__ __forceinline__ void levels_of_block(const float (&y)[G], int b, const QArgs& a, uint64_t seed,
                                                int64_t base, Scaled scaled, Deq deq, uint32_t (&w)[G / 2]) {
  if constexpr (RTNE) {
#pragma unroll
    for (int j = 0; j < B; j += 2) {
      const int e = b * B + j;
      w[e / 2] = detail::bf16x2_rn(deq(detail::rtne_level_fast<F>(scaled(y[e]))),
                                   deq(detail::rtne_level_fast<F>(scaled(y[e + 1]))));
    }
  } else {
    sr_block<B, WIDE, DRAW>(a, seed, base, b * B, [&](int e0, const uint32_t(&r)[4]) {
#pragma unroll
      for (int i = 0; i < 4; i += 2)
        w[(e0 + i) / 2] = detail::bf16x2_rn(deq(detail::sr_level_fast<F>(scaled(y[e0 + i]), r[i])),
                                            deq(detail::sr_level_fast<F>(scaled(y[e0 + i + 1]), r[i + 1])));
    });
  }
}
// Under fp32 scales a block whose scale and magnitudes (lo .. hi) lie in fp32_step_in_range takes the reciprocal
// without a test per element; any other block, scale_fp32_by_reciprocal's test per element. The values are the
// dequantiser's (dequant_value, or dequant_value_unit_global without a tensor-level scale).
template <int F, int B, bool FP32, bool RTNE, bool WIDE, int DRAW, int G>
__device__ __forceinline__ void level_block(const float (&y)[G], int b, const BlockScale& bs, ScaleKind kind,
                                            const QArgs& a, uint64_t seed, int64_t base, float lo, float hi,
                                            float g_dec, uint32_t (&w)[G / 2]) {
  const float s = bs.dec;
  if constexpr (FP32) {  // fp32 scales have no tensor-level scale
    const auto deq = [s](float l) { return dequant_value_unit_global(l, s); };
    const float recip = fp32_step_reciprocal(bs);
    if (fp32_step_in_range(bs, lo, hi))
      levels_of_block<F, B, RTNE, WIDE, DRAW>(
          y, b, a, seed, base, [&](float x) { return scale_fp32_in_range(x, bs, recip); }, deq, w);
    else
      levels_of_block<F, B, RTNE, WIDE, DRAW>(
          y, b, a, seed, base, [&](float x) { return scale_fp32_by_reciprocal(x, bs, recip); }, deq, w);
  } else {
    const bool unit = kind != ScaleKind::ue4m3;
    levels_of_block<F, B, RTNE, WIDE, DRAW>(
        y, b, a, seed, base, [&](float x) { return scale_element(kind, x, bs); },
        [=](float l) { return unit ? dequant_value_unit_global(l, s) : dequant_value(l, s, g_dec); }, w);
  }
}

// The decode table (decode(format, code), 16 words) in shared memory, for the lookups of the fake quantiser and the
// dequantiser. Indexed by each lane's own code, the kernel parameter itself compiles to an indexed constant load,
// which the hardware serialises over the distinct addresses of a warp (up to 16); shared memory serves 16 distinct
// words in one access. Every thread of the block calls it (a barrier), before any returns.
__device__ __forceinline__ const float* shared_decode_table(const float (&value)[16]) {
  __shared__ float table[16];
  const unsigned t = threadIdx.x + threadIdx.y * blockDim.x;
  if (t < 16) table[t] = value[t];
  __syncthreads();
  return table;
}

// One element, widened to FP32 (the transpose kernel's loads).
__device__ __forceinline__ float load1(const float* p) { return __ldg(p); }
__device__ __forceinline__ float load1(const uint16_t* p) { return bf16_to_f32(__ldg(p)); }

// Quotient and remainder of a group index: 32-bit division where the index fits (64-bit division is a long
// software sequence, paid once per group).
__device__ __forceinline__ void split_index(int64_t g, int64_t per_row, bool small, int64_t& row, int64_t& col) {
  if (small) {
    const uint32_t r = uint32_t(g) / uint32_t(per_row);
    row = r;
    col = int64_t(uint32_t(g) - r * uint32_t(per_row));
  } else {
    row = g / per_row;
    col = g - row * per_row;
  }
}

// Everything after the load, for G consecutive values y of output row `row` from column col0 (output layout
// [a.rows, a.cols]): RHT-D, block amax and scale, rounding, packed codes and scales stored. Shared by the
// row-wise and the transposed kernel, so both run the same golden arithmetic on the same values.
// IDX: a.row_index is set (a template parameter, so that the default kernels are compiled as they were, with their
// registers and speed; the indexed ones are instantiated beside them).
// LEVELS: the caller fakes quantisation only (a.deq set, a.codes null: the one-read kernel), and each value goes to
// its level and dequantised value without a code (level_block); otherwise codes are formed and looked up. A
// template parameter: compiled into every kernel, the second path doubled their code and the one-read kernel
// has no register to spare for both.
// dtab: shared_decode_table(a.value) where a.deq is set and codes are formed (not read under LEVELS).
// Returns, where a.deq is set, a bound on the magnitudes of the dequantised values it writes: the largest block's
// dequant_value of the grid's largest level, in FP32 (every code's is at most that; the BF16 values written are at
// most its BF16 rounding, within a factor 1 + 2^-8); NaN where a block scale is. Callers that do not use it pay
// nothing (the function is inlined).
template <int F, int B, int D, int G, bool WIDE = true, bool IDX = false, bool LEVELS = false, int RND = -1,
          int DRAW = -1, int SC = -1>
__device__ __forceinline__ float quantize_group(float (&y)[G], int64_t row, int64_t col0, const QArgs& a,
                                               float s_enc, const float* dtab) {
  constexpr ElemFormat f = kAllFormats[F];
  // Under RHT, whether the input itself holds NaN or Inf (the fault report's bit 0), one max.NaN per element; the
  // rotated values' block amaxes below say whether they do.
  float in_max = 0.0f;
  if constexpr (D > 0) {
#pragma unroll
    for (int j = 0; j < G; ++j) in_max = fmax_nan(in_max, fabsf(y[j]));
  }
  rotate_group<G, D>(y, a.signs, a.rht_bf16);
  const int64_t base = row * a.cols + col0;  // a multiple of G: G divides cols and col0 (the SR groups)
  // The element index SR draws at: the larger tensor's where the row is one of its rows.
  int64_t sr_base = base;
  if constexpr (IDX) {
    const int64_t r = __ldg(a.row_index + row);
    if (r < 0 && a.nonfinite) atomicOr(a.nonfinite, 4);
    sr_base = r * a.cols + col0;
  }
  // RND, DRAW and SC: the Rounding, SrDraw and ScaleKind fixed at compile time where the launcher knows them (the
  // kernel then holds that path's code alone), or -1 for QArgs' own.
  const bool rtne = (RND < 0 ? a.rounding : Rounding(RND)) == Rounding::rtne;
  const ScaleKind scale = SC < 0 ? a.scale : ScaleKind(SC);
  const float g_dec = scale == ScaleKind::ue4m3 ? 1.0f / s_enc : 1.0f;
  if (base == 0 && a.global_dec) *a.global_dec = g_dec;

  const int64_t kb = a.cols / B;
  const uint64_t seed = !rtne && a.seed_dev ? __ldg(a.seed_dev) : a.seed;
  uint32_t packed[G / 8];
#pragma unroll
  for (int w = 0; w < G / 8; ++w) packed[w] = 0;
  float s_dec[G / B];
  bool nonfinite = false;
  // Fake quantisation without codes: each value goes to its level and its dequantised BF16 value (level_block,
  // into deq); no code is packed or looked up.
  constexpr bool levels = LEVELS;
  uint32_t deq[G / 2];
#pragma unroll
  for (int b = 0; b < G / B; ++b) {
    const int64_t sidx = row * kb + col0 / B + b;
    float local = 0.0f, lo = FLT_MAX;
    const bool fp32 = scale == ScaleKind::fp32;
#pragma unroll
    for (int j = 0; j < B; ++j) {
      local = fmax_nan(local, fabsf(y[b * B + j]));
      if (levels && fp32) lo = fminf(lo, fabsf(y[b * B + j]));  // fp32_step_in_range's lo
    }
    // NaN or Inf among the (rotated) values: a NaN or Inf input, or, as fp4lab::quantize says, finite inputs near
    // FLT_MAX that rotate to Inf/NaN. Neither has a code.
    nonfinite |= !(local <= FLT_MAX);
    const float amax = a.block_amax ? a.block_amax[sidx] : local;
    const BlockScale bs = block_scale(f, scale, amax, s_enc);
    s_dec[b] = bs.dec;
    if (a.scales) a.scales[sidx] = bs.dec;
    if (a.scale_codes) a.scale_codes[sidx] = bs.code;
    // Unswitched by hand so that neither the division of fp32 scales nor Philox runs where it is not needed.
    const int64_t at = rtne ? base : sr_base;
    if constexpr (levels) {
      if (fp32) {
        if (rtne)
          level_block<F, B, true, true, WIDE, DRAW>(y, b, bs, ScaleKind::fp32, a, seed, at, lo, local, g_dec, deq);
        else
          level_block<F, B, true, false, WIDE, DRAW>(y, b, bs, ScaleKind::fp32, a, seed, at, lo, local, g_dec, deq);
      } else {
        if (rtne) level_block<F, B, false, true, WIDE, DRAW>(y, b, bs, scale, a, seed, at, lo, local, g_dec, deq);
        else level_block<F, B, false, false, WIDE, DRAW>(y, b, bs, scale, a, seed, at, lo, local, g_dec, deq);
      }
    } else {
      if (fp32) {
        if (rtne) round_block<F, B, true, true, WIDE>(y, b, bs, ScaleKind::fp32, a, seed, at, packed);
        else round_block<F, B, true, false, WIDE>(y, b, bs, ScaleKind::fp32, a, seed, at, packed);
      } else {
        if (rtne) round_block<F, B, false, true, WIDE>(y, b, bs, a.scale, a, seed, at, packed);
        else round_block<F, B, false, false, WIDE>(y, b, bs, a.scale, a, seed, at, packed);
      }
    }
  }
  // Bit 0: the input holds NaN or Inf; bit 1: its rotation does. Under RHT the input's own test decides bit 0:
  // the BF16 rounding of the rotated values (rht_bf16) turns the canonical NaN into -0, so a NaN input can leave
  // every rotated value finite.
  const bool input_bad = D > 0 ? !(in_max <= FLT_MAX) : nonfinite;
  const bool rotated_bad = D > 0 && nonfinite;
  if ((input_bad || rotated_bad) && a.nonfinite) atomicOr(a.nonfinite, (input_bad ? 1 : 0) | (rotated_bad ? 2 : 0));
  if (!levels && a.codes) {
    uint8_t* out = a.codes + base / 2;
    if constexpr (G == 16) {
      *reinterpret_cast<uint2*>(out) = make_uint2(packed[0], packed[1]);
    } else {
#pragma unroll
      for (int w = 0; w < G / 16; ++w)
        reinterpret_cast<uint4*>(out)[w] =
            make_uint4(packed[4 * w], packed[4 * w + 1], packed[4 * w + 2], packed[4 * w + 3]);
    }
  }
  float bound = 0.0f;
  if (a.deq) {
    // The dequantiser's arithmetic (dequantize_kernel), on the codes still in registers (level_block has done it
    // already where no codes are formed): fake quantisation reads the input once and writes BF16 once, instead of
    // writing codes and scales and reading them back. Without a tensor-level scale (g_dec == 1) the product by it is
    // left out: dequant_value_unit_global.
    const bool unit = scale != ScaleKind::ue4m3;
    if constexpr (!levels) {
#pragma unroll
      for (int e = 0; e < G; e += 2) {
        const float glo = dtab[(packed[e / 8] >> (4 * (e % 8))) & 15u];
        const float ghi = dtab[(packed[e / 8] >> (4 * (e % 8 + 1))) & 15u];
        const float lo = unit ? dequant_value_unit_global(glo, s_dec[e / B]) : dequant_value(glo, s_dec[e / B], g_dec);
        const float hi = unit ? dequant_value_unit_global(ghi, s_dec[e / B]) : dequant_value(ghi, s_dec[e / B], g_dec);
        deq[e / 2] = detail::bf16x2_rn(lo, hi);
      }
    }
    const uint32_t* w = deq;
    uint4* o = reinterpret_cast<uint4*>(a.deq + base);
#pragma unroll
    for (int i = 0; i < G / 8; ++i) o[i] = make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
    // After the stores, so that it holds no register while they are formed. The largest level,
    // decode(format, max_index), is an immediate.
#pragma unroll
    for (int b = 0; b < G / B; ++b)
      bound = fmax_nan(bound, unit ? dequant_value_unit_global(f.gmax(), s_dec[b])
                                   : dequant_value(f.gmax(), s_dec[b], g_dec));
  }
  return bound;
}

// The tensor-level half of ue4m3 (S_enc from amax(tensor)), as fp4lab::quantize computes it.
template <int F>
__device__ __forceinline__ float tensor_encode(const QArgs& a) {
  constexpr ElemFormat f = kAllFormats[F];
  return a.scale == ScaleKind::ue4m3 ? nvfp4_global_encode(f, __uint_as_float(*a.tensor_amax)) : 1.0f;
}

// A group's raw input words: 16-byte loads (cols is a multiple of 16, so every group starts 32-byte (BF16) or
// 64-byte (FP32) aligned when the tensor does).
template <class T, int G>
struct RawGroup {
  uint4 v[G * sizeof(T) / 16];
};
template <class T, int G>
__device__ __forceinline__ void load_raw(const T* p, RawGroup<T, G>& r) {
  const uint4* q = reinterpret_cast<const uint4*>(p);
#pragma unroll
  for (int i = 0; i < G * int(sizeof(T)) / 16; ++i) r.v[i] = __ldg(q + i);
}
// BF16 inputs widen exactly to FP32, as the golden model's reader does, so a BF16 tensor quantises to the bits
// its FP32 copy would.
template <int G>
__device__ __forceinline__ void widen(const RawGroup<float, G>& r, float (&y)[G]) {
#pragma unroll
  for (int i = 0; i < G / 4; ++i) {
    y[4 * i] = __uint_as_float(r.v[i].x);
    y[4 * i + 1] = __uint_as_float(r.v[i].y);
    y[4 * i + 2] = __uint_as_float(r.v[i].z);
    y[4 * i + 3] = __uint_as_float(r.v[i].w);
  }
}
template <int G>
__device__ __forceinline__ void widen(const RawGroup<uint16_t, G>& r, float (&y)[G]) {
#pragma unroll
  for (int i = 0; i < G / 8; ++i) {
    const uint32_t w[4] = {r.v[i].x, r.v[i].y, r.v[i].z, r.v[i].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      y[8 * i + 2 * j] = bf16_to_f32(uint16_t(w[j] & 0xFFFFu));
      y[8 * i + 2 * j + 1] = bf16_to_f32(uint16_t(w[j] >> 16));
    }
  }
}

// The transposed kernels' raw words: G rows of two adjacent columns (one 32-bit word per row for BF16, two for
// FP32). Odd row lengths load element by element (the pair is not aligned); a missing second column reads as 0.
template <class T, int G>
struct RawPairs {
  uint32_t w[G * sizeof(T) / 2];
};
template <int G>
__device__ __forceinline__ void load_pairs(const uint16_t* p, int64_t ld, bool aligned, bool two,
                                           RawPairs<uint16_t, G>& r) {
#pragma unroll
  for (int i = 0; i < G; ++i) {
    if (aligned) {
      r.w[i] = __ldg(reinterpret_cast<const unsigned int*>(p + i * ld));
    } else {
      const uint32_t lo = __ldg(p + i * ld), hi = two ? __ldg(p + i * ld + 1) : 0u;
      r.w[i] = lo | (hi << 16);
    }
  }
}
template <int G>
__device__ __forceinline__ void load_pairs(const float* p, int64_t ld, bool aligned, bool two, RawPairs<float, G>& r) {
#pragma unroll
  for (int i = 0; i < G; ++i) {
    if (aligned) {
      const float2 v = __ldg(reinterpret_cast<const float2*>(p + i * ld));
      r.w[2 * i] = __float_as_uint(v.x);
      r.w[2 * i + 1] = __float_as_uint(v.y);
    } else {
      r.w[2 * i] = __float_as_uint(__ldg(p + i * ld));
      r.w[2 * i + 1] = two ? __float_as_uint(__ldg(p + i * ld + 1)) : 0u;
    }
  }
}
template <int G>
__device__ __forceinline__ void widen_pairs(const RawPairs<uint16_t, G>& r, float (&y0)[G], float (&y1)[G]) {
#pragma unroll
  for (int i = 0; i < G; ++i) {
    y0[i] = bf16_to_f32(uint16_t(r.w[i] & 0xFFFFu));
    y1[i] = bf16_to_f32(uint16_t(r.w[i] >> 16));
  }
}
template <int G>
__device__ __forceinline__ void widen_pairs(const RawPairs<float, G>& r, float (&y0)[G], float (&y1)[G]) {
#pragma unroll
  for (int i = 0; i < G; ++i) {
    y0[i] = __uint_as_float(r.w[2 * i]);
    y1[i] = __uint_as_float(r.w[2 * i + 1]);
  }
}

// Row-wise: one thread quantises one group of G = max(B, D) consecutive elements of a row, its G/B blocks wholly
// in registers; consecutive threads take consecutive groups, so every load and store instruction of a warp covers
// consecutive memory. (A grid of resident blocks striding over the tensor with the next group prefetched was
// measured slower on the H200: more instructions per element, and the kernel is issue-bound, not latency-bound.)
template <class T, int F, int B, int D, bool IDX>
__global__ void __launch_bounds__(kThreads) quantize_kernel(const QArgs a) {
  constexpr int G = B > D ? B : D;
  const int64_t groups_per_row = a.cols / G, n = a.rows * groups_per_row;
  const int64_t g = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const float* dtab = a.deq ? shared_decode_table(a.value) : nullptr;  // a.deq is the same for the whole grid
  if (g >= n) return;
  RawGroup<T, G> raw;
  load_raw(static_cast<const T*>(a.x) + g * G, raw);  // row * cols + col0 == g * G
  float y[G];
  widen(raw, y);
  int64_t row, cg;
  split_index(g, groups_per_row, n < (int64_t(1) << 32), row, cg);
  quantize_group<F, B, D, G, true, IDX>(y, row, cg * G, a, tensor_encode<F>(a), dtab);
}

// Transposed: quantises X^T for X [a.cols, a.rows] row-major (a.rows x a.cols is the output's shape), without
// materialising X^T. A thread takes two adjacent columns of X and G consecutive rows of them (G loads of two
// adjacent elements); each column's G values are one group of output row = that column, quantised by the same
// quantize_group as the row-wise kernel. A warp's lanes are 8 consecutive row groups x 4 adjacent column pairs, so
// each store instruction writes, per column, 8 adjacent groups' codes (64 bytes) and scales (32 bytes for block
// 16) as whole sectors; with 32 column pairs per lane row each store touched 32 partial sectors. A block
// (32 x kTRows threads) covers 64 columns x kTRows row groups.
constexpr int kTRows = 8;
static_assert(kTRows == 8, "the lane mapping: 8 row groups x 4 column pairs per warp");
template <class T, int F, int B, int D, bool IDX>
__global__ void __launch_bounds__(32 * kTRows) quantize_t_kernel(const QArgs a) {
  constexpr int G = B > D ? B : D;
  const int64_t xcols = a.rows, ngroups = a.cols / G;  // X's row length; groups down a column
  const int64_t j = (int64_t(blockIdx.x) * 32 + threadIdx.y * 4 + (threadIdx.x >> 3)) * 2;
  const int64_t gr = int64_t(blockIdx.y) * kTRows + (threadIdx.x & 7);
  const float* dtab = a.deq ? shared_decode_table(a.value) : nullptr;
  if (j >= xcols || gr >= ngroups) return;
  const bool two = j + 1 < xcols;
  RawPairs<T, G> raw;
  load_pairs<G>(static_cast<const T*>(a.x) + gr * G * xcols + j, xcols, (xcols & 1) == 0, two, raw);
  float y0[G], y1[G];
  widen_pairs<G>(raw, y0, y1);
  const float s_enc = tensor_encode<F>(a);
  // Groups of 32 keep Philox's 64-bit spelling: with the widening multiplies these kernels take 130 registers,
  // over the 128 that hold two blocks per SM, and ran 0.69-0.75x as fast on an H200 (mxfp4, 8192x1024 and
  // 8192x2816); the groups of 16 and the row-wise kernels gain from them (kernels/README.md).
  constexpr bool kWide = G != 32;
  quantize_group<F, B, D, G, kWide, IDX>(y0, j, gr * G, a, s_enc, dtab);
  if (two) quantize_group<F, B, D, G, kWide, IDX>(y1, j + 1, gr * G, a, s_enc, dtab);
}

struct AmaxArgs {
  const void* x;  // float or BF16 bits, the kernel's T
  int64_t rows, cols;  // the quantised operand's shape (for the transposed kernels, X^T's)
  float* block_amax;   // rows * cols / B, or null
  unsigned* tensor_amax;
  bool rht_bf16;
  float signs[32];
};

// The tensor amax as an atomic maximum of non-negative FP32 bit patterns (their unsigned order is their numeric
// order): reduced over the thread block first, so one atomic per block, not per warp, meets at one address.
__device__ __forceinline__ void block_max_to(unsigned* dst, float m) {
  __shared__ float warp_max[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  const int t = threadIdx.x + threadIdx.y * blockDim.x, nw = (blockDim.x * blockDim.y + 31) / 32;
  if ((t & 31) == 0) warp_max[t >> 5] = m;
  __syncthreads();
  if (t == 0) {
    for (int w = 1; w < nw; ++w) m = fmaxf(m, warp_max[w]);
    if (m > 0.0f) atomicMax(dst, __float_as_uint(m));
  }
}

// Block amaxes of one group of (rotated) values; returns their maximum.
template <int B, int D, int G>
__device__ __forceinline__ float group_amax(float (&y)[G], int64_t row, int64_t col0, const AmaxArgs& a) {
  rotate_group<G, D>(y, a.signs, a.rht_bf16);
  float m = 0.0f;
#pragma unroll
  for (int b = 0; b < G / B; ++b) {
    float bm = 0.0f;
#pragma unroll
    for (int j = 0; j < B; ++j) bm = fmaxf(bm, fabsf(y[b * B + j]));
    if (a.block_amax) a.block_amax[row * (a.cols / B) + col0 / B + b] = bm;
    m = fmaxf(m, bm);
  }
  return m;
}

// Block amax of the (rotated) values and the tensor amax, row-wise (thread layout of quantize_kernel).
template <class T, int B, int D>
__global__ void __launch_bounds__(kThreads) amax_kernel(const AmaxArgs a) {
  constexpr int G = B > D ? B : D;
  const int64_t groups_per_row = a.cols / G, n = a.rows * groups_per_row;
  const int64_t g = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  float m = 0.0f;
  if (g < n) {  // no early return: every thread reaches block_max_to's barrier
    RawGroup<T, G> raw;
    load_raw(static_cast<const T*>(a.x) + g * G, raw);
    float y[G];
    widen(raw, y);
    int64_t row, cg;
    split_index(g, groups_per_row, n < (int64_t(1) << 32), row, cg);
    m = group_amax<B, D, G>(y, row, cg * G, a);
  }
  block_max_to(a.tensor_amax, m);
}

// The same over X^T, reading X [a.cols, a.rows] by columns. A thread block covers quantize_t_kernel's 64 columns
// x kTRows row groups. Without block amaxes a warp takes one row group and 32 column pairs, so each row it loads
// is 128 contiguous bytes (BF16); with them (16x16 tiles), quantize_t_kernel's lane layout, whose block-amax
// stores fill whole sectors. The maximum does not depend on the order.
template <class T, int B, int D>
__global__ void __launch_bounds__(32 * kTRows) amax_t_kernel(const AmaxArgs a) {
  constexpr int G = B > D ? B : D;
  const int64_t xcols = a.rows, ngroups = a.cols / G;
  const bool by_rows = a.block_amax == nullptr;
  const int pair = by_rows ? threadIdx.x : threadIdx.y * 4 + (threadIdx.x >> 3);
  const int rgroup = by_rows ? threadIdx.y : (threadIdx.x & 7);
  const int64_t j = (int64_t(blockIdx.x) * 32 + pair) * 2;
  const int64_t gr = int64_t(blockIdx.y) * kTRows + rgroup;
  float m = 0.0f;
  if (j < xcols && gr < ngroups) {
    const bool two = j + 1 < xcols;
    RawPairs<T, G> raw;
    load_pairs<G>(static_cast<const T*>(a.x) + gr * G * xcols + j, xcols, (xcols & 1) == 0, two, raw);
    float y0[G], y1[G];
    widen_pairs<G>(raw, y0, y1);
    m = group_amax<B, D, G>(y0, j, gr * G, a);
    if (two) m = fmaxf(m, group_amax<B, D, G>(y1, j + 1, gr * G, a));
  }
  block_max_to(a.tensor_amax, m);
}

// 16x16 tiles (NVFP4 weights): every block of a tile takes the maximum over the tile's 16 rows.
__global__ void tile_amax_kernel(float* amax, int64_t rows, int64_t kb) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= (rows / 16) * kb) return;
  const int64_t r0 = (t / kb) * 16, b = t % kb;
  float m = 0.0f;
  for (int r = 0; r < 16; ++r) m = fmaxf(m, amax[(r0 + r) * kb + b]);
  for (int r = 0; r < 16; ++r) amax[(r0 + r) * kb + b] = m;
}

struct RhtArgs {
  const void* x;  // float or BF16 bits, the kernel's T
  float* y;
  int64_t rows, cols;
  bool bf16;
  float signs[kMaxRht];
};

// The unfused form's first pass: one thread rotates one block of D values and writes them back as FP32.
template <class T, int D>
__global__ void __launch_bounds__(kThreads) rht_kernel(const RhtArgs a) {
  const int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= a.rows * a.cols / D) return;
  float y[D];
  load_group<D>(static_cast<const T*>(a.x) + g * D, y);
  rotate_group<D, D>(y, a.signs, a.bf16);
  float4* out = reinterpret_cast<float4*>(a.y + g * D);
#pragma unroll
  for (int i = 0; i < D / 4; ++i) out[i] = make_float4(y[4 * i], y[4 * i + 1], y[4 * i + 2], y[4 * i + 3]);
}


// ---- dispatch -----------------------------------------------------------------------------------------------
// TR: the transposed kernels (a.rows x a.cols is X^T's shape).
inline dim3 transposed_grid(int64_t rows, int64_t cols, int G) {
  return dim3(unsigned((rows + 63) / 64), unsigned((cols / G + kTRows - 1) / kTRows));
}

template <class T, int F, int B, int D, bool TR, bool IDX>
void launch_quantize_idx(const QArgs& a, cudaStream_t s) {
  constexpr int G = B > D ? B : D;
  if constexpr (TR)
    quantize_t_kernel<T, F, B, D, IDX><<<transposed_grid(a.rows, a.cols, G), dim3(32, kTRows), 0, s>>>(a);
  else
    quantize_kernel<T, F, B, D, IDX><<<detail::blocks_for(a.rows * (a.cols / G), kThreads), kThreads, 0, s>>>(a);
}
template <class T, int F, int B, int D, bool TR>
void launch_quantize(const QArgs& a, cudaStream_t s) {
  if (a.row_index)
    launch_quantize_idx<T, F, B, D, TR, true>(a, s);
  else
    launch_quantize_idx<T, F, B, D, TR, false>(a, s);
}

template <class T, int F, int B, bool TR>
void launch_quantize_d(int d, const QArgs& a, cudaStream_t s) {
  switch (d) {
    case 0: return launch_quantize<T, F, B, 0, TR>(a, s);
    case 16: return launch_quantize<T, F, B, 16, TR>(a, s);
    case 32: return launch_quantize<T, F, B, 32, TR>(a, s);
  }
  throw std::logic_error("fused RHT size must be 0, 16 or 32");
}

template <class T, int F, bool TR>
void launch_quantize_bd(int block, int d, const QArgs& a, cudaStream_t s) {
  if (block == 16) return launch_quantize_d<T, F, 16, TR>(d, a, s);
  return launch_quantize_d<T, F, 32, TR>(d, a, s);
}

}  // namespace

template <class T, int F, bool TR>
void detail::launch_quantize_fmt(int block, int d, const QArgs& a, cudaStream_t s) {
  launch_quantize_bd<T, F, TR>(block, d, a, s);
}

}  // namespace fp4lab::cuda
