// Block quantiser: optional RHT, block scale (fp32 / ue4m3 / ue8m0), rounding onto a 4-bit grid.
//
// The per-block and per-element arithmetic is written once here as inline host/device functions and
// used by the golden model, the SystemC model, the RTL harness and the CUDA kernels alike. Blocks run
// along rows (the GEMM's reduction dimension): a tensor [rows, cols] has rows x cols/block scales.
#pragma once

#include <cfloat>
#include <cstdint>
#include <array>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fp4lab/buffer.hpp"
#include "fp4lab/format.hpp"
#include "fp4lab/philox.hpp"
#include "fp4lab/scale.hpp"

namespace fp4lab {

// ---- per-tensor and per-block scale arithmetic (docs/spec.md §2) ----------------------------------

// NVFP4 global encode scale S_enc = min(448 * gmax / amax(tensor), FLT_MAX), as Transformer Engine computes it
// (compute_global_encode_scaling_factor_FP4); 1 for an all-zero tensor or when the quotient is 0. The clamp
// matters for a tiny but normal amax (below about 8e-36 for e2m1): the quotient overflows, and FLT_MAX keeps
// the block scales in UE4M3's range where 1 would flush every one of them to zero.
FP4LAB_HD inline float nvfp4_global_encode(const ElemFormat& f, float tensor_amax) {
  const float q = (448.0f * f.gmax()) / tensor_amax;
  const float s = q > 3.40282347e+38f ? 3.40282347e+38f : q;  // FLT_MAX (a literal: usable in device code)
  return (tensor_amax == 0.0f || s == 0.0f) ? 1.0f : s;
}

struct BlockScale {
  float dec = 0;     // decoded block scale: element value = grid value * dec (* global_dec for ue4m3)
  float enc = 0;     // multiplier applied to inputs (ue4m3, ue8m0*); fp32 divides by dec instead
  uint8_t code = 0;  // E4M3 / E8M0 bit pattern; 0 for fp32
};

// Block scale from the block's amax. s_enc is the tensor's S_enc (ue4m3 only).
FP4LAB_HD inline BlockScale block_scale(const ElemFormat& f, ScaleKind kind, float amax, float s_enc) {
  BlockScale b;
  switch (kind) {
    case ScaleKind::fp32:
      b.dec = amax / f.gmax();
      break;
    case ScaleKind::ue4m3: {
      // Transformer Engine's order: multiplier = S_enc * FP32(1/gmax); scale = amax * multiplier,
      // clamped to 448, then cast to E4M3 (RTNE); encode = 1 / (E4M3 value * S_dec).
      const float mult = s_enc * (1.0f / f.gmax());
      float s = amax * mult;
      s = s < FLT_MAX ? s : FLT_MAX;
      s = s < 448.0f ? s : 448.0f;
      b.code = ue4m3_encode(s);
      b.dec = e4m3_decode(b.code);
      const float e = 1.0f / (b.dec * (1.0f / s_enc));
      b.enc = e < FLT_MAX ? e : FLT_MAX;
      break;
    }
    case ScaleKind::ue8m0:
    case ScaleKind::ue8m0_ceil: {
      // An all-zero block takes the smallest scale, and so does a block whose amax / gmax underflows to 0
      // (amax <= 3 * 2^-149 for E2M1): the exact ceil(log2) is then below -127 and clamps there.
      int X = -127;
      if (kind == ScaleKind::ue8m0 && amax > 0.0f) X = floor_log2(amax) - f.emax();
      if (kind == ScaleKind::ue8m0_ceil && amax / f.gmax() > 0.0f) X = ceil_log2(amax / f.gmax());
      b.code = e8m0_encode_exp(X);
      b.dec = e8m0_decode(b.code);
      b.enc = e8m0_decode(uint8_t(254 - b.code));  // 2^-X, exact
      break;
    }
  }
  return b;
}

// The value handed to the rounder for input x in a block with scale b.
FP4LAB_HD inline float scale_element(ScaleKind kind, float x, const BlockScale& b) {
  if (kind == ScaleKind::fp32) return b.dec == 0.0f ? x * 0.0f : x / b.dec;  // underflowed scale -> zeros
  return x * b.enc;
}

// The reciprocal scale_fp32_by_reciprocal takes, once per block: 1 / dec, correctly rounded.
FP4LAB_HD inline float fp32_step_reciprocal(const BlockScale& b) { return 1.0f / b.dec; }

// scale_element for fp32 scales, bit for bit, without a division per element: `recip` is
// fp32_step_reciprocal(b), computed once per block. q = x * recip is within an ulp of x / dec, the residual x - q * dec is exact as one FMA, and
// q + residual * recip rounded once is x / dec correctly rounded (Markstein's theorem: the reciprocal correctly
// rounded, nothing under- or overflowing on the way, which the ranges below keep). Any other x or scale (zero,
// tiny, huge, non-finite) takes scale_element itself. The quantiser kernels use it; the models' tests hold it to
// scale_element (QuantizeStep.*).
// The range inside which it takes the reciprocal, for a scale and magnitudes from lo to hi: a quantiser that knows
// a block's smallest and largest magnitude tests the block once and calls scale_fp32_in_range for each element.
FP4LAB_HD inline bool fp32_step_in_range(const BlockScale& b, float lo, float hi) {
  return b.dec >= 0x1p-60f && b.dec <= 0x1p60f && lo >= 0x1p-60f && hi <= 0x1p60f;
}
FP4LAB_HD inline float scale_fp32_in_range(float x, const BlockScale& b, float recip) {
  const float q = x * recip;
  return fmaf(fmaf(-q, b.dec, x), recip, q);
}
FP4LAB_HD inline float scale_fp32_by_reciprocal(float x, const BlockScale& b, float recip) {
  const float ax = x < 0.0f ? -x : x;
  if (fp32_step_in_range(b, ax, ax)) return scale_fp32_in_range(x, b, recip);
  return scale_element(ScaleKind::fp32, x, b);
}

// A quantised element's value: (grid value * block scale) * global_dec, two FP32 products in that order (the
// dequantiser and the fake quantiser, host and device, all compute it here).
FP4LAB_HD inline float dequant_value(float grid, float block_scale, float global_dec) {
  return grid * block_scale * global_dec;
}
// The same where global_dec is 1 (every scale but ue4m3): the product by 1 changes no finite value (nor an
// infinity), so it is left out; only a NaN product (from no finite input) may differ in its payload.
FP4LAB_HD inline float dequant_value_unit_global(float grid, float block_scale) { return grid * block_scale; }

// ---- whole-tensor quantiser (golden model) --------------------------------------------------------

struct QuantConfig {
  ElemFormat format = kE1M2;
  int block = 16;                 // elements per scale along a row: 16 or 32
  bool tile2d = false;            // 16x16 tiles: one scale per 16 rows x 16 columns (NVFP4 weights)
  ScaleKind scale = ScaleKind::fp32;
  int rht = 0;                    // Hadamard size d; 0 = no rotation
  std::vector<float> rht_signs;   // d entries of +-1
  bool rht_bf16 = false;          // round rotated values to BF16 before amax (Transformer Engine)
  Rounding rounding = Rounding::rtne;
  uint64_t seed = 0;              // stochastic rounding key
  uint32_t stream = 0;            // tensor id in the SR counter
  SrDraw sr_draw = kDefaultSrDraw;  // how SR draws its words (philox.hpp); last, so older pickles still load

