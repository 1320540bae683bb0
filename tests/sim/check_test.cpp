// --check: the simulated MAC array and accumulator compute every output through the Datapath, tile by tile in
// the scheduler's order, and each output's FP32 bit pattern must equal fp4lab::gemm's. Synthetic traces with
// edge tiles (no dimension a multiple of the tile), several TCUs, every recipe and prep mode; a datapath that
// corrupts one product must be caught; and the bundled trace (workloads/tiny-lm/step_005000).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "fp4lab/gemm.hpp"
#include "fp4lab/io/safetensors.hpp"
#include "fp4lab/recipe.hpp"
#include "fp4lab/sim/run.hpp"
#include "sim_test_util.hpp"

namespace fp4lab::sim::test {
namespace {

namespace fs = std::filesystem;

// A trace folder of `layers` records of [tokens, in], [out, in], [tokens, out], heavy-tailed values (a Student-t
// with a few large channels, like an fc2 input), written as BF16.
std::string synthetic_trace(const std::string& name, int64_t tokens, int64_t in, int64_t out, int layers = 1) {
  const fs::path dir = fs::temp_directory_path() / ("fp4lab_sim_" + name + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::mt19937 rng(1234);
  std::student_t_distribution<float> t(3.0f);
  auto fill = [&](int64_t r, int64_t c, float scale) {
    std::vector<float> v(size_t(r * c));
    for (int64_t i = 0; i < r * c; ++i) v[size_t(i)] = scale * t(rng) * ((i % c) % 37 == 5 ? 20.0f : 1.0f);
    return v;
  };
  for (int l = 0; l < layers; ++l) {
    const std::string g = "layer" + std::to_string(l) + ".linear_fc2";
    io::write_safetensors((dir / (g + ".safetensors")).string(),
                          {io::make_bf16(g + ".fwd_x", {tokens, in}, fill(tokens, in, 1.0f)),
                           io::make_bf16(g + ".fwd_w", {out, in}, fill(out, in, 0.02f)),
                           io::make_bf16(g + ".bwd_dy", {tokens, out}, fill(tokens, out, 1e-6f))},
                          {{"fp4lab.trace.version", "1"}, {"model", "synthetic"}});
  }
  return dir.string();
}

RunOptions recipe_options(const std::string& name, bool check = true) {
  RunOptions o;
  o.recipe = name;
  const Recipe r = Recipe::preset(name);
  o.quant = [r](Pass p, Operand op, uint32_t gemm) { return r.operand(p, op, gemm); };
  o.check = check;
  return o;
}

void expect_clean(const Report& rep, int64_t outputs) {
  ASSERT_TRUE(rep.checked);
  EXPECT_EQ(rep.total_checked(), outputs);
  EXPECT_EQ(rep.total_mismatches(), 0);
  for (const JobReport& j : rep.jobs) EXPECT_EQ(j.mismatches, 0) << j.name << ": " << j.first_mismatch;
}

TEST(Check, EveryRecipeAndPrepModeWithEdgeTilesAndThreeTcus) {
  // 96 x 160 x 64: 6 x 4 output tiles of 16 in fwd_y, K = 160 -> k-steps of 64, 64 and 32.
  const std::string dir = synthetic_trace("recipes", 96, 160, 64);
  const io::Trace trace(dir, 32);
  const int64_t outputs = 96 * 64 + 96 * 160 + 64 * 160;  // fwd_y, bwd_dx, bwd_dw
  for (const char* mode : {"frontend", "fused", "unfused", "none"}) {
    Simulator sim(config("teaching", {std::string("prep.mode=") + mode, "tcu.count=3"}));
    for (const std::string& recipe : Recipe::preset_names()) {
      SCOPED_TRACE(std::string(mode) + " " + recipe);
      const Report rep = run_trace(sim, trace, dir, recipe_options(recipe));
      ASSERT_EQ(rep.jobs.size(), 3u);
      expect_clean(rep, outputs);
    }
  }
  fs::remove_all(dir);
}

TEST(Check, OtherTileShapesAndOneAccumulator) {
  const std::string dir = synthetic_trace("tiles", 80, 96, 144);
  const io::Trace trace(dir, 16);
  const int64_t outputs = 80 * 144 + 80 * 96 + 144 * 96;
  Simulator sim(config("teaching", {"tile.m=48", "tile.n=32", "tile.k=96", "acc.tiles=1", "tcu.count=5",
                                    "buffer.bytes=65536", "tile.raster_group=2"}));
  expect_clean(run_trace(sim, trace, dir, recipe_options("ufp4")), outputs);
  fs::remove_all(dir);
}

// The golden datapath with one block product off by one: --check must see it.
class OffByOne final : public Datapath {
 public:
  std::string name() const override { return "off-by-one"; }
  void block_dots(const TileStep& s, int32_t* p) override {
    golden_.block_dots(s, p);
    if (++calls_ == 3) p[0] += 1;
  }
  void scale_accumulate(const TileStep& s, const int32_t* p, float* acc) override { golden_.scale_accumulate(s, p, acc); }
  void finish(const float* acc, int64_t n, float ga, float gb, float* out) override { golden_.finish(acc, n, ga, gb, out); }

 private:
  GoldenDatapath golden_;
  int calls_ = 0;
};

TEST(Check, ACorruptedProductIsReported) {
  const std::string dir = synthetic_trace("corrupt", 64, 64, 64);
  const io::Trace trace(dir, 16);
  Simulator sim(config("teaching"), std::make_shared<OffByOne>());
  RunOptions o = recipe_options("ufp4");
  o.passes = {Pass::fwd_y};
  const Report rep = run_trace(sim, trace, dir, o);
  EXPECT_EQ(rep.total_checked(), 64 * 64);
  EXPECT_EQ(rep.total_mismatches(), 1);
  // The third k-step token is the first (and only) step of the third 16 x 16 tile in row-major raster order.
  EXPECT_NE(rep.jobs[0].first_mismatch.find("C[0, 32]"), std::string::npos) << rep.jobs[0].first_mismatch;
  fs::remove_all(dir);
}

// An output-tile datapath (the granularity of the Verilated RTL MAC): the scalar contract per output of each
// tile, computed after the timed run. Checks that the tiles the Simulator hands over cover C exactly once.
class TileGolden final : public Datapath {
 public:
  std::string name() const override { return "tile-golden"; }
  Granularity granularity() const override { return Granularity::output_tile; }
  void block_dots(const TileStep&, int32_t*) override { FAIL() << "k-step call on an output-tile datapath"; }
  void scale_accumulate(const TileStep&, const int32_t*, float*) override { FAIL() << "k-step call"; }
  void finish(const float*, int64_t, float, float, float*) override { FAIL() << "k-step call"; }
  void output_tiles(const QTensor& a, const QTensor& b, const std::vector<OutputTile>& tiles, float* c) override {
    const int64_t K = a.cols, B = a.block, KB = K / B, N = b.rows;
    std::vector<int> seen(size_t(a.rows * N), 0);
    for (const OutputTile& t : tiles)
      for (int64_t m = t.m0; m < t.m0 + t.tm; ++m)
        for (int64_t n = t.n0; n < t.n0 + t.tn; ++n) {
          float acc = 0.0f;
          for (int64_t k = 0; k < KB; ++k) {
            int32_t p = 0;
            for (int64_t j = k * B; j < (k + 1) * B; ++j)
              p += decode_int(a.format, a.codes[m * K + j]) * decode_int(b.format, b.codes[n * K + j]);
            acc = contract_step(acc, p, a.scales[m * KB + k], b.scales[n * KB + k]);
          }
          c[m * N + n] = contract_finish(acc, tensor_factor(a.format, a.global_dec), tensor_factor(b.format, b.global_dec));
          ++seen[size_t(m * N + n)];
        }
    for (int v : seen) ASSERT_EQ(v, 1);
    ++calls;
  }
  int calls = 0;
};

TEST(Check, OutputTileDatapathAfterTheTimedRun) {
  const std::string dir = synthetic_trace("tiles_dp", 96, 160, 64);
  const io::Trace trace(dir, 16);
  auto dp = std::make_shared<TileGolden>();
  Simulator sim(config("teaching", {"tcu.count=3", "tile.raster_group=2"}), dp);
  const Report with = run_trace(sim, trace, dir, recipe_options("nvfp4"));
  expect_clean(with, 96 * 64 + 96 * 160 + 64 * 160);
  EXPECT_EQ(dp->calls, 3);
  const Report without = run_trace(sim, trace, dir, recipe_options("nvfp4", false));
  for (size_t i = 0; i < with.jobs.size(); ++i) EXPECT_EQ(with.jobs[i].cycles, without.jobs[i].cycles);
  fs::remove_all(dir);
}

// The Verilated RTL block MAC as the datapath (fp4lab sim --check --rtl), when this build has it.
TEST(Check, RtlDatapathEveryRecipe) {
  const auto names = datapath_names();
  if (std::find(names.begin(), names.end(), "rtl") == names.end())
    GTEST_SKIP() << "this build has no RTL datapath (FP4LAB_RTL=OFF, or Verilator / the fp4lab_rtl_sc target missing)";
  const std::string dir = synthetic_trace("rtl", 32, 64, 96);
  const io::Trace trace(dir, 32);
  Simulator sim(config("teaching", {"tcu.count=2"}), make_datapath("rtl"));
  for (const std::string& recipe : Recipe::preset_names()) {
    SCOPED_TRACE(recipe);
    const Report rep = run_trace(sim, trace, dir, recipe_options(recipe));
    expect_clean(rep, 32 * 96 + 32 * 64 + 96 * 64);
  }
  fs::remove_all(dir);
}

// Slow (label `slow`, ~3 M RTL beats): one record of the bundled trace through the RTL MAC.
TEST(SlowCheck, RtlDatapathBundledTraceOneRecord) {
  const auto names = datapath_names();
  if (std::find(names.begin(), names.end(), "rtl") == names.end())
    GTEST_SKIP() << "this build has no RTL datapath";
  const std::string file = root() + "/workloads/tiny-lm/step_005000/layers.0.attn.proj.safetensors";
  const io::Trace trace(file, 16);
  Simulator sim(config("h100-class"), make_datapath("rtl"));
  expect_clean(run_trace(sim, trace, file, recipe_options("ufp4")), 3 * 256 * 256);
}

// Finite inputs whose RHT overflows FP32 used to quantise to Inf/NaN on both sides and compare "equal"
// (0 mismatches); the golden model now refuses them, so --check reports the fault instead of passing.
TEST(Check, RhtOverflowIsAnErrorNotZeroMismatches) {
  const fs::path dir = fs::temp_directory_path() / ("fp4lab_sim_overflow_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<float> x(32 * 64, 1.0f), w(64 * 64, 0.01f), dy(32 * 64, 0.01f);
  for (int j = 0; j < 16; ++j) x[size_t(3 * 64 + j)] = 3.0e38f;
  io::write_safetensors((dir / "g.safetensors").string(),
                        {io::make_f32("g.fwd_x", {32, 64}, x), io::make_f32("g.fwd_w", {64, 64}, w),
                         io::make_f32("g.bwd_dy", {32, 64}, dy)},
                        {{"fp4lab.trace.version", "1"}});
  const io::Trace trace(dir.string(), 16);
  Simulator sim(config("teaching"));
  try {
    run_trace(sim, trace, dir.string(), recipe_options("ufp4"));
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("RHT overflows FP32 at row 3, block 0"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(Check, TimingDoesNotDependOnCheck) {
  const std::string dir = synthetic_trace("same", 64, 96, 128);
  const io::Trace trace(dir, 16);
  Simulator sim(config("teaching", {"tcu.count=2"}));
  const Report a = run_trace(sim, trace, dir, recipe_options("e2m1-ref", true));
  const Report b = run_trace(sim, trace, dir, recipe_options("e2m1-ref", false));
  ASSERT_EQ(a.jobs.size(), b.jobs.size());
  for (size_t i = 0; i < a.jobs.size(); ++i) EXPECT_EQ(a.jobs[i].cycles, b.jobs[i].cycles) << a.jobs[i].name;
  fs::remove_all(dir);
}

// The simulator numbers a trace's records as fp4lab analyze and fp4lab cuda check do: record i quantises with
// SR GEMM id i (stream i*8 + pass*2 + operand), so the three draw the same stochastic-rounding bits.
TEST(Check, RecordsAreNumberedAsAnalyzeNumbersThem) {
  const std::string dir = synthetic_trace("ids", 32, 64, 48, 3);
  const io::Trace trace(dir, 16);
  const Recipe r = Recipe::preset("ufp4");
  std::vector<uint32_t> seen;
  RunOptions o = recipe_options("ufp4", false);
  o.quant = [&](Pass p, Operand op, uint32_t gemm) {
    seen.push_back(gemm);
    return r.operand(p, op, gemm);
  };
  Simulator sim(config("teaching"));
  EXPECT_EQ(run_trace(sim, trace, dir, o).jobs.size(), 9u);
  ASSERT_EQ(seen.size(), 3u * 6u);  // three records, two operands of three passes
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], uint32_t(i / 6)) << i;
  fs::remove_all(dir);
}

// Progress (fp4lab sim prints it on a terminal): one call per simulated job, numbered 1..n of n, before the job
// runs, naming it; with --check and without, over a trace and over a shape list, with one pass picked.
TEST(Check, ProgressNamesEveryJobInOrder) {
  const std::string dir = synthetic_trace("progress", 32, 64, 48, 2);
  const io::Trace trace(dir, 16);
  Simulator sim(config("teaching"));
  for (bool check : {true, false})
    for (bool one_pass : {false, true}) {
      RunOptions o = recipe_options("ufp4", check);
      if (one_pass) o.passes = {Pass::bwd_dx};
      std::vector<std::string> names;
      o.progress = [&](size_t i, size_t n, const std::string& what) {
        EXPECT_EQ(i, names.size() + 1);
        EXPECT_EQ(n, one_pass ? 2u : 6u);
        names.push_back(what);
      };
      const Report rep = run_trace(sim, trace, dir, o);
      ASSERT_EQ(names.size(), rep.jobs.size());
      for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(names[i], rep.jobs[i].name) << i;
      if (one_pass) {
        EXPECT_EQ(names.back(), "layer1.linear_fc2.bwd_dx");
      }
    }
  RunOptions o = recipe_options("ufp4", false);
  size_t calls = 0, of = 0;
  o.progress = [&](size_t i, size_t n, const std::string&) { calls = i, of = n; };
  EXPECT_EQ(run_shapes(sim, {{"a", 32, 64, 48, 1}, {"b", 32, 64, 48, 1}}, "shapes", o).jobs.size(), 6u);
  EXPECT_EQ(calls, 6u);
  EXPECT_EQ(of, 6u);
  fs::remove_all(dir);
}

TEST(Check, BundledTraceTeachingUfp4) {
  const std::string dir = root() + "/workloads/tiny-lm/step_005000";
  const io::Trace trace(dir, 16);
  ASSERT_EQ(trace.records().size(), 8u);
  int64_t outputs = 0;
  for (const auto& r : trace.records()) outputs += r.tokens * r.out + r.tokens * r.in + r.out * r.in;
  Simulator sim(config("teaching"));
  expect_clean(run_trace(sim, trace, dir, recipe_options("ufp4")), outputs);
}

TEST(Check, BundledTraceH100ClassEveryRecipe) {
  const std::string dir = root() + "/workloads/tiny-lm/step_005000";
  int64_t outputs = 0;
  {
    const io::Trace t(dir, 32);
    for (const auto& r : t.records()) outputs += r.tokens * r.out + r.tokens * r.in + r.out * r.in;
  }
  Simulator sim(config("h100-class"));
  for (const std::string& recipe : Recipe::preset_names()) {
    SCOPED_TRACE(recipe);
    const io::Trace trace(dir, Recipe::preset(recipe).block);
    expect_clean(run_trace(sim, trace, dir, recipe_options(recipe)), outputs);
  }
}

}  // namespace
}  // namespace fp4lab::sim::test
