// How the GEMM contract's operands feed the RTL block MAC (rtl/fp4_mac_unit.sv): one beat per 16-element
// block, in ascending block order per output, with the flags the unit needs. Shared by the Verilator
// regression (tests/rtl) and the SystemC wrapper (fp4lab/rtl/sc_mac.hpp) so both drive the RTL alike.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4lab/format.hpp"
#include "fp4lab/gemm.hpp"
#include "fp4lab/quantize.hpp"

namespace fp4lab::rtl {

// The RTL's format id (fp4lab_pkg::fmt_e) is the format's index in kAllFormats; the format-table test
// checks that the two orders agree.
inline int format_id(const ElemFormat& f) {
  const int i = format_index(f);
  if (i < 0) throw std::invalid_argument(std::string("format '") + f.name + "' has no RTL id");
  return i;
}

struct MacBeat {
  uint64_t a = 0, b = 0;       // 16 codes each, element j in bits [4j+3:4j]
  uint8_t fmt_a = 0, fmt_b = 0;
  uint32_t sa = 0, sb = 0;     // FP32 bits of the decoded block scales
  bool first = false, last = false, join = false;
  uint32_t ga = 0, gb = 0;     // FP32 bits of the per-tensor factors (read on last beats)
};

// The unit's beat protocol: beat h of `halves` 16-element beats of block k of `blocks`. Every beat but a
// block's last is a join beat; the first block opens the output and the last beat of the last block
// closes it (and carries the per-tensor factors).
inline void set_beat_position(MacBeat& beat, int64_t k, int64_t blocks, int64_t h, int64_t halves) {
  beat.join = h + 1 < halves;
  beat.first = k == 0;
  beat.last = k + 1 == blocks && !beat.join;
}

// Packs 16 consecutive codes starting at `codes`.
inline uint64_t pack16(const uint8_t* codes) {
  uint64_t v = 0;
  for (int j = 0; j < kMacWidth; ++j) v |= uint64_t(codes[j] & 0xF) << (4 * j);
  return v;
}

// Appends the beats of output (m, n) of C = A . B^T: K/block blocks, a 32-element block as a join beat
// followed by its closing beat. Throws std::invalid_argument on operands the contract cannot multiply.
inline void append_mac_beats(const QTensor& a, int64_t m, const QTensor& b, int64_t n, std::vector<MacBeat>& out) {
  check_gemm_operands(a, b);
  if (a.block % kMacWidth != 0)
    throw std::invalid_argument("RTL MAC takes blocks that are multiples of " + std::to_string(kMacWidth) +
                                " elements, not " + std::to_string(a.block));
  const int64_t K = a.cols, KB = a.kblocks(), halves = a.block / kMacWidth;
  const uint32_t ga = f32_bits(tensor_factor(a.format, a.global_dec));
  const uint32_t gb = f32_bits(tensor_factor(b.format, b.global_dec));
  const uint8_t fa = uint8_t(format_id(a.format)), fb = uint8_t(format_id(b.format));
  for (int64_t k = 0; k < KB; ++k)
    for (int64_t h = 0; h < halves; ++h) {
      MacBeat beat;
      const int64_t col = k * a.block + h * kMacWidth;
      beat.a = pack16(&a.codes[size_t(m * K + col)]);
      beat.b = pack16(&b.codes[size_t(n * K + col)]);
      beat.fmt_a = fa;
      beat.fmt_b = fb;
      beat.sa = f32_bits(a.scales[size_t(m * KB + k)]);
      beat.sb = f32_bits(b.scales[size_t(n * KB + k)]);
      set_beat_position(beat, k, KB, h, halves);
      beat.ga = ga;
      beat.gb = gb;
      out.push_back(beat);
    }
}

}  // namespace fp4lab::rtl
