// The generic Verilator harness every RTL regression uses: a device under test with clock, reset and
// optional VCD tracing (+trace), a checker that counts vectors and prints the first mismatches with
// their inputs, and a valid/ready stream driver with random stalls on both sides.
//
// Plusargs (Verilator style, given after the gtest flags):
//   +trace         write <unit>.vcd in the working directory
//   +seed=N        random seed (default fixed, so a failure reproduces)
//   +scale=F       multiply every random vector count by F (e.g. +scale=10 for a long run)
//   +workloads=DIR the bundled trace, for the trace-tile tests
#pragma once

#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <verilated.h>
#include <verilated_vcd_c.h>

namespace fp4lab::rtl_test {

void set_plusargs(int argc, char** argv);
bool trace_requested();
// The value of +name=value, or "" when absent.
std::string plusarg_value(const char* name);
uint64_t seed();
// n scaled by +scale=F; never below 1.
uint64_t scaled(uint64_t n);

// A Verilated model with its own context. Combinational units use eval(); clocked ones tick().
template <class M>
class Dut {
 public:
  // Verilator 5.006 registers and erases a model's scopes in the *thread's current* context, not the
  // model's own, so with several models per process (each with its own context) that pointer must be
  // ours whenever a model is built or destroyed; otherwise it may point at a context already freed.
  explicit Dut(const std::string& name) : name_(name), ctx_(std::make_unique<VerilatedContext>()) {
    if (trace_requested()) ctx_->traceEverOn(true);
    Verilated::threadContextp(ctx_.get());
    m_ = std::make_unique<M>(ctx_.get(), name.c_str());
    if (trace_requested()) {
#if VM_TRACE
      vcd_ = std::make_unique<VerilatedVcdC>();
      m_->trace(vcd_.get(), 99);
      vcd_->open((name + ".vcd").c_str());
#else
      ADD_FAILURE() << "+trace: these models were Verilated without --trace (see rtl/verilator.f)";
#endif
    }
  }
  ~Dut() {
    Verilated::threadContextp(ctx_.get());
    if (vcd_) vcd_->close();
    m_->final();
    vcd_.reset();
    m_.reset();
  }
  Dut(const Dut&) = delete;
  Dut& operator=(const Dut&) = delete;

  M* operator->() { return m_.get(); }
  M& model() { return *m_; }

  void eval() {
    m_->eval();
    if (vcd_) vcd_->dump(time_++);
  }
  // One clock cycle: inputs set before the call are sampled at the rising edge; outputs read after the
  // call are those of the new state.
  void tick() {
    m_->clk_i = 1;
    m_->eval();
    if (vcd_) vcd_->dump(time_++);
    m_->clk_i = 0;
    m_->eval();
    if (vcd_) vcd_->dump(time_++);
    ++cycles_;
  }
  // The two halves of a cycle, for drivers that set inputs on the falling edge (one eval settles both the
  // falling edge and the new inputs) and then read the handshake before the rising edge.
  void fall() {
    m_->clk_i = 0;
    m_->eval();
    if (vcd_) vcd_->dump(time_++);
  }
  void rise() {
    m_->clk_i = 1;
    m_->eval();
    if (vcd_) vcd_->dump(time_++);
    ++cycles_;
  }
  void reset() {
    m_->clk_i = 0;
    m_->rst_ni = 0;
    m_->eval();
    tick();
    m_->rst_ni = 1;
    tick();
  }
  uint64_t cycles() const { return cycles_; }

