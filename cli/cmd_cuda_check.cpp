// fp4lab cuda check: every GEMM of one or more traces quantised and multiplied on the GPU, compared bit for bit
// with the golden model (the check itself: fp4lab/cuda/check.hpp). Exit 1 on any mismatch (or when nothing was
// compared). Under mpirun -np N (built with MPI) rank r takes GPU r % device count and a share of the records
// (largest first, to the least-loaded rank, as analyze shares them: fp4lab/dist/dist.hpp); rank 0 prints the
// combined summary. The options and the trace headers are checked in every build, before any device is looked at.
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cmd_cuda_common.hpp"
#include "commands.hpp"
#include "files.hpp"
#include "fp4lab/dist/dist.hpp"
#include "fp4lab/io/safetensors.hpp"
#include "fp4lab/recipe.hpp"
#include "options.hpp"

#ifdef FP4LAB_CLI_HAS_CUDA
#include <cstdio>
#include <cstring>

#include "fp4lab/cuda/check.hpp"
#endif

namespace fp4lab::cli {

namespace {

#ifdef FP4LAB_CLI_HAS_CUDA
namespace fc = fp4lab::cuda;

std::string hex32(uint32_t u) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", u);
  return b;
}
float as_float(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// "  MISMATCH <what>: <where> ..." as the check finds it.
std::string mismatch_line(const fc::Mismatch& m) {
  std::string line = "  MISMATCH " + m.what + ": " + m.where;
  if (m.sizes)
    return line + ": sizes differ" +
           (m.floats ? "" : " (" + std::to_string(m.golden_size) + " vs " + std::to_string(m.gpu_size) + ")");
  line += " [" + std::to_string(m.row) + ", " + std::to_string(m.col) + "]: golden ";
  if (!m.floats) return line + std::to_string(m.golden) + ", gpu " + std::to_string(m.gpu);
  return line + hex32(m.golden) + " (" + std::to_string(as_float(m.golden)) + "), gpu " + hex32(m.gpu) + " (" +
         std::to_string(as_float(m.gpu)) + ")";
}
#endif

}  // namespace

int cmd_cuda_check(const Invocation& inv) {
  po::options_description desc("fp4lab cuda check options");
  std::vector<std::string> traces;
  std::string recipe_name = "ufp4", gemm_kind = "both", sr_draw = sr_draw_name(fp4lab::Recipe{}.sr_draw);
  int show = 5, limit = 0;
  uint64_t seed = 0;
  bool native = false;
  desc.add_options()(
      "trace", po::value(&traces)->multitoken()->required(), "trace folders or files (docs/spec.md §7), e.g. several steps")(
      "recipe", po::value(&recipe_name)->default_value("ufp4"), ("one of " + knob_choices("recipe", ", ")).c_str())(
      "seed", po::value(&seed)->default_value(0), "stochastic-rounding seed")(
      "sr-draw", po::value(&sr_draw)->default_value(sr_draw),
      (knob_choices("sr_draw", "|") + ": how SR draws its words (docs/spec.md §4)").c_str())(
      "gemm", po::value(&gemm_kind)->default_value("both"), "GPU GEMM kernels to check: fast, reference or both")(
      "native", po::bool_switch(&native), "also run the SM100 tcgen05 path (sm_100 device only) within its tolerance")(
      "show", po::value(&show)->default_value(5), "mismatches printed per category")(
      "limit", po::value(&limit)->default_value(0), "check only the first N GEMMs of the traces (0 = all)");
  cli::add_common_options(desc);
  po::variables_map vm;
  if (!cli::parse_args(inv, desc, "--trace DIR [DIR ..] [--recipe R] [--json FILE|-]", vm))
    return kExitOk;
  const cli::JsonOut json(vm);
  if (gemm_kind != "fast" && gemm_kind != "reference" && gemm_kind != "both")
    usage_error("--gemm must be fast, reference or both, not '" + gemm_kind + "'");
  fp4lab::Recipe recipe = gpu::preset(recipe_name);
  recipe.seed = seed;
  recipe.sr_draw = cli::parse_sr_draw(sr_draw);
  // Every rank opens every header (cheap, no tensor data): a bad trace is reported before the device is looked at.
  std::vector<std::unique_ptr<fp4lab::io::Trace>> trs;
  for (const std::string& t : traces) {
    trs.push_back(std::make_unique<fp4lab::io::Trace>(t, recipe.block));
    if (trs.back()->records().empty()) throw fp4lab::io::Error(t + ": no GEMM records");
  }
  std::vector<std::string> inputs(traces.begin(), traces.end());
  for (const auto& t : trs)
    for (const auto& r : t->records()) inputs.push_back(r.file);
  cli::check_outputs(vm, {}, inputs);
  gpu::require_gpu();  // exit 4 without CUDA in this build, 3 without a device
#ifdef FP4LAB_CLI_HAS_CUDA
  fc::CheckOptions opt;
  opt.recipe = recipe;
  opt.gemm = gemm_kind == "fast"        ? fc::CheckedGemm::fast
             : gemm_kind == "reference" ? fc::CheckedGemm::reference
                                        : fc::CheckedGemm::both;
  opt.show = show;
  opt.limit = limit;
  const fc::ConformanceCheck check(std::move(trs), opt);
  const std::vector<int> owner = dist::assign(check.sizes(), dist::size());
  const fc::DeviceInfo dev = fc::use_device(dist::rank());  // one rank per GPU
  std::ostream& out = json.table() ? std::cout : std::cerr;  // with --json -, stdout holds only the JSON
  const std::string me = dist::size() > 1 ? "[rank " + std::to_string(dist::rank()) + "] " : "";
  std::string trace_list;
  for (const auto& t : traces) trace_list += (trace_list.empty() ? "" : ", ") + printable(t);
  if (dist::rank() == 0)
    out << "fp4lab cuda check: trace " << trace_list << " (" << check.records() << " GEMMs), recipe " << recipe.name
        << ", " << dist::size() << " rank" << (dist::size() > 1 ? "s" : "") << "\n";
  out << me << "device " << dev.id << ": " << dev.name << " (sm_" << dev.cc_major << dev.cc_minor << ")\n";
  std::string native_why;
  const bool native_ok = native && fc::ConformanceCheck::native_ready(&native_why);
  if (native && !native_ok) out << "SKIPPED native tcgen05 check: " << native_why << "\n";

  fc::CheckEvents events;
  events.mismatch = [](const fc::Mismatch& m) { std::cout << mismatch_line(m) << "\n"; };
  events.gemm = [&](const fc::GemmChecked& g) {
    out << me << "  " << g.name << "  M=" << g.M << " N=" << g.N << " K=" << g.K << "  A " << g.a.label() << "  B "
        << g.b.label() << "\n";
  };
  const fc::CheckResult mine = check.run(owner, dist::rank(), native_ok, events);

  // Rank 0 adds up every rank's results (exact integer counts; the worst ratio is a max). One item per rank
  // (indexed by rank); a record's fault travels inside it, so the first in record order wins.
  const std::vector<std::string> parts = dist::gather({{size_t(dist::rank()), mine.to_bytes()}}, {});
  if (dist::rank() != 0) return dist::from_root(kExitOk);
  std::vector<fc::CheckResult> results;
  for (const std::string& p : parts) results.push_back(fc::CheckResult::from_bytes(p));
  const fc::CheckResult sum = fc::merge(results);
  if (sum.fault_index) {
    // Named once, by rank 0, through main's report; the other ranks return and end quietly with its code.
    dist::from_root(kExitData);
    throw fc::CheckFault(*sum.fault_index, sum.fault);
  }
  out << "\nsummary (GPU vs golden model, bit for bit):\n";
  for (const auto& [k, x] : sum.tallies) {
    out << "  " << x.what << std::string(x.what.size() < 16 ? 16 - x.what.size() : 1, ' ') << x.compared
        << " compared, " << x.mismatched << " mismatched";
    if (x.nan_pairs) out << " (" << x.nan_pairs << " NaN pairs counted equal)";
    out << "\n";
  }
  const uint64_t total = sum.compared(), bad = sum.mismatched();
  if (native_ok)
    out << "  native sm100    " << sum.native.compared << " compared, " << sum.native.out_of_bound
        << " outside the tolerance (worst |err|/tol " << sum.native.worst << ")\n";
  Json tallies = Json::array();
  for (const auto& [k, x] : sum.tallies)
    tallies.push_back({{"what", x.what}, {"compared", x.compared}, {"mismatched", x.mismatched}, {"nan_pairs", x.nan_pairs}});
  Json j = {{"command", "check"}, {"traces", traces}, {"recipe", recipe.name}, {"device", dev.name},
            {"tallies", tallies}, {"compared", total}, {"mismatched", bad}};
  if (native_ok)
    j["native"] = {{"compared", sum.native.compared}, {"out_of_bound", sum.native.out_of_bound},
                   {"worst", sum.native.worst}};
  json.write(j);
  if (total == 0) {
    out << "FAIL: nothing was compared\n";
    return dist::from_root(kExitData);
  }
  if (bad || sum.native.out_of_bound) {
    out << "FAIL: " << bad << " mismatches\n";
    return dist::from_root(kExitData);
  }
  out << "PASS: " << total << " values, 0 mismatches\n";
  return dist::from_root(kExitOk);
#endif
}

}  // namespace fp4lab::cli
