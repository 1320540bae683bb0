// One run of `fp4lab sim`, typed: its options parsed once (the command line's, or one run of a sweep file:
// cli/sim_sweep.cpp), then executed from the typed form alone.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "knobs.hpp"
#include "fp4lab/sim/config.hpp"
#include "fp4lab/sim/workload.hpp"
#include "options.hpp"

namespace fp4lab::cli {

struct SimRun {
  std::string command_line;          // recorded in the report (and a shape list's comments)
  std::optional<JsonOut> json;       // --json FILE|- (always set once parsed)
  std::optional<std::string> config_file;  // --config: an input no output may name
  std::optional<std::string> shapes_out;
  bool print_shapes = false;

  // The workload: exactly one of a trace, a shape list, a model's training step or one kernel.
  enum class Workload { trace, shapes, model, kernel } workload = Workload::trace;
  std::string input;                 // the trace, shape list or model config.json
  bool full_size = false;            // trace: each record at its layer's full size
  int64_t tokens = 0;                // model: the step's tokens
  sim::JobKind kernel = sim::JobKind::step;
  std::vector<int64_t> dims;         // kernel: {rows, K} for quantize, else {M, N, K}
  bool check = false, rtl = false;

  sim::Config config;                // the TCU (absent --config: the defaults, only with print_shapes)
  std::string recipe = "custom";     // named in the report
  Knobs knobs;                       // the recipe knobs of every operand (fp4lab::operand_config)
  uint64_t stream0 = 0;              // GEMM g draws SR stream (stream0 + g)*8 + pass*2 + operand
  std::optional<Pass> pass;          // one GEMM of the three

  // The run's own options beside the TCU keys, in --help order: the report's config gets them, so that
  // `fp4lab sim --config REPORT.json` repeats the run.
  std::vector<std::pair<std::string, nlohmann::json>> recorded;

  // Each operand's quantiser settings (usage errors for bad knobs).
  sim::OperandConfigFn quant() const;
};

// The run `inv` describes; nullopt when it ran nothing (help, version, --list-configs printed). `in_sweep`: one run
// of a sweep, which writes no outputs of its own. Throws Error.
std::optional<SimRun> parse_sim_run(const Invocation& inv, bool in_sweep);
// Executes a run: its report to stdout and --json, or with `capture` into *capture instead (a sweep's run).
// Throws Error.
void execute_sim_run(const SimRun& run, nlohmann::json* capture);

}  // namespace fp4lab::cli
