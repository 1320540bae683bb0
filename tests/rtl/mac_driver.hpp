// Drives any build of the block MAC (rtl/fp4_mac_unit.sv) with MacBeats; shared by the random, GEMM-tile
// and bundled-trace regressions.
#pragma once

#include <string>
#include <vector>

#include "fp4lab/format.hpp"
#include "fp4lab/gemm.hpp"
#include "fp4lab/rtl/mac_beats.hpp"
#include "harness.hpp"

namespace fp4lab::rtl_test {

template <class M>
void put_beat(Dut<M>& dut, const rtl::MacBeat& b) {
  dut->a_i = b.a;
  dut->b_i = b.b;
  dut->fmt_a_i = b.fmt_a;
  dut->fmt_b_i = b.fmt_b;
  dut->sa_i = b.sa;
  dut->sb_i = b.sb;
  dut->first_i = b.first;
  dut->last_i = b.last;
  dut->join_i = b.join;
  dut->ga_i = b.ga;
  dut->gb_i = b.gb;
}

std::string describe_beat(const rtl::MacBeat& b);

// The golden result of one output's beats: p by decode_int products, then the shared contract steps
// (gemm.hpp contract_step / contract_finish).
uint32_t golden_chain(const rtl::MacBeat* beats, size_t n);

bool same_f32_or_nan(uint32_t want, uint32_t got);

// C = A . B^T through the MAC, row-major [M, N]; compared with reference::gemm_contract.
template <class M>
void check_gemm_tile(Dut<M>& dut, Checker& chk, const QTensor& a, const QTensor& b, const std::string& what,
                     double p_idle = 0.0, double p_stall = 0.0);

}  // namespace fp4lab::rtl_test

#include "mac_driver_impl.hpp"
