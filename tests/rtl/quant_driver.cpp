#include "quant_driver.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "fp4lab/philox.hpp"
#include "fp4lab/rtl/mac_beats.hpp"
#include "fp4lab/scale.hpp"

namespace fp4lab::rtl_test {

namespace {
template <class W>
void put_f32s(W& wide, const float* v, int n) {
  for (int j = 0; j < n; ++j) wide[j] = f32_bits(v[j]);
}
}  // namespace

RtlQuant rtl_quantize(Dut<Vfp4_quant_unit>& dut, const float* y, int64_t rows, int64_t cols, const QuantConfig& cfg,
                      double p_idle, double p_stall) {
  const int64_t nsub = cols / 16, kb = cols / cfg.block, nblk = rows * nsub;
  const bool shared_amax = cfg.block == 32 || cfg.tile2d;
  float s_enc = 1.0f;
  if (cfg.scale == ScaleKind::ue4m3) {
    float t = 0.0f;
    for (int64_t i = 0; i < rows * cols; ++i) t = std::max(t, std::fabs(y[i]));
    s_enc = nvfp4_global_encode(cfg.format, t);
  }
  auto drive_common = [&](uint64_t i) {
    const int64_t r = int64_t(i) / nsub, sb = int64_t(i) % nsub;
    put_f32s(dut->y_i, y + r * cols + sb * 16, 16);
    dut->fmt_i = uint32_t(rtl::format_id(cfg.format));
    dut->scale_i = uint32_t(cfg.scale);
    dut->sr_i = cfg.rounding == Rounding::sr;
    dut->s_enc_i = f32_bits(s_enc);
    // 16 words of 24 bits packed into 12 32-bit words
    uint32_t words[12] = {};
    if (cfg.rounding == Rounding::sr)
      for (int j = 0; j < 16; ++j) {
        const uint64_t idx = uint64_t(r * cols + sb * 16 + j);
        const uint64_t rb = sr_word(cfg.sr_draw, cfg.seed, cfg.stream, idx) >> 8;
        const int bit = 24 * j;
        words[bit / 32] |= uint32_t(rb << (bit % 32));
        if (bit % 32 > 8) words[bit / 32 + 1] |= uint32_t(rb >> (32 - bit % 32));
      }
    for (int w = 0; w < 12; ++w) dut->rbits_i[w] = words[w];
  };

  // Pass 1 (shared amax only): each 16-wide block's own amax.
  std::vector<uint32_t> amax_ext(size_t(nblk), 0);
  if (shared_amax) {
    std::vector<uint32_t> own(static_cast<size_t>(nblk));
    run_stream(
        dut, uint64_t(nblk), uint64_t(nblk),
        [&](uint64_t i) {
          drive_common(i);
          dut->amax_ext_en_i = 0;
        },
        [&](uint64_t k) {
          own[k] = dut->amax_o;
          return true;
        },
        p_idle, p_stall);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t sb = 0; sb < nsub; ++sb) {
        uint32_t m = 0;  // bit patterns of non-negative floats order like the values
        if (cfg.tile2d)
          for (int64_t rr = r - r % 16; rr < r - r % 16 + 16; ++rr) m = std::max(m, own[size_t(rr * nsub + sb)]);
        else
          m = std::max(own[size_t(r * nsub + (sb & ~int64_t(1)))], own[size_t(r * nsub + (sb | 1))]);
        amax_ext[size_t(r * nsub + sb)] = m;
      }
  }

