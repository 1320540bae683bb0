// Block MAC (block-scale multiply and FP32 accumulation), docs/datapath.md section 3: random chains of
// blocks (>= 10^6 block vectors on the dual-format build), GEMM tiles quantised by the golden model for
// every recipe preset, and the handshake under random stalls. Reports verified vectors per second.
#include <chrono>
#include <deque>
#include <string>
#include <vector>

#include "Vfp4_mac_unit_dual.h"
#include "Vfp4_mac_unit_e1m2.h"
#include "Vfp4_mac_unit_e2m1.h"
#include "fp4lab/quantize.hpp"
#include "fp4lab/recipe.hpp"
#include "fp4lab/scale.hpp"
#include "harness.hpp"
#include "mac_driver.hpp"

namespace fp4lab::rtl_test {
namespace {

// Block scales as the quantisers make them, plus the corners of the FP32 steps: zero, subnormal, huge
// (products overflow to Inf; Inf - Inf gives NaN), powers of two.
uint32_t random_scale(std::mt19937_64& rng) {
  const uint32_t kind = uint32_t(rng() % 20);
  if (kind < 8) return (uint32_t(107 + rng() % 40) << 23) | uint32_t(rng() & 0x7FFFFF);  // amax/gmax-like
  if (kind < 11) return f32_bits(e4m3_decode(uint8_t(rng() % 0x7F)));                   // ue4m3
  if (kind < 14) return f32_bits(e8m0_decode(uint8_t(rng() % 255)));                     // ue8m0
  if (kind < 16) return uint32_t(rng() % (40u << 23));                                   // tiny / subnormal
  if (kind < 18) return (uint32_t(200 + rng() % 55) << 23) | uint32_t(rng() & 0x7FFFFF);  // huge
  if (kind < 19) return 0;
  return uint32_t(rng());  // anything, NaN included: the unit must follow IEEE like the C++ does
}

// Random chains: each output gets 1..8 blocks (a quarter of them 1x32 blocks sent as join + closing
// beat), one format per operand, random codes and scales. Shapes are drawn up front so the beat count
// is known; contents are generated as the stream asks for them, so memory stays flat.
class ChainGen {
 public:
  ChainGen(std::vector<int> fmts, uint64_t s, uint64_t min_beats) : fmts_(std::move(fmts)), rng_(s) {
    std::mt19937_64 shape_rng(s ^ 0x5a5a);
    while (total_ < min_beats) {
      const int blocks = 1 + int(shape_rng() % 8), halves = (shape_rng() % 4 == 0) ? 2 : 1;
      shapes_.push_back({blocks, halves});
      total_ += uint64_t(blocks * halves);
    }
  }
  uint64_t total_beats() const { return total_; }
  uint64_t outputs() const { return shapes_.size(); }
  const rtl::MacBeat& beat(uint64_t i) {
    while (i >= base_ + cur_.size()) next_chain();
    return cur_[i - base_];
  }
  // Expected outputs in order, with the beats that made them (for the mismatch report).
  std::deque<std::pair<uint32_t, std::vector<rtl::MacBeat>>> expected;

