#include "fp4lab/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 warns inside its own AVX-512 intrinsics (their _mm512_undefined_ps passthrough, GCC PR 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "fp4lab/philox.hpp"
#include "fp4lab/rht.hpp"

namespace fp4lab {

std::string QuantConfig::label() const {
  std::string s = std::string(format.name) + "_b" + std::to_string(block) + (tile2d ? "x16" : "") + "_" +
                  scale_name(scale) + "scale_rht" + std::to_string(rht) + "_" +
                  rounding_name(rounding);
  if (rounding == Rounding::sr) s += std::string("-") + sr_draw_name(sr_draw);
  return s;
}

void validate(const QuantConfig& cfg, int64_t rows, int64_t cols) {
  auto fail = [](const std::string& m) { throw std::invalid_argument(m); };
  if (rows <= 0 || cols <= 0)
    fail("empty tensor [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  if (!block_size_ok(cfg.block)) fail(block_size_fault(cfg.block));
  if (cols % cfg.block != 0)
    fail("reduction dimension " + std::to_string(cols) + " is not a multiple of the block size " +
         std::to_string(cfg.block));
  if (cfg.tile2d && (cfg.block != 16 || rows % 16 != 0))
    fail("16x16 tiles need block 16 and a row count that is a multiple of 16 (rows = " + std::to_string(rows) + ")");
  if (cfg.rht != 0) {
    if (!rht_size_ok(cfg.rht)) fail(rht_size_fault(cfg.rht));
    if (cols % cfg.rht != 0)
      fail("reduction dimension " + std::to_string(cols) + " is not a multiple of the RHT size " +
           std::to_string(cfg.rht));
    if (int(cfg.rht_signs.size()) != cfg.rht)
      fail("RHT needs " + std::to_string(cfg.rht) + " signs, got " + std::to_string(cfg.rht_signs.size()));
    for (float s : cfg.rht_signs)
      if (s != 1.0f && s != -1.0f) fail("RHT signs must be +1 or -1");
  }
  if (cfg.scale == ScaleKind::ue4m3 && cfg.block != 16) fail("ue4m3 scales (NVFP4) use block 16");
}

void check_finite(const float* x, int64_t n, const char* what, int64_t base) {
  // A branch-free scan of the exponent bits first (it vectorises); the element is located only on a fault.
  uint32_t all_ones = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, 4);
    all_ones |= uint32_t((b & 0x7F800000u) == 0x7F800000u);
  }
  if (!all_ones) return;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i]))
      throw std::invalid_argument(std::string(what) + ": element " + std::to_string(base + i) + " is " +
                                  (std::isnan(x[i]) ? "NaN" : "Inf") + " (4-bit grids have no such codes)");
}

