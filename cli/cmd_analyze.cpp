// fp4lab analyze: the docs/spec.md §6 analyses of every GEMM in a trace — per tensor (fwd_x, fwd_w, bwd_dy)
// and per training GEMM (fwd_y, bwd_dx, bwd_dw), for each grid with and without RHT — as the paper's Q1
// table on stdout and analysis JSON v1 on request. With no --trace it runs on the bundled trace.
// The analysis is the library fp4lab/trace_analysis.hpp; this file parses the options, spreads the records over
// MPI ranks (fp4lab/dist/dist.hpp) and writes the report.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include "commands.hpp"
#include "faults.hpp"  // and fp4lab/dist/dist.hpp
#include "files.hpp"
#include "fp4lab/trace_analysis.hpp"
#include "options.hpp"

#ifndef FP4LAB_DEFAULT_TRACE
#define FP4LAB_DEFAULT_TRACE "workloads/tiny-lm/step_005000"
#endif

namespace fp4lab::cli {

namespace {
// The trace analyze reads without --trace, found when it runs (a checkout or build folder may move): $FP4LAB_TRACE;
// else the bundled trace of the checkout the executable sits in (build*/bin/fp4lab, two folders up); else that of
// the checkout it was built from.
std::string default_trace() {
  if (const char* e = std::getenv("FP4LAB_TRACE"); e && *e) return e;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path t = exe.parent_path().parent_path().parent_path() / "workloads/tiny-lm/step_005000";
    if (std::filesystem::is_directory(t, ec)) return t.string();
  }
  return FP4LAB_DEFAULT_TRACE;
}

// The Q1 table: per (gemm, role) and (gemm, pass) the SQNR of each setting, the deltas and inversion where both
// grids are given with and without RHT, B_eff of the tensors, the decay, and the recipes' GEMMs.
void print_table(const AnalysisResult& r) {
  const std::vector<AnalysisSetting>& settings = r.plan.settings;
  std::string trace_path;
  for (const auto& p : r.traces) trace_path += (trace_path.empty() ? "" : ", ") + p;
  std::cout << fmt("fp4lab analyze: %s — %zu GEMMs, %lld elements, 1x%d blocks, %s scales, RTNE (%.1f s)\n\n",
                   printable(trace_path).c_str(), r.records.size(), (long long)r.elements, r.plan.block,
                   scale_name(r.plan.scale), r.seconds);
  auto db = [](double v) { return sqnr_text(v, 10, 2); };  // "  21.96 dB", or "     exact" for no error
  auto find = [&](const char* f, int d) -> size_t {
    for (size_t i = 0; i < settings.size(); ++i)
      if (std::string(settings[i].format.name) == f && settings[i].rht == d) return i;
    return 0;
  };
  const bool can_invert = r.inversion.has_value();
  const int d = r.plan.inversion_rht;
  const size_t e2_0 = find("e2m1", 0), e2_r = find("e2m1", d), e1_0 = find("e1m2", 0), e1_r = find("e1m2", d);
  auto inverted = [&](const AnalysisRow& x) { return x.sqnr[e2_0] > x.sqnr[e1_0] && x.sqnr[e1_r] > x.sqnr[e2_r]; };
  // One column width for every setting, wide enough for its longest header ("Beff e2m1 no-rht"), so no header is
  // cut and the cells line up under it.
  int w = 14;
  for (const auto& s : settings) w = std::max(w, int(("Beff " + s.label()).size()));
  auto header = [&](const char* title, bool with_beff) {
    std::cout << title << "\n" << fmt("%-26s %-7s", "gemm", "");
    for (const auto& s : settings) std::cout << fmt(" %*s", w, s.label().c_str());
    if (can_invert) std::cout << fmt(" %8s %8s", "dE2M1", "dE1M2");
    if (with_beff)
      for (const auto& s : settings) std::cout << fmt(" %*s", w, ("Beff " + s.label()).c_str());
    std::cout << "\n";
  };
  auto row = [&](const AnalysisRow& x, bool with_beff) {
    std::cout << fmt("%-26s %-7s", printable(x.gemm).c_str(), x.what.c_str());
    for (double v : x.sqnr) std::cout << fmt(" %*s", w, db(v).c_str());
    if (can_invert)
      std::cout << " " << delta_text(x.sqnr[e2_r] - x.sqnr[e2_0], 8, 2) << " " << delta_text(x.sqnr[e1_r] - x.sqnr[e1_0], 8, 2);
    if (with_beff)
      for (double v : x.beff) std::cout << fmt(" %*.3f", w, v);
    if (can_invert && inverted(x)) std::cout << "  inversion";
    std::cout << "\n";
  };
  header("Tensor SQNR (dB; with RHT against the rotated tensor), d = SQNR(RHT) - SQNR(none), and B_eff", true);
  for (const RecordResult& rec : r.records)
    for (const AnalysisRow& x : rec.tensor_rows) row(x, true);
  std::cout << "\n";
  header("GEMM-output SQNR (dB) against the float64 product of the unquantised operands", false);
  for (const RecordResult& rec : r.records)
    for (const AnalysisRow& x : rec.gemm_rows) row(x, false);
  if (can_invert)
    std::cout << fmt("\nInversion (E2M1 ahead without RHT, E1M2 ahead with RHT-%d): %zu of %zu tensors, %zu of %zu GEMMs\n",
                     d, r.inversion->tensors.size(), r.inversion->tensors_total, r.inversion->gemms.size(),
                     r.inversion->gemms_total);
  std::cout << "\nShrinkage through the forward chain: prod(eta) over fwd_y GEMMs = exp(-sum delta)\n";
  for (const auto& [label, v] : r.decay) std::cout << fmt("  %-16s %.6f\n", label.c_str(), v);
  if (!r.plan.recipes.empty()) {
    std::cout << "\nTraining recipes (each pass with the recipe's own operand settings)\n";
    for (const RecordResult& rec : r.records)
      for (const GemmEntry& e : rec.gemms)
        if (!e.g.recipe.empty())
          std::cout << fmt("  %-10s %-26s %-7s SQNR %s  eta %.6f\n", e.g.recipe.c_str(), printable(e.gemm).c_str(),
                           e.g.pass.c_str(), db(e.g.sqnr_db).c_str(), e.g.eta);
  }
}

// The options' text, typed by the knob parsers (options.hpp: a bad value is a usage error with the message it has
// everywhere); the library checks what is left (a value given twice, an empty list, a sign count against an RHT
// size). Signs are read only when a setting rotates, the seed only for recipe runs: unused, they are not checked.
AnalysisOptions analysis_options(const po::variables_map& vm) {
  AnalysisOptions o;
  o.traces = vm["trace"].as<std::vector<std::string>>();
  o.formats.clear();
  for (const auto& f : split_list(vm["formats"].as<std::string>())) o.formats.push_back(parse_format(f));
  o.rht.clear();
  for (const auto& r : split_list(vm["rht"].as<std::string>())) o.rht.push_back(parse_rht(r, "rht"));
  o.block = vm["block"].as<int>();
  o.scale = parse_scale(vm["scale"].as<std::string>());
  o.rht_seed = uint_option(vm, "rht-seed", UINT64_MAX);
  o.sr_draw = parse_sr_draw(vm["sr-draw"].as<std::string>());  // a name, checked even where no recipe runs
  const bool rotates = std::any_of(o.rht.begin(), o.rht.end(), [](int d) { return d != 0; });
  if (vm.count("rht-signs") && rotates) {
    const std::string& t = vm["rht-signs"].as<std::string>();
    o.rht_signs = t == "te" ? AnalysisOptions::RhtSigns{true, {}}
                            : AnalysisOptions::RhtSigns{false, parse_rht_signs(t, 0)};
  }
  if (vm.count("recipe")) {
    const std::string& t = vm["recipe"].as<std::string>();
    o.recipes = t == "all" ? Recipe::preset_names() : split_list(t);
    if (!o.recipes->empty()) o.seed = uint_option(vm, "seed", UINT64_MAX);
  }
  return o;
}

// The library's faults with the command line's exit codes: 2 for an option, 1 for the data.
template <class F>
auto library(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const AnalysisError& e) {
    throw Error(e.usage ? kExitUsage : kExitData, e.what());
  }
}

