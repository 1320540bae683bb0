// fp4lab sim: the cycle-approximate tensor-core unit model (sim/). Replays the three training GEMMs of every
// record of a trace (--trace DIR; --full-size times each at the layer's size in the captured step), or of every
// layer of a shape list (--shapes FILE, timing only) or of a model's training step derived from its Hugging Face
// config.json (--model FILE --tokens N, timing only), or one kernel alone as a GPU benchmark times it (--kernel
// NAME --shape DIMS, timing only; docs/validation.md), on the TCU a configuration file describes
// (--config sim/configs/*.cfg; every key of it can also be given as --key VALUE).
// With --check the simulated MAC array and accumulator compute every output through the datapath (the golden
// model's arithmetic, or the Verilated RTL with --rtl) and each is compared bit for bit with fp4lab::gemm.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <tuple>

#include "bundled_configs.hpp"
#include "commands.hpp"
#include "files.hpp"
#include "fp4lab/io/files.hpp"
#include "fp4lab/io/outputs.hpp"
#include "fp4lab/io/safetensors.hpp"
#include "fp4lab/sim/config.hpp"
#include "fp4lab/sim/model_shapes.hpp"
#include "fp4lab/sim/run.hpp"
#include "fp4lab/sim/simulator.hpp"
#include "options.hpp"
#include "sim_config.hpp"
#include "sim_run.hpp"