namespace {

#if defined(__AVX512F__)
// RHT-16 of one block held in one register: rht_block's operations exactly, 16 lanes at once. Stage h:
// lane j with (j & h) == 0 takes y_j + y_{j+h}, lane j + h takes y_j - y_{j+h}; the partner lane comes
// from a permute. Each result is the same single FP32 add or subtract of the same operands, so the bits
// match rht_block's (checked in tests/bench/test_quantize_fast.cpp).
inline __m512 rht16(__m512 y, __m512i sign_bits) {
  y = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(y), sign_bits));  // s_j * x_j: a sign flip
  __m512 p = _mm512_permute_ps(y, 0b10'11'00'01);  // h = 1: partner j ^ 1
  y = _mm512_mask_sub_ps(_mm512_add_ps(y, p), 0xAAAA, p, y);
  p = _mm512_permute_ps(y, 0b01'00'11'10);  // h = 2: partner j ^ 2
  y = _mm512_mask_sub_ps(_mm512_add_ps(y, p), 0xCCCC, p, y);
  p = _mm512_shuffle_f32x4(y, y, 0b10'11'00'01);  // h = 4: swap neighbouring 128-bit quarters
  y = _mm512_mask_sub_ps(_mm512_add_ps(y, p), 0xF0F0, p, y);
  p = _mm512_shuffle_f32x4(y, y, 0b01'00'11'10);  // h = 8: swap the 256-bit halves
  y = _mm512_mask_sub_ps(_mm512_add_ps(y, p), 0xFF00, p, y);
  return _mm512_mul_ps(y, _mm512_set1_ps(rht_inv_sqrt(16)));
}
#endif

// dst = RHT of one row of src (cfg.rht != 0; dst may equal src), then BF16 rounding when asked.
void rotate_row(const float* src, float* dst, int64_t cols, const QuantConfig& cfg) {
  const int d = cfg.rht;
#if defined(__AVX512F__)
  if (d == 16) {
    alignas(64) uint32_t bits[16];
    for (int j = 0; j < 16; ++j) bits[j] = cfg.rht_signs[j] < 0 ? 0x8000'0000u : 0u;
    const __m512i sign_bits = _mm512_load_si512(bits);
    for (int64_t c = 0; c < cols; c += 16) _mm512_storeu_ps(dst + c, rht16(_mm512_loadu_ps(src + c), sign_bits));
  } else
#endif
  {
    if (dst != src) std::copy(src, src + cols, dst);
    for (int64_t c = 0; c < cols; c += d) rht_block(dst + c, d, cfg.rht_signs.data());
  }
  if (cfg.rht_bf16)
    for (int64_t c = 0; c < cols; ++c) dst[c] = round_to_bf16(dst[c]);
}

// The first column of a rotated row that is not finite, or -1. Finite inputs near FLT_MAX can rotate to Inf
// (a butterfly add overflows, or the BF16 rounding carries into the exponent), and Inf - Inf gives NaN;
// neither has a code, so a rotation that overflows is refused rather than quantised into Inf/NaN outputs.
int64_t first_nonfinite(const float* y, int64_t cols) {
  uint32_t all_ones = 0;  // branch-free scan (vectorises); located only on a fault
  for (int64_t c = 0; c < cols; ++c) {
    uint32_t b;
    std::memcpy(&b, y + c, 4);
    all_ones |= uint32_t((b & 0x7F800000u) == 0x7F800000u);
  }
  if (!all_ones) return -1;
  for (int64_t c = 0; c < cols; ++c)
    if (!std::isfinite(y[c])) return c;
  return -1;
}

// The lowest faulty (row, column) over the rows an OpenMP team rotated: exceptions cannot leave a parallel
// region, so rows record faults here and the caller throws after the region.
struct RotationFault {
  int64_t row = -1, col = -1;
  void note(int64_t r, int64_t c) {
#pragma omp critical(fp4lab_rotation_fault)
    if (row < 0 || r < row) {
      row = r;
      col = c;
    }
  }
  // dst = rotate_row(src); false (the fault noted as row `r` of the whole tensor) when the rotation overflowed.
  bool rotate(const float* src, float* dst, int64_t cols, const QuantConfig& cfg, int64_t r) {
    rotate_row(src, dst, cols, cfg);
    const int64_t c = first_nonfinite(dst, cols);
    if (c >= 0) note(r, c);
    return c < 0;
  }
  void raise(const QuantConfig& cfg) const {
    if (row >= 0)
      throw std::invalid_argument("RHT overflows FP32 at row " + std::to_string(row) + ", block " +
                                  std::to_string(col / cfg.rht) + " (RHT-" + std::to_string(cfg.rht) +
                                  " block of columns " + std::to_string(col / cfg.rht * cfg.rht) + ".." +
                                  std::to_string(col / cfg.rht * cfg.rht + cfg.rht - 1) + ")");
  }
};

float block_amax(const float* y, int n) {
#if defined(__AVX512F__)
  // The largest |y| is the same value whatever the order of the comparisons (inputs are finite, and fabs
  // leaves no -0), so 16 lanes at a time and a reduction give the loop's result.
  if (n % 16 == 0) {
    __m512 m = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(y + j)));
    return _mm512_reduce_max_ps(m);
  }
#endif
  float m = 0.0f;
  for (int j = 0; j < n; ++j) m = std::max(m, std::fabs(y[j]));
  return m;
}

// The named grids as compile-time constants: with the format known, round_rtne's midpoints fold to
// constants and the per-block loop vectorises. Any other tuple runs on the runtime format.
template <const ElemFormat* F>
struct FixedFormat {
  static constexpr const ElemFormat* format = F;
  const ElemFormat& get() const { return *F; }
  uint8_t rtne(float v) const { return round_rtne_fixed<F>(v); }
  uint8_t sr(float v, uint32_t r) const { return round_sr_fixed<F>(v, r); }
};
struct RuntimeFormat {
  ElemFormat f;
  const ElemFormat& get() const { return f; }
  uint8_t rtne(float v) const { return round_rtne(f, v); }
  uint8_t sr(float v, uint32_t r) const { return round_sr(f, v, r); }
};
template <class Body>
void with_format(const ElemFormat& f, Body&& body) {
  if (same_grid(f, kE2M1)) return body(FixedFormat<&kE2M1>{});
  if (same_grid(f, kE1M2)) return body(FixedFormat<&kE1M2>{});
  if (same_grid(f, kInt4)) return body(FixedFormat<&kInt4>{});
  if (same_grid(f, kE2M1Max2)) return body(FixedFormat<&kE2M1Max2>{});
  body(RuntimeFormat{f});
}

#if defined(__AVX512F__)
// round_rtne_fixed<F>(y[j] / dec) for 16 elements in one register: the same FP32 operations in the same order
// (the divide, the clamp to gmax, the power-of-two multiply, the rints, compares and the one multiply and add of
// e2m1's top stretch), so the same codes (tests/models/quantize_fast_test.cpp: against round_rtne around every
// midpoint and level, and against a step-by-step quantiser). GCC vectorises the plain loop only four lanes wide.
template <const ElemFormat* F>
inline void round16_fp32(const float* y, float dec, uint8_t* codes) {
  constexpr ElemFormat f = *F;
  const __m512 v = _mm512_div_ps(_mm512_loadu_ps(y), _mm512_set1_ps(dec));
  __m512 a = _mm512_abs_ps(v);
  const __m512 gmax = _mm512_set1_ps(f.gmax());
  a = _mm512_mask_mov_ps(a, _mm512_cmp_ps_mask(a, gmax, _CMP_GT_OQ), gmax);
  const __m512 u = f.int_shift() >= 0 ? _mm512_mul_ps(a, _mm512_set1_ps(float(1 << f.int_shift())))
                                      : _mm512_div_ps(a, _mm512_set1_ps(float(1 << -f.int_shift())));
  constexpr int kRint = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;  // nearbyint in the default mode
  __m512 idx;
  if constexpr (f.int_max() == f.max_index) {
    idx = _mm512_roundscale_ps(u, kRint);
  } else {
    static_assert(same_grid(f, kE2M1), "a fixed grid is uniform or e2m1 (round_rtne_fixed)");
    const __m512 l1 = _mm512_roundscale_ps(u, kRint);
    const __m512 l2 = _mm512_mul_ps(_mm512_set1_ps(2.0f), _mm512_roundscale_ps(_mm512_mul_ps(u, _mm512_set1_ps(0.5f)), kRint));
    const __m512 l4 = _mm512_mul_ps(_mm512_set1_ps(4.0f), _mm512_roundscale_ps(_mm512_mul_ps(u, _mm512_set1_ps(0.25f)), kRint));
    const __m512 four = _mm512_set1_ps(4.0f), eight = _mm512_set1_ps(8.0f);
    // lvl = u <= 4 ? l1 : u <= 8 ? l2 : l4
    __m512 lvl = _mm512_mask_mov_ps(l4, _mm512_cmp_ps_mask(u, eight, _CMP_LE_OQ), l2);
    lvl = _mm512_mask_mov_ps(lvl, _mm512_cmp_ps_mask(u, four, _CMP_LE_OQ), l1);
    // idx = lvl <= 4 ? lvl : lvl <= 8 ? lvl * 0.5 + 2 : 7
    const __m512 mid = _mm512_add_ps(_mm512_mul_ps(lvl, _mm512_set1_ps(0.5f)), _mm512_set1_ps(2.0f));
    idx = _mm512_mask_mov_ps(_mm512_set1_ps(7.0f), _mm512_cmp_ps_mask(lvl, eight, _CMP_LE_OQ), mid);
    idx = _mm512_mask_mov_ps(idx, _mm512_cmp_ps_mask(lvl, four, _CMP_LE_OQ), lvl);
  }
  // make_code(signbit(v), int(idx)): bit 3 the sign, bits 0-2 the index.
  const __m512i sign = _mm512_srli_epi32(_mm512_castps_si512(v), 31);
  const __m512i code = _mm512_or_si512(_mm512_slli_epi32(sign, 3),
                                       _mm512_and_si512(_mm512_cvttps_epi32(idx), _mm512_set1_epi32(7)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(codes), _mm512_cvtepi32_epi8(code));
}
template <class Fmt>
struct Round16 : std::false_type {};
template <const ElemFormat* F>
struct Round16<FixedFormat<F>> : std::true_type {};
#endif

// Scales and rounds the n values of one block (n the block size, base a multiple of it); SR draws the word for
// element index base + j.
template <class Fmt>
void round_block(const Fmt& fmt, const float* __restrict y, int n, const BlockScale& bs, const QuantConfig& cfg,
                 int64_t base, uint8_t* __restrict codes) {
  const BlockScale b = bs;
  if (cfg.rounding == Rounding::rtne) {
    // Testing scale_element's loop-invariant condition up front lets its inlined body fold to a single
    // divide in the first loop: no branch left in either loop, so both vectorise.
    const ScaleKind kind = cfg.scale;
#if defined(__AVX512F__)
    if constexpr (Round16<Fmt>::value) {
      if (kind == ScaleKind::fp32 && b.dec != 0.0f && n % 16 == 0) {
        for (int j = 0; j < n; j += 16) round16_fp32<Fmt::format>(y + j, b.dec, codes + j);
        return;
      }
    }
#endif
    if (kind == ScaleKind::fp32 && b.dec != 0.0f) {
#pragma omp simd simdlen(16)
      for (int j = 0; j < n; ++j) codes[j] = fmt.rtne(scale_element(ScaleKind::fp32, y[j], b));
    } else {
#pragma omp simd simdlen(16)
      for (int j = 0; j < n; ++j) codes[j] = fmt.rtne(scale_element(kind, y[j], b));
    }
  } else {
    // The block's words first, then the rounding in one loop without calls, so that it vectorises. philox4: one
    // Philox block per four elements, philox16 per sixteen (a block of 16 or 32 starts at a multiple of its size,
    // so its groups are the contract's, sr_word).
    uint32_t w[32];
    if (n > 32) throw std::logic_error("round_block: a block has 16 or 32 elements");
    if (cfg.sr_draw == SrDraw::philox4) {
      for (int j = 0; j < n; j += 4) sr_words4(cfg.seed, cfg.stream, uint64_t(base + j) >> 2, w + j);
    } else if (cfg.sr_draw == SrDraw::philox16) {
      for (int j = 0; j < n; j += 16) {
        uint32_t g[4];
        sr_words4(cfg.seed, cfg.stream, uint64_t(base + j) >> 4, g);
        for (int e = 0; e < 16; ++e) w[j + e] = sr_byte_word(g[e >> 2], e & 3);
      }
    } else {
      for (int j = 0; j < n; ++j) w[j] = random_bits(cfg.seed, cfg.stream, uint64_t(base + j));
    }
    const ScaleKind kind = cfg.scale;
#pragma omp simd simdlen(16)
    for (int j = 0; j < n; ++j) codes[j] = fmt.sr(scale_element(kind, y[j], b), w[j]);
  }
}

}  // namespace

namespace {
// Rows of src rotated into dst (the same rows, or another buffer of them); a row that overflows is refused, named
// as row row0 + r of the whole tensor.
void rotate_rows(const float* src, float* dst, int64_t rows, int64_t cols, const QuantConfig& cfg, int64_t row0 = 0) {
  RotationFault fault;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    fault.rotate(src + r * cols, dst + r * cols, cols, cfg, row0 + r);
  }
  fault.raise(cfg);
}
}  // namespace

