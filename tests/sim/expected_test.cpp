// Expected reports under version control (tests/sim/expected/*.json), one per configuration and workload,
// diffed against a fresh run: any change in what the model reports shows up here as a JSON patch. After an
// intended change, regenerate them with tests/sim/regen_expected.sh (FP4LAB_REGEN_EXPECTED=1) and review the
// diff before committing. (The numbers themselves are checked by hand in timing_test.cpp, not here.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "fp4lab/recipe.hpp"
#include "fp4lab/sim/run.hpp"
#include "sim_test_util.hpp"

namespace fp4lab::sim::test {
namespace {

RunOptions options(const std::string& recipe) {
  RunOptions o;
  o.recipe = recipe;
  const Recipe r = Recipe::preset(recipe);
  o.quant = [r](Pass p, Operand op, uint32_t gemm) { return r.operand(p, op, gemm); };
  return o;
}

void compare_or_regenerate(const nlohmann::json& got, const std::string& name) {
  const std::string path = root() + "/tests/sim/expected/" + name + ".json";
  const char* regen = std::getenv("FP4LAB_REGEN_EXPECTED");
  if (regen && std::string(regen) == "1") {
    std::ofstream(path) << got.dump(1) << "\n";
    GTEST_SKIP() << "regenerated " << path;
  }
  std::ifstream in(path);
  ASSERT_TRUE(in) << path << " is missing: run tests/sim/regen_expected.sh";
  const nlohmann::json want = nlohmann::json::parse(in);
  // Round-trip through text so both sides hold the numbers JSON can carry.
  const nlohmann::json fresh = nlohmann::json::parse(got.dump());
  EXPECT_EQ(fresh, want) << path << " differs; patch from expected to fresh:\n"
                         << nlohmann::json::diff(want, fresh).dump(1);
}

const char* kTrace = "workloads/tiny-lm/step_005000";

TEST(Expected, TeachingBundledTraceUfp4) {
  Simulator sim(config("teaching"));
  const io::Trace trace(root() + "/" + kTrace, 16);
  compare_or_regenerate(run_trace(sim, trace, kTrace, options("ufp4")).to_json(), "teaching_tiny-lm_ufp4");
}

TEST(Expected, TeachingBundledTraceE2m1Ref) {
  Simulator sim(config("teaching"));
  const io::Trace trace(root() + "/" + kTrace, 16);
  compare_or_regenerate(run_trace(sim, trace, kTrace, options("e2m1-ref")).to_json(), "teaching_tiny-lm_e2m1-ref");
}

TEST(Expected, H100ClassBundledTraceUfp4) {
  Simulator sim(config("h100-class"));
  const io::Trace trace(root() + "/" + kTrace, 16);
  compare_or_regenerate(run_trace(sim, trace, kTrace, options("ufp4")).to_json(), "h100-class_tiny-lm_ufp4");
}

TEST(Expected, H100ClassDense15bUfp4) {
  Simulator sim(config("h100-class"));
  const std::string shapes = "workloads/shapes/dense-1.5b.csv";
  compare_or_regenerate(run_shapes(sim, read_shapes(root() + "/" + shapes), shapes, options("ufp4")).to_json(),
                        "h100-class_dense-1.5b_ufp4");
}

}  // namespace
}  // namespace fp4lab::sim::test