namespace fp4lab::cli {

// --sweep FILE: many runs of this command over MPI ranks (cli/sim_sweep.cpp), each a typed SimRun.
bool sim_sweep_requested(const Invocation& inv);
int cmd_sim_sweep(const Invocation& inv);

namespace {
// The place ("totals.cycles", "jobs[3].energy_pj.dram") of the first number in j that is not finite, or "".
std::string first_nonfinite(const nlohmann::json& j, const std::string& at = "") {
  if (j.is_number_float() && !std::isfinite(j.get<double>())) return at.empty() ? "figure" : at;
  if (j.is_object())
    for (const auto& [k, v] : j.items())
      if (std::string b = first_nonfinite(v, at.empty() ? k : at + "." + k); !b.empty()) return b;
  if (j.is_array())
    for (size_t i = 0; i < j.size(); ++i)
      if (std::string b = first_nonfinite(j[i], at + "[" + std::to_string(i) + "]"); !b.empty()) return b;
  return "";
}

// Before the run: no output (--json, `outputs`) may name an input (`inputs`, the config file); as check_outputs.
void check_run_outputs(const SimRun& run, std::vector<std::string> outputs, std::vector<std::string> inputs) {
  if (!run.json->dest.empty() && run.json->dest != "-") outputs.push_back(run.json->dest);
  if (run.config_file) inputs.push_back(*run.config_file);
  if (const auto f = io::output_fault(outputs, inputs)) throw Error(f->usage ? kExitUsage : kExitData, f->message);
}

std::vector<std::string> shapes_outputs(const SimRun& run) {
  if (!run.shapes_out) return {};
  return {*run.shapes_out};
}
}  // namespace

int cmd_sim(const Invocation& inv) {
  if (sim_sweep_requested(inv)) return cmd_sim_sweep(inv);
  if (const std::optional<SimRun> run = parse_sim_run(inv, /*in_sweep=*/false)) execute_sim_run(*run, nullptr);
  return kExitOk;
}

sim::OperandConfigFn SimRun::quant() const {
  return [knobs = knobs, stream0 = stream0](Pass p, Operand o, uint32_t gemm) {
    Knobs k = knobs;
    k["stream"] = int64_t(stream0 + gemm);
    try {
      return fp4lab::operand_config(k, p, o);
    } catch (const KnobError& e) {
      usage_error(e.what());
    }
  };
}

std::optional<SimRun> parse_sim_run(const Invocation& inv, bool in_sweep) {
  po::options_description desc("fp4lab sim options");
  desc.add_options()
      ("trace", po::value<std::string>()->value_name("DIR"), "trace v1 folder (or one .safetensors file) to replay")
      ("shapes", po::value<std::string>()->value_name("FILE"),
       "GEMM shape list (workloads/shapes/*.csv): timing only")
      ("model", po::value<std::string>()->value_name("FILE"),
       "a Hugging Face config.json: the GEMMs of one training step of that model (docs/spec.md §13), timing only; "
       "with --tokens")
      ("tokens", po::value<std::string>()->value_name("N"), "tokens of the --model training step (batch x sequence)")
      ("full-size", po::bool_switch(),
       "time each --trace record at the layer's size in the captured step (its tokens_in_pass, out_features_kept "
       "and calls_in_step metadata); --check still checks the captured tensors")
      ("shapes-out", po::value<std::string>()->value_name("FILE"),
       "also write the shape list the run times (--model or --trace) to FILE")
      ("print-shapes", po::bool_switch(),
       "print the shape list the run would time (--model or --trace) and stop: no simulation, no --config needed")
      ("kernel", po::value<std::string>()->value_name("NAME"),
       "one kernel alone, as a GPU benchmark times it: quantize (operand A's passes), unpack, mma or gemm "
       "(unpack + mma); timing only, with --shape")
      ("shape", po::value<std::string>()->value_name("DIMS"), "the kernel's shape: RxK for quantize, else MxNxK")
      ("check", po::bool_switch(), "compute every output through the simulated datapath and compare it bit for bit "
                                   "with fp4lab::gemm (traces only); any mismatch is an error")
      ("rtl", po::bool_switch(), "use the Verilated RTL datapath for the MAC array and accumulator (with --check)")
      ("sweep", po::value<std::string>()->value_name("FILE"),
       "run every configuration of a TOML sweep file instead (fp4lab sim --sweep FILE --help; docs/mpi.md)")
      ("list-configs", po::bool_switch(),
       "list the bundled TCU configurations (sim/configs/*.cfg: --config NAME) with a line on each, and stop");
  po::options_description knobs("recipe and knobs (each operand of each pass takes its recipe config; --pass picks "
                                "one of the three GEMMs)");
  add_recipe_options(knobs, /*with_role=*/false);
  desc.add(knobs);
  desc.add(sim_config_options());
  add_common_options(desc);
  po::variables_map vm;
  if (!parse_args(inv, desc, "--trace DIR [--full-size]|--shapes FILE|--model CONFIG.json --tokens N|--kernel NAME "
                  "--shape DIMS --config CFG [--recipe R] [--check] [--rtl] [--json OUT] [--shapes-out FILE|--print-shapes]", vm))
    return std::nullopt;
  if (vm["list-configs"].as<bool>()) {
    if (vm.size() != std::size_t(std::count_if(vm.begin(), vm.end(), [](const auto& kv) { return kv.second.defaulted(); })) + 1)
      usage_error("--list-configs lists the bundled configurations and runs nothing: give it alone");
    size_t width = 0;
    for (const BundledConfig& c : bundled_configs()) width = std::max(width, std::string(c.name).size());
    for (const BundledConfig& c : bundled_configs())
      std::cout << c.name << std::string(width + 2 - std::string(c.name).size(), ' ') << bundled_config_description(c)
                << "\n";
    std::cout << std::flush;
    if (!std::cout) data_error("stdout", "write failed");
    return std::nullopt;
  }
  SimRun run;
  run.command_line = inv.command_line;
  run.json.emplace(vm);
  if (vm.count("config")) run.config_file = vm["config"].as<std::string>();
  if (vm.count("shapes-out")) run.shapes_out = vm["shapes-out"].as<std::string>();
  const bool print_shapes = vm["print-shapes"].as<bool>(), full_size = vm["full-size"].as<bool>();
  if (!vm.count("config") && !print_shapes) usage_error("--config CFG is required (e.g. sim/configs/teaching.cfg)");
  if (vm.count("trace") + vm.count("shapes") + vm.count("kernel") + vm.count("model") != 1)
    usage_error("give exactly one of --trace DIR, --shapes FILE, --model FILE and --kernel NAME");
  if (vm.count("kernel") != vm.count("shape")) usage_error("--kernel NAME and --shape DIMS go together");
  if (vm.count("model") != vm.count("tokens")) usage_error("--model FILE and --tokens N go together");
  if (full_size && !vm.count("trace")) usage_error("--full-size sizes a trace's records: use it with --trace");
  if ((vm.count("shapes-out") || print_shapes) && !vm.count("model") && !vm.count("trace"))
    usage_error("--shapes-out and --print-shapes list the shapes of --model or --trace");
  if (vm.count("shapes-out") && print_shapes) usage_error("give one of --shapes-out FILE and --print-shapes");
  if (print_shapes && vm.count("json")) usage_error("--print-shapes runs nothing: it writes no --json report");
  if (print_shapes && vm["check"].as<bool>()) usage_error("--print-shapes runs nothing: it checks nothing (--check)");
  if (in_sweep && (vm.count("shapes-out") || print_shapes))
    usage_error("--shapes-out and --print-shapes are for one run, not a sweep's");
  run.print_shapes = print_shapes;
  run.full_size = full_size;
  run.check = vm["check"].as<bool>();
  run.rtl = vm["rtl"].as<bool>();
  if (run.check && !vm.count("trace")) usage_error("--check needs tensors: use --trace");
  if (run.rtl && !run.check) usage_error("--rtl drives the RTL datapath, which only runs with --check");
  if (vm.count("tokens")) {
    const std::string text = vm["tokens"].as<std::string>();
    try {
      run.tokens = int64_t(fp4lab::parse_uint(text, "tokens", uint64_t(sim::kMaxShapeDim)));
    } catch (const KnobError&) {
      run.tokens = 0;
    }
    if (run.tokens == 0)
      usage_error("--tokens: '" + shown(text) + "' is not an integer from 1 to " + std::to_string(sim::kMaxShapeDim));
  }

  if (vm.count("config")) try {
      run.config = sim_config_from(vm);
    } catch (const std::invalid_argument& e) {
      usage_error(vm["config"].as<std::string>() + ": " + e.what());
    }
  run.recipe = vm.count("recipe") ? vm["recipe"].as<std::string>() : "custom";
  // GEMM g of the workload draws SR stream (N + g)*8 + pass*2 + operand, N = --stream (0): the records of a trace
  // are numbered in the order the trace lists them (fp4lab analyze keys a record by its identity instead).
  run.stream0 = vm.count("stream") ? uint_option(vm, "stream", UINT32_MAX) : 0;
  run.knobs = recipe_knobs(vm);
  run.quant()(Pass::fwd_y, Operand::a, 0);  // option errors surface here, before anything runs
  if (vm.count("pass")) run.pass = selected_pass(vm);

  if (vm.count("model")) {
    run.workload = SimRun::Workload::model;
    run.input = vm["model"].as<std::string>();
  } else if (vm.count("trace")) {
    run.workload = SimRun::Workload::trace;
    run.input = vm["trace"].as<std::string>();
  } else if (vm.count("shapes")) {
    run.workload = SimRun::Workload::shapes;
    run.input = vm["shapes"].as<std::string>();
  } else {
    run.workload = SimRun::Workload::kernel;
    try {
      run.kernel = sim::parse_job_kind(vm["kernel"].as<std::string>());
    } catch (const std::invalid_argument& e) {
      usage_error(e.what());
    }
    if (run.kernel == sim::JobKind::step) usage_error("--kernel step is a training GEMM: use --shapes or --trace");
    run.dims = parse_dims(vm["shape"].as<std::string>(), run.kernel == sim::JobKind::quantize ? "RxK" : "MxNxK", "shape");
  }

  for (const auto& od : desc.options()) {
    const std::string& key = od->long_name();
    static const char* const kNotRun[] = {"help", "version", "config", "json", "sweep", "shapes-out", "print-shapes"};
    if (std::find(std::begin(kNotRun), std::end(kNotRun), key) != std::end(kNotRun)) continue;
    if (key == "full-size" && !full_size) continue;  // reports of other runs stay as they were
    if (key == "list-configs") continue;
    // The TCU keys are the report's configuration already (Config::to_json leaves out unset area keys).
    if (std::any_of(sim::config_keys().begin(), sim::config_keys().end(), [&](const auto& k) { return k.name == key; }))
      continue;
    if (vm.count(key)) run.recorded.emplace_back(key, option_value_json(vm[key]));
  }
  return run;
}

void execute_sim_run(const SimRun& run, nlohmann::json* capture) {
  using Workload = SimRun::Workload;
  const JsonOut& json = *run.json;
  const bool print_shapes = run.print_shapes, full_size = run.full_size;
  sim::RunOptions opt;
  opt.recipe = run.recipe;
  opt.quant = run.quant();
  if (run.pass) opt.passes = {*run.pass};
  opt.check = run.check;
  const Progress progress("sim");
  // A sweep's runs are reported by the sweep, one line each (cli/sim_sweep.cpp).
  if (!capture) opt.progress = [&progress](size_t i, size_t n, const std::string& what) { progress.step(i, n, what); };

  // --model and --trace: the layers the run times, as a shape list (--shapes-out, --print-shapes). A model's and a
  // full-size record's dimensions are rounded up to the multiples the recipe's passes need (k_multiples).
  std::vector<sim::LayerShape> layers;
  int64_t report_tokens = 0;  // --model: the step's tokens, for the figures per token
  std::vector<std::string> comments;
  std::unique_ptr<io::Trace> trace;
  std::vector<std::string> inputs;
  const auto pad = [&](const std::vector<sim::LayerShape>& exact, const std::string& file) {
    const sim::ShapeMultiples m = sim::k_multiples(opt.quant, opt.passes);
    std::vector<sim::LayerShape> padded;
    try {
      padded = sim::pad_shapes(exact, m);
    } catch (const std::invalid_argument& e) {
      data_error(file, e.what());
    }
    std::string changed;
    for (size_t i = 0; i < exact.size(); ++i)
      for (auto [name, a, b] : {std::tuple{"tokens", exact[i].tokens, padded[i].tokens},
                                std::tuple{"in", exact[i].in, padded[i].in}, std::tuple{"out", exact[i].out, padded[i].out}})
        if (a != b)
          changed += (changed.empty() ? "" : ", ") + exact[i].gemm + " " + name + " " + std::to_string(a) + " -> " +
                     std::to_string(b);
    if (!changed.empty())
      comments.push_back("Rounded up to whole blocks (tokens a multiple of " + std::to_string(m.tokens) + ", in of " +
                         std::to_string(m.in) + ", out of " + std::to_string(m.out) + "; zero padding): " + changed);
    return padded;
  };
  const std::string& path = run.input;
  if (run.workload == Workload::model) {
    inputs = {path};
    sim::ModelShapes model;
    try {
      model = sim::read_model_shapes(path, run.tokens);
    } catch (const std::invalid_argument& e) {
      throw Error(kExitData, e.what());  // already "FILE: field: fault"
    }
    report_tokens = run.tokens;
    comments.push_back("One training step of " + path + " (docs/spec.md §13): " + model.summary);
    layers = pad(model.layers, path);
  } else if (run.workload == Workload::trace) {
    trace = std::make_unique<io::Trace>(path, opt.quant(Pass::fwd_y, Operand::a, 0).block);
    inputs = {path};
    for (const io::TraceRecord& r : trace->records()) inputs.push_back(r.file);
    try {
      layers = sim::trace_shapes(*trace, full_size);
    } catch (const std::invalid_argument& e) {
      throw Error(kExitData, e.what());  // already "FILE: metadata 'KEY' ..."
    }
    comments.push_back(std::string(full_size ? "The full-size layers of the records of " : "The records of ") + path +
                       (full_size ? " (tokens_in_pass, out_features_kept, calls_in_step; docs/spec.md §13)" : ""));
    if (full_size) {
      layers = pad(layers, path);
      opt.record_shapes = layers;
    }
  }
  std::string shapes_text;
  if (run.shapes_out || print_shapes) {
    comments.push_back("Written by: " + run.command_line);
    for (std::string& c : comments) c = printable(c);
    try {
      shapes_text = sim::shapes_csv(layers, comments);
    } catch (const std::invalid_argument& e) {
      data_error(path, e.what());
    }
  }
  if (print_shapes) {
    std::cout << shapes_text << std::flush;
    if (!std::cout) data_error("stdout", "write failed");
    return;
  }

  std::shared_ptr<sim::Datapath> dp;
  try {
    dp = sim::make_datapath(run.rtl ? "rtl" : "golden");
  } catch (const std::invalid_argument& e) {
    usage_error(e.what());
  }

  sim::Report report;
  sim::Simulator simulator(run.config, dp);
  if (run.workload == Workload::kernel) {
    check_run_outputs(run, {}, {});
    try {
      report = sim::run_kernel(simulator, run.kernel, run.dims, opt);
    } catch (const std::invalid_argument& e) {
      usage_error(e.what());
    }
  } else if (run.workload == Workload::shapes) {
    std::vector<sim::LayerShape> layers;
    try {
      layers = sim::read_shapes(path);
    } catch (const std::invalid_argument& e) {
      throw Error(kExitData, e.what());  // already "FILE:LINE: fault"
    }
    check_run_outputs(run, {}, {path});  // before the run: --json must not name an input
    try {
      report = sim::run_shapes(simulator, layers, path, opt);
    } catch (const std::invalid_argument& e) {
      data_error(path, e.what());
    }
  } else if (run.workload == Workload::model) {
    check_run_outputs(run, shapes_outputs(run), inputs);  // before the run: no output may name the config
    try {
      report = sim::run_shapes(simulator, layers, path, opt);
    } catch (const std::invalid_argument& e) {
      data_error(path, e.what());
    }
  } else {
    // Before the run: --json and --shapes-out must not name an input or a trace file.
    check_run_outputs(run, shapes_outputs(run), inputs);
    try {
      report = sim::run_trace(simulator, *trace, path, opt);
    } catch (const std::invalid_argument& e) {
      data_error(path, e.what());
    }
  }

  report.tokens = report_tokens;
  nlohmann::json j = report.to_json();
  // Every figure of a report is finite: one that is not (a workload too large to total in a double) ends the run as a
  // data error naming its input, never as a table or JSON of inf or nan with exit 0 (docs/spec.md §11.1).
  if (const std::string bad = first_nonfinite(j); !bad.empty())
    data_error(report.source, "the report's " + bad + " is not a finite number (the workload is too large to total)");
  if (json.table() && !capture) {
    // GEMM names come from the trace's tensor names: no control byte of theirs reaches the terminal raw.
    std::ostringstream table;
    report.print(table);
    std::cout << printable(table.str(), /*keep_newlines=*/true);
  }
  j["command"] = run.command_line;
  for (const auto& [key, v] : run.recorded)
    if (!j["config"].contains(key)) j["config"][key] = v;
  if (capture) {
    *capture = j;
  } else if (run.shapes_out) {
    // Both outputs or neither: the shape list is committed once the report is written.
    io::AtomicFile f(*run.shapes_out);
    f.write(shapes_text.data(), shapes_text.size());
    f.close();
    json.write(j);
    f.commit();
  } else {
    json.write(j);
  }
  if (run.check) {
    if (report.total_checked() == 0) data_error("", "--check compared no outputs (empty trace or no pass selected)");
    if (report.total_mismatches() > 0) {
      for (const auto& g : report.jobs)
        if (g.mismatches > 0)
          data_error("", std::to_string(report.total_mismatches()) + " outputs differ from fp4lab::gemm; first in " +
                             g.name + ": " + g.first_mismatch);
    }
  }
}

}  // namespace fp4lab::cli
