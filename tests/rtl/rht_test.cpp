// RHT-16 butterfly against rht_block (+ round_to_bf16 for the nvfp4 preset): random blocks with every
// sign vector kind, including values whose sums overflow; then RHT -> quantiser chains against the
// golden quantize() with rotation on, for the presets that rotate.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "Vfp32_rht16_unit.h"
#include "fp4lab/recipe.hpp"
#include "fp4lab/rht.hpp"
#include "fp4lab/scale.hpp"
#include "harness.hpp"
#include "quant_driver.hpp"

namespace fp4lab::rtl_test {
namespace {

TEST(Rht, Butterfly) {
  Dut<Vfp32_rht16_unit> dut("fp32_rht16_unit");
  dut.reset();
  Checker chk("fp32_rht16_unit");
  std::mt19937_64 rng(seed());
  F32Gen gen(seed() + 3);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  struct Vec {
    float x[16];
    uint32_t neg;
    bool bf16;
  };
  std::vector<Vec> vecs;
  const std::vector<float> te = rht_signs_te(16);
  for (uint64_t i = 0, n = scaled(100'000); i < n; ++i) {
    Vec v;
    const uint32_t kind = uint32_t(rng() % 4);
    const float scale = std::ldexp(1.0f, int(rng() % 260) - 140);  // subnormal to overflow
    for (float& e : v.x) e = kind == 0 ? f32_from_bits((gen.any() & 0x7FFFFFFFu) | (uint32_t(rng() & 1) << 31)) : scale * gauss(rng);
    for (float& e : v.x)
      if (!std::isfinite(e)) e = 1.0f;  // inputs are finite (the quantiser rejects NaN/Inf before rotating)
    std::vector<float> signs = i % 3 == 0 ? te : i % 3 == 1 ? rht_signs_from_seed(16, rng()) : std::vector<float>(16);
    if (i % 3 == 2)
      for (float& s : signs) s = (rng() & 1) ? -1.0f : 1.0f;
    v.neg = 0;
    for (int j = 0; j < 16; ++j)
      if (signs[size_t(j)] < 0) v.neg |= 1u << j;
    v.bf16 = rng() & 1;
    vecs.push_back(v);
  }
  run_stream(
      dut, vecs.size(), vecs.size(),
      [&](uint64_t i) {
        for (int j = 0; j < 16; ++j) dut->x_i[j] = f32_bits(vecs[i].x[j]);
        dut->neg_i = vecs[i].neg;
        dut->bf16_i = vecs[i].bf16;
      },
      [&](uint64_t k) {
        const Vec& v = vecs[k];
        float y[16], s[16];
        for (int j = 0; j < 16; ++j) {
          y[j] = v.x[j];
          s[j] = (v.neg >> j) & 1 ? -1.0f : 1.0f;
        }
        rht_block(y, 16, s);
        bool ok = true;
        for (int j = 0; j < 16; ++j) {
          if (v.bf16) y[j] = round_to_bf16(y[j]);
          const uint32_t want = f32_bits(y[j]), got = dut->y_o[j];
          ok = ok && (std::isnan(y[j]) ? std::isnan(f32_from_bits(got)) : want == got);
        }
        return chk.check(ok, [&] {
          std::string s = "neg=" + hex32(v.neg) + (v.bf16 ? " bf16" : "") + "\n    x:";
          for (int j = 0; j < 16; ++j) s.append(" ").append(hex32(f32_bits(v.x[j])));
          s += "\n    want:";
          for (int j = 0; j < 16; ++j) s.append(" ").append(hex32(f32_bits(y[j])));
          s += "\n    got: ";
          for (int j = 0; j < 16; ++j) s.append(" ").append(hex32(dut->y_o[j]));
          return s;
        });
      },
      0.1, 0.1);
  chk.finish();
}

// RTL RHT -> RTL quantiser == golden quantize with rotation, for every preset operand that rotates.
TEST(Rht, ChainIntoQuantiser) {
  Dut<Vfp32_rht16_unit> rht("fp32_rht16_unit_chain");
  Dut<Vfp4_quant_unit> quant("fp4_quant_unit_chain");
  rht.reset();
  quant.reset();
  Checker chk("rht16_quant_chain");
  std::mt19937_64 rng(seed() + 11);
  std::student_t_distribution<float> heavy(3.0f);
  const int64_t rows = 32, cols = 128;
  int chains = 0;
  for (const std::string& name : Recipe::preset_names()) {
    const Recipe r = Recipe::preset(name);
    for (Pass p : kPasses)
      for (Operand o : {Operand::a, Operand::b}) {
        QuantConfig cfg = r.operand(p, o, uint32_t(rng()));
        if (cfg.rht != 16) continue;
        std::vector<float> x(static_cast<size_t>(rows * cols));
        for (float& v : x) v = heavy(rng);
        const QTensor g = quantize(x.data(), rows, cols, cfg);
        const std::vector<float> y = rtl_rotate(rht, x.data(), rows, cols, cfg);
        compare_quant(chk, rtl_quantize(quant, y.data(), rows, cols, cfg), g, y.data(),
                      name + "/" + pass_name(p) + (o == Operand::a ? "/A" : "/B") + " " + cfg.label());
        ++chains;
      }
  }
  std::printf("[rht16_quant_chain] %d preset operands rotated and quantised\n", chains);
  EXPECT_GT(chains, 0);
  chk.finish();
}

}  // namespace
}  // namespace fp4lab::rtl_test
