// fp4lab cuda qbench: the quantiser on BF16 operands at training shapes, every variant beside a device-to-device
// copy of the same bytes in the same run. Variants per recipe: plain (the recipe's grid, block and scale, RTNE),
// rht16 (fused RHT-16 with the recipe's BF16 rounding), sr (stochastic rounding); each row-wise (quantise
// [R, C] along C) and transposed (quantise X^T, [C, R] along R, reading X [R, C] in place), and for the
// transposed case the route it replaces: a copy of X (the cheapest transposed copy) then the row-wise pass.
// Bytes = BF16 in + packed codes + FP32 decoded scales (+ scale codes); the copy moves the same total (half read,
// half written). Inputs rotate through buffers over 4x the L2; calls run as CUDA-graph batches.
// The options are checked in every build, before any device is looked at.
#include <cstdint>
#include <string>
#include <vector>

#include "commands.hpp"
#include "cuda_tools.hpp"
#include "options.hpp"

#ifdef FP4LAB_CLI_HAS_CUDA
#include <algorithm>
#include <iostream>
#include <map>
#include <utility>

#include "fp4lab/rht.hpp"
#endif

namespace fp4lab::cli {

#ifdef FP4LAB_CLI_HAS_CUDA
namespace {
using namespace gpu;  // random_tensor

fp4lab::cuda::Buffer<uint16_t> device_random_bf16(int64_t n, uint64_t seed) {
  const std::vector<float> h = random_tensor(std::min<int64_t>(n, int64_t(1) << 22), seed);
  std::vector<uint16_t> hb(h.size());
  for (size_t i = 0; i < h.size(); ++i) hb[i] = fp4lab::f32_to_bf16(h[i]);
  fp4lab::cuda::Buffer<uint16_t> b(static_cast<size_t>(n));
  fp4lab::cuda::check(cudaMemcpy(b.data(), hb.data(), hb.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  for (int64_t done = int64_t(hb.size()); done < n;) {
    const int64_t c = std::min(done, n - done);
    fp4lab::cuda::check(cudaMemcpy(b.data() + done, b.data(), size_t(c) * 2, cudaMemcpyDeviceToDevice), "cudaMemcpy D2D");
    done += c;
  }
  // The copies run on the legacy stream, which qbench's non-blocking stream does not wait for.
  fp4lab::cuda::check(cudaDeviceSynchronize(), "device_random_bf16");
  return b;
}

}  // namespace
#endif

int cmd_cuda_qbench(const Invocation& inv) {
  po::options_description desc("fp4lab cuda qbench options");
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
  if (!cli::parse_args(inv, desc,
                       "[--shape RxC ..] [--recipe R ..] [--variant V] [--layout L] [--reps N] [--json FILE]",
                       vm))
    return kExitOk;
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
  for (const auto& r : recipes) rlist.push_back(gpu::preset(r));
  gpu::require_gpu();  // exit 4 without CUDA in this build, 3 without a device
#ifdef FP4LAB_CLI_HAS_CUDA
  using namespace gpu;  // Timer, fixed, pad, fc
  const fc::DeviceInfo dev = fc::device_info();
  cudaStream_t s;
  fc::check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  Timer T(s);
  Json J;
  J["device"] = {{"name", dev.name}, {"sm", dev.cc_major * 10 + dev.cc_minor}, {"sms", dev.sms},
                 {"l2_bytes", dev.l2_bytes}};
  std::cout << "fp4lab cuda qbench on " << dev.name << " (" << dev.sms << " SMs, L2 " << dev.l2_bytes / (1 << 20)
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
    fc::check(cudaDeviceSynchronize(), "cudaMemcpy D2D");  // legacy-stream copies, before stream s reads them
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
                    << pad(layout, 12) << pad(fixed(us, 2), 9) << pad(fixed(gbs, 0), 8) << pad(fixed(t_copy, 2), 9)
                    << pad(fixed(copy_gbs, 0), 10) << pad(fixed(100 * gbs / copy_gbs, 0), 7) << "\n";
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
  return kExitOk;
#endif
}

}  // namespace fp4lab::cli
