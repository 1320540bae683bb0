// Template part of mac_driver.hpp.
#pragma once

#include <cmath>
#include <cstdio>

#include "fp4lab/scale.hpp"
#include "reference/contract_gemm.hpp"

namespace fp4lab::rtl_test {

inline std::string describe_beat(const rtl::MacBeat& b) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "{a=%016llx %s, b=%016llx %s, sa=%s, sb=%s, first=%d last=%d join=%d, ga=%s gb=%s}",
                (unsigned long long)b.a, kAllFormats[b.fmt_a].name, (unsigned long long)b.b,
                kAllFormats[b.fmt_b].name, fmt_f32(b.sa).c_str(), fmt_f32(b.sb).c_str(), b.first, b.last, b.join,
                fmt_f32(b.ga).c_str(), fmt_f32(b.gb).c_str());
  return buf;
}

inline uint32_t golden_chain(const rtl::MacBeat* beats, size_t n) {
  float acc = 0.0f;
  int32_t held = 0;
  uint32_t out = 0;
  for (size_t i = 0; i < n; ++i) {
    const rtl::MacBeat& b = beats[i];
    int32_t p = held;
    for (int j = 0; j < kMacWidth; ++j)
      p += decode_int(kAllFormats[b.fmt_a], uint8_t((b.a >> (4 * j)) & 0xF)) *
           decode_int(kAllFormats[b.fmt_b], uint8_t((b.b >> (4 * j)) & 0xF));
    if (b.join) {
      held = p;
      continue;
    }
    held = 0;
    if (b.first) acc = 0.0f;
    acc = contract_step(acc, p, f32_from_bits(b.sa), f32_from_bits(b.sb));
    if (b.last) out = f32_bits(contract_finish(acc, f32_from_bits(b.ga), f32_from_bits(b.gb)));
  }
  return out;
}

inline bool same_f32_or_nan(uint32_t want, uint32_t got) {
  if (std::isnan(f32_from_bits(want))) return std::isnan(f32_from_bits(got));
  return want == got;
}

template <class M>
void check_gemm_tile(Dut<M>& dut, Checker& chk, const QTensor& a, const QTensor& b, const std::string& what,
                     double p_idle, double p_stall) {
  const std::vector<float> want = reference::gemm_contract(a, b);
  std::vector<rtl::MacBeat> beats;
  std::vector<size_t> start;  // first beat of each output
  for (int64_t m = 0; m < a.rows; ++m)
    for (int64_t n = 0; n < b.rows; ++n) {
      start.push_back(beats.size());
      rtl::append_mac_beats(a, m, b, n, beats);
    }
  start.push_back(beats.size());
  const uint64_t outputs = uint64_t(a.rows * b.rows);
  run_stream(
      dut, beats.size(), outputs, [&](uint64_t i) { put_beat(dut, beats[i]); },
      [&](uint64_t k) {
        const uint32_t w = f32_bits(want[k]), got = dut->out_o;
        return chk.check(
            w == got,
            [&] {
              std::string s = what + " output (" + std::to_string(k / b.rows) + ", " + std::to_string(k % b.rows) +
                              "): want " + fmt_f32(w) + " got " + fmt_f32(got) + "; beats:";
              for (size_t i = start[k]; i < start[k + 1]; ++i) s += "\n    " + describe_beat(beats[i]);
              return s;
            },
            start[k + 1] - start[k]);
      },
      p_idle, p_stall);
}

}  // namespace fp4lab::rtl_test