std::vector<float> rotate(const float* x, int64_t rows, int64_t cols, const QuantConfig& cfg) {
  // The shape is checked here too: rotating a row whose length is not a multiple of the RHT size would
  // run past its end (analyze rotates before it quantises).
  validate(cfg, rows, cols);
  std::vector<float> y(x, x + rows * cols);
  if (cfg.rht == 0) return y;
  check_finite(x, rows * cols, "input tensor");
  rotate_rows(y.data(), y.data(), rows, cols, cfg);
  return y;
}

void rotate(const float* x, int64_t rows, int64_t cols, const QuantConfig& cfg, F32Buffer& y, int64_t row0) {
  validate(cfg, rows, cols);
  y.resize(size_t(rows * cols));
  if (cfg.rht == 0) {
    std::copy(x, x + rows * cols, y.data());
    return;
  }
  check_finite(x, rows * cols, "input tensor", row0 * cols);
  rotate_rows(x, y.data(), rows, cols, cfg, row0);
}

OperandMeta OperandMeta::of(const QuantConfig& cfg, int64_t rows, int64_t cols) {
  OperandMeta m;
  m.format = cfg.format;
  m.scale_kind = cfg.scale;
  m.block = cfg.block;
  m.tile2d = cfg.tile2d;
  m.rht = cfg.rht;
  if (cfg.rht != 0) m.rht_signs = cfg.rht_signs;
  m.rows = rows;
  m.cols = cols;
  return m;
}

