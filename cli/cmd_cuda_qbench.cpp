// fp4lab cuda qbench: the quantiser on BF16 operands at training shapes, every variant beside a device-to-device
// copy of the same bytes in the same run. Variants per recipe: plain (the recipe's grid, block and scale, RTNE),
// rht16 (fused RHT-16 with the recipe's BF16 rounding), sr (stochastic rounding), sr1 (SR under philox1), sr16
// (SR under philox16), rht16-sr (both, a step's dY under ufp4) and rht16-sr16 (the same under philox16); each
// row-wise (quantise [R, C] along C) and transposed (quantise X^T, [C, R] along R, reading X [R, C] in place), and for
// the transposed case the route it replaces: a copy of X (the cheapest transposed copy) then the row-wise pass; and
// the fake quantiser a training step's fast GEMMs run (fake-row, fake-transposed: BF16 dequantised values out;
// fake-both: both from one read, fake_quantize_both, as the step takes X and X^T, dY and dY^T).
// Bytes = BF16 in + packed codes + FP32 decoded scales (+ scale codes), or BF16 in + BF16 out for the fake
// layouts (twice out for fake-both); the copy moves the same total (half read, half written). Inputs rotate through buffers over 4x the L2; calls run as CUDA-graph batches.
// The options are checked in every build, before any device is looked at.
#include <cstdint>
#include <string>
#include <vector>

#include "cmd_cuda_common.hpp"
#include "commands.hpp"
#include "options.hpp"

#ifdef FP4LAB_CLI_HAS_CUDA
#include <iostream>
#include <utility>

#include "fp4lab/cuda/timing.hpp"
#endif