  std::string label() const;      // e.g. "e1m2_b16_fp32scale_rht16_rtne", "..._sr-philox4"

  // Every setting, once, in declaration order (and kFieldNames their names, as the Python keywords spell them):
  // equality and the Python binding's pickling walk this list, so a field added later cannot be left out of
  // either without a compile error (kFieldNames' size is checked against it).
  auto fields() {
    return std::tie(format, block, tile2d, scale, rht, rht_signs, rht_bf16, rounding, seed, stream, sr_draw);
  }
  auto fields() const {
    return std::tie(format, block, tile2d, scale, rht, rht_signs, rht_bf16, rounding, seed, stream, sr_draw);
  }
  static constexpr std::array<const char*, 11> kFieldNames = {"format", "block", "tile2d", "scale",  "rht",    "rht_signs",
                                                              "rht_bf16", "rounding", "seed", "stream", "sr_draw"};
};

namespace detail {
// A format compares by its grid (two spellings of one grid are one setting), everything else by ==.
inline bool field_equal(const ElemFormat& a, const ElemFormat& b) { return same_grid(a, b); }
template <class T>
bool field_equal(const T& a, const T& b) { return a == b; }
template <class Tuple, size_t... I>
bool fields_equal(const Tuple& a, const Tuple& b, std::index_sequence<I...>) {
  return (field_equal(std::get<I>(a), std::get<I>(b)) && ...);
}
}  // namespace detail

inline bool operator==(const QuantConfig& a, const QuantConfig& b) {
  using Fields = decltype(a.fields());
  static_assert(std::tuple_size_v<Fields> == QuantConfig::kFieldNames.size(), "a QuantConfig field without a name");
  return detail::fields_equal(a.fields(), b.fields(), std::make_index_sequence<std::tuple_size_v<Fields>>());
}
inline bool operator!=(const QuantConfig& a, const QuantConfig& b) { return !(a == b); }

// What a quantised operand is apart from its data: format, scale encoding, blocking, the rotation it was
// quantised under and its shape. The host (QTensor) and device (cuda::DQTensor) operands both are one, so
// moving an operand between them, or taking part of one, copies this as one value.
struct OperandMeta {
  ElemFormat format = kE1M2;
  ScaleKind scale_kind = ScaleKind::fp32;
  int block = 16;
  bool tile2d = false;
  // The rotation the operand was quantised under (docs/spec.md §3): a GEMM multiplies only operands rotated
  // alike, or both unrotated, so an operand carries it for check_gemm_operands.
  int rht = 0;                       // Hadamard size; 0 = not rotated
  std::vector<float> rht_signs;      // its d signs (+-1); empty when rht = 0
  int64_t rows = 0, cols = 0;