// The records spread over the ranks (by operand size, largest first, to the least-loaded rank); each rank analyses
// its own, and rank 0 merges all of them in record order (docs/mpi.md). Other ranks get no result. One process
// analyses every record itself.
std::optional<AnalysisResult> analyze_over_ranks(const TraceAnalysis& ta) {
  const Progress progress("analyze");
  const std::vector<int> owner = dist::assign(ta.record_sizes(), dist::size());
  std::vector<size_t> my;
  for (size_t ri = 0; ri < owner.size(); ++ri)
    if (owner[ri] == dist::rank()) my.push_back(ri);
  RecordBatch batch = ta.analyze(my, [&](size_t i, size_t n, const std::string& gemm) {
    progress.step(i, n, dist::size() > 1 ? gemm + " (rank " + std::to_string(dist::rank()) + ")" : gemm);
  });
  std::vector<RecordResult> results;
  if (dist::size() == 1) {
    if (batch.fault) std::rethrow_exception(batch.fault);
    results = std::move(batch.results);
  } else {
    // Each record's results travel to rank 0 exactly (doubles as their bits); gather() names the first fault in
    // record order, the one a single process would have met.
    std::vector<dist::Item> items;
    for (size_t k = 0; k < batch.results.size(); ++k) items.push_back({my[k], to_bytes(batch.results[k])});
    batch.results.clear();
    dist::Fault fault;
    if (batch.fault) {
      fault.index = my[batch.fault_at];
      fault.code = describe(batch.fault, "analyze", fault.msg);
    }
    const std::vector<std::string> bytes = dist::gather(std::move(items), fault);
    if (!dist::root()) return std::nullopt;
    for (const std::string& b : bytes) results.push_back(record_from_bytes(b));
  }
  AnalysisResult r = ta.merge(std::move(results));
  r.seconds = progress.seconds();
  return r;
}
}  // namespace