  // Pass 2: quantise.
  RtlQuant out;
  out.codes.assign(size_t(rows * cols), 0);
  out.dec.assign(size_t(rows * kb), 0);
  out.scode.assign(size_t(rows * kb), 0);
  run_stream(
      dut, uint64_t(nblk), uint64_t(nblk),
      [&](uint64_t i) {
        drive_common(i);
        dut->amax_ext_en_i = shared_amax;
        dut->amax_ext_i = amax_ext[i];
      },
      [&](uint64_t k) {
        const int64_t r = int64_t(k) / nsub, sb = int64_t(k) % nsub;
        const uint64_t codes = dut->codes_o;
        for (int j = 0; j < 16; ++j) out.codes[size_t(r * cols + sb * 16 + j)] = uint8_t((codes >> (4 * j)) & 0xF);
        // Both halves of a 32-block give the same scale; keep the first half's, the second must agree.
        const size_t bi = size_t(r * kb + sb * 16 / cfg.block);
        if (sb * 16 % cfg.block == 0) {
          out.dec[bi] = dut->dec_o;
          out.scode[bi] = uint8_t(dut->scode_o);
        } else if (out.dec[bi] != dut->dec_o || out.scode[bi] != dut->scode_o) {
          out.dec[bi] = ~0u;  // halves disagree: guaranteed mismatch
        }
        return true;
      },
      p_idle, p_stall);
  return out;
}

bool compare_quant(Checker& chk, const RtlQuant& rtl, const QTensor& g, const float* y, const std::string& what) {
  const int64_t kb = g.kblocks();
  bool go = true;
  for (int64_t r = 0; r < g.rows && go; ++r)
    for (int64_t b = 0; b < kb && go; ++b) {
      const size_t bi = size_t(r * kb + b);
      bool ok = rtl.dec[bi] == f32_bits(g.scales[bi]) && rtl.scode[bi] == (g.scale_codes.empty() ? 0 : g.scale_codes[bi]);
      for (int64_t c = b * g.block; c < (b + 1) * g.block; ++c) ok = ok && rtl.codes[size_t(r * g.cols + c)] == g.codes[size_t(r * g.cols + c)];
      go = chk.check(
          ok,
          [&] {
            std::string s = what + " block (" + std::to_string(r) + ", " + std::to_string(b) + "): scale want " +
                            fmt_f32(f32_bits(g.scales[bi])) + " code " +
                            std::to_string(g.scale_codes.empty() ? 0 : g.scale_codes[bi]) + ", got " +
                            fmt_f32(rtl.dec[bi]) + " code " + std::to_string(rtl.scode[bi]) + "\n    y:";
            char buf[48];
            for (int64_t c = b * g.block; c < (b + 1) * g.block; ++c) {
              std::snprintf(buf, sizeof buf, " %08x", f32_bits(y[r * g.cols + c]));
              s += buf;
            }
            s += "\n    codes want/got:";
            for (int64_t c = b * g.block; c < (b + 1) * g.block; ++c) {
              std::snprintf(buf, sizeof buf, " %x/%x", g.codes[size_t(r * g.cols + c)], rtl.codes[size_t(r * g.cols + c)]);
              s += buf;
            }
            return s;
          },
          uint64_t(g.block / 16));
    }
  return go;
}

std::vector<float> rtl_rotate(Dut<Vfp32_rht16_unit>& dut, const float* x, int64_t rows, int64_t cols,
                              const QuantConfig& cfg, double p_idle, double p_stall) {
  if (cfg.rht != 16) throw std::invalid_argument("the RTL RHT unit is RHT-16");
  const int64_t nsub = cols / 16;
  uint32_t neg = 0;
  for (int j = 0; j < 16; ++j)
    if (cfg.rht_signs[size_t(j)] < 0) neg |= 1u << j;
  std::vector<float> y(static_cast<size_t>(rows * cols));
  run_stream(
      dut, uint64_t(rows * nsub), uint64_t(rows * nsub),
      [&](uint64_t i) {
        put_f32s(dut->x_i, x + int64_t(i) * 16, 16);
        dut->neg_i = neg;
        dut->bf16_i = cfg.rht_bf16;
      },
      [&](uint64_t k) {
        for (int j = 0; j < 16; ++j) y[size_t(int64_t(k) * 16 + j)] = f32_from_bits(dut->y_o[j]);
        return true;
      },
      p_idle, p_stall);
  return y;
}

}  // namespace fp4lab::rtl_test