namespace fp4lab::cli {

int cmd_cuda_qbench(const Invocation& inv) {
  po::options_description desc("fp4lab cuda qbench options");
  std::vector<std::string> shapes, recipes;
  std::string only_variant, only_layout;
  int reps = 15;
  desc.add_options()("shape", po::value(&shapes)->multitoken(),
                     "operand shapes RxC (default: the 103M model's 8192x1024 8192x2816 1024x8192 2816x1024 1024x1024)")(
      "recipe", po::value(&recipes)->multitoken(), "recipes (default: ufp4 e2m1-ref nvfp4 mxfp4)")(
      "reps", po::value(&reps)->default_value(15), "timed repetitions (median reported)")(
      "variant", po::value(&only_variant),
      "only this variant: plain, rht16, sr (philox4), sr1 (philox1), sr16 (philox16), rht16-sr or rht16-sr16")(
      "layout", po::value(&only_layout),
      "only this layout: row-wise, transposed, copy+row, fake-row, fake-transposed or fake-both");
  cli::add_common_options(desc);
  po::variables_map vm;
  if (!cli::parse_args(inv, desc,
                       "[--shape RxC ..] [--recipe R ..] [--variant V] [--layout L] [--reps N] [--json FILE]",
                       vm))
    return kExitOk;
  const cli::JsonOut json(vm);
  if (reps < 3) usage_error("--reps must be >= 3");
  const auto one_of = [](const std::string& v, std::initializer_list<const char*> names, const char* opt) {
    if (v.empty()) return;
    for (const char* n : names)
      if (v == n) return;
    usage_error(std::string(opt) + " " + v + ": unknown (see --help)");
  };
  one_of(only_variant, {"plain", "rht16", "sr", "sr1", "sr16", "rht16-sr", "rht16-sr16"}, "--variant");
  one_of(only_layout, {"row-wise", "transposed", "copy+row", "fake-row", "fake-transposed", "fake-both"},
         "--layout");
  if (shapes.empty()) shapes = {"8192x1024", "8192x2816", "1024x8192", "2816x1024", "1024x1024"};
  if (recipes.empty()) recipes = fp4lab::Recipe::preset_names();
  std::vector<std::vector<int64_t>> slist;
  for (const auto& sh : shapes) {
    slist.push_back(cli::parse_dims(sh, "RxC", "shape"));
    if (slist.back()[0] % 32 || slist.back()[1] % 32) usage_error("--shape " + sh + ": R and C must be multiples of 32");
  }
  std::vector<fp4lab::Recipe> rlist;
  for (const auto& r : recipes) rlist.push_back(gpu::preset(r));
  gpu::require_gpu();  // exit 4 without CUDA in this build, 3 without a device
#ifdef FP4LAB_CLI_HAS_CUDA
  namespace fc = fp4lab::cuda;
  using gpu::fixed, gpu::pad;
  const fc::DeviceInfo dev = fc::device_info();
  fc::Stream stream;
  fc::Timer T(stream.get());
  Json J;
  J["device"] = {{"name", dev.name}, {"sm", dev.cc_major * 10 + dev.cc_minor}, {"sms", dev.sms},
                 {"l2_bytes", dev.l2_bytes}};
  std::cout << "fp4lab cuda qbench on " << dev.name << " (" << dev.sms << " SMs, L2 " << dev.l2_bytes / (1 << 20)
            << " MiB); BF16 in; median of " << reps << "; copy = cudaMemcpyAsync device-to-device of the same bytes"
            << " (read + written), same run\n";
  std::cout << pad("shape", 11) << pad("recipe", 10) << pad("variant", 9) << pad("layout", 16) << pad("us", 9)
            << pad("GB/s", 8) << pad("copy us", 9) << pad("copy GB/s", 10) << pad("%copy", 7) << "\n";
  Json rows = Json::array();
  for (const auto& sh : slist) {
    const int64_t R = sh[0], C = sh[1];
    fc::Bf16QuantBench bench(dev, R, C);
    for (const fp4lab::Recipe& rec : rlist) {
      const fc::Bf16Variants v = fc::bf16_variants(rec);
      for (auto [vname, cfg] : {std::pair<const char*, const fp4lab::QuantConfig*>{"plain", &v.plain},
                                {"rht16", &v.rht16}, {"sr", &v.sr}, {"sr1", &v.sr1},
                                {"sr16", &v.sr16}, {"rht16-sr", &v.rht16_sr}, {"rht16-sr16", &v.rht16_sr16}}) {
        for (auto [layout, lay] : {std::pair<const char*, fc::Bf16Layout>{"row-wise", fc::Bf16Layout::row_wise},
                                   {"transposed", fc::Bf16Layout::transposed},
                                   {"copy+row", fc::Bf16Layout::copy_row},
                                   {"fake-row", fc::Bf16Layout::fake_row},
                                   {"fake-transposed", fc::Bf16Layout::fake_transposed},
                                   {"fake-both", fc::Bf16Layout::fake_both}}) {
          const std::string l = layout;
          if (l == "copy+row" && std::string(vname) != "plain") continue;
          if ((!only_variant.empty() && only_variant != vname) || (!only_layout.empty() && only_layout != l)) continue;
          const double bytes = bench.bytes(v.plain, lay);
          const fc::CopyTime copy = bench.copy(T, bytes, reps);
          const double t_copy = copy.us, copy_gbs = copy.gbs;
          const double us = bench.time(T, *cfg, lay, reps);
          const double gbs = bytes / us / 1e3;
          std::cout << pad(std::to_string(R) + "x" + std::to_string(C), 11) << pad(rec.name, 10) << pad(vname, 9)
                    << pad(layout, 16) << pad(fixed(us, 2), 9) << pad(fixed(gbs, 0), 8) << pad(fixed(t_copy, 2), 9)
                    << pad(fixed(copy_gbs, 0), 10) << pad(fixed(100 * gbs / copy_gbs, 0), 7) << "\n";
          rows.push_back({{"rows", R}, {"cols", C}, {"recipe", rec.name}, {"variant", vname}, {"layout", layout},
                          {"config", cfg->label()}, {"us", us}, {"gbs", gbs}, {"bytes", bytes}, {"copy_us", t_copy},
                          {"copy_gbs", copy_gbs}, {"fraction_of_copy", gbs / copy_gbs}, {"graph_batch", bench.batch()},
                          {"buffers", bench.buffers()}, {"samples_us", T.samples}});
        }
      }
    }
  }
  J["quantize_bf16"] = rows;
  stream.close();
  J["command"] = "qbench";
  json.write(J);
  return kExitOk;
#endif
}

}  // namespace fp4lab::cli
