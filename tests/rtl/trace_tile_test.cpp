// Tiles of the bundled real training trace (workloads/, read by models/io) through the RTL: for every
// recipe preset and training pass, the operands of a 16 x 16 output tile (full K) are rotated and
// quantised by the RTL RHT and quantiser units and multiplied by the block MAC; all three must match the
// golden model bit for bit. Registered as its own ctest only when a trace is bundled; run without
// +workloads=DIR, or with a folder holding no trace, it fails rather than skips.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "Vfp32_rht16_unit.h"
#include "Vfp4_mac_unit_dual.h"
#include "Vfp4_quant_unit.h"
#include "fp4lab/io/safetensors.hpp"
#include "fp4lab/recipe.hpp"
#include "harness.hpp"
#include "mac_driver.hpp"
#include "quant_driver.hpp"

namespace fp4lab::rtl_test {
namespace {

// Rows [0, n) of a row-major [rows, cols] tensor.
std::vector<float> head_rows(const std::vector<float>& t, int64_t cols, int64_t n) {
  return std::vector<float>(t.begin(), t.begin() + n * cols);
}

TEST(TraceTile, PresetsThroughRtl) {
  const std::string dir = plusarg_value("workloads");
  ASSERT_FALSE(dir.empty()) << "give the bundled trace as +workloads=DIR";
  ASSERT_TRUE(std::filesystem::exists(dir)) << dir << ": no such trace folder";
  const io::Trace trace(dir);
  ASSERT_FALSE(trace.records().empty()) << dir << ": the trace holds no linear-layer records";
  // The outlier-heavy fc2 input when there is one (docs/spec.md §8), else the first layer.
  const io::TraceRecord* pick = &trace.records().front();
  for (const io::TraceRecord& r : trace.records())
    if (r.gemm.size() >= 3 && r.gemm.compare(r.gemm.size() - 3, 3, "fc2") == 0) {
      pick = &r;
      break;
    }
  const io::TraceRecord& rec = *pick;
  const io::Trace::Layer layer = trace.load(rec);
  std::printf("[trace_tiles] %s from %s: tokens %lld, in %lld, out %lld\n", rec.gemm.c_str(), rec.file.c_str(),
              (long long)rec.tokens, (long long)rec.in, (long long)rec.out);

  Dut<Vfp32_rht16_unit> rht("fp32_rht16_unit_trace");
  Dut<Vfp4_quant_unit> quant("fp4_quant_unit_trace");
  Dut<Vfp4_mac_unit_dual> mac("fp4_mac_unit_dual_trace");
  rht.reset();
  quant.reset();
  mac.reset();
  Checker qchk("trace_tiles_quant"), mchk("trace_tiles_mac");
  for (const std::string& name : Recipe::preset_names()) {
    const Recipe r = Recipe::preset(name);
    for (Pass p : kPasses) {
      const PassOperands ops = pass_operands(p, layer.x.data(), layer.w.data(), layer.dy.data(), rec.tokens, rec.in,
                                             rec.out);
      const int64_t tm = std::min<int64_t>(16, ops.M), tn = std::min<int64_t>(16, ops.N), K = ops.K;
      const std::vector<float> a = head_rows(ops.a, K, tm), b = head_rows(ops.b, K, tn);
      const std::string what = rec.gemm + " " + name + "/" + pass_name(p);
      QTensor q[2];
      for (int side = 0; side < 2; ++side) {
        QuantConfig cfg = r.operand(p, side == 0 ? Operand::a : Operand::b, uint32_t(side + 1));
        const std::vector<float>& x = side == 0 ? a : b;
        const int64_t rows = side == 0 ? tm : tn;
        if (cfg.tile2d && rows % 16 != 0) cfg.tile2d = false;
        q[side] = quantize(x.data(), rows, K, cfg);
        const std::vector<float> y = cfg.rht == 16 ? rtl_rotate(rht, x.data(), rows, K, cfg) : x;
        compare_quant(qchk, rtl_quantize(quant, y.data(), rows, K, cfg), q[side], y.data(),
                      what + (side == 0 ? " A " : " B ") + cfg.label());
      }
      check_gemm_tile(mac, mchk, q[0], q[1], what);
    }
  }
  qchk.finish();
  mchk.finish();
}

}  // namespace
}  // namespace fp4lab::rtl_test
