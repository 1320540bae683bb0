// Roofline check on the h100-class configuration: for large GEMMs on operands already quantised in memory
// (prep.mode = none, cold L2), the modelled time can beat neither bound -- the MAC array at its peak
// (M N K / peak MACs per cycle) nor DRAM moving each operand and the output once (bytes / bandwidth) --
// and lies within 15% of the larger. The margin covers wave quantisation (tiles / 132 TCUs rounded up),
// pipeline fill and drain.
#include <gtest/gtest.h>

#include <algorithm>

#include "fp4lab/recipe.hpp"
#include "sim_test_util.hpp"

namespace fp4lab::sim::test {
namespace {

struct Shape {
  int64_t M, N, K;
  bool memory_bound;  // which bound is the larger, worked out in the test body
};

TEST(Roofline, H100ClassLargeGemmsBetweenTheBoundsAndWithin15Percent) {
  const Config cfg = config("h100-class", {"prep.mode=none"});
  Simulator sim(cfg);
  const Recipe r = Recipe::preset("ufp4");
  const Shape shapes[] = {{8192, 8192, 8192, false},
                          {4096, 4096, 16384, false},
                          {4096, 11008, 4096, false},
                          {16384, 128, 8192, true},
                          {65536, 256, 256, true}};
  for (const Shape& s : shapes) {
    GemmJob j = job(s.M, s.N, s.K);
    j.a = r.operand(Pass::fwd_y, Operand::a);
    j.b = r.operand(Pass::fwd_y, Operand::b);
    const JobReport rep = sim.run(j);
    // 132 x 256 block units x 16 = 540672 MAC/cycle; DRAM 1830.6 B/cycle; operands 0.5 B per code + a 4-byte
    // scale per 16 elements = 0.75 B per element; FP32 output 4 B.
    const double compute = double(s.M) * s.N * s.K / 540672.0;
    const double bytes = 0.75 * double(s.M) * s.K + 0.75 * double(s.N) * s.K + 4.0 * double(s.M) * s.N;
    const double memory = bytes / 1830.6;
    const double bound = std::max(compute, memory);
    const std::string what = std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K);
    EXPECT_EQ(memory > compute, s.memory_bound) << what;
    EXPECT_GE(double(rep.cycles), compute) << what;
    EXPECT_GE(double(rep.cycles), memory) << what;
    EXPECT_LE(double(rep.cycles), 1.15 * bound) << what << ": " << rep.cycles << " cycles, bound " << bound;
    EXPECT_DOUBLE_EQ(rep.bytes.at("dram_write"), 4.0 * double(s.M) * s.N) << what;
  }
}

TEST(Roofline, H100ClassPeakIsTheInt8Figure) {
  const Config cfg = config("h100-class");
  // 1979 TOP/s dense INT8 = 2 ops x 132 SMs x 4 tensor cores x 1024 MAC/cycle x 1.83 GHz
  EXPECT_EQ(cfg.peak_macs_per_cycle(), 132 * 4 * 1024);
  EXPECT_NEAR(2.0 * double(cfg.peak_macs_per_cycle()) * cfg.clock_ghz * 1e9, 1979e12, 1e12);
  EXPECT_NEAR(cfg.dram.bandwidth * cfg.clock_ghz * 1e9, 3.35e12, 1e9);
}

TEST(Roofline, SeparatePassesAreMemoryBound) {
  // The fused RHT + quantise pass reads BF16 and writes codes + scales: 2 + 0.75 bytes per element, nothing
  // reused, so it takes at least that over the DRAM bandwidth, and not much more.
  const Config cfg = config("h100-class", {"prep.mode=fused"});
  Simulator sim(cfg);
  const Recipe r = Recipe::preset("ufp4");
  GemmJob j = job(8192, 8192, 8192);
  j.a = r.operand(Pass::fwd_y, Operand::a);
  j.b = r.operand(Pass::fwd_y, Operand::b);
  const JobReport rep = sim.run(j);
  const double bound = 2 * 8192.0 * 8192 * (2 + 0.75) / 1830.6;
  EXPECT_GE(double(rep.prep_cycles), bound);
  EXPECT_LE(double(rep.prep_cycles), 1.05 * bound);
}

}  // namespace
}  // namespace fp4lab::sim::test
