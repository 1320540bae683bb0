// Bad configurations, shape lists and jobs give one-line errors that name the file (and line) and the fault.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "sim_test_util.hpp"

namespace fp4lab::sim::test {
namespace {

namespace fs = std::filesystem;

std::string write_temp(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / ("fp4lab_sim_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p) << text;
  return p.string();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Config, BothShippedConfigurationsLoad) {
  const Config t = config("teaching"), h = config("h100-class");
  EXPECT_EQ(t.name, "teaching");
  EXPECT_EQ(t.peak_macs_per_cycle(), 64);
  EXPECT_EQ(h.name, "h100-class");
  EXPECT_EQ(h.tcus, 132);
  EXPECT_EQ(h.prep, PrepMode::fused);
}

TEST(Config, OverridesWinOverTheFile) {
  const Config c = config("teaching", {"mac.units=8", "prep.mode=unfused"});
  EXPECT_EQ(c.mac_units, 8);
  EXPECT_EQ(c.prep, PrepMode::unfused);
}

TEST(Config, ErrorsNameTheFileAndTheFault) {
  const std::string missing = write_temp("missing.cfg", "name = x\nclock.ghz = 1\n");
  std::string e = error_of([&] { Config::load(missing); });
  EXPECT_NE(e.find(missing), std::string::npos) << e;
  EXPECT_NE(e.find("missing key 'tcu.count'"), std::string::npos) << e;

  const std::string typo = write_temp("typo.cfg", "[mac]\nunits = 4\nunitz = 5\n");
  e = error_of([&] { Config::load(typo); });
  EXPECT_NE(e.find(typo), std::string::npos) << e;
  EXPECT_NE(e.find("unitz"), std::string::npos) << e;

  e = error_of([&] { config("teaching", {"mac.kind=quad"}); });
  EXPECT_NE(e.find("teaching.cfg"), std::string::npos) << e;
  EXPECT_NE(e.find("mac.kind 'quad'"), std::string::npos) << e;

  e = error_of([&] { config("teaching", {"tile.k=48"}); });
  EXPECT_NE(e.find("tile.k must be a positive multiple of 32"), std::string::npos) << e;

  e = error_of([&] { config("teaching", {"buffer.bytes=1000"}); });
  EXPECT_NE(e.find("cannot hold buffer.slots"), std::string::npos) << e;

  e = error_of([&] { Config::load("/nonexistent/x.cfg"); });
  EXPECT_NE(e.find("/nonexistent/x.cfg: cannot open"), std::string::npos) << e;
}

TEST(Config, ShippedShapeListsParse) {
  for (const char* f : {"dense-1.5b", "moe-mixtral-8x7b", "llama2-7b", "llama2-70b", "square-8192"}) {
    const auto layers = read_shapes(root() + "/workloads/shapes/" + f + ".csv");
    ASSERT_FALSE(layers.empty()) << f;
    for (const auto& l : layers) {
      EXPECT_EQ(l.tokens % 32, 0) << f << " " << l.gemm;
      EXPECT_EQ(l.in % 32, 0) << f << " " << l.gemm;
      EXPECT_EQ(l.out % 32, 0) << f << " " << l.gemm;
    }
  }
  const auto l70 = read_shapes(root() + "/workloads/shapes/llama2-70b.csv");
  EXPECT_EQ(l70[0].gemm, "linear_qkv");
  EXPECT_EQ(l70[0].out, (64 + 2 * 8) * 128);  // GQA: 64 query heads, 8 KV heads of 128
  EXPECT_EQ(l70[3].in, 28672);
  EXPECT_EQ(l70[3].count, 80);
}

TEST(Config, ShapeListErrorsNameFileAndLine) {
  const std::string bad = write_temp("bad.csv", "# c\ngemm,tokens,in,out\nfc1,4096,4096,11008\nfc2,4096,x,4096\n");
  std::string e = error_of([&] { read_shapes(bad); });
  EXPECT_NE(e.find(bad + ":4: in = 'x' is not a positive integer"), std::string::npos) << e;
  const std::string nohead = write_temp("nohead.csv", "fc1,1,2,3\n");
  e = error_of([&] { read_shapes(nohead); });
  EXPECT_NE(e.find(nohead + ":1: expected the header"), std::string::npos) << e;
  const std::string empty = write_temp("empty.csv", "gemm,tokens,in,out\n");
  e = error_of([&] { read_shapes(empty); });
  EXPECT_NE(e.find("no layers listed"), std::string::npos) << e;
}

TEST(Config, JobsTheHardwareCannotRunAreRefused) {
  Simulator sim(config("teaching"));
  std::string e = error_of([&] { sim.run(job(16, 16, 40)); });
  EXPECT_NE(e.find("K = 40 is not a multiple of the block size 16"), std::string::npos) << e;
  e = error_of([&] { sim.run(job(16, 16, 64, plain(128))); });
  EXPECT_NE(e.find("RHT size 128 must divide"), std::string::npos) << e;
}

TEST(Config, OneSimulatorAtATime) {
  Simulator a(config("teaching"));
  EXPECT_THROW(Simulator b(config("teaching")), std::invalid_argument);
}

}  // namespace
}  // namespace fp4lab::sim::test