QTensor QTensor::rows_panel(int64_t row0, int64_t n) const {
  if (row0 < 0 || n < 0 || row0 + n > rows)
    throw std::invalid_argument("rows [" + std::to_string(row0) + ", " + std::to_string(row0 + n) +
                                ") are not rows of the operand (" + std::to_string(rows) + ")");
  QTensor p;
  p.meta() = meta();
  p.rows = n;
  p.global_dec = global_dec;
  const int64_t kb = kblocks();
  p.codes.assign(codes.begin() + row0 * cols, codes.begin() + (row0 + n) * cols);
  p.scales.assign(scales.begin() + row0 * kb, scales.begin() + (row0 + n) * kb);
  if (!scale_codes.empty()) p.scale_codes.assign(scale_codes.begin() + row0 * kb, scale_codes.begin() + (row0 + n) * kb);
  return p;
}

std::vector<float> QTensor::dequantize() const {
  // dequant(r, c) block by block: the same two FP32 multiplies, with the 16 code values from a table.
  float value[16];
  for (int c = 0; c < 16; ++c) value[c] = decode(format, uint8_t(c));
  std::vector<float> out(size_t(rows * cols));
  const int64_t kb = kblocks();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < kb; ++b) {
      const float s = scales[r * kb + b];
      const int64_t base = r * cols + b * block;
      for (int j = 0; j < block; ++j) out[base + j] = dequant_value(value[codes[base + j] & 15], s, global_dec);
    }
  return out;
}

