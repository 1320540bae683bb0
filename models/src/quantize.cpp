#include "fp4lab/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "fp4lab/philox.hpp"
#include "fp4lab/rht.hpp"

namespace fp4lab {

std::string QuantConfig::label() const {
  std::string s = std::string(format.name) + "_b" + std::to_string(block) + (tile2d ? "x16" : "") + "_" +
                  scale_name(scale) + "scale_rht" + std::to_string(rht) + "_" +
                  (rounding == Rounding::rtne ? "rtne" : "sr");
  return s;
}

void validate(const QuantConfig& cfg, int64_t rows, int64_t cols) {
  auto fail = [](const std::string& m) { throw std::invalid_argument(m); };
  if (rows <= 0 || cols <= 0)
    fail("empty tensor [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  if (cfg.block != 16 && cfg.block != 32) fail("block size must be 16 or 32, not " + std::to_string(cfg.block));
  if (cols % cfg.block != 0)
    fail("reduction dimension " + std::to_string(cols) + " is not a multiple of the block size " +
         std::to_string(cfg.block));
  if (cfg.tile2d && (cfg.block != 16 || rows % 16 != 0))
    fail("16x16 tiles need block 16 and a row count that is a multiple of 16 (rows = " + std::to_string(rows) + ")");
  if (cfg.rht != 0) {
    if (!rht_size_ok(cfg.rht) || cfg.rht < 16)
      fail("RHT size must be a power of two from 16 to 128, not " + std::to_string(cfg.rht));
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

void check_finite(const float* x, int64_t n, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i]))
      throw std::invalid_argument(std::string(what) + ": element " + std::to_string(i) + " is " +
                                  (std::isnan(x[i]) ? "NaN" : "Inf") + " (4-bit grids have no such codes)");
}

std::vector<float> rotate(const float* x, int64_t rows, int64_t cols, const QuantConfig& cfg) {
  std::vector<float> y(x, x + rows * cols);
  if (cfg.rht == 0) return y;
  const int d = cfg.rht;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* row = y.data() + r * cols;
    for (int64_t c = 0; c < cols; c += d) rht_block(row + c, d, cfg.rht_signs.data());
    if (cfg.rht_bf16)
      for (int64_t c = 0; c < cols; ++c) row[c] = round_to_bf16(row[c]);
  }
  return y;
}

std::vector<float> QTensor::dequantize() const {
  std::vector<float> out(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = dequant(r, c);
  return out;
}

QTensor quantize(const float* x_in, int64_t rows, int64_t cols, const QuantConfig& cfg) {
  validate(cfg, rows, cols);
  check_finite(x_in, rows * cols, "input tensor");
  const ElemFormat& f = cfg.format;

  // 1. What the scales see: the rotated tensor when RHT is on.
  std::vector<float> rotated;
  const float* x = x_in;
  if (cfg.rht != 0) {
    rotated = rotate(x_in, rows, cols, cfg);
    x = rotated.data();
  }

  QTensor q;
  q.format = f;
  q.scale_kind = cfg.scale;
  q.block = cfg.block;
  q.tile2d = cfg.tile2d;
  q.rows = rows;
  q.cols = cols;
  const int64_t kb = cols / cfg.block;
  q.codes.assign(size_t(rows * cols), 0);
  q.scales.assign(size_t(rows * kb), 0.0f);
  if (cfg.scale != ScaleKind::fp32) q.scale_codes.assign(size_t(rows * kb), 0);

  // 2. Block amax (|x| max over the block, or over the 16x16 tile) and the tensor amax.
  std::vector<float> amax(size_t(rows * kb), 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < kb; ++b) {
      float m = 0.0f;
      for (int j = 0; j < cfg.block; ++j) m = std::max(m, std::fabs(x[r * cols + b * cfg.block + j]));
      amax[r * kb + b] = m;
    }
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
    for (float m : amax) t = std::max(t, m);
    s_enc = nvfp4_global_encode(f, t);
    q.global_dec = 1.0f / s_enc;
  }

  // 3. Scale and round every element. SR draws the word for element index r*cols+c of this tensor.
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < kb; ++b) {
      const BlockScale bs = block_scale(f, cfg.scale, amax[r * kb + b], s_enc);
      q.scales[r * kb + b] = bs.dec;
      if (!q.scale_codes.empty()) q.scale_codes[r * kb + b] = bs.code;
      for (int j = 0; j < cfg.block; ++j) {
        const int64_t i = r * cols + b * cfg.block + j;
        const float v = scale_element(cfg.scale, x[i], bs);
        q.codes[i] = cfg.rounding == Rounding::rtne ? round_rtne(f, v)
                                                    : round_sr(f, v, random_bits(cfg.seed, cfg.stream, uint64_t(i)));
      }
    }
  return q;
}

}  // namespace fp4lab
