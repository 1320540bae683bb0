// The host side of the GPU tools (fp4lab_cuda_tools, kernels/harness), which runs without a GPU: the conformance
// check's record list over opened traces, its results carried between processes and merged as one process would
// count them, and the fault of a machine without a device. The GPU side is checked by `fp4lab cuda check` itself.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "fp4lab/cuda/check.hpp"
#include "fp4lab/cuda/device.hpp"

namespace fc = fp4lab::cuda;

namespace {

const std::string kTrace = FP4LAB_SOURCE_DIR "/workloads/tiny-lm/step_005000";

std::vector<std::unique_ptr<fp4lab::io::Trace>> open(const std::vector<std::string>& paths) {
  std::vector<std::unique_ptr<fp4lab::io::Trace>> t;
  for (const auto& p : paths) t.push_back(std::make_unique<fp4lab::io::Trace>(p, 16));
  return t;
}

fc::CheckResult part(std::vector<fc::Tally> tallies, fc::NativeTally native) {
  fc::CheckResult r;
  for (const auto& t : tallies) r.tallies[t.what] = t;
  r.native = native;
  return r;
}

}  // namespace

TEST(ConformanceCheck, ListsTheRecordsOfEveryTraceInOrderUpToTheLimit) {
  const fp4lab::io::Trace tr(kTrace, 16);
  const size_t n = tr.records().size();
  ASSERT_GT(n, 2u);
  fc::CheckOptions opt;
  const fc::ConformanceCheck all(open({kTrace, kTrace}), opt);
  ASSERT_EQ(all.records(), 2 * n);
  ASSERT_EQ(all.sizes().size(), 2 * n);
  for (size_t i = 0; i < 2 * n; ++i) {
    const auto& r = tr.records()[i % n];  // the second trace's records follow the first's
    EXPECT_EQ(all.sizes()[i], uint64_t(r.tokens * r.in + r.out * r.in + r.tokens * r.out)) << i;
  }
  opt.limit = int(n) + 1;  // the limit counts across the traces
  const fc::ConformanceCheck some(open({kTrace, kTrace}), opt);
  EXPECT_EQ(some.records(), n + 1);
  EXPECT_EQ(std::vector<uint64_t>(all.sizes().begin(), all.sizes().begin() + long(n) + 1), some.sizes());
}

TEST(CheckResult, TravelsExactly) {
  fc::CheckResult r = part({{"codes", 123456789012345ull, 3, 0}, {"gemm fast", 7, 0, 2}}, {11, 1, 0.1 + 0.2});
  r.fault_index = 4;
  r.fault = "a.safetensors: gemm 'x\ty' fwd_y: \"bad\"";
  const fc::CheckResult b = fc::CheckResult::from_bytes(r.to_bytes());
  ASSERT_EQ(b.tallies.size(), 2u);
  for (const auto& [k, t] : r.tallies) {
    const fc::Tally& u = b.tallies.at(k);
    EXPECT_EQ(u.what, t.what);
    EXPECT_EQ(u.compared, t.compared);
    EXPECT_EQ(u.mismatched, t.mismatched);
    EXPECT_EQ(u.nan_pairs, t.nan_pairs);
  }
  EXPECT_EQ(b.native.compared, 11u);
  EXPECT_EQ(b.native.out_of_bound, 1u);
  EXPECT_EQ(b.native.worst, 0.1 + 0.2);  // the same double, not a rounded one
  ASSERT_TRUE(b.fault_index.has_value());
  EXPECT_EQ(*b.fault_index, 4u);
  EXPECT_EQ(b.fault, r.fault);
  EXPECT_FALSE(fc::CheckResult::from_bytes(fc::CheckResult().to_bytes()).fault_index.has_value());
}

TEST(CheckResult, MergesAsOneProcessCounts) {
  fc::CheckResult a = part({{"codes", 10, 1, 0}, {"scales", 5, 0, 1}}, {4, 0, 0.25});
  fc::CheckResult b = part({{"codes", 20, 2, 0}, {"gemm fast", 8, 0, 3}}, {6, 2, 0.5});
  fc::CheckResult c = part({}, {});
  b.fault_index = 9;
  b.fault = "later record";
  c.fault_index = 3;
  c.fault = "first record";
  const fc::CheckResult m = fc::merge({a, b, c});
  ASSERT_EQ(m.tallies.size(), 3u);
  EXPECT_EQ(m.tallies.at("codes").compared, 30u);
  EXPECT_EQ(m.tallies.at("codes").mismatched, 3u);
  EXPECT_EQ(m.tallies.at("scales").nan_pairs, 1u);
  EXPECT_EQ(m.tallies.at("gemm fast").nan_pairs, 3u);
  EXPECT_EQ(m.compared(), 43u);
  EXPECT_EQ(m.mismatched(), 3u);
  EXPECT_EQ(m.native.compared, 10u);
  EXPECT_EQ(m.native.out_of_bound, 2u);
  EXPECT_EQ(m.native.worst, 0.5);
  ASSERT_TRUE(m.fault_index.has_value());  // the lowest record's fault, whichever share met it
  EXPECT_EQ(*m.fault_index, 3u);
  EXPECT_EQ(m.fault, "first record");
  EXPECT_FALSE(fc::merge({a}).fault_index.has_value());
}

TEST(Device, NoDeviceIsItsOwnFault) {
  std::string why;
  if (fc::device_available(&why)) {
    EXPECT_NO_THROW(fc::require_device());
    return;
  }
  try {
    fc::require_device();
    FAIL() << "no NoDevice";
  } catch (const fc::NoDevice& e) {
    EXPECT_EQ(std::string(e.what()), "no usable CUDA device (" + why + ")");
  }
}