namespace {
// quantize_rows; `amax` null: the tensor is x, whole (row0 = 0), its amax taken here.
QTensor quantize_impl(const float* x_in, int64_t row0, int64_t rows, int64_t cols, const QuantConfig& cfg,
                      const float* tensor_amax) {
  validate(cfg, rows, cols);
  check_finite(x_in, rows * cols, "input tensor", row0 * cols);
  const ElemFormat& f = cfg.format;

  QTensor q;
  q.meta() = OperandMeta::of(cfg, rows, cols);
  const int64_t kb = cols / cfg.block;
  q.codes.assign(size_t(rows * cols), 0);
  q.scales.assign(size_t(rows * kb), 0.0f);
  if (cfg.scale != ScaleKind::fp32) q.scale_codes.assign(size_t(rows * kb), 0);

  // Without 16x16 tiles or a tensor-wide scale (ue4m3) every row stands alone: one pass per row rotates
  // it into a private buffer (when RHT is on), takes the block amax, scales and rounds, so the rotated
  // tensor is never materialised. Same steps and operations as the general path below.
  if (!cfg.tile2d && cfg.scale != ScaleKind::ue4m3) {
    RotationFault fault;
    with_format(f, [&](const auto& fmt) {
#pragma omp parallel
      {
        std::vector<float> buf(size_t(cfg.rht != 0 ? cols : 0));
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
          const float* y = x_in + r * cols;
          if (cfg.rht != 0) {
            if (!fault.rotate(y, buf.data(), cols, cfg, row0 + r)) continue;
            y = buf.data();
          }
          // Fetch the next row into L2 while this one is scaled and rounded; otherwise the rotation's
          // streaming read of it would wait on memory instead of overlapping with the rounding.
          if (r + 1 < rows)
            for (int64_t c = 0; c < cols; c += 16) __builtin_prefetch(x_in + (r + 1) * cols + c, 0, 2);
          for (int64_t b = 0; b < kb; ++b) {
            const float* yb = y + b * cfg.block;
            const BlockScale bs = block_scale(f, cfg.scale, block_amax(yb, cfg.block), 1.0f);
            q.scales[r * kb + b] = bs.dec;
            if (!q.scale_codes.empty()) q.scale_codes[r * kb + b] = bs.code;
            const int64_t i0 = r * cols + b * cfg.block;
            round_block(fmt, yb, cfg.block, bs, cfg, row0 * cols + i0, q.codes.data() + i0);
          }
        }
      }
    });
    fault.raise(cfg);
    return q;
  }

