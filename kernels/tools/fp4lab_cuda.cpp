// fp4lab-cuda: run the CUDA kernels against the golden model (check) and time them (bench).
//
//   fp4lab-cuda check --trace DIR [DIR ..] [--recipe R]
//                                               every GEMM of the traces, quantised and multiplied on the GPU,
//                                               compared bit for bit with the golden model; exit 1 on any
//                                               mismatch (or when nothing was compared). Under mpirun -np N
//                                               (built with MPI) rank r takes GPU r % device count and a share
//                                               of the records (largest first, to the least-loaded rank);
//                                               rank 0 prints the combined summary.
//   fp4lab-cuda bench [--trace DIR]              quantise (plain / fused RHT / unfused RHT), achieved bandwidth
//                                               against a device-to-device copy, block-scaled GEMM against
//                                               cuBLAS BF16; trace shapes and 8192 x 8192
//   fp4lab-cuda qbench [--shape RxC ..]         BF16 quantiser per recipe and variant (plain, RHT-16, SR;
//                                               row-wise and transposed) beside a copy of the same bytes
//   fp4lab-cuda timings [--quant RxK ..] [--gemm MxNxK ..]
//                                               per-kernel medians of repeats (copy, the three quantiser
//                                               passes, the fast GEMM's unpack, mma and whole call) as JSON rows
// Options, --help/--version/--config FILE/--json FILE|-, output-path checks and one-line errors come from fp4lab's
// own helpers (cli/options.hpp, cli/files.hpp), so both tools parse and report alike.
// Exit codes: 0 ok, 1 mismatch or bad data, 2 usage, 3 no usable CUDA device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "files.hpp"
#include "fp4lab/cuda/kernels.hpp"
#include "fp4lab/gemm.hpp"
#include "fp4lab/io/safetensors.hpp"
#include "fp4lab/quantize.hpp"
#include "fp4lab/recipe.hpp"
#include "fp4lab/rht.hpp"
#include "fp4lab/scale.hpp"
#include "mpi_dist.hpp"  // ranks, the record-to-rank rule and the gather of fp4lab analyze
#include "options.hpp"

namespace po = boost::program_options;
using Json = nlohmann::ordered_json;
namespace fc = fp4lab::cuda;
namespace cli = fp4lab::cli;

namespace {

constexpr int kExitMismatch = 1, kExitUsage = 2, kExitNoDevice = 3;

// The usage fault of fp4lab's helpers (exit 2).
[[noreturn]] void usage_error(const std::string& msg) { cli::usage_error(msg); }

cli::Invocation invocation(const char* cmd, const std::vector<std::string>& args) {
  cli::Invocation inv;
  inv.program = "fp4lab-cuda";
  inv.command = cmd;
  inv.args = args;
  return inv;
}

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

bool require_device(const char* cmd) {
  std::string why;
  if (fc::device_available(&why)) return true;
  std::cerr << "fp4lab-cuda " << cmd << ": error: no usable CUDA device (" << why << ")" << std::endl;
  return false;
}

// ---- ranks ----------------------------------------------------------------------------------------------------
// One process per GPU under mpirun (fp4lab-cuda-mpi), through fp4lab's own rank layer (cli/mpi_dist.hpp); without
// MPI or without a launcher, one process.
namespace dist = cli::dist;

// ---- check ---------------------------------------------------------------------------------------------------
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

int cmd_check(const std::vector<std::string>& args) {
  po::options_description desc("fp4lab-cuda check options");
  std::vector<std::string> traces;
  std::string recipe_name = "ufp4", gemm_kind = "both";
  int show = 5, limit = 0;
  uint64_t seed = 0;
  bool native = false;
  desc.add_options()(
      "trace", po::value(&traces)->multitoken()->required(), "trace folders or files (docs/spec.md §7), e.g. several steps")(
      "recipe", po::value(&recipe_name)->default_value("ufp4"), "ufp4, e2m1-ref, nvfp4 or mxfp4")(
      "seed", po::value(&seed)->default_value(0), "stochastic-rounding seed")(
      "gemm", po::value(&gemm_kind)->default_value("both"), "GPU GEMM kernels to check: fast, reference or both")(
      "native", po::bool_switch(&native), "also run the SM100 tcgen05 path (sm_100 device only) within its tolerance")(
      "show", po::value(&show)->default_value(5), "mismatches printed per category")(
      "limit", po::value(&limit)->default_value(0), "check only the first N GEMMs of the traces (0 = all)");
  cli::add_common_options(desc);
  po::variables_map vm;
  if (!cli::parse_args(invocation("check", args), desc, "--trace DIR [DIR ..] [--recipe R] [--json FILE|-]", vm))
    return 0;
  const cli::JsonOut json(vm);
  if (gemm_kind != "fast" && gemm_kind != "reference" && gemm_kind != "both")
    usage_error("--gemm must be fast, reference or both, not '" + gemm_kind + "'");
  fp4lab::Recipe recipe = fp4lab::Recipe::preset(recipe_name);  // invalid_argument -> usage
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
  const std::vector<int> owner = dist::assign(sizes, dist::size());
  std::vector<std::string> inputs(traces.begin(), traces.end());
  for (const auto& t : trs)
    for (const auto& r : t->records()) inputs.push_back(r.file);
  cli::check_outputs(vm, {}, inputs);
  if (!require_device("check")) return kExitNoDevice;
  int devices = 1;
  fc::check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  fc::check(cudaSetDevice(dist::rank() % devices), "cudaSetDevice");  // one rank per GPU
  const fc::DeviceInfo dev = fc::device_info();
  std::ostream& out = json.table() ? std::cout : std::cerr;  // with --json -, stdout holds only the JSON
  const std::string me = dist::size() > 1 ? "[rank " + std::to_string(dist::rank()) + "] " : "";
  std::string trace_list;
  for (const auto& t : traces) trace_list += (trace_list.empty() ? "" : ", ") + cli::printable(t);
  if (dist::rank() == 0)
    out << "fp4lab-cuda check: trace " << trace_list << " (" << refs.size() << " GEMMs), recipe " << recipe.name
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
      const std::string name = cli::printable(rec.gemm) + "." + fp4lab::pass_name(pass);  // echoed: escaped
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
  const std::vector<std::string> parts = dist::gather("check", {{size_t(dist::rank()), part.dump()}}, {});
  if (dist::rank() != 0) return dist::from_root(0);
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
    std::cerr << "fp4lab-cuda check: error: " << fault_msg << std::endl;
    return dist::from_root(kExitMismatch);
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
    return dist::from_root(kExitMismatch);
  }
  if (bad || native_out_of_bound) {
    out << "FAIL: " << bad << " mismatches\n";
    return dist::from_root(kExitMismatch);
  }
  out << "PASS: " << total << " values, 0 mismatches\n";
  return dist::from_root(0);
}