 private:
  std::string name_;
  std::unique_ptr<VerilatedContext> ctx_;
  std::unique_ptr<M> m_;
  std::unique_ptr<VerilatedVcdC> vcd_;
  uint64_t time_ = 0, cycles_ = 0;
};

// Counts vectors and mismatches. The first `report` mismatches are printed with their inputs; the run
// should stop after `limit` of them (check() returns false). finish() fails the test on any mismatch
// and on a run that checked nothing.
class Checker {
 public:
  explicit Checker(std::string unit, uint64_t report = 10, uint64_t limit = 100)
      : unit_(std::move(unit)), report_(report), limit_(limit) {}
  // `count` vectors were verified by this one comparison (e.g. every block of a MAC chain).
  bool check(bool ok, const std::function<std::string()>& describe, uint64_t count = 1) {
    vectors_ += count;
    if (!ok) {
      if (mismatches_ < report_)
        std::fprintf(stderr, "[%s] MISMATCH #%llu: %s\n", unit_.c_str(), (unsigned long long)(mismatches_ + 1),
                     describe().c_str());
      ++mismatches_;
    }
    return mismatches_ < limit_;
  }
  uint64_t vectors() const { return vectors_; }
  uint64_t mismatches() const { return mismatches_; }
  void finish() const {
    std::printf("[%s] %llu vectors checked, %llu mismatches\n", unit_.c_str(), (unsigned long long)vectors_,
                (unsigned long long)mismatches_);
    EXPECT_GT(vectors_, 0u) << unit_ << ": a run that checked zero vectors is a failure";
    EXPECT_EQ(mismatches_, 0u) << unit_ << ": RTL disagrees with the golden model (inputs printed above)";
  }

 private:
  std::string unit_;
  uint64_t report_, limit_;
  uint64_t vectors_ = 0, mismatches_ = 0;
};

// Drives a unit with valid/ready handshakes on input (in_valid_i/in_ready_o) and output
// (out_valid_o/out_ready_i): `n` input beats, each put on the ports by drive(i); outputs are handed to
// take(k) in order (k counts outputs). Random idle cycles on the input and stalls on the output exercise
// the handshakes; with both probabilities 0 the unit runs at full rate. Returns the cycles spent.
template <class M>
uint64_t run_stream(Dut<M>& dut, uint64_t n, uint64_t expected_outputs, const std::function<void(uint64_t)>& drive,
                    const std::function<bool(uint64_t)>& take, double p_idle, double p_stall,
                    uint64_t max_cycles_per_beat = 64) {
  std::mt19937_64 rng(seed() ^ 0x5eed);
  std::bernoulli_distribution idle(p_idle), stall(p_stall);
  uint64_t sent = 0, got = 0, cycles = 0;
  const uint64_t budget = (n + 16) * max_cycles_per_beat;
  bool keep_going = true;
  while ((sent < n || got < expected_outputs) && keep_going && cycles < budget) {
    // Inputs change with the falling edge; the handshake is read once they have settled and takes
    // effect at the rising edge (two evaluations per cycle).
    const bool offer = sent < n && !(p_idle > 0 && idle(rng));
    dut->in_valid_i = offer;
    if (offer) drive(sent);
    dut->out_ready_i = !(p_stall > 0 && stall(rng));
    dut.fall();
    const bool in_fire = offer && dut->in_ready_o;
    const bool out_fire = dut->out_valid_o && dut->out_ready_i;
    if (out_fire) keep_going = take(got++);
    dut.rise();
    if (in_fire) ++sent;
    ++cycles;
  }
  EXPECT_EQ(sent, n) << "input beats accepted (ran " << cycles << " cycles)";
  EXPECT_EQ(got, expected_outputs) << "outputs produced";
  return cycles;
}

// ---- bit-level helpers ------------------------------------------------------------------------------
std::string hex32(uint32_t v);
std::string fmt_f32(uint32_t bits);  // "0x3f800000 (1)"

// Random FP32 operands that hit the corners: specials, subnormals, short significands (so products and
// sums land exactly on rounding ties), nearby exponents (cancellation) and plain random bits.
class F32Gen {
 public:
  explicit F32Gen(uint64_t s) : rng_(s) {}
  uint32_t any();
  // A second operand related to `a`: same or nearby exponent, or one that makes a tie likely.
  uint32_t near(uint32_t a);
  uint32_t bits32() { return uint32_t(rng_()); }
  std::mt19937_64& rng() { return rng_; }

 private:
  std::mt19937_64 rng_;
};

}  // namespace fp4lab::rtl_test
