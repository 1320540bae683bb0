// fp4lab cuda check: every GEMM of one or more traces quantised and multiplied on the GPU, compared bit for bit
// with the golden model. Exit 1 on any mismatch (or when nothing was compared). Under mpirun -np N (built with
// MPI) rank r takes GPU r % device count and a share of the records (largest first, to the least-loaded rank, as
// analyze shares them: fp4lab/dist/dist.hpp); rank 0 prints the combined summary. The options and the trace headers are
// checked in every build, before any device is looked at.
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "cuda_tools.hpp"
#include "files.hpp"
#include "fp4lab/io/safetensors.hpp"
#include "fp4lab/recipe.hpp"
#include "fp4lab/dist/dist.hpp"
#include "options.hpp"

#ifdef FP4LAB_CLI_HAS_CUDA
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "fp4lab/gemm.hpp"
#include "fp4lab/quantize.hpp"
#endif

namespace fp4lab::cli {

#ifdef FP4LAB_CLI_HAS_CUDA
namespace {
namespace fc = fp4lab::cuda;

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
std::string hex32(uint32_t u) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", u);
  return b;
}

struct Tally {
  std::string what;
  uint64_t compared = 0, mismatched = 0, nan_pairs = 0;
  int shown = 0;
};

struct Checker {
  int show = 5;
  std::map<std::string, Tally> t;

  Tally& tally(const std::string& what) {
    Tally& x = t[what];
    x.what = what;
    return x;
  }
  void mismatch(Tally& x, const std::string& line) {
    ++x.mismatched;
    if (x.shown++ < show) std::cout << "  MISMATCH " << x.what << ": " << line << "\n";
  }
  // Codes, scale codes: bytes.
  void bytes(const std::string& what, const std::string& where, const std::vector<uint8_t>& gold,
             const std::vector<uint8_t>& gpu, int64_t cols) {
    Tally& x = tally(what);
    if (gold.size() != gpu.size()) {
      mismatch(x, where + ": sizes differ (" + std::to_string(gold.size()) + " vs " + std::to_string(gpu.size()) + ")");
      return;
    }
    for (size_t i = 0; i < gold.size(); ++i) {
      ++x.compared;
      if (gold[i] != gpu[i])
        mismatch(x, where + " [" + std::to_string(i / cols) + ", " + std::to_string(i % cols) + "]: golden " +
                        std::to_string(gold[i]) + ", gpu " + std::to_string(gpu[i]));
    }
  }
  // FP32 values by bit pattern. Two NaNs count as equal but are tallied: x86 and CUDA produce different
  // canonical NaNs (0xffc00000 vs 0x7fffffff), so their payloads are not part of the contract.
  void floats(const std::string& what, const std::string& where, const std::vector<float>& gold,
              const std::vector<float>& gpu, int64_t cols) {
    Tally& x = tally(what);
    if (gold.size() != gpu.size()) {
      mismatch(x, where + ": sizes differ");
      return;
    }
    for (size_t i = 0; i < gold.size(); ++i) {
      ++x.compared;
      if (std::isnan(gold[i]) && std::isnan(gpu[i])) {
        ++x.nan_pairs;
        continue;
      }
      if (bits(gold[i]) != bits(gpu[i]))
        mismatch(x, where + " [" + std::to_string(i / cols) + ", " + std::to_string(i % cols) + "]: golden " +
                        hex32(bits(gold[i])) + " (" + std::to_string(gold[i]) + "), gpu " + hex32(bits(gpu[i])) +
                        " (" + std::to_string(gpu[i]) + ")");
    }
  }
  void tensor(const std::string& where, const fp4lab::QTensor& gold, const fp4lab::QTensor& gpu) {
    bytes("codes", where, gold.codes, gpu.codes, gold.cols);
    floats("scales", where, gold.scales, gpu.scales, gold.kblocks());
    bytes("scale codes", where, gold.scale_codes, gpu.scale_codes, gold.kblocks());
    floats("global scale", where, {gold.global_dec}, {gpu.global_dec}, 1);
  }
};

}  // namespace
#endif

