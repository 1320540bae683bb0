// fp4lab sim: the cycle-approximate tensor-core unit model (sim/). Replays the three training GEMMs of every
// record of a trace (--trace DIR), or of every layer of a shape list (--shapes FILE, timing only), or one kernel
// alone as a GPU benchmark times it (--kernel NAME --shape DIMS, timing only; docs/validation.md), on the TCU
// a configuration file describes (--config sim/configs/*.cfg; every key of it can also be given as --key VALUE).
// With --check the simulated MAC array and accumulator compute every output through the datapath (the golden
// model's arithmetic, or the Verilated RTL with --rtl) and each is compared bit for bit with fp4lab::gemm.
#include <algorithm>
#include <iostream>
#include <sstream>

#include "commands.hpp"
#include "files.hpp"
#include "fp4lab/io/safetensors.hpp"
#include "fp4lab/sim/config.hpp"
#include "fp4lab/sim/run.hpp"
#include "fp4lab/sim/simulator.hpp"
#include "options.hpp"

namespace fp4lab::cli {

// --sweep FILE: many runs of this command over MPI ranks (cli/sim_sweep.cpp), each through run_sim.
bool sim_sweep_requested(const Invocation& inv);
int cmd_sim_sweep(const Invocation& inv);
int run_sim(const Invocation& inv, nlohmann::json* capture);

int cmd_sim(const Invocation& inv) {
  return sim_sweep_requested(inv) ? cmd_sim_sweep(inv) : run_sim(inv, nullptr);
}

// One run. With `capture` the report goes there (for a sweep) instead of to stdout and --json.
int run_sim(const Invocation& inv, nlohmann::json* capture) {
  po::options_description desc("fp4lab sim options");
  desc.add_options()
      ("trace", po::value<std::string>()->value_name("DIR"), "trace v1 folder (or one .safetensors file) to replay")
      ("shapes", po::value<std::string>()->value_name("FILE"),
       "GEMM shape list (workloads/shapes/*.csv): timing only")
      ("kernel", po::value<std::string>()->value_name("NAME"),
       "one kernel alone, as a GPU benchmark times it: quantize (operand A's passes), unpack, mma or gemm "
       "(unpack + mma); timing only, with --shape")
      ("shape", po::value<std::string>()->value_name("DIMS"), "the kernel's shape: RxK for quantize, else MxNxK")
      ("check", po::bool_switch(), "compute every output through the simulated datapath and compare it bit for bit "
                                   "with fp4lab::gemm (traces only); any mismatch is an error")
      ("rtl", po::bool_switch(), "use the Verilated RTL datapath for the MAC array and accumulator (with --check)")
      ("sweep", po::value<std::string>()->value_name("FILE"),
       "run every configuration of a TOML sweep file instead (fp4lab sim --sweep FILE --help; docs/mpi.md)");
  po::options_description knobs("recipe and knobs (each operand of each pass takes its recipe config; --pass picks "
                                "one of the three GEMMs)");
  add_recipe_options(knobs, /*with_role=*/false);
  desc.add(knobs);
  desc.add(sim::Config::options());
  add_common_options(desc);
  po::variables_map vm;
  if (!parse_args(inv, desc, "--trace DIR|--shapes FILE|--kernel NAME --shape DIMS --config CFG [--recipe R] [--check] [--rtl] [--json OUT]", vm))
    return kExitOk;
  const JsonOut json(vm);
  if (!vm.count("config")) usage_error("--config CFG is required (e.g. sim/configs/teaching.cfg)");
  if (vm.count("trace") + vm.count("shapes") + vm.count("kernel") != 1)
    usage_error("give exactly one of --trace DIR, --shapes FILE and --kernel NAME");
  if (vm.count("kernel") != vm.count("shape")) usage_error("--kernel NAME and --shape DIMS go together");
  const bool check = vm["check"].as<bool>(), rtl = vm["rtl"].as<bool>();
  if (check && !vm.count("trace")) usage_error("--check needs tensors: use --trace");
  if (rtl && !check) usage_error("--rtl drives the RTL datapath, which only runs with --check");

  sim::Config cfg;
  try {
    cfg = sim::Config::from(vm);
  } catch (const std::invalid_argument& e) {
    usage_error(vm["config"].as<std::string>() + ": " + e.what());
  }
  sim::RunOptions opt;
  opt.recipe = vm.count("recipe") ? vm["recipe"].as<std::string>() : "custom";
  // GEMM g of the workload draws SR stream (N + g)*8 + pass*2 + operand, N = --stream (0): the records of a trace
  // are numbered as fp4lab analyze and fp4lab cuda check number them.
  const uint64_t stream0 = vm.count("stream") ? uint_option(vm, "stream", UINT32_MAX) : 0;
  opt.quant = [&vm, stream0](Pass p, Operand o, uint32_t gemm) {
    Knobs k = recipe_knobs(vm);
    k["stream"] = int64_t(stream0 + gemm);
    try {
      return fp4lab::operand_config(k, p, o);
    } catch (const KnobError& e) {
      usage_error(e.what());
    }
  };
  opt.quant(Pass::fwd_y, Operand::a, 0);  // option errors surface here, before anything runs
  if (vm.count("pass")) opt.passes = {selected_pass(vm)};
  opt.check = check;
  const Progress progress("sim");
  // A sweep's runs are reported by the sweep, one line each (cli/sim_sweep.cpp).
  if (!capture) opt.progress = [&progress](size_t i, size_t n, const std::string& what) { progress.step(i, n, what); };

  std::shared_ptr<sim::Datapath> dp;
  try {
    dp = sim::make_datapath(rtl ? "rtl" : "golden");
  } catch (const std::invalid_argument& e) {
    usage_error(e.what());
  }

  sim::Report report;
  sim::Simulator simulator(cfg, dp);
  if (vm.count("kernel")) {
    sim::JobKind kind = sim::JobKind::step;
    try {
      kind = sim::parse_job_kind(vm["kernel"].as<std::string>());
    } catch (const std::invalid_argument& e) {
      usage_error(e.what());
    }
    if (kind == sim::JobKind::step) usage_error("--kernel step is a training GEMM: use --shapes or --trace");
    const std::vector<int64_t> dims =
        parse_dims(vm["shape"].as<std::string>(), kind == sim::JobKind::quantize ? "RxK" : "MxNxK", "shape");
    check_outputs(vm, {}, {});
    try {
      report = sim::run_kernel(simulator, kind, dims, opt);
    } catch (const std::invalid_argument& e) {
      usage_error(e.what());
    }
  } else if (vm.count("shapes")) {
    const std::string path = vm["shapes"].as<std::string>();
    std::vector<sim::LayerShape> layers;
    try {
      layers = sim::read_shapes(path);
    } catch (const std::invalid_argument& e) {
      throw Error(kExitData, e.what());  // already "FILE:LINE: fault"
    }
    check_outputs(vm, {}, {path});  // before the run: --json must not name an input
    try {
      report = sim::run_shapes(simulator, layers, path, opt);
    } catch (const std::invalid_argument& e) {
      data_error(path, e.what());
    }
  } else {
    const std::string path = vm["trace"].as<std::string>();
    const io::Trace trace(path, opt.quant(Pass::fwd_y, Operand::a, 0).block);
    std::vector<std::string> inputs = {path};
    for (const io::TraceRecord& r : trace.records()) inputs.push_back(r.file);
    check_outputs(vm, {}, inputs);  // before the run: --json must not name an input or a trace file
    try {
      report = sim::run_trace(simulator, trace, path, opt);
    } catch (const std::invalid_argument& e) {
      data_error(path, e.what());
    }
  }

  if (json.table() && !capture) {
    // GEMM names come from the trace's tensor names: no control byte of theirs reaches the terminal raw.
    std::ostringstream table;
    report.print(table);
    std::cout << printable(table.str(), /*keep_newlines=*/true);
  }
  nlohmann::json j = report.to_json();
  j["command"] = inv.command_line;
  // The run's own options beside the TCU keys, so that `fp4lab sim --config REPORT.json` repeats the run.
  for (const auto& od : desc.options()) {
    const std::string& key = od->long_name();
    static const char* const kNotRun[] = {"help", "version", "config", "json", "sweep"};
    if (std::find(std::begin(kNotRun), std::end(kNotRun), key) != std::end(kNotRun)) continue;
    if (vm.count(key) && !j["config"].contains(key)) j["config"][key] = option_value_json(vm[key]);
  }
  if (capture) *capture = j;
  else json.write(j);
  if (check) {
    if (report.total_checked() == 0) data_error("", "--check compared no outputs (empty trace or no pass selected)");
    if (report.total_mismatches() > 0) {
      for (const auto& g : report.jobs)
        if (g.mismatches > 0)
          data_error("", std::to_string(report.total_mismatches()) + " outputs differ from fp4lab::gemm; first in " +
                             g.name + ": " + g.first_mismatch);
    }
  }
  return kExitOk;
}

}  // namespace fp4lab::cli
