// The TCU model: units for operand fetch, the RHT front-end, the quantiser, the MAC array, the
// scale-and-accumulate stage and write-back, fed by a tile scheduler, sharing a memory system (an optional
// L2 in front of DRAM). Tiles flow through bounded queues with back-pressure, one event per k-step tile --
// never one per MAC -- so an 8192^3 GEMM simulates in well under a second. The units are threads of an event
// kernel that keeps SystemC 2.3.4's order of execution (sim/src/kernel.hpp), so the cycles are SystemC's.
//
// SystemC runs a datapath's own modules (the Verilated RTL) and has one global kernel per process: only one
// Simulator may exist at a time. Each Simulator starts a fresh kernel context, so a process can build several
// in turn (tests do).
#pragma once

#include <memory>
#include <vector>

#include "fp4lab/quantize.hpp"
#include "fp4lab/sim/config.hpp"
#include "fp4lab/sim/datapath.hpp"
#include "fp4lab/sim/report.hpp"
#include "fp4lab/sim/workload.hpp"

namespace fp4lab::sim {

namespace detail {
struct Model;
}

// The work a simulated job did, from which its energy is priced (Simulator::price).
struct JobCounters {
  double blocks = 0, acc_ops = 0, rht_ops = 0, q_elems = 0, sr_elems = 0;
  double sr_draws = 0;  // Philox4x32-10 blocks: one per 1, 4 or 16 SR elements (philox1, philox4, philox16)
  double dram_read = 0, dram_write = 0, l2_read = 0, l2_write = 0, buf_read = 0, buf_write = 0;
};

class Simulator {
 public:
  // Throws std::invalid_argument when the configuration is invalid or another Simulator is alive.
  explicit Simulator(const Config& cfg, std::shared_ptr<Datapath> datapath = std::make_shared<GoldenDatapath>());
  ~Simulator();
  Simulator(const Simulator&) = delete;
  Simulator& operator=(const Simulator&) = delete;

  const Config& config() const { return cfg_; }
  const Datapath& datapath() const { return *dp_; }

  // Timing only. Throws std::invalid_argument when the job cannot run here (shape not a multiple of the block,
  // a grid the MAC units lack without a fallback path, tile.k not a multiple of the RHT size in the front-end).
  JobReport run(const GemmJob& job);
  // Timing plus the functional datapath: the MAC array and accumulator compute C [M, N] from the quantised
  // operands (job.M x job.K and job.N x job.K) through the Datapath, tile by tile, as the schedule runs.
  JobReport run(const GemmJob& job, const QTensor& a, const QTensor& b, std::vector<float>& c);

  // Wall seconds spent inside Datapath calls since construction (the functional share of a --check run).
  double datapath_seconds() const;

  // A process-wide memo of timing-only jobs, for sweeps (off by default): a job whose timing inputs -- the
  // configuration less its energy, area, name and mac.kind (which enters the timing only through whether the grid
  // is native), the job's shape, kind and operand formats, and the cycle it starts at -- were simulated before, in
  // this Simulator or an earlier one, is answered from the memo and priced with this configuration's energy and
  // area: the same report, bit for bit, without running the model again. Returns the previous setting.
  static bool cache_jobs(bool on);
  // Jobs answered from the memo since the process started (for the sweep's benchmark).
  static uint64_t cached_jobs();

 private:
  Config cfg_;   // as given
  Config slot_;  // what the model runs: cfg_.per_slot()
  std::shared_ptr<Datapath> dp_;
  std::unique_ptr<detail::Model> model_;
  JobReport run_impl(const GemmJob& job, const QTensor* a, const QTensor* b, std::vector<float>* c);
  void price(JobReport& r, const JobCounters& work) const;
  void check_time_range(const GemmJob& job, bool native, int64_t t0) const;
};

// True when MAC units of `kind` multiply `f` natively (e2m1_max2 rides on E2M1 units, int4 on E1M2 units).
bool mac_native(MacKind kind, const ElemFormat& f);

}  // namespace fp4lab::sim
