// Block dot-product unit, every build: every product pair in every lane (exhaustive), then random full
// blocks, through the valid/ready pipeline with random stalls. Golden: sum of decode_int products
// (docs/datapath.md section 3, step 1).
#include <string>
#include <vector>

#include "Vfp4_dot_unit_dual.h"
#include "Vfp4_dot_unit_e1m2.h"
#include "Vfp4_dot_unit_e2m1.h"
#include "Vfp4_dot_unit_int4.h"
#include "fp4lab/format.hpp"
#include "fp4lab/gemm.hpp"  // kMacWidth
#include "harness.hpp"

namespace fp4lab::rtl_test {
namespace {

struct DotVec {
  uint64_t a, b;
  uint8_t fa, fb;
};

int32_t golden_dot(const DotVec& v) {
  int32_t p = 0;
  for (int j = 0; j < kMacWidth; ++j)
    p += decode_int(kAllFormats[v.fa], uint8_t((v.a >> (4 * j)) & 0xF)) *
         decode_int(kAllFormats[v.fb], uint8_t((v.b >> (4 * j)) & 0xF));
  return p;
}

std::string describe(const DotVec& v, int32_t want, int32_t got) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "a=%016llx (%s) b=%016llx (%s): want %d got %d", (unsigned long long)v.a,
                kAllFormats[v.fa].name, (unsigned long long)v.b, kAllFormats[v.fb].name, want, got);
  return buf;
}

template <class M>
void dot_build(const char* unit, std::vector<int> fmts) {
  std::vector<DotVec> vecs;
  // 1. Every product pair of every format pair, in every lane, the other lanes holding +0.
  for (int fa : fmts)
    for (int fb : fmts)
      for (int lane = 0; lane < kMacWidth; ++lane)
        for (uint64_t ca = 0; ca < 16; ++ca)
          for (uint64_t cb = 0; cb < 16; ++cb)
            vecs.push_back({ca << (4 * lane), cb << (4 * lane), uint8_t(fa), uint8_t(fb)});
  const size_t exhaustive = vecs.size();
  // 2. Random full blocks, with the extremes (all lanes at the largest product, of either sign) first.
  for (int fa : fmts)
    for (int fb : fmts) {
      vecs.push_back({0x7777777777777777ull, 0x7777777777777777ull, uint8_t(fa), uint8_t(fb)});
      vecs.push_back({0xFFFFFFFFFFFFFFFFull, 0x7777777777777777ull, uint8_t(fa), uint8_t(fb)});
    }
  F32Gen gen(seed());
  for (uint64_t i = 0, n = scaled(200'000); i < n; ++i) {
    const uint64_t a = gen.rng()(), b = gen.rng()();
    vecs.push_back({a, b, uint8_t(fmts[gen.rng()() % fmts.size()]), uint8_t(fmts[gen.rng()() % fmts.size()])});
  }

  Dut<M> dut(unit);
  dut.reset();
  Checker chk(unit);
  auto drive = [&](uint64_t i) {
    dut->a_i = vecs[i].a;
    dut->b_i = vecs[i].b;
    dut->fmt_a_i = vecs[i].fa;
    dut->fmt_b_i = vecs[i].fb;
  };
  auto take = [&](uint64_t k) {
    const int32_t want = golden_dot(vecs[k]), got = int32_t(dut->p_o);
    return chk.check(want == got, [&] { return describe(vecs[k], want, got); });
  };
  // Random idle input cycles and output stalls exercise the handshake throughout.
  const uint64_t cycles = run_stream(dut, vecs.size(), vecs.size(), drive, take, 0.1, 0.1);
  std::printf("[%s] %zu exhaustive product-pair vectors, %zu random blocks, %llu cycles\n", unit, exhaustive,
              vecs.size() - exhaustive, (unsigned long long)cycles);
  chk.finish();
}

// The units' N parameter is the MAC width (fp4lab::kMacWidth): kMacWidth lanes each holding code 1 sum to
// kMacWidth products. A narrower unit drops lanes from the sum; a wider one has an input port no 64-bit word
// fills (its Verilated port type would not take one: this file would not compile).
template <class M>
void width_is_mac_width(const char* unit, int fmt) {
  static_assert(4 * kMacWidth == 64, "a beat of codes is one 64-bit word");
  uint64_t ones = 0;
  for (int j = 0; j < kMacWidth; ++j) ones |= uint64_t(1) << (4 * j);
  const int32_t one = decode_int(kAllFormats[fmt], 1);
  ASSERT_NE(one, 0);
  Dut<M> dut(unit);
  dut.reset();
  int32_t got = 0;
  bool seen = false;
  run_stream(
      dut, 1, 1,
      [&](uint64_t) {
        dut->a_i = ones;
        dut->b_i = ones;
        dut->fmt_a_i = uint8_t(fmt);
        dut->fmt_b_i = uint8_t(fmt);
      },
      [&](uint64_t) {
        got = int32_t(dut->p_o);
        seen = true;
        return true;
      },
      0, 0);
  ASSERT_TRUE(seen) << unit;
  EXPECT_EQ(got, kMacWidth * one * one) << unit;
}

TEST(Dot, WidthIsTheMacWidth) {
  width_is_mac_width<Vfp4_dot_unit_e2m1>("fp4_dot_unit_e2m1", 0);
  width_is_mac_width<Vfp4_dot_unit_e1m2>("fp4_dot_unit_e1m2", 1);
  width_is_mac_width<Vfp4_dot_unit_int4>("fp4_dot_unit_int4", 2);
  width_is_mac_width<Vfp4_dot_unit_dual>("fp4_dot_unit_dual", 1);
}

TEST(Dot, E2M1Build) { dot_build<Vfp4_dot_unit_e2m1>("fp4_dot_unit_e2m1", {0, 3}); }
TEST(Dot, E1M2Build) { dot_build<Vfp4_dot_unit_e1m2>("fp4_dot_unit_e1m2", {1, 2}); }
TEST(Dot, Int4Build) { dot_build<Vfp4_dot_unit_int4>("fp4_dot_unit_int4", {2, 1}); }
TEST(Dot, DualBuild) { dot_build<Vfp4_dot_unit_dual>("fp4_dot_unit_dual", {0, 1, 2, 3}); }

}  // namespace
}  // namespace fp4lab::rtl_test