  // 1. What the scales see: the rotated tensor when RHT is on.
  std::vector<float> rotated;
  const float* x = x_in;
  if (cfg.rht != 0) {
    rotated.assign(x_in, x_in + rows * cols);
    rotate_rows(rotated.data(), rotated.data(), rows, cols, cfg, row0);
    x = rotated.data();
  }

  // 2. Block amax (|x| max over the block, or over the 16x16 tile) and the tensor amax.
  std::vector<float> amax(size_t(rows * kb), 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < kb; ++b) amax[r * kb + b] = block_amax(x + r * cols + b * cfg.block, cfg.block);
  if (cfg.tile2d)
    for (int64_t r0 = 0; r0 < rows; r0 += 16)
      for (int64_t b = 0; b < kb; ++b) {
        float m = 0.0f;
        for (int r = 0; r < 16; ++r) m = std::max(m, amax[(r0 + r) * kb + b]);
        for (int r = 0; r < 16; ++r) amax[(r0 + r) * kb + b] = m;
      }
  float s_enc = 1.0f;
  if (cfg.scale == ScaleKind::ue4m3) {
    float t = 0.0f;
    if (tensor_amax) t = *tensor_amax;
    else
      for (float m : amax) t = std::max(t, m);
    s_enc = nvfp4_global_encode(f, t);
    q.global_dec = 1.0f / s_enc;
  }

  // 3. Scale and round every element. SR draws the word for element index r*cols+c of this tensor.
  with_format(f, [&](const auto& fmt) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < kb; ++b) {
        const BlockScale bs = block_scale(f, cfg.scale, amax[r * kb + b], s_enc);
        q.scales[r * kb + b] = bs.dec;
        if (!q.scale_codes.empty()) q.scale_codes[r * kb + b] = bs.code;
        const int64_t i0 = r * cols + b * cfg.block;
        round_block(fmt, x + i0, cfg.block, bs, cfg, row0 * cols + i0, q.codes.data() + i0);
      }
  });
  return q;
}
}  // namespace

QTensor quantize(const float* x, int64_t rows, int64_t cols, const QuantConfig& cfg) {
  return quantize_impl(x, 0, rows, cols, cfg, nullptr);
}

QTensor quantize_rows(const float* x, int64_t row0, int64_t rows, int64_t cols, const QuantConfig& cfg, float amax) {
  return quantize_impl(x, row0, rows, cols, cfg, &amax);
}

float tensor_amax(const float* x, int64_t rows, int64_t cols, const QuantConfig& cfg, int64_t row0) {
  validate(cfg, rows, cols);
  check_finite(x, rows * cols, "input tensor", row0 * cols);
  std::vector<float> buf(size_t(cfg.rht != 0 ? cols : 0));
  RotationFault fault;
  float t = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* y = x + r * cols;
    if (cfg.rht != 0) {
      if (!fault.rotate(y, buf.data(), cols, cfg, row0 + r)) break;
      y = buf.data();
    }
    for (int64_t b = 0; b < cols; b += cfg.block) t = std::max(t, block_amax(y + b, cfg.block));
  }
  fault.raise(cfg);
  return t;
}

}  // namespace fp4lab