int cmd_analyze(const Invocation& inv) {
  po::options_description desc("fp4lab analyze options");
  desc.add_options()
      ("trace",
       po::value<std::vector<std::string>>()
           ->multitoken()
           ->default_value(std::vector<std::string>{default_trace()}, default_trace())
           ->value_name("DIR|FILE .."),
       "trace v1 folders or files, e.g. several steps of a run (default: $FP4LAB_TRACE, else the bundled trace "
       "workloads/tiny-lm/step_005000 of the checkout holding this executable)")
      ("formats", po::value<std::string>()->default_value("e2m1,e1m2")->value_name("F,.."), "grids to compare")
      ("rht", po::value<std::string>()->default_value("none,16")->value_name("D,.."),
       "RHT settings to compare: none (or 0) and Hadamard sizes (powers of two, 16 to 128)")
      ("rht-signs", po::value<std::string>()->value_name("S1,..,SD|te"),
       "RHT signs (default te, Transformer Engine's, for d = 16; seeded for other sizes)")
      ("rht-seed", po::value<std::string>()->default_value("0")->value_name("S"),
       "seed of the RHT signs for sizes without --rht-signs other than 16")
      ("block", po::value<int>()->default_value(16)->value_name("B"), "block size along the reduction dimension")
      ("scale", po::value<std::string>()->default_value("fp32")->value_name("S"),
       ("block scale " + knob_choices("scale", "|") + " (docs/spec.md §6 pins fp32 amax/gmax)").c_str())
      ("recipe", po::value<std::string>()->value_name("R,..|all"),
       ("also run the three GEMMs under these training recipes (" + knob_choices("recipe", ", ") +
        "; all: the presets)").c_str())
      ("seed", po::value<std::string>()->default_value("0")->value_name("S"), "stochastic-rounding seed of recipe runs")
      ("sr-draw", po::value<std::string>()->default_value(sr_draw_name(AnalysisOptions{}.sr_draw))->value_name("D"),
       (knob_choices("sr_draw", "|") + ": how the recipe runs' SR draws its words (docs/spec.md §4)").c_str());
  add_common_options(desc);
  po::variables_map vm;
  if (!parse_args(inv, desc, "[--trace DIR] [--formats e2m1,e1m2] [--rht none,16] [--recipe R,..] [--json FILE|-]", vm))
    return kExitOk;
  const JsonOut json(vm);

  const AnalysisOptions o = analysis_options(vm);
  AnalysisPlan plan = library([&] { return plan_analysis(o); });

  // Every rank opens every header (no tensor data: cheap) so that all see the same record list; agreed on,
  // so a folder one rank cannot read fails the whole job at once.
  std::unique_ptr<TraceAnalysis> ta;
  dist::agree(describer("analyze"), [&] { ta = library([&] { return std::make_unique<TraceAnalysis>(o.traces, plan); }); });
  library([&] { ta->validate(); });
  check_outputs(vm, {}, ta->inputs());

  const std::optional<AnalysisResult> r = analyze_over_ranks(*ta);
  if (!r) return kExitOk;  // rank 0 writes the one report
  if (json.table()) print_table(*r);
  json.write_pieces([&](const Json& stamps, const JsonOut::Sink& sink) {
    write_analysis_json(*r, inv.command_line, stamps, sink);
  });
  return kExitOk;
}

}  // namespace fp4lab::cli
