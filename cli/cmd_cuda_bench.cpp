// fp4lab cuda bench: a 1 GiB device-to-device copy (the bandwidth baseline); per shape (the trace's operand shapes
// and N x N) plain, fused RHT-16 and unfused quantisation against the copy; per GEMM shape (the trace's passes and
// N^3) every fast-kernel tile shape beside cuBLAS BF16, for block 16 (ufp4) and block 32 (mxfp4). The options are
// checked in every build, before any device is looked at.
#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cmd_cuda_common.hpp"
#include "commands.hpp"
#include "files.hpp"
#include "fp4lab/io/safetensors.hpp"
#include "options.hpp"

#ifdef FP4LAB_CLI_HAS_CUDA
#include <iostream>
#include <map>
#include <memory>

#include "fp4lab/cuda/epilogue_bound.hpp"
#include "fp4lab/cuda/timing.hpp"
#endif

namespace fp4lab::cli {

int cmd_cuda_bench(const Invocation& inv) {
  po::options_description desc("fp4lab cuda bench options");
  std::string trace, recipe_name = "ufp4";
  int reps = 20, big = 8192;
  desc.add_options()("trace", po::value(&trace), "add the shapes of this trace")(
      "recipe", po::value(&recipe_name)->default_value("ufp4"), "quantiser format/block/scale (RTNE, RHT-16)")(
      "size", po::value(&big)->default_value(8192), "the square shape benchmarked beside the trace shapes")(
      "reps", po::value(&reps)->default_value(20), "timed repetitions (median reported)");
  cli::add_common_options(desc);
  po::variables_map vm;
  if (!cli::parse_args(inv, desc, "[--trace DIR] [--size N] [--reps N] [--json FILE]", vm))
    return kExitOk;
  const cli::JsonOut json(vm);
  if (reps < 3 || big < 256 || big % 256 != 0) usage_error("--reps must be >= 3 and --size a multiple of 256");
  const fp4lab::Recipe recipe = gpu::preset(recipe_name);
  if (!trace.empty()) cli::check_outputs(vm, {}, {trace});
  // Shapes: quantiser operands (rows, K) and GEMMs (M, N, K) of the trace (its headers read now: a bad
  // trace is reported before the device is looked at), then the big square.
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
  gpu::require_gpu();  // exit 4 without CUDA in this build, 3 without a device
#ifdef FP4LAB_CLI_HAS_CUDA
  namespace fc = fp4lab::cuda;
  using gpu::fixed, gpu::pad;
  const fc::DeviceInfo dev = fc::device_info();
  const int clock_khz = fc::device_clocks(dev.id).sm_khz;
  fc::Stream stream;
  fc::Timer T(stream.get());
  Json J;
  J["device"] = {{"name", dev.name}, {"sm", dev.cc_major * 10 + dev.cc_minor}, {"sms", dev.sms},
                 {"l2_bytes", dev.l2_bytes}, {"clock_khz", clock_khz}};
  std::cout << "fp4lab cuda bench on " << dev.name << " (sm_" << dev.cc_major << dev.cc_minor << ", " << dev.sms
            << " SMs, L2 " << dev.l2_bytes / (1 << 20) << " MiB, SM clock " << clock_khz / 1000 << " MHz)\n";

  // Baseline 1: device-to-device copy (bytes read + bytes written).
  const size_t copy_bytes = size_t(1) << 30;
  const fc::CopyTime copy = fc::time_copy(T, copy_bytes, reps);
  const double copy_us = copy.us, copy_gbs = copy.gbs;
  std::cout << "device-to-device copy, 1 GiB: " << fixed(copy_us, 0) << " us, " << fixed(copy_gbs, 0)
            << " GB/s (read + write)\n";
  J["copy"] = {{"bytes", copy_bytes}, {"us", copy_us}, {"gbs", copy_gbs}};

  // ---- quantiser: plain, fused RHT-16 + quantise, unfused (RHT pass, then quantise) ----
  const fp4lab::QuantConfig plain = fc::plain_config(recipe), rot = fc::rht16_config(plain);
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
    const fc::QuantTimes q = fc::time_quantize(T, dev, copy_gbs, rows, K, plain, rot, reps);
    const double gbs_plain = q.bytes / q.plain_us / 1e3, gbs_fused = q.bytes / q.fused_us / 1e3;
    std::cout << pad(std::to_string(rows) + "x" + std::to_string(K), 14) << pad("elem", 6)
              << pad(fixed(q.plain_us, 2), 11) << pad(fixed(q.fused_us, 2), 11) << pad(fixed(q.unfused_us, 2), 12)
              << pad(fixed(q.fused_us / q.plain_us, 3), 13) << pad(fixed(q.unfused_us / q.fused_us, 3), 15)
              << pad(fixed(gbs_plain, 0), 12) << pad(fixed(100 * gbs_plain / copy_gbs, 0), 7)
              << pad(fixed(gbs_fused, 0), 12) << pad(fixed(100 * gbs_fused / copy_gbs, 0), 7) << "\n";
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
  std::map<std::tuple<int64_t, int64_t, int64_t>, double> cublas_us;  // per shape, measured once
  Json jg = Json::array();
  for (const char* rname : {"ufp4", "nvfp4", "mxfp4"}) {
    const fp4lab::QuantConfig gc = fc::plain_config(gpu::preset(rname));
    // Whether this recipe's scales take the fused epilogue.
    fc::GemmCase probe(gc, 128, 128, 4 * gc.block, stream.get());
    const bool fused = probe.prepare_fused(stream.get());
    // Bound from the contract's per-block epilogue (epilogue_bound.hpp), in the form this GEMM takes.
    const int epi_ops = fc::epilogue_fp32_instructions(fused);
    const double bound_tops = fc::epilogue_bound_ops_per_s(dev.sms, clock_khz, gc.block, fused) / 1e12;
    std::cout << "\nblock-scaled GEMM " << gc.label() << " (fast kernel: mma.sync on int8 views, or wgmma on F16"
              << " views, + FP32 contract epilogue; 'total' includes the unpack pass) vs cuBLAS BF16 (BF16 in, FP32 out)\n";
    std::cout << "  epilogue bound at this clock: " << fixed(bound_tops, 0) << " TOPS (" << epi_ops
              << " FP32 instructions per output per " << gc.block << "-element block"
              << (fused ? ": the fused form, every scale passing fma_exact_scale" : "") << ")\n";
    std::cout << "  tile variants: ";
    for (int v = 0; v < fc::gemm_fast_variants(); ++v)
      std::cout << (v ? ", " : "") << v << " = " << fc::gemm_fast_variant_name(v)
                << (v == fc::gemm_fast_default_variant(gc.block, big, big) ? " (default at the big shape)" : "");
    std::cout << "\n" << pad("M x N x K", 20) << pad("variant", 8) << pad("unpack us", 11) << pad("mma us", 11)
              << pad("TOPS(total)", 13) << pad("cuBLAS us", 11) << pad("TFLOPS", 9) << pad("ratio", 8)
              << (fused ? pad("unfused mma us", 16) + pad("fused/unfused", 15) : std::string()) << "\n";
    for (auto [M, N, K] : glist) {
      if (K % gc.block) continue;
      fc::GemmCase g(gc, M, N, K, stream.get());
      // Plain launch loops, no graphs, for both sides: cuBLAS under stream capture needs its own workspace setup.
      const bool fused_here = g.prepare_fused(stream.get());  // these operands' scales (the header's are a probe's)
      double t_cub = 0, tflops = 0;
      if (cublas && cublas_us.count({M, N, K})) {
        t_cub = cublas_us[{M, N, K}];
      } else if (cublas) {
        t_cub = g.time_cublas_bf16(T, *cublas, reps);
        cublas_us[{M, N, K}] = t_cub;
      }
      if (cublas) tflops = g.flops / t_cub / 1e6;
      int best = -1;
      double best_tops = 0;
      for (int variant = 0; variant < fc::gemm_fast_variants(); ++variant) {
        // The unpack pass writes the views this variant reads (int8, or F16 for wgmma): timed for each.
        const double t_prep = g.time_unpack(T, reps, variant);
        const double t_mma = g.time_mma(T, reps, variant);
        // The same launch with the separate multiply and add: the fused form's gain.
        const double t_unfused = fused_here ? g.time_mma_unfused(T, reps, variant) : 0.0;
        const double tops = g.flops / (t_prep + t_mma) / 1e6;
        if (tops > best_tops) {
          best_tops = tops;
          best = variant;
        }
        std::cout << pad(std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K), 20)
                  << pad(std::to_string(variant), 8) << pad(fixed(t_prep, 2), 11) << pad(fixed(t_mma, 2), 11)
                  << pad(fixed(tops, 1), 13) << pad(cublas ? fixed(t_cub, 2) : "-", 11)
                  << pad(cublas ? fixed(tflops, 1) : "-", 9) << pad(cublas ? fixed(t_cub / (t_prep + t_mma), 3) : "-", 8)
                  << (!fused ? std::string()
                      : fused_here ? pad(fixed(t_unfused, 2), 16) + pad(fixed(t_mma / t_unfused, 3), 15)
                                   : pad("-", 16) + pad("-", 15))
                  << "\n";
        jg.push_back({{"recipe", rname}, {"label", gc.label()}, {"M", M}, {"N", N}, {"K", K}, {"variant", variant},
                      {"variant_name", fc::gemm_fast_variant_name(variant)}, {"unpack_us", t_prep}, {"mma_us", t_mma},
                      {"tops", tops}, {"cublas_bf16_us", t_cub}, {"cublas_tflops", tflops},
                      {"ratio_vs_cublas", cublas ? t_cub / (t_prep + t_mma) : 0.0},
                      {"epilogue_bound_tops", bound_tops}, {"fused_epilogue", fused_here},
                      {"unfused_mma_us", fused_here ? Json(t_unfused) : Json()}});  // null: not measured
      }
      std::cout << pad("best: variant " + std::to_string(best), 28) << ", " << fixed(best_tops, 1) << " TOPS = "
                << fixed(100 * best_tops / bound_tops, 0) << "% of the epilogue bound"
                << (cublas ? ", " + fixed(best_tops / tflops, 3) + "x cuBLAS BF16" : std::string()) << "\n";
    }
  }
  J["gemm"] = jg;
  stream.close();
  J["command"] = "bench";
  json.write(J);  // a temporary file renamed into place; adds fp4lab_version and git_commit
  return kExitOk;
#endif
}

}  // namespace fp4lab::cli