int cmd_cuda_check(const Invocation& inv) {
  po::options_description desc("fp4lab cuda check options");
  std::vector<std::string> traces;
  std::string recipe_name = "ufp4", gemm_kind = "both";
  int show = 5, limit = 0;
  uint64_t seed = 0;
  bool native = false;
  desc.add_options()(
      "trace", po::value(&traces)->multitoken()->required(), "trace folders or files (docs/spec.md §7), e.g. several steps")(
      "recipe", po::value(&recipe_name)->default_value("ufp4"), ("one of " + knob_choices("recipe", ", ")).c_str())(
      "seed", po::value(&seed)->default_value(0), "stochastic-rounding seed")(
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
  // Every rank opens every header (cheap, no tensor data): a bad trace is reported before the device is looked at.
  std::vector<std::unique_ptr<fp4lab::io::Trace>> trs;
  struct Ref {
    const fp4lab::io::Trace* tr;
    const fp4lab::io::TraceRecord* rec;
  };
  std::vector<Ref> refs;  // all folders' records in order; a record's position is its SR stream, as in analyze
  std::vector<uint64_t> sizes;
  for (const std::string& t : traces) {
    trs.push_back(std::make_unique<fp4lab::io::Trace>(t, recipe.block));
    if (trs.back()->records().empty()) throw fp4lab::io::Error(t + ": no GEMM records");
    for (const auto& r : trs.back()->records()) {
      if (limit > 0 && refs.size() >= size_t(limit)) break;
      refs.push_back({trs.back().get(), &r});
      sizes.push_back(uint64_t(r.tokens * r.in + r.out * r.in + r.tokens * r.out));
    }
  }
  std::vector<std::string> inputs(traces.begin(), traces.end());
  for (const auto& t : trs)
    for (const auto& r : t->records()) inputs.push_back(r.file);
  cli::check_outputs(vm, {}, inputs);
  gpu::require_gpu();  // exit 4 without CUDA in this build, 3 without a device
#ifdef FP4LAB_CLI_HAS_CUDA
  const std::vector<int> owner = dist::assign(sizes, dist::size());
  int devices = 1;
  fc::check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  fc::check(cudaSetDevice(dist::rank() % devices), "cudaSetDevice");  // one rank per GPU
  const fc::DeviceInfo dev = fc::device_info();
  std::ostream& out = json.table() ? std::cout : std::cerr;  // with --json -, stdout holds only the JSON
  const std::string me = dist::size() > 1 ? "[rank " + std::to_string(dist::rank()) + "] " : "";
  std::string trace_list;
  for (const auto& t : traces) trace_list += (trace_list.empty() ? "" : ", ") + printable(t);
  if (dist::rank() == 0)
    out << "fp4lab cuda check: trace " << trace_list << " (" << refs.size() << " GEMMs), recipe " << recipe.name
        << ", " << dist::size() << " rank" << (dist::size() > 1 ? "s" : "") << "\n";
  out << me << "device " << dev.id << ": " << dev.name << " (sm_" << dev.cc_major << dev.cc_minor << ")\n";
  std::string native_why;
  const bool native_ok = native && fc::native_device_ok(&native_why);
  if (native && !native_ok) out << "SKIPPED native tcgen05 check: " << native_why << "\n";

  Checker ck;
  ck.show = show;
  fc::QuantWorkspace ws;
  fc::GemmWorkspace gws;
  fc::Buffer<float> dx, dc;
  uint64_t native_compared = 0, native_out_of_bound = 0;
  double native_worst = 0.0;
  size_t fault_index = SIZE_MAX;
  std::string fault_msg;
  auto check_record = [&](size_t ri) {
    const fp4lab::io::TraceRecord& rec = *refs[ri].rec;
    const fp4lab::io::Trace::Layer L = refs[ri].tr->load(rec);
    for (fp4lab::Pass pass : fp4lab::kPasses) {
      const fp4lab::PassOperands ops =
          fp4lab::pass_operands(pass, L.x.data(), L.w.data(), L.dy.data(), rec.tokens, rec.in, rec.out);
      const std::string name = printable(rec.gemm) + "." + fp4lab::pass_name(pass);  // echoed: escaped
      const fp4lab::QuantConfig ca = recipe.operand(pass, fp4lab::Operand::a, uint32_t(ri));
      const fp4lab::QuantConfig cb = recipe.operand(pass, fp4lab::Operand::b, uint32_t(ri));
      fp4lab::QTensor ga, gb;
      std::vector<float> gc;
      try {
        ga = fp4lab::quantize(ops.a.data(), ops.M, ops.K, ca);
        gb = fp4lab::quantize(ops.b.data(), ops.N, ops.K, cb);
        gc = fp4lab::gemm(ga, gb);
      } catch (const std::invalid_argument& e) {  // the data's fault (e.g. an RHT that overflows FP32), exit 1
        cli::data_error(rec.file, "gemm '" + rec.gemm + "' " + fp4lab::pass_name(pass) + ": " + e.what());
      }

      fc::DQTensor qa, qb;
      auto quantise_both_paths = [&](const std::vector<float>& x, int64_t rows, const fp4lab::QuantConfig& cfg,
                                     const fp4lab::QTensor& gold, fc::DQTensor& out, const char* role) {
        dx.upload(x);
        if (cfg.rht != 0) {  // the unfused form first, then the fused one (kept for the GEMM)
          fc::quantize(dx.data(), rows, ops.K, cfg, out, ws, nullptr, fc::RhtPath::unfused);
          ck.tensor(name + " " + role + " (" + cfg.label() + ", unfused RHT)", gold, fc::to_host(out));
        }
        fc::quantize(dx.data(), rows, ops.K, cfg, out, ws, nullptr, fc::RhtPath::fused);
        ck.tensor(name + " " + role + " (" + cfg.label() + ")", gold, fc::to_host(out));
      };
      quantise_both_paths(ops.a, ops.M, ca, ga, qa, "A");
      quantise_both_paths(ops.b, ops.N, cb, gb, qb, "B");

      dc.resize(size_t(ops.M * ops.N));
      if (gemm_kind != "reference") {
        dc.fill_bytes(0xFF);  // poison: an unwritten output cannot pass
        fc::gemm_fast(qa, qb, dc.data(), gws);
        ck.floats("gemm fast", name + " C", gc, dc.to_host(), ops.N);
      }
      if (gemm_kind != "fast") {
        dc.fill_bytes(0xFF);
        fc::gemm_reference(qa, qb, dc.data());
        ck.floats("gemm reference", name + " C", gc, dc.to_host(), ops.N);
      }
      if (native_ok && fc::native_supported(qa, qb)) {
        dc.fill_bytes(0xFF);
        fc::gemm_native_sm100(qa, qb, dc.data(), gws);
        const std::vector<float> nc = dc.to_host();
        const std::vector<double> tol = fc::native_tolerance(ga, gb);
        for (size_t i = 0; i < nc.size(); ++i) {
          ++native_compared;
          const double err = std::fabs(double(nc[i]) - double(gc[i]));
          if (!(err <= tol[i])) ++native_out_of_bound;
          native_worst = std::max(native_worst, tol[i] > 0 ? err / tol[i] : (err > 0 ? INFINITY : 0.0));
        }
      }
      out << me << "  " << name << "  M=" << ops.M << " N=" << ops.N << " K=" << ops.K << "  A " << ca.label()
                << "  B " << cb.label() << "\n";
    }
  };
  for (size_t ri = 0; ri < refs.size(); ++ri) {
    if (owner[ri] != dist::rank()) continue;
    // A bad file (or a device fault) ends this rank's share; rank 0 names the first in record order, once,
    // after every rank has reported, so no rank is left waiting.
    try {
      check_record(ri);
    } catch (const std::exception& e) {
      fault_index = ri;
      fault_msg = e.what();
      break;
    }
  }

  // Rank 0 adds up every rank's tallies (exact integer counts; the worst ratio is a max).
  Json part = {{"fault_index", fault_index == SIZE_MAX ? Json(nullptr) : Json(fault_index)},
               {"fault", fault_msg},
               {"native", {native_compared, native_out_of_bound, native_worst}},
               {"tallies", Json::array()}};
  for (const auto& [k, x] : ck.t) part["tallies"].push_back({x.what, x.compared, x.mismatched, x.nan_pairs});
  // One item per rank (indexed by rank); a record's fault travels inside it, so the first in record order wins.
  const std::vector<std::string> parts = dist::gather({{size_t(dist::rank()), part.dump()}}, {});
  if (dist::rank() != 0) return dist::from_root(kExitOk);
  std::map<std::string, Tally> sum;
  size_t first_fault = SIZE_MAX;
  native_compared = native_out_of_bound = 0;
  native_worst = 0.0;
  for (const std::string& ptext : parts) {
    const Json p = Json::parse(ptext);
    if (!p["fault_index"].is_null() && p["fault_index"].get<size_t>() < first_fault) {
      first_fault = p["fault_index"].get<size_t>();
      fault_msg = p["fault"].get<std::string>();
    }
    native_compared += p["native"][0].get<uint64_t>();
    native_out_of_bound += p["native"][1].get<uint64_t>();
    native_worst = std::max(native_worst, p["native"][2].get<double>());
    for (const Json& t : p["tallies"]) {
      Tally& x = sum[t[0].get<std::string>()];
      x.what = t[0].get<std::string>();
      x.compared += t[1].get<uint64_t>();
      x.mismatched += t[2].get<uint64_t>();
      x.nan_pairs += t[3].get<uint64_t>();
    }
  }
  if (first_fault != SIZE_MAX) {
    // Named once, by rank 0, through main's report; the other ranks return and end quietly with its code.
    dist::from_root(kExitData);
    throw Error(kExitData, fault_msg);
  }
  ck.t = std::move(sum);
  uint64_t total = 0, bad = 0;
  out << "\nsummary (GPU vs golden model, bit for bit):\n";
  for (const auto& [k, x] : ck.t) {
    out << "  " << x.what << std::string(x.what.size() < 16 ? 16 - x.what.size() : 1, ' ') << x.compared
              << " compared, " << x.mismatched << " mismatched";
    if (x.nan_pairs) out << " (" << x.nan_pairs << " NaN pairs counted equal)";
    out << "\n";
    total += x.compared;
    bad += x.mismatched;
  }
  if (native_ok)
    out << "  native sm100    " << native_compared << " compared, " << native_out_of_bound
              << " outside the tolerance (worst |err|/tol " << native_worst << ")\n";
  Json tallies = Json::array();
  for (const auto& [k, x] : ck.t)
    tallies.push_back({{"what", x.what}, {"compared", x.compared}, {"mismatched", x.mismatched}, {"nan_pairs", x.nan_pairs}});
  Json j = {{"command", "check"}, {"traces", traces}, {"recipe", recipe.name}, {"device", dev.name},
            {"tallies", tallies}, {"compared", total}, {"mismatched", bad}};
  if (native_ok) j["native"] = {{"compared", native_compared}, {"out_of_bound", native_out_of_bound}, {"worst", native_worst}};
  json.write(j);
  if (total == 0) {
    out << "FAIL: nothing was compared\n";
    return dist::from_root(kExitData);
  }
  if (bad || native_out_of_bound) {
    out << "FAIL: " << bad << " mismatches\n";
    return dist::from_root(kExitData);
  }
  out << "PASS: " << total << " values, 0 mismatches\n";
  return dist::from_root(kExitOk);
#endif
}

}  // namespace fp4lab::cli
