// fp4lab cuda timings: the per-kernel timings the simulator is validated against, one JSON row per kernel and
// shape with every repeat's time (the median is the figure). Kernels: copy (device-to-device, per size),
// quantize_plain / quantize_fused_rht16 / quantize_unfused_rht16 (per --quant operand), and per --gemm shape and
// --gemm-recipe the fast contract GEMM's int8 unpack pass (gemm_unpack), its mma kernel (gemm_mma) and the whole
// call (gemm_fast: both, as a training step runs them), each at the default tile variant.
// The options are checked in every build, before any device is looked at.
#include <cstdint>
#include <string>
#include <vector>

#include "cmd_cuda_common.hpp"
#include "commands.hpp"
#include "options.hpp"

#ifdef FP4LAB_CLI_HAS_CUDA
#include <algorithm>
#include <iostream>

#include "fp4lab/cuda/timing.hpp"
#endif

namespace fp4lab::cli {

int cmd_cuda_timings(const Invocation& inv) {
  po::options_description desc("fp4lab cuda timings options");
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
  if (!cli::parse_args(inv, desc,
                       "[--quant RxK ..] [--gemm MxNxK ..] [--gemm-recipe R ..] [--reps N] [--json FILE]", vm))
    return kExitOk;
  const cli::JsonOut json(vm);
  if (reps < 3) usage_error("--reps must be >= 3");
  if (gemm_recipes.empty()) gemm_recipes = {"ufp4", "mxfp4"};
  if (copy_sizes.empty())
    for (int64_t b = int64_t(1) << 20; b <= int64_t(1) << 30; b *= 4) copy_sizes.push_back(b);
  for (int64_t b : copy_sizes)
    if (b < 4096 || b > (int64_t(1) << 32) || b % 4096) usage_error("--copy sizes must be multiples of 4096 up to 4 GiB");
  const fp4lab::Recipe recipe = gpu::preset(recipe_name);
  std::vector<std::vector<int64_t>> qlist, glist;
  for (const auto& q : quant) {
    qlist.push_back(cli::parse_dims(q, "RxK", "quant"));
    if (qlist.back()[1] % recipe.block) usage_error("--quant " + q + ": K is not a multiple of the block");
  }
  std::vector<fp4lab::Recipe> grecipes;
  for (const auto& r : gemm_recipes) grecipes.push_back(gpu::preset(r));
  for (const auto& g : gemms) {
    glist.push_back(cli::parse_dims(g, "MxNxK", "gemm"));
    for (const auto& gr : grecipes)
      if (glist.back()[2] % gr.block) usage_error("--gemm " + g + ": K is not a multiple of every recipe's block");
  }
  gpu::require_gpu();  // exit 4 without CUDA in this build, 3 without a device
#ifdef FP4LAB_CLI_HAS_CUDA
  namespace fc = fp4lab::cuda;
  using gpu::fixed, gpu::pad;
  const fp4lab::QuantConfig plain = fc::plain_config(recipe), rot = fc::rht16_config(plain);
  std::vector<fp4lab::QuantConfig> gcs;
  for (const auto& gr : grecipes) gcs.push_back(fc::plain_config(gr));
  const fc::DeviceInfo dev = fc::device_info();
  const fc::Clocks clocks = fc::device_clocks(dev.id);
  const int clock_khz = clocks.sm_khz, mem_khz = clocks.memory_khz, bus_bits = clocks.memory_bus_bits;
  fc::Stream stream;
  fc::Timer T(stream.get());
  Json J;
  J["command"] = "timings";
  J["device"] = {{"name", dev.name}, {"sm", dev.cc_major * 10 + dev.cc_minor}, {"sms", dev.sms},
                 {"l2_bytes", dev.l2_bytes}, {"clock_khz", clock_khz}, {"memory_clock_khz", mem_khz},
                 {"memory_bus_bits", bus_bits}};
  J["reps"] = reps;
  std::ostream& out = json.table() ? std::cout : std::cerr;
  out << "fp4lab cuda timings on " << dev.name << " (sm_" << dev.cc_major << dev.cc_minor << ", " << dev.sms
      << " SMs, L2 " << dev.l2_bytes / (1 << 20) << " MiB, SM clock " << clock_khz / 1000 << " MHz), median of "
      << reps << "\n";
  Json rows = Json::array();
  auto row = [&](const std::string& kernel, const std::string& label, const std::string& shape, double median,
                 const std::vector<double>& samples, Json extra) {
    Json r = {{"kernel", kernel}, {"recipe", label}, {"shape", shape}, {"median_us", median}, {"samples_us", samples}};
    for (auto& [k, v] : extra.items()) r[k] = v;
    rows.push_back(r);
    out << pad(kernel, 24) << pad(shape, 22) << pad(fixed(median, 2), 12) << " us\n" << std::flush;
  };

  // Device-to-device copies: bytes read + bytes written over time; the source and destination walk through
  // 1 GiB buffers so that small copies do not stay in the L2.
  {
    fc::CopyWalk walk(size_t(*std::max_element(copy_sizes.begin(), copy_sizes.end())));
    for (int64_t b : copy_sizes) {
      const fc::CopyWalk::Time t = walk.time(T, b, reps);
      row("copy", "", std::to_string(b), t.us, T.samples,
          {{"bytes", b}, {"gbs", 2.0 * double(b) / t.us / 1e3}, {"batch", t.batch}, {"graph", t.batch > 1}});
    }
  }
  double copy_gbs = 0;
  for (const Json& r : rows) copy_gbs = std::max(copy_gbs, r["gbs"].get<double>());

  for (const auto& d : qlist) {
    const int64_t R = d[0], K = d[1];
    const fc::QuantTimes q = fc::time_quantize(T, dev, copy_gbs, R, K, plain, rot, reps);
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
      fc::GemmCase g(gc, M, N, K, stream.get());  // back-to-back launches (no graph), as a training step issues them
      const int variant = fc::gemm_fast_default_variant(gc.block, M, N);
      const std::string shape = std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
      const Json ex = {{"M", M}, {"N", N}, {"K", K}, {"batch", g.batch}, {"graph", false}, {"variant", variant},
                       {"variant_name", fc::gemm_fast_variant_name(variant)}};
      const double t_prep = g.time_unpack(T, reps);  // the default variant's views
      row("gemm_unpack", gc.label(), shape, t_prep, T.samples, ex);
      const double t_mma = g.time_mma(T, reps, variant);
      row("gemm_mma", gc.label(), shape, t_mma, T.samples, ex);
      const double t_all = g.time_fast(T, reps, variant);
      Json ex2 = ex;
      ex2["tops"] = g.flops / t_all / 1e6;
      row("gemm_fast", gc.label(), shape, t_all, T.samples, ex2);
    }
  }
  stream.close();
  J["rows"] = rows;
  json.write(J);
  return kExitOk;
#endif
}

}  // namespace fp4lab::cli