  // The operand cfg quantises a [rows, cols] tensor into.
  static OperandMeta of(const QuantConfig& cfg, int64_t rows, int64_t cols);
  OperandMeta& meta() { return *this; }
  const OperandMeta& meta() const { return *this; }
  int64_t kblocks() const { return cols / block; }
};

struct QTensor : OperandMeta {
  std::vector<uint8_t> codes;        // rows x cols; bit 3 sign, bits 0-2 magnitude index
  std::vector<float> scales;         // rows x cols/block decoded block scales (2-D tiles repeat per row)
  std::vector<uint8_t> scale_codes;  // same shape: E4M3 / E8M0 bit patterns; empty for fp32
  float global_dec = 1.0f;           // S_dec for ue4m3; 1 otherwise

  float dequant(int64_t r, int64_t c) const {
    return dequant_value(decode(format, codes[r * cols + c]), scales[r * kblocks() + c / block], global_dec);
  }
  std::vector<float> dequantize() const;
  // Rows [row0, row0 + n) as an operand of their own: the same settings, those rows' codes and scales. Throws
  // std::invalid_argument for rows outside the tensor.
  QTensor rows_panel(int64_t row0, int64_t n) const;
};

// Throws std::invalid_argument with a one-line reason on a bad shape, configuration or a non-finite input.
// The block sizes the contract defines (docs/spec.md §2): the one rule every layer and front-end applies.
inline bool block_size_ok(int block) { return block == 16 || block == 32; }
inline std::string block_size_fault(int block) {
  return "block size must be 16 or 32, not " + std::to_string(block);
}

void validate(const QuantConfig& cfg, int64_t rows, int64_t cols);
// `base`: the index of x[0] in the tensor a fault names (x may hold some of its rows).
void check_finite(const float* x, int64_t n, const char* what, int64_t base = 0);

// The values the block scales see: x rotated by RHT (and rounded to BF16 when asked), or x itself.
std::vector<float> rotate(const float* x, int64_t rows, int64_t cols, const QuantConfig& cfg);
// The same into y (resized to rows x cols), written once rather than copied and then rotated in place. x may be rows
// [row0, ..) of a larger tensor, which faults then name.
void rotate(const float* x, int64_t rows, int64_t cols, const QuantConfig& cfg, F32Buffer& y, int64_t row0 = 0);

QTensor quantize(const float* x, int64_t rows, int64_t cols, const QuantConfig& cfg);

// Rows [row0, row0 + rows) of a larger tensor quantised as quantize() quantises them within it, so that a large
// tensor can be quantised a panel of rows at a time: x holds those rows only, stochastic rounding draws by element
// index in the whole tensor, ue4m3's block scales take the whole tensor's `amax` (tensor_amax of it, or the largest
// over its panels), faults name rows and elements of the whole. With 16x16 tiles row0 and rows are multiples of 16.
QTensor quantize_rows(const float* x, int64_t row0, int64_t rows, int64_t cols, const QuantConfig& cfg, float amax);
// The tensor amax ue4m3's scales take: the largest |value| the block scales see (rotated, and rounded to BF16,
// when asked). The largest over a tensor's panels (rows [row0, ..)) is the whole's (a maximum has no order).
float tensor_amax(const float* x, int64_t rows, int64_t cols, const QuantConfig& cfg, int64_t row0 = 0);

}  // namespace fp4lab
