// fp4lab::rtl::ScMac: the RTL block MAC (rtl/fp4_mac_unit.sv, dual-format build, Verilated with --sc) as
// a SystemC module, for a tensor-core model that wants the real datapath in place of the golden
// contract (fp4lab sim --rtl). Link the CMake target fp4lab_rtl_sc; translation units that include this
// header must define SC_CPLUSPLUS=201703L (the target exports it), see docs/spec.md §11.
//
// Timing: one kMacWidth-element block (beat) per clock when the RTL is ready; a result leaves latency() cycles
// after its last beat. Bind `clk` to the model's clock and call run_tile() from an SC_THREAD.
#pragma once

#include <cstdint>
#include <memory>

#include <systemc>

#include "fp4lab/quantize.hpp"

namespace fp4lab::rtl {

class ScMac : public sc_core::sc_module {
 public:
  sc_core::sc_in<bool> clk;

  explicit ScMac(sc_core::sc_module_name name);
  ~ScMac() override;

  // Computes C[m, n] = sum over blocks of A[m, :] . B[n, :] under the datapath contract for
  // m in [m0, m0 + tm), n in [n0, n0 + tn), writing c[(m - m0) * tn + (n - n0)]. The beats of all
  // outputs stream back to back (m-major, then n), so the pipeline stays full. Blocking: waits on
  // clk, so it must run in an SC_THREAD. Returns the clock cycles it took. Throws
  // std::invalid_argument on operands the contract cannot multiply or a tile outside them.
  uint64_t run_tile(const QTensor& a, const QTensor& b, int64_t m0, int64_t tm, int64_t n0, int64_t tn, float* c);

  // Cycles from accepting an output's last beat to its result (the RTL's DEPTH + 1).
  static int latency();
  // Beats (blocks of kMacWidth) and clock cycles spent in run_tile so far.
  uint64_t beats() const { return beats_; }
  uint64_t cycles() const { return cycles_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  bool reset_done_ = false;
  uint64_t beats_ = 0, cycles_ = 0;
};

}  // namespace fp4lab::rtl