// ---- bench ---------------------------------------------------------------------------------------------------
struct Timer {
  cudaStream_t s;
  cudaEvent_t e0, e1;
  explicit Timer(cudaStream_t st) : s(st) {
    fc::check(cudaEventCreate(&e0), "cudaEventCreate");
    fc::check(cudaEventCreate(&e1), "cudaEventCreate");
  }
  ~Timer() {
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  // Median over `reps` of the time of one call of f, in microseconds. Short calls run `batch` at a time, captured
  // into a CUDA graph (launch gaps out of the figure) unless `graph` is false, and the time is divided by `batch`.
  template <class F>
  double median_us(F&& f, int reps, int batch = 1, bool graph = true) {
    for (int i = 0; i < 2; ++i) f(i);  // warm-up: allocations, module load, attributes
    fc::check(cudaStreamSynchronize(s), "warm-up");
    cudaGraphExec_t exec = nullptr;
    if (batch > 1 && graph) {
      cudaGraph_t g;
      fc::check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      for (int i = 0; i < batch; ++i) f(i);
      fc::check(cudaStreamEndCapture(s, &g), "cudaStreamEndCapture");
      fc::check(cudaGraphInstantiate(&exec, g, 0), "cudaGraphInstantiate");
      cudaGraphDestroy(g);
      fc::check(cudaGraphLaunch(exec, s), "cudaGraphLaunch");  // warm the graph
    }
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
      fc::check(cudaEventRecord(e0, s), "cudaEventRecord");
      if (exec)
        fc::check(cudaGraphLaunch(exec, s), "cudaGraphLaunch");
      else
        for (int i = 0; i < batch; ++i) f(r * batch + i);
      fc::check(cudaEventRecord(e1, s), "cudaEventRecord");
      fc::check(cudaEventSynchronize(e1), "cudaEventSynchronize");
      float ms = 0;
      fc::check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
      t.push_back(1000.0 * ms / batch);
    }
    if (exec) cudaGraphExecDestroy(exec);
    samples = t;  // in run order
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
  std::vector<double> samples;  // the last median_us call's per-call times, microseconds, in run order
};

// Inputs like training tensors: mostly Gaussian, a few large outliers (so block scales vary).
std::vector<float> random_tensor(int64_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> N(0.0f, 1.0f);
  std::uniform_real_distribution<float> U(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = U(g) < 0.001f ? 20.0f * N(g) : N(g);
  return v;
}

std::string fmt(double x, int prec = 1) {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(prec);
  o << x;
  return o.str();
}
std::string pad(const std::string& s, size_t w) { return s.size() >= w ? s : std::string(w - s.size(), ' ') + s; }

// A device tensor of n values drawn like random_tensor: one host draw of at most 4 Mi values, repeated on the
// device (a kernel's time does not depend on which values repeat, and drawing billions on the host takes minutes).
fc::Buffer<float> device_random(int64_t n, uint64_t seed) {
  static std::map<uint64_t, std::vector<float>> drawn;  // per seed, drawn once
  std::vector<float>& h = drawn[seed];
  if (h.empty()) h = random_tensor(int64_t(1) << 22, seed);
  const int64_t chunk = std::min<int64_t>(n, int64_t(h.size()));
  fc::Buffer<float> b(static_cast<size_t>(n));
  fc::check(cudaMemcpy(b.data(), h.data(), size_t(chunk) * 4, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  for (int64_t done = chunk; done < n;) {
    const int64_t c = std::min(done, n - done);
    fc::check(cudaMemcpy(b.data() + done, b.data(), size_t(c) * 4, cudaMemcpyDeviceToDevice), "cudaMemcpy D2D");
    done += c;
  }
  return b;
}

// Quantiser timings of one [rows, K] FP32 operand: plain, fused RHT + quantise, unfused (RHT pass, then the plain
// quantiser). Inputs rotate through enough copies that one pass over them is 4x the L2; short calls run as a
// CUDA-graph batch that visits them all.
struct QuantTimes {
  double plain_us = 0, fused_us = 0, unfused_us = 0;
  std::vector<double> plain_samples, fused_samples, unfused_samples;
  double bytes = 0;  // FP32 in + codes + scales out
  int batch = 1, buffers = 1;
};
QuantTimes time_quantize(Timer& T, const fc::DeviceInfo& dev, double copy_gbs, int64_t rows, int64_t K,
                         const fp4lab::QuantConfig& plain, const fp4lab::QuantConfig& rot, int reps, cudaStream_t s) {
  QuantTimes r;
  const int64_t n = rows * K;
  const size_t in_bytes = size_t(n) * 4;
  const int nbuf = int(std::clamp<size_t>((4 * dev.l2_bytes + in_bytes - 1) / in_bytes, 1, 1024));
  std::vector<fc::Buffer<float>> xs;
  xs.push_back(device_random(n, 7));
  for (int i = 1; i < nbuf; ++i) {
    xs.emplace_back(static_cast<size_t>(n));
    fc::check(cudaMemcpy(xs.back().data(), xs[0].data(), in_bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy D2D");
  }
  fc::Buffer<float> rotated(static_cast<size_t>(n));
  fc::DQTensor q;
  fc::QuantWorkspace ws;
  const double est_us = double(in_bytes) / (copy_gbs * 1e3) * 2;
  r.buffers = nbuf;
  r.batch = std::max(nbuf, int(std::clamp(2000.0 / std::max(est_us, 1.0), 1.0, 200.0)));
  auto x = [&](int i) { return xs[size_t(i % nbuf)].data(); };
  r.plain_us = T.median_us(
      [&](int i) { fc::quantize(x(i), rows, K, plain, q, ws, s, fc::RhtPath::fused, false); }, reps, r.batch);
  r.plain_samples = T.samples;
  r.fused_us = T.median_us(
      [&](int i) { fc::quantize(x(i), rows, K, rot, q, ws, s, fc::RhtPath::fused, false); }, reps, r.batch);
  r.fused_samples = T.samples;
  r.unfused_us = T.median_us(
      [&](int i) {
        fc::rht(x(i), rotated.data(), rows, K, rot, s);
        fc::quantize(rotated.data(), rows, K, plain, q, ws, s, fc::RhtPath::fused, false);
      },
      reps, r.batch);
  r.unfused_samples = T.samples;
  r.bytes = double(n) * (4.0 + 0.5 + 4.0 / plain.block + (plain.scale == fp4lab::ScaleKind::fp32 ? 0.0 : 1.0 / plain.block));
  return r;
}

// The quantised operands of an M x N x K block-scaled GEMM under gc (A [M, K], B [N, K]).
void gemm_operands(const fp4lab::QuantConfig& gc, int64_t M, int64_t N, int64_t K, fc::DQTensor& qa,
                   fc::DQTensor& qb, cudaStream_t s) {
  fc::QuantWorkspace ws;
  {
    fc::Buffer<float> xa = device_random(M * K, 11);
    fc::quantize(xa.data(), M, K, gc, qa, ws, s);
  }
  fc::Buffer<float> xb = device_random(N * K, 13);
  fc::quantize(xb.data(), N, K, gc, qb, ws, s);
  fc::check(cudaStreamSynchronize(s), "quantise operands");
}

// One GEMM shape's operands, output and workspace, and the batch its timing runs in: calls under ~2 ms (at an
// assumed 200 TOPS) repeat in batches.
struct GemmCase {
  fc::Buffer<float> dc;
  fc::DQTensor qa, qb;
  fc::GemmWorkspace gws;
  double flops = 0;
  int batch = 1;
  GemmCase(const fp4lab::QuantConfig& gc, int64_t M, int64_t N, int64_t K, cudaStream_t s)
      : dc(static_cast<size_t>(M * N)), flops(2.0 * double(M) * double(N) * double(K)) {
    gemm_operands(gc, M, N, K, qa, qb, s);
    batch = int(std::clamp(2e3 / std::max(flops / 200e12 * 1e6, 1.0), 1.0, 100.0));
  }
};

fp4lab::QuantConfig plain_config(const fp4lab::Recipe& r) {
  fp4lab::QuantConfig c;
  c.format = r.format;
  c.block = r.block;
  c.scale = r.scale;
  c.rounding = fp4lab::Rounding::rtne;
  return c;
}
fp4lab::QuantConfig rht16_config(const fp4lab::QuantConfig& plain) {
  fp4lab::QuantConfig c = plain;
  c.rht = 16;
  c.rht_signs = fp4lab::rht_signs_te(16);
  return c;
}

int cmd_bench(const std::vector<std::string>& args) {
  po::options_description desc("fp4lab-cuda bench options");
  std::string trace, recipe_name = "ufp4";
  int reps = 20, big = 8192;
  desc.add_options()("trace", po::value(&trace), "add the shapes of this trace")(
      "recipe", po::value(&recipe_name)->default_value("ufp4"), "quantiser format/block/scale (RTNE, RHT-16)")(
      "size", po::value(&big)->default_value(8192), "the square shape benchmarked beside the trace shapes")(
      "reps", po::value(&reps)->default_value(20), "timed repetitions (median reported)");
  cli::add_common_options(desc);
  po::variables_map vm;
  if (!cli::parse_args(invocation("bench", args), desc, "[--trace DIR] [--size N] [--reps N] [--json FILE]", vm))
    return 0;
  const cli::JsonOut json(vm);
  if (reps < 3 || big < 256 || big % 256 != 0) usage_error("--reps must be >= 3 and --size a multiple of 256");
  const fp4lab::Recipe recipe = fp4lab::Recipe::preset(recipe_name);
  if (!trace.empty()) cli::check_outputs(vm, {}, {trace});
  if (!require_device("bench")) return kExitNoDevice;

  const fc::DeviceInfo dev = fc::device_info();
  int clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev.id);
  cudaStream_t s;
  fc::check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  Timer T(s);
  Json J;
  J["device"] = {{"name", dev.name}, {"sm", dev.cc_major * 10 + dev.cc_minor}, {"sms", dev.sms},
                 {"l2_bytes", dev.l2_bytes}, {"clock_khz", clock_khz}};
  std::cout << "fp4lab-cuda bench on " << dev.name << " (sm_" << dev.cc_major << dev.cc_minor << ", " << dev.sms
            << " SMs, L2 " << dev.l2_bytes / (1 << 20) << " MiB, SM clock " << clock_khz / 1000 << " MHz)\n";

  // Baseline 1: device-to-device copy (bytes read + bytes written).
  const size_t copy_bytes = size_t(1) << 30;
  fc::Buffer<uint8_t> c0(copy_bytes), c1(copy_bytes);
  c0.fill_bytes(1);
  const double copy_us = T.median_us(
      [&](int) { fc::check(cudaMemcpyAsync(c1.data(), c0.data(), copy_bytes, cudaMemcpyDeviceToDevice, s), "copy"); },
      reps);
  const double copy_gbs = 2.0 * double(copy_bytes) / copy_us / 1e3;
  c0 = fc::Buffer<uint8_t>();
  c1 = fc::Buffer<uint8_t>();
  std::cout << "device-to-device copy, 1 GiB: " << fmt(copy_us, 0) << " us, " << fmt(copy_gbs, 0)
            << " GB/s (read + write)\n";
  J["copy"] = {{"bytes", copy_bytes}, {"us", copy_us}, {"gbs", copy_gbs}};

  // Shapes: quantiser operands (rows, K) and GEMMs (M, N, K) of the trace, then the big square.
  std::set<std::pair<int64_t, int64_t>> qshapes;
  std::set<std::tuple<int64_t, int64_t, int64_t>> gshapes;
  if (!trace.empty()) {
    const fp4lab::io::Trace tr(trace, 16);
    for (const auto& r : tr.records()) {
      qshapes.insert({r.tokens, r.in});
      qshapes.insert({r.out, r.in});
      qshapes.insert({r.tokens, r.out});
      qshapes.insert({r.out, r.tokens});
      qshapes.insert({r.in, r.tokens});
      gshapes.insert({r.tokens, r.out, r.in});
      gshapes.insert({r.tokens, r.in, r.out});
      gshapes.insert({r.out, r.in, r.tokens});
    }
  }
  std::vector<std::pair<int64_t, int64_t>> qlist(qshapes.begin(), qshapes.end());
  qlist.push_back({big, big});
  std::vector<std::tuple<int64_t, int64_t, int64_t>> glist(gshapes.begin(), gshapes.end());
  glist.push_back({big, big, big});

  // ---- quantiser: plain, fused RHT-16 + quantise, unfused (RHT pass, then quantise) ----
  const fp4lab::QuantConfig plain = plain_config(recipe), rot = rht16_config(plain);
  std::cout << "\nquantise " << plain.label() << " vs " << rot.label()
            << " (FP32 in; packed codes + FP32 scales out; median of " << reps
            << "; inputs rotated through buffers > 4x L2; small shapes timed as CUDA-graph batches)\n";
  std::cout << "  bandwidth = (4 B in + 0.5 B codes + 4/B B scales per element) / time, against the copy\n";
  std::cout << "  division (fp32 scales): 'elem' = x / dec per element as the golden scale_element writes it\n";
  std::cout << pad("rows x K", 14) << pad("div", 6) << pad("plain us", 11) << pad("fused us", 11)
            << pad("unfused us", 12) << pad("fused/plain", 13) << pad("unfused/fused", 15) << pad("plain GB/s", 12)
            << pad("%copy", 7) << pad("fused GB/s", 12) << pad("%copy", 7) << "\n";
  Json jq = Json::array();
  for (auto [rows, K] : qlist) {
    const QuantTimes q = time_quantize(T, dev, copy_gbs, rows, K, plain, rot, reps, s);
    const double gbs_plain = q.bytes / q.plain_us / 1e3, gbs_fused = q.bytes / q.fused_us / 1e3;
    std::cout << pad(std::to_string(rows) + "x" + std::to_string(K), 14) << pad("elem", 6)
              << pad(fmt(q.plain_us, 2), 11) << pad(fmt(q.fused_us, 2), 11) << pad(fmt(q.unfused_us, 2), 12)
              << pad(fmt(q.fused_us / q.plain_us, 3), 13) << pad(fmt(q.unfused_us / q.fused_us, 3), 15)
              << pad(fmt(gbs_plain, 0), 12) << pad(fmt(100 * gbs_plain / copy_gbs, 0), 7)
              << pad(fmt(gbs_fused, 0), 12) << pad(fmt(100 * gbs_fused / copy_gbs, 0), 7) << "\n";
    jq.push_back({{"rows", rows}, {"K", K}, {"division", "element"}, {"plain_us", q.plain_us},
                  {"fused_us", q.fused_us}, {"unfused_us", q.unfused_us}, {"fused_over_plain", q.fused_us / q.plain_us},
                  {"unfused_over_fused", q.unfused_us / q.fused_us}, {"plain_gbs", gbs_plain}, {"fused_gbs", gbs_fused},
                  {"graph_batch", q.batch}, {"buffers", q.buffers}});
  }
  J["quantize"] = {{"plain", plain.label()}, {"fused", rot.label()}, {"shapes", jq}};

  // ---- GEMM: block-scaled (fast kernel, int8 unpack included) vs cuBLAS BF16 ----
  std::unique_ptr<fc::CublasBf16> cublas;
  try {
    cublas = std::make_unique<fc::CublasBf16>();
  } catch (const std::exception& e) {
    std::cout << "\ncuBLAS baseline unavailable: " << e.what() << "\n";
  }
  const double fp32_lanes_per_s = 128.0 * dev.sms * clock_khz * 1e3;
  std::map<std::tuple<int64_t, int64_t, int64_t>, double> cublas_us;  // per shape, measured once
  Json jg = Json::array();
  for (const char* rname : {"ufp4", "mxfp4"}) {
    const fp4lab::QuantConfig gc = plain_config(fp4lab::Recipe::preset(rname));
    // Bound from the contract's per-block epilogue: 4 FP32 instructions (exact int->float subtraction, two
    // multiplies, one add) per output per block, on 128 FP32 lanes per SM.
    const double bound_tops = fp32_lanes_per_s / 4.0 * 2.0 * gc.block / 1e12;
    std::cout << "\nblock-scaled GEMM " << gc.label() << " (fast kernel: int8 mma.sync + FP32 contract epilogue;"
              << " 'total' includes the int8 unpack pass) vs cuBLAS BF16 (BF16 in, FP32 out)\n";
    std::cout << "  epilogue bound at this clock: " << fmt(bound_tops, 0) << " TOPS (4 FP32 instructions per output per "
              << gc.block << "-element block)\n";
    std::cout << "  tile variants: ";
    for (int v = 0; v < fc::gemm_fast_variants(); ++v)
      std::cout << (v ? ", " : "") << v << " = " << fc::gemm_fast_variant_name(v)
                << (v == fc::gemm_fast_default_variant(gc.block, big, big) ? " (default at the big shape)" : "");
    std::cout << "\n" << pad("M x N x K", 20) << pad("variant", 8) << pad("unpack us", 11) << pad("mma us", 11)
              << pad("TOPS(total)", 13) << pad("cuBLAS us", 11) << pad("TFLOPS", 9) << pad("ratio", 8) << "\n";
    for (auto [M, N, K] : glist) {
      if (K % gc.block) continue;
      GemmCase g(gc, M, N, K, s);
      auto& [dc, qa, qb, gws, flops, batch] = g;
      // Plain launch loops, no graphs, for both sides: cuBLAS under stream capture needs its own workspace setup.
      const double t_prep = T.median_us([&](int) { fc::gemm_fast_prepare(qa, qb, gws, s); }, reps, batch, false);
      double t_cub = 0, tflops = 0;
      if (cublas && cublas_us.count({M, N, K})) {
        t_cub = cublas_us[{M, N, K}];
      } else if (cublas) {
        std::vector<uint16_t> ha(static_cast<size_t>(M * K)), hb(static_cast<size_t>(N * K));
        const std::vector<float> fa = random_tensor(M * K, 17), fb = random_tensor(N * K, 19);
        for (size_t i = 0; i < ha.size(); ++i) ha[i] = fp4lab::f32_to_bf16(fa[i]);
        for (size_t i = 0; i < hb.size(); ++i) hb[i] = fp4lab::f32_to_bf16(fb[i]);
        fc::Buffer<uint16_t> da, db;
        da.upload(ha);
        db.upload(hb);
        t_cub = T.median_us([&](int) { cublas->gemm(da.data(), db.data(), dc.data(), M, N, K, s); }, reps, batch, false);
        cublas_us[{M, N, K}] = t_cub;
      }
      if (cublas) tflops = flops / t_cub / 1e6;
      int best = -1;
      double best_tops = 0;
      for (int variant = 0; variant < fc::gemm_fast_variants(); ++variant) {
        const double t_mma =
            T.median_us([&](int) { fc::gemm_fast_run(qa, qb, dc.data(), gws, s, variant); }, reps, batch, false);
        const double tops = flops / (t_prep + t_mma) / 1e6;
        if (tops > best_tops) {
          best_tops = tops;
          best = variant;
        }
        std::cout << pad(std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K), 20)
                  << pad(std::to_string(variant), 8) << pad(fmt(t_prep, 2), 11) << pad(fmt(t_mma, 2), 11)
                  << pad(fmt(tops, 1), 13) << pad(cublas ? fmt(t_cub, 2) : "-", 11)
                  << pad(cublas ? fmt(tflops, 1) : "-", 9) << pad(cublas ? fmt(t_cub / (t_prep + t_mma), 3) : "-", 8)
                  << "\n";
        jg.push_back({{"recipe", rname}, {"label", gc.label()}, {"M", M}, {"N", N}, {"K", K}, {"variant", variant},
                      {"variant_name", fc::gemm_fast_variant_name(variant)}, {"unpack_us", t_prep}, {"mma_us", t_mma},
                      {"tops", tops}, {"cublas_bf16_us", t_cub}, {"cublas_tflops", tflops},
                      {"ratio_vs_cublas", cublas ? t_cub / (t_prep + t_mma) : 0.0},
                      {"epilogue_bound_tops", bound_tops}});
      }
      std::cout << pad("best: variant " + std::to_string(best), 28) << ", " << fmt(best_tops, 1) << " TOPS = "
                << fmt(100 * best_tops / bound_tops, 0) << "% of the epilogue bound"
                << (cublas ? ", " + fmt(best_tops / tflops, 3) + "x cuBLAS BF16" : std::string()) << "\n";
    }
  }
  J["gemm"] = jg;
  fc::check(cudaStreamDestroy(s), "cudaStreamDestroy");
  J["command"] = "bench";
  json.write(J);  // a temporary file renamed into place; adds fp4lab_version and git_commit
  return 0;
}

// fp4lab-cuda timings: the per-kernel timings the simulator is validated against, one JSON row per kernel and
// shape with every repeat's time (the median is the figure). Kernels: copy (device-to-device, per size),
// quantize_plain / quantize_fused_rht16 / quantize_unfused_rht16 (per --quant operand), and per --gemm shape and
// --gemm-recipe the fast contract GEMM's int8 unpack pass (gemm_unpack), its mma kernel (gemm_mma) and the whole
// call (gemm_fast: both, as a training step runs them), each at the default tile variant.
int cmd_timings(const std::vector<std::string>& args) {
  po::options_description desc("fp4lab-cuda timings options");
  std::vector<std::string> quant, gemms, gemm_recipes;
  std::vector<int64_t> copy_sizes;
  std::string recipe_name = "ufp4";
  int reps = 9;
  desc.add_options()("quant", po::value(&quant)->multitoken(), "quantiser operand shapes RxK (rows x K)")(
      "gemm", po::value(&gemms)->multitoken(), "GEMM shapes MxNxK")(
      "recipe", po::value(&recipe_name)->default_value("ufp4"), "the quantiser's format/block/scale (RTNE; RHT-16)")(
      "gemm-recipe", po::value(&gemm_recipes)->multitoken(), "recipes of the GEMM operands (default: ufp4 mxfp4)")(
      "copy", po::value(&copy_sizes)->multitoken(), "device-to-device copy sizes in bytes (default: 1 MiB .. 1 GiB)")(
      "reps", po::value(&reps)->default_value(9), "timed repetitions per kernel and shape (median reported)");
  cli::add_common_options(desc);
  po::variables_map vm;
  if (!cli::parse_args(invocation("timings", args), desc,
                       "[--quant RxK ..] [--gemm MxNxK ..] [--gemm-recipe R ..] [--reps N] [--json FILE]", vm))
    return 0;
  const cli::JsonOut json(vm);
  if (reps < 3) usage_error("--reps must be >= 3");
  if (gemm_recipes.empty()) gemm_recipes = {"ufp4", "mxfp4"};
  if (copy_sizes.empty())
    for (int64_t b = int64_t(1) << 20; b <= int64_t(1) << 30; b *= 4) copy_sizes.push_back(b);
  for (int64_t b : copy_sizes)
    if (b < 4096 || b > (int64_t(1) << 32) || b % 4096) usage_error("--copy sizes must be multiples of 4096 up to 4 GiB");
  const fp4lab::QuantConfig plain = plain_config(fp4lab::Recipe::preset(recipe_name)), rot = rht16_config(plain);
  std::vector<std::vector<int64_t>> qlist, glist;
  for (const auto& q : quant) {
    qlist.push_back(cli::parse_dims(q, "RxK", "quant"));
    if (qlist.back()[1] % plain.block) usage_error("--quant " + q + ": K is not a multiple of the block");
  }
  std::vector<fp4lab::QuantConfig> gcs;
  for (const auto& r : gemm_recipes) gcs.push_back(plain_config(fp4lab::Recipe::preset(r)));
  for (const auto& g : gemms) {
    glist.push_back(cli::parse_dims(g, "MxNxK", "gemm"));
    for (const auto& gc : gcs)
      if (glist.back()[2] % gc.block) usage_error("--gemm " + g + ": K is not a multiple of every recipe's block");
  }
  if (!require_device("timings")) return kExitNoDevice;

  const fc::DeviceInfo dev = fc::device_info();
  int clock_khz = 0, mem_khz = 0, bus_bits = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev.id);
  cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, dev.id);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev.id);
  cudaStream_t s;
  fc::check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  Timer T(s);
  Json J;
  J["command"] = "timings";
  J["device"] = {{"name", dev.name}, {"sm", dev.cc_major * 10 + dev.cc_minor}, {"sms", dev.sms},
                 {"l2_bytes", dev.l2_bytes}, {"clock_khz", clock_khz}, {"memory_clock_khz", mem_khz},
                 {"memory_bus_bits", bus_bits}};
  J["reps"] = reps;
  std::ostream& out = json.table() ? std::cout : std::cerr;
  out << "fp4lab-cuda timings on " << dev.name << " (sm_" << dev.cc_major << dev.cc_minor << ", " << dev.sms
      << " SMs, L2 " << dev.l2_bytes / (1 << 20) << " MiB, SM clock " << clock_khz / 1000 << " MHz), median of "
      << reps << "\n";
  Json rows = Json::array();
  auto row = [&](const std::string& kernel, const std::string& label, const std::string& shape, double median,
                 const std::vector<double>& samples, Json extra) {
    Json r = {{"kernel", kernel}, {"recipe", label}, {"shape", shape}, {"median_us", median}, {"samples_us", samples}};
    for (auto& [k, v] : extra.items()) r[k] = v;
    rows.push_back(r);
    out << pad(kernel, 24) << pad(shape, 22) << pad(fmt(median, 2), 12) << " us\n" << std::flush;
  };

  // Device-to-device copies: bytes read + bytes written over time; the source and destination walk through
  // 1 GiB buffers so that small copies do not stay in the L2.
  {
    const size_t span = std::max<size_t>(size_t(1) << 30, size_t(*std::max_element(copy_sizes.begin(), copy_sizes.end())));
    fc::Buffer<uint8_t> c0(span), c1(span);
    c0.fill_bytes(1);
    for (int64_t b : copy_sizes) {
      const size_t nb = span / size_t(b);
      const double est_us = 2.0 * double(b) / 4e6;
      const int batch = int(std::clamp(2000.0 / std::max(est_us, 1.0), 1.0, 500.0));
      const double us = T.median_us(
          [&](int i) {
            const size_t off = size_t(i) % nb * size_t(b);
            fc::check(cudaMemcpyAsync(c1.data() + off, c0.data() + off, size_t(b), cudaMemcpyDeviceToDevice, s), "copy");
          },
          reps, batch);
      row("copy", "", std::to_string(b), us, T.samples,
          {{"bytes", b}, {"gbs", 2.0 * double(b) / us / 1e3}, {"batch", batch}, {"graph", batch > 1}});
    }
  }
  double copy_gbs = 0;
  for (const Json& r : rows) copy_gbs = std::max(copy_gbs, r["gbs"].get<double>());

  for (const auto& d : qlist) {
    const int64_t R = d[0], K = d[1];
    const QuantTimes q = time_quantize(T, dev, copy_gbs, R, K, plain, rot, reps, s);
    const std::string shape = std::to_string(R) + "x" + std::to_string(K);
    const Json ex = {{"rows", R}, {"K", K}, {"bytes", q.bytes}, {"batch", q.batch}, {"graph", q.batch > 1},
                     {"buffers", q.buffers}};
    row("quantize_plain", plain.label(), shape, q.plain_us, q.plain_samples, ex);
    row("quantize_fused_rht16", rot.label(), shape, q.fused_us, q.fused_samples, ex);
    row("quantize_unfused_rht16", rot.label(), shape, q.unfused_us, q.unfused_samples, ex);
  }

  for (const auto& gc : gcs) {
    for (const auto& d : glist) {
      const int64_t M = d[0], N = d[1], K = d[2];
      GemmCase g(gc, M, N, K, s);  // back-to-back launches (no graph), as a training step issues them
      auto& [dc, qa, qb, gws, flops, batch] = g;
      const int variant = fc::gemm_fast_default_variant(gc.block, M, N);
      const std::string shape = std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
      const Json ex = {{"M", M}, {"N", N}, {"K", K}, {"batch", batch}, {"graph", false}, {"variant", variant},
                       {"variant_name", fc::gemm_fast_variant_name(variant)}};
      const double t_prep = T.median_us([&](int) { fc::gemm_fast_prepare(qa, qb, gws, s); }, reps, batch, false);
      row("gemm_unpack", gc.label(), shape, t_prep, T.samples, ex);
      const double t_mma =
          T.median_us([&](int) { fc::gemm_fast_run(qa, qb, dc.data(), gws, s, variant); }, reps, batch, false);
      row("gemm_mma", gc.label(), shape, t_mma, T.samples, ex);
      const double t_all = T.median_us([&](int) { fc::gemm_fast(qa, qb, dc.data(), gws, s, variant); }, reps, batch, false);
      Json ex2 = ex;
      ex2["tops"] = flops / t_all / 1e6;
      row("gemm_fast", gc.label(), shape, t_all, T.samples, ex2);
    }
  }
  fc::check(cudaStreamDestroy(s), "cudaStreamDestroy");
  J["rows"] = rows;
  json.write(J);
  return 0;
}

// fp4lab-cuda qbench: the quantiser on BF16 operands at training shapes, every variant beside a device-to-device
// copy of the same bytes in the same run. Variants per recipe: plain (the recipe's grid, block and scale, RTNE),
// rht16 (fused RHT-16 with the recipe's BF16 rounding), sr (stochastic rounding); each row-wise (quantise
// [R, C] along C) and transposed (quantise X^T, [C, R] along R, reading X [R, C] in place), and for the
// transposed case the route it replaces: a copy of X (the cheapest transposed copy) then the row-wise pass.
// Bytes = BF16 in + packed codes + FP32 decoded scales (+ scale codes); the copy moves the same total (half read,
// half written). Inputs rotate through buffers over 4x the L2; calls run as CUDA-graph batches.
fc::Buffer<uint16_t> device_random_bf16(int64_t n, uint64_t seed) {
  const std::vector<float> h = random_tensor(std::min<int64_t>(n, int64_t(1) << 22), seed);
  std::vector<uint16_t> hb(h.size());
  for (size_t i = 0; i < h.size(); ++i) hb[i] = fp4lab::f32_to_bf16(h[i]);
  fc::Buffer<uint16_t> b(static_cast<size_t>(n));
  fc::check(cudaMemcpy(b.data(), hb.data(), hb.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  for (int64_t done = int64_t(hb.size()); done < n;) {
    const int64_t c = std::min(done, n - done);
    fc::check(cudaMemcpy(b.data() + done, b.data(), size_t(c) * 2, cudaMemcpyDeviceToDevice), "cudaMemcpy D2D");
    done += c;
  }
  return b;
}

int cmd_qbench(const std::vector<std::string>& args) {
  po::options_description desc("fp4lab-cuda qbench options");
  std::vector<std::string> shapes, recipes;
  std::string only_variant, only_layout;
  int reps = 15;
  desc.add_options()("shape", po::value(&shapes)->multitoken(),
                     "operand shapes RxC (default: the 103M model's 8192x1024 8192x2816 1024x8192 2816x1024 1024x1024)")(
      "recipe", po::value(&recipes)->multitoken(), "recipes (default: ufp4 e2m1-ref nvfp4 mxfp4)")(
      "reps", po::value(&reps)->default_value(15), "timed repetitions (median reported)")(
      "variant", po::value(&only_variant), "only this variant: plain, rht16 or sr")(
      "layout", po::value(&only_layout), "only this layout: row-wise, transposed or copy+row");
  cli::add_common_options(desc);
  po::variables_map vm;
  if (!cli::parse_args(invocation("qbench", args), desc,
                       "[--shape RxC ..] [--recipe R ..] [--variant V] [--layout L] [--reps N] [--json FILE]",
                       vm))
    return 0;
  const cli::JsonOut json(vm);
  if (reps < 3) usage_error("--reps must be >= 3");
  if (shapes.empty()) shapes = {"8192x1024", "8192x2816", "1024x8192", "2816x1024", "1024x1024"};
  if (recipes.empty()) recipes = fp4lab::Recipe::preset_names();
  std::vector<std::vector<int64_t>> slist;
  for (const auto& sh : shapes) {
    slist.push_back(cli::parse_dims(sh, "RxC", "shape"));
    if (slist.back()[0] % 32 || slist.back()[1] % 32) usage_error("--shape " + sh + ": R and C must be multiples of 32");
  }
  std::vector<fp4lab::Recipe> rlist;
  for (const auto& r : recipes) rlist.push_back(fp4lab::Recipe::preset(r));
  if (!require_device("qbench")) return kExitNoDevice;

  const fc::DeviceInfo dev = fc::device_info();
  cudaStream_t s;
  fc::check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  Timer T(s);
  Json J;
  J["device"] = {{"name", dev.name}, {"sm", dev.cc_major * 10 + dev.cc_minor}, {"sms", dev.sms},
                 {"l2_bytes", dev.l2_bytes}};
  std::cout << "fp4lab-cuda qbench on " << dev.name << " (" << dev.sms << " SMs, L2 " << dev.l2_bytes / (1 << 20)
            << " MiB); BF16 in; median of " << reps << "; copy = cudaMemcpyAsync device-to-device of the same bytes"
            << " (read + written), same run\n";
  std::cout << pad("shape", 11) << pad("recipe", 10) << pad("variant", 9) << pad("layout", 12) << pad("us", 9)
            << pad("GB/s", 8) << pad("copy us", 9) << pad("copy GB/s", 10) << pad("%copy", 7) << "\n";
  Json rows = Json::array();
  for (const auto& sh : slist) {
    const int64_t R = sh[0], C = sh[1], n = R * C;
    const size_t in_bytes = size_t(n) * 2;
    const int nbuf = int(std::clamp<size_t>((4 * dev.l2_bytes + in_bytes - 1) / in_bytes, 2, 256));
    std::vector<fc::Buffer<uint16_t>> xs;
    xs.push_back(device_random_bf16(n, 7));
    for (int i = 1; i < nbuf; ++i) {
      xs.emplace_back(static_cast<size_t>(n));
      fc::check(cudaMemcpy(xs.back().data(), xs[0].data(), in_bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy D2D");
    }
    fc::Buffer<uint16_t> xt(static_cast<size_t>(n));  // the copy of the replaced transposed route
    fc::Buffer<uint8_t> dst(in_bytes);
    fc::DQTensor q;
    fc::QuantWorkspace ws;
    const int batch = std::max(nbuf, int(std::clamp(3000.0 / std::max(double(in_bytes) / 4e3 * 2, 1.0), 1.0, 200.0)));
    auto x = [&](int i) { return xs[size_t(i % nbuf)].data(); };
    std::map<size_t, double> copy_us;  // per byte count
    auto copy_time = [&](size_t bytes) {
      if (!copy_us.count(bytes))
        copy_us[bytes] = T.median_us(
            [&](int i) {
              fc::check(cudaMemcpyAsync(dst.data(), x(i), bytes / 2, cudaMemcpyDeviceToDevice, s), "copy");
            },
            reps, batch);
      return copy_us[bytes];
    };
    for (const fp4lab::Recipe& rec : rlist) {
      fp4lab::QuantConfig plain;
      plain.format = rec.format;
      plain.block = rec.block;
      plain.scale = rec.scale;
      plain.seed = 0x5eed;
      plain.stream = 3;
      fp4lab::QuantConfig rht = plain, sr = plain;
      rht.rht = 16;
      rht.rht_signs = fp4lab::rht_signs_te(16);
      rht.rht_bf16 = rec.rht_bf16;
      sr.rounding = fp4lab::Rounding::sr;
      const double bytes = double(n) * (2.0 + 0.5 + 4.0 / plain.block +
                                        (plain.scale == fp4lab::ScaleKind::fp32 ? 0.0 : 1.0 / plain.block)) + 4;
      const double t_copy = copy_time(size_t(bytes) & ~size_t(15));
      const double copy_gbs = double(size_t(bytes) & ~size_t(15)) / t_copy / 1e3;
      for (auto [vname, cfg] : {std::pair<const char*, const fp4lab::QuantConfig*>{"plain", &plain},
                                {"rht16", &rht}, {"sr", &sr}}) {
        for (const char* layout : {"row-wise", "transposed", "copy+row"}) {
          const std::string l = layout;
          if (l == "copy+row" && std::string(vname) != "plain") continue;
          if ((!only_variant.empty() && only_variant != vname) || (!only_layout.empty() && only_layout != l)) continue;
          const double us = T.median_us(
              [&](int i) {
                if (l == "row-wise") {
                  fc::quantize_bf16(x(i), R, C, *cfg, q, ws, s, fc::RhtPath::fused, false);
                } else if (l == "transposed") {
                  fc::quantize_transposed_bf16(x(i), R, C, *cfg, q, ws, s, fc::RhtPath::fused, false);
                } else {
                  fc::check(cudaMemcpyAsync(xt.data(), x(i), in_bytes, cudaMemcpyDeviceToDevice, s), "copy");
                  fc::quantize_bf16(xt.data(), C, R, *cfg, q, ws, s, fc::RhtPath::fused, false);
                }
              },
              reps, batch);
          const double gbs = bytes / us / 1e3;
          std::cout << pad(std::to_string(R) + "x" + std::to_string(C), 11) << pad(rec.name, 10) << pad(vname, 9)
                    << pad(layout, 12) << pad(fmt(us, 2), 9) << pad(fmt(gbs, 0), 8) << pad(fmt(t_copy, 2), 9)
                    << pad(fmt(copy_gbs, 0), 10) << pad(fmt(100 * gbs / copy_gbs, 0), 7) << "\n";
          rows.push_back({{"rows", R}, {"cols", C}, {"recipe", rec.name}, {"variant", vname}, {"layout", layout},
                          {"config", cfg->label()}, {"us", us}, {"gbs", gbs}, {"bytes", bytes}, {"copy_us", t_copy},
                          {"copy_gbs", copy_gbs}, {"fraction_of_copy", gbs / copy_gbs}, {"graph_batch", batch},
                          {"buffers", nbuf}, {"samples_us", T.samples}});
        }
      }
    }
  }
  J["quantize_bf16"] = rows;
  fc::check(cudaStreamDestroy(s), "cudaStreamDestroy");
  J["command"] = "qbench";
  json.write(J);
  return 0;
}

void usage(std::ostream& os) {
  os << "usage: fp4lab-cuda <check|bench|qbench|timings> [options]   (fp4lab-cuda <subcommand> --help)\n"
        "  check   quantise and multiply every GEMM of a trace on the GPU; compare with the golden model bit for bit\n"
        "  bench   quantiser (plain / fused RHT / unfused RHT) and block-scaled GEMM timings beside their baselines\n"
        "  qbench  BF16 quantiser variants (plain / RHT-16 / SR, row-wise and transposed) beside a copy of the same bytes\n"
        "  timings per-kernel medians of repeats over given shapes, as JSON (the simulator's validation set)\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(std::cerr);
    return kExitUsage;
  }
  const std::string cmd = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  dist::init(&argc, &argv);
  struct Finalize {
    ~Finalize() { dist::finalize(); }
  } finalize;
  // One line per fault, control bytes escaped, as fp4lab reports them. Faults that reach here happen alike on
  // every rank (options, trace headers; a record's fault is gathered inside check), so rank 0 names them once.
  auto report = [&](const std::string& msg, int code) {
    if (dist::rank() == 0)
      std::cerr << "fp4lab-cuda " << cli::printable(cmd) << ": error: " << cli::printable(msg) << std::endl;
    return code;
  };
  try {
    int code = kExitUsage;
    if (cmd == "check") {
      code = cmd_check(args);
    } else if (cmd == "bench") {
      code = cmd_bench(args);
    } else if (cmd == "qbench") {
      code = cmd_qbench(args);
    } else if (cmd == "timings") {
      code = cmd_timings(args);
    } else if (cmd == "--help" || cmd == "-h" || cmd == "help") {
      usage(std::cout);
      code = 0;
    } else if (cmd == "--version") {
      std::cout << "fp4lab-cuda: " << cli::version_line() << "\n";
      code = 0;
    } else {
      usage(std::cerr);
    }
    std::cout.flush();
    if (!std::cout) return report("stdout: write failed", code == 0 ? kExitMismatch : code);
    return code;
  } catch (const cli::Error& e) {  // usage (2) or data (1), from the shared helpers
    return report(e.what(), e.exit_code);
  } catch (const po::error& e) {
    return report(std::string(e.what()) + " (see fp4lab-cuda " + cmd + " --help)", kExitUsage);
  } catch (const std::invalid_argument& e) {  // bad recipe name or configuration
    return report(e.what(), kExitUsage);
  } catch (const fp4lab::io::Error& e) {  // a bad trace file: the message names file and fault
    return report(e.what(), kExitMismatch);
  } catch (const std::exception& e) {
    return report(e.what(), kExitMismatch);
  }
}