 private:
  void next_chain() {
    base_ += cur_.size();
    cur_.clear();
    const auto [blocks, halves] = shapes_[next_++];
    const uint8_t fa = uint8_t(fmts_[rng_() % fmts_.size()]), fb = uint8_t(fmts_[rng_() % fmts_.size()]);
    const uint32_t ga = rng_() % 2 ? random_scale(rng_) : f32_bits(std::ldexp(1.0f, -int(rng_() % 3)));
    const uint32_t gb = rng_() % 2 ? random_scale(rng_) : f32_bits(std::ldexp(1.0f, -int(rng_() % 3)));
    for (int k = 0; k < blocks; ++k) {
      const uint32_t sa = random_scale(rng_), sb = random_scale(rng_);
      for (int h = 0; h < halves; ++h) {
        rtl::MacBeat b;
        b.a = rng_();
        b.b = rng_();
        b.fmt_a = fa;
        b.fmt_b = fb;
        b.sa = sa;
        b.sb = sb;
        rtl::set_beat_position(b, k, blocks, h, halves);
        b.ga = ga;
        b.gb = gb;
        cur_.push_back(b);
      }
    }
    expected.emplace_back(golden_chain(cur_.data(), cur_.size()), cur_);
  }
  std::vector<int> fmts_;
  std::mt19937_64 rng_;
  std::vector<std::pair<int, int>> shapes_;  // (blocks, beats per block)
  uint64_t total_ = 0;
  size_t next_ = 0;
  std::vector<rtl::MacBeat> cur_;
  uint64_t base_ = 0;
};

template <class M>
void random_chains(const char* unit, std::vector<int> fmts, uint64_t beats, double p_idle, double p_stall,
                   bool report_rate) {
  Dut<M> dut(unit);
  dut.reset();
  Checker chk(unit);
  ChainGen gen(fmts, seed(), beats);
  auto take = [&](uint64_t) {
    auto [want, chain] = std::move(gen.expected.front());
    gen.expected.pop_front();
    const uint32_t got = dut->out_o;
    return chk.check(
        same_f32_or_nan(want, got),
        [&] {
          std::string s = "want " + fmt_f32(want) + " got " + fmt_f32(got) + "; beats:";
          for (const rtl::MacBeat& b : chain) s += "\n    " + describe_beat(b);
          return s;
        },
        chain.size());
  };
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t cycles = run_stream(
      dut, gen.total_beats(), gen.outputs(), [&](uint64_t i) { put_beat(dut, gen.beat(i)); }, take, p_idle,
      p_stall);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[%s] %llu block vectors in %llu outputs, %llu cycles, %.2f s: %.3g verified vectors/s%s\n", unit,
              (unsigned long long)chk.vectors(), (unsigned long long)gen.outputs(), (unsigned long long)cycles, s,
              double(chk.vectors()) / s, report_rate ? " (one core: RTL + golden + stimulus)" : "");
  chk.finish();
}

TEST(Mac, DualRandom) {
  random_chains<Vfp4_mac_unit_dual>("fp4_mac_unit_dual", {0, 1, 2, 3}, scaled(1'000'000), 0.0, 0.0, true);
}
TEST(Mac, DualRandomStalls) {
  random_chains<Vfp4_mac_unit_dual>("fp4_mac_unit_dual_stalls", {0, 1, 2, 3}, scaled(100'000), 0.2, 0.3, false);
}
TEST(Mac, E2M1Random) {
  random_chains<Vfp4_mac_unit_e2m1>("fp4_mac_unit_e2m1", {0, 3}, scaled(200'000), 0.1, 0.1, false);
}
TEST(Mac, E1M2Random) {
  random_chains<Vfp4_mac_unit_e1m2>("fp4_mac_unit_e1m2", {1, 2}, scaled(200'000), 0.1, 0.1, false);
}

// GEMM tiles of random data quantised by the golden model for every preset and pass, against
// reference::gemm_contract.
TEST(Mac, PresetTiles) {
  Dut<Vfp4_mac_unit_dual> dut("fp4_mac_unit_dual_tiles");
  dut.reset();
  Checker chk("fp4_mac_unit_dual_tiles");
  std::mt19937_64 rng(seed());
  std::student_t_distribution<float> heavy(3.0f);  // outlier-heavy, like activations
  const int64_t M = 8, N = 8, K = 256;
  for (const std::string& name : Recipe::preset_names()) {
    const Recipe r = Recipe::preset(name);
    for (Pass p : kPasses) {
      std::vector<float> a(size_t(M * K)), b(size_t(N * K));
      for (float& v : a) v = heavy(rng);
      for (float& v : b) v = 0.02f * heavy(rng);
      QuantConfig ca = r.operand(p, Operand::a, 1), cb = r.operand(p, Operand::b, 2);
      cb.tile2d = false;  // 8 rows cannot form 16x16 tiles; tiles are covered by the quantiser test
      const QTensor qa = quantize(a.data(), M, K, ca), qb = quantize(b.data(), N, K, cb);
      check_gemm_tile(dut, chk, qa, qb, name + "/" + pass_name(p), 0.1, 0.1);
    }
  }
  // Mixed grids: the dual build takes a different format on each side.
  std::vector<float> a(size_t(M * K)), b(size_t(N * K));
  for (float& v : a) v = heavy(rng);
  for (float& v : b) v = heavy(rng);
  QuantConfig ca, cb;
  ca.format = kE2M1;
  cb.format = kE1M2;
  check_gemm_tile(dut, chk, quantize(a.data(), M, K, ca), quantize(b.data(), N, K, cb), "e2m1 x e1m2");
  chk.finish();
}

}  // namespace
}  // namespace fp4lab::rtl_test
