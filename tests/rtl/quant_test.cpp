// Block quantiser against the golden quantize(): every format x scale kind x rounding on 1x16 blocks,
// OCP MX 1x32 blocks and NVFP4 16x16 weight tiles (two-pass amax), over data that hits the corners:
// zeros, subnormal and huge values, outliers, heavy tails.
#include <random>
#include <string>
#include <vector>

#include "fp4lab/quantize.hpp"
#include "harness.hpp"
#include "quant_driver.hpp"

namespace fp4lab::rtl_test {
namespace {

// Tensors of `rows` x `cols` in several distributions.
std::vector<std::vector<float>> test_tensors(std::mt19937_64& rng, int64_t rows, int64_t cols) {
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::student_t_distribution<float> heavy(2.5f);
  std::vector<std::vector<float>> out;
  const int64_t n = rows * cols;
  for (float scale : {1.0f, 3e-3f, 1e-30f, 2e-39f, 1e30f, 1.5e-45f}) {  // 1.5e-45: amax a few ulps of 2^-149
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = scale * gauss(rng);
    out.push_back(x);
  }
  {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = heavy(rng);
    out.push_back(x);
  }
  {  // sparse, all-zero blocks, one outlier per row, signed zeros
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] = (rng() % 3 == 0) ? gauss(rng) : ((rng() & 1) ? -0.0f : 0.0f);
    for (int64_t c = 0; c < 16; ++c) x[size_t(c)] = 0.0f;
    for (int64_t r = 0; r < rows; ++r) x[size_t(r * cols + int64_t(rng() % uint64_t(cols)))] = 1000.0f;
    out.push_back(x);
  }
  {  // values on grid points of a power-of-two scale: exact ties for RTNE
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = std::ldexp(float(int(rng() % 29) - 14), -2 - int(rng() % 3));
    out.push_back(x);
  }
  return out;
}

void run_config(Dut<Vfp4_quant_unit>& dut, Checker& chk, std::mt19937_64& rng, const QuantConfig& cfg,
                int64_t rows, int64_t cols, double p_idle, double p_stall) {
  for (const std::vector<float>& x : test_tensors(rng, rows, cols)) {
    const QTensor g = quantize(x.data(), rows, cols, cfg);
    const RtlQuant q = rtl_quantize(dut, x.data(), rows, cols, cfg, p_idle, p_stall);
    if (!compare_quant(chk, q, g, x.data(), cfg.label())) return;
  }
}

TEST(Quant, AllFormatsScalesRoundings) {
  Dut<Vfp4_quant_unit> dut("fp4_quant_unit");
  dut.reset();
  Checker chk("fp4_quant_unit");
  std::mt19937_64 rng(seed());
  int configs = 0;
  for (const ElemFormat& f : kAllFormats)
    for (ScaleKind s : {ScaleKind::fp32, ScaleKind::ue4m3, ScaleKind::ue8m0, ScaleKind::ue8m0_ceil})
      for (Rounding r : {Rounding::rtne, Rounding::sr}) {
        QuantConfig cfg;
        cfg.format = f;
        cfg.scale = s;
        cfg.rounding = r;
        cfg.seed = rng();
        cfg.stream = uint32_t(rng());
        run_config(dut, chk, rng, cfg, 32, 64, 0.1, 0.1);
        ++configs;
        if (r == Rounding::sr) {  // the other draws too (cfg.sr_draw is philox4 by default)
          for (SrDraw d : kSrDraws)
            if (d != kDefaultSrDraw) {
              cfg.sr_draw = d;
              run_config(dut, chk, rng, cfg, 32, 64, 0.1, 0.1);
              ++configs;
            }
          cfg.sr_draw = kDefaultSrDraw;
        }
        // OCP MX 1x32 blocks (ue4m3 is block 16 only) and 16x16 tiles (block 16).
        if (s != ScaleKind::ue4m3) {
          cfg.block = 32;
          run_config(dut, chk, rng, cfg, 32, 64, 0.0, 0.0);
          cfg.block = 16;
          ++configs;
        }
        cfg.tile2d = true;
        run_config(dut, chk, rng, cfg, 32, 64, 0.0, 0.0);
        ++configs;
      }
  std::printf("[fp4_quant_unit] %d configurations\n", configs);
  chk.finish();
}

// A longer run on the two presets' main operands (ufp4 and nvfp4), random normal data.
TEST(Quant, PresetVolume) {
  Dut<Vfp4_quant_unit> dut("fp4_quant_unit_volume");
  dut.reset();
  Checker chk("fp4_quant_unit_volume");
  std::mt19937_64 rng(seed() + 7);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  const int64_t rows = 256, cols = 256;
  for (int rep = 0, n = int(scaled(2)); rep < n; ++rep)
    for (const ElemFormat& f : {kE1M2, kE2M1})
      for (ScaleKind s : {ScaleKind::fp32, ScaleKind::ue4m3})
        for (Rounding r : {Rounding::rtne, Rounding::sr}) {
          QuantConfig cfg;
          cfg.format = f;
          cfg.scale = s;
          cfg.rounding = r;
          cfg.seed = rng();
          std::vector<float> x(static_cast<size_t>(rows * cols));
          const float scale = std::ldexp(1.0f, int(rng() % 40) - 20);
          for (float& v : x) v = scale * gauss(rng);
          const QTensor g = quantize(x.data(), rows, cols, cfg);
          if (!compare_quant(chk, rtl_quantize(dut, x.data(), rows, cols, cfg), g, x.data(), cfg.label())) break;
        }
  chk.finish();
}

}  // namespace
}  // namespace fp4lab::rtl_test
