#include "fp4lab/rtl/sc_mac.hpp"

#include <stdexcept>
#include <string>
#include <vector>

#include "Vfp4_mac_unit_sc.h"
#include "fp4lab/rtl/mac_beats.hpp"
#include "fp4lab/scale.hpp"

namespace fp4lab::rtl {

struct ScMac::Impl {
  explicit Impl(const char* name) : rtl(name) {
    rtl.rst_ni(rst_n);
    rtl.in_valid_i(in_valid);
    rtl.in_ready_o(in_ready);
    rtl.a_i(a);
    rtl.b_i(b);
    rtl.fmt_a_i(fmt_a);
    rtl.fmt_b_i(fmt_b);
    rtl.sa_i(sa);
    rtl.sb_i(sb);
    rtl.first_i(first);
    rtl.last_i(last);
    rtl.join_i(join);
    rtl.ga_i(ga);
    rtl.gb_i(gb);
    rtl.out_valid_o(out_valid);
    rtl.out_ready_i(out_ready);
    rtl.out_o(out);
  }
  Vfp4_mac_unit_sc rtl;
  sc_core::sc_signal<bool> rst_n{"rst_n"}, in_valid{"in_valid"}, in_ready{"in_ready"};
  sc_core::sc_signal<uint64_t> a{"a"}, b{"b"};
  sc_core::sc_signal<uint32_t> fmt_a{"fmt_a"}, fmt_b{"fmt_b"}, sa{"sa"}, sb{"sb"}, ga{"ga"}, gb{"gb"};
  sc_core::sc_signal<bool> first{"first"}, last{"last"}, join{"join"}, out_valid{"out_valid"}, out_ready{"out_ready"};
  sc_core::sc_signal<uint32_t> out{"out"};
};

ScMac::ScMac(sc_core::sc_module_name name) : sc_module(name), clk("clk"), impl_(std::make_unique<Impl>("rtl")) {
  impl_->rtl.clk_i(clk);  // the Verilated module's clock port binds straight to ours
}

ScMac::~ScMac() = default;

int ScMac::latency() { return FP4LAB_RTL_SC_DEPTH + 1; }

uint64_t ScMac::run_tile(const QTensor& a, const QTensor& b, int64_t m0, int64_t tm, int64_t n0, int64_t tn,
                         float* c) {
  if (m0 < 0 || tm < 0 || m0 + tm > a.rows || n0 < 0 || tn < 0 || n0 + tn > b.rows)
    throw std::invalid_argument("RTL MAC tile [" + std::to_string(m0) + "+" + std::to_string(tm) + ", " +
                                std::to_string(n0) + "+" + std::to_string(tn) + "] lies outside the " +
                                std::to_string(a.rows) + " x " + std::to_string(b.rows) + " output");
  std::vector<MacBeat> beats;
  for (int64_t m = m0; m < m0 + tm; ++m)
    for (int64_t n = n0; n < n0 + tn; ++n) append_mac_beats(a, m, b, n, beats);
  const size_t outputs = size_t(tm * tn);
  Impl& s = *impl_;
  auto negedge = [&] { sc_core::wait(clk.negedge_event()); };
  if (!reset_done_) {
    s.rst_n.write(false);
    negedge();
    negedge();
    s.rst_n.write(true);
    negedge();
    reset_done_ = true;
  }
  // Inputs change on the falling edge; the RTL samples them on the rising one. Two delta cycles let the
  // Verilated model settle its combinational outputs (ready) before the handshake is read.
  size_t sent = 0, got = 0;
  uint64_t cycles = 0;
  s.out_ready.write(true);
  while (got < outputs) {
    negedge();
    if (s.out_valid.read()) c[got++] = f32_from_bits(s.out.read());  // taken at the coming rising edge
    const bool offer = sent < beats.size();
    s.in_valid.write(offer);
    if (offer) {
      const MacBeat& bt = beats[sent];
      s.a.write(bt.a);
      s.b.write(bt.b);
      s.fmt_a.write(bt.fmt_a);
      s.fmt_b.write(bt.fmt_b);
      s.sa.write(bt.sa);
      s.sb.write(bt.sb);
      s.first.write(bt.first);
      s.last.write(bt.last);
      s.join.write(bt.join);
      s.ga.write(bt.ga);
      s.gb.write(bt.gb);
    }
    sc_core::wait(sc_core::SC_ZERO_TIME);
    sc_core::wait(sc_core::SC_ZERO_TIME);
    if (offer && s.in_ready.read()) ++sent;
    ++cycles;
  }
  s.in_valid.write(false);
  beats_ += beats.size();
  cycles_ += cycles;
  return cycles;
}

}  // namespace fp4lab::rtl
