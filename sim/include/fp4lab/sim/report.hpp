// What a run of the TCU model reports, per GEMM and in total, as a table and as JSON.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "fp4lab/sim/config.hpp"

namespace fp4lab::sim {

// Where the cycles of a GEMM went, seen from the MAC array (averaged over TCUs; the parts sum to `cycles`):
//   prep        separate RHT / quantise / amax passes through memory before the GEMM phase
//   fill        GEMM phase start until the first k-step reaches the MAC array (pipeline fill)
//   compute     the MAC array busy
//   bandwidth   waiting for operands held up in the memory system (bandwidth or latency)
//   rht         waiting for operands held up in the RHT front-end
//   quant       waiting for operands held up in the quantiser
//   accumulate  the MAC array blocked by the scale-and-accumulate stage or write-back
//   tail        after the TCU's last k-step: accumulate, write-back, and waiting for the slowest TCU
//   idle        TCUs that got no output tile (fewer tiles than TCUs)
inline const std::vector<std::string>& stall_categories() {
  static const std::vector<std::string> c = {"prep", "fill", "compute", "bandwidth", "rht",
                                             "quant", "accumulate", "tail", "idle"};
  return c;
}
inline const std::vector<std::string>& unit_names() {
  static const std::vector<std::string> u = {"fetch", "rht", "quant", "mac", "acc", "writeback", "dram", "l2"};
  return u;
}

struct JobReport {
  std::string name, layer, pass;
  std::string kernel = "step";     // the job's kind (JobKind): what of it ran
  int64_t M = 0, N = 0, K = 0;
  std::string format, scale, prep_mode;
  int block = 0, rht = 0;
  bool native = true;              // the MAC units take this grid natively
  double count = 1;                // weight in the totals
  int64_t cycles = 0, prep_cycles = 0;
  double time_us = 0;
  double macs = 0;                 // useful multiply-adds, M * N * K
  double mac_util = 0;             // macs / (peak per cycle * cycles)
  std::map<std::string, double> busy;    // unit -> share of cycles busy (TCU units averaged over TCUs)
  std::map<std::string, double> bytes;   // dram_read, dram_write, l2_read, l2_write, buffer_read, buffer_write
  std::map<std::string, double> stalls;  // category -> cycles (averaged over TCUs)
  std::map<std::string, double> energy_pj;  // component -> pJ
  double energy_total_pj = 0;
  // --check
  bool checked = false;
  int64_t outputs_checked = 0, mismatches = 0;
  std::string first_mismatch;
};

struct Report {
  nlohmann::json config;           // Config::to_json(): the configuration file of the run
  nlohmann::json area;             // area_json(): null where the configuration prices no area
  int64_t tokens = 0;              // tokens the run's step trains (--model); 0 = not known
  int64_t peak_macs_per_cycle = 0;
  std::string datapath;            // golden | rtl
  std::string recipe, source;  // recipe name; the trace folder or shape list
  std::vector<JobReport> jobs;
  bool checked = false;
  // Totals weight every job by its count.
  double total_cycles() const;
  double total_time_us() const;
  double total_energy_pj() const;
  double total_macs() const;
  int64_t total_mismatches() const;
  int64_t total_checked() const;
  nlohmann::json to_json() const;
  void print(std::ostream& os) const;
};

nlohmann::json job_json(const JobReport& j);
// The built units' area (NAND2 equivalents and mm^2: the MAC array and the whole unit) and static power, or null
// where the configuration gives no area.* key.
nlohmann::json area_json(const Config& c);

}  // namespace fp4lab::sim
