// Running workloads through a Simulator: a shape list (timing only) or a trace v1 folder (timing, and with
// `check` the functional datapath compared bit for bit with the golden model's fp4lab::gemm).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "fp4lab/io/safetensors.hpp"
#include "fp4lab/sim/report.hpp"
#include "fp4lab/sim/simulator.hpp"
#include "fp4lab/sim/workload.hpp"

namespace fp4lab::sim {

struct RunOptions {
  std::string recipe = "custom";   // printed in the report
  OperandConfigFn quant;           // each operand's quantiser settings, by pass
  std::vector<Pass> passes{std::begin(kPasses), std::end(kPasses)};
  bool check = false;              // traces only
  // Traces: the shape each record is timed at, one per record in order (the full-size shapes of trace_shapes);
  // empty: each record's own. --check still computes and compares the captured tensors' GEMMs.
  std::vector<LayerShape> record_shapes;
  // Called before each GEMM job is simulated: (1-based index, jobs in the run, GemmJob::name()).
  std::function<void(size_t, size_t, const std::string&)> progress;
};

// Wall-clock split of a run, for the benchmark: golden = quantisation + the reference GEMM (+ loading),
// datapath = the Datapath calls of the simulated MAC array and accumulator, total = everything.
struct RunTimes {
  double load = 0, quantise = 0, reference = 0, datapath = 0, total = 0;
};

Report run_shapes(Simulator& sim, const std::vector<LayerShape>& layers, const std::string& source,
                  const RunOptions& opt);
// One kernel on its own (JobKind other than step), as a GPU benchmark times it: `dims` is {rows, K} for quantize
// (operand A of pass opt.passes[0]), {M, N, K} otherwise. Timing only.
Report run_kernel(Simulator& sim, JobKind kind, const std::vector<int64_t>& dims, const RunOptions& opt);
Report run_trace(Simulator& sim, const io::Trace& trace, const std::string& source, const RunOptions& opt,
                 RunTimes* times = nullptr);

// Bit-pattern comparison of two FP32 outputs; returns the number of differing elements and describes the first.
int64_t count_mismatches(const std::vector<float>& got, const std::vector<float>& want, int64_t cols,
                         std::string* first);

}  // namespace fp4lab::sim
