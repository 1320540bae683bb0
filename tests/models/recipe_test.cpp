// Recipe presets (recipe.hpp) against docs/spec.md §2's table, and the pass operand layouts.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "fp4lab/gemm.hpp"
#include "fp4lab/philox.hpp"
#include "fp4lab/recipe.hpp"
#include "fp4lab/rht.hpp"
#include "fp4lab/settings.hpp"
#include "test_util.hpp"

namespace fp4lab::test {
namespace {

// docs/spec.md §2, one row per preset, written from the table:
//   rht_passes: the GEMMs whose both operands are rotated; sr on dY operands; tiles on the weight.
struct PresetRow {
  const char* name;
  const char* format;
  int block;
  ScaleKind scale;
  bool rht_fwd_y, rht_bwd_dx, rht_bwd_dw;
  bool sr_dy;
  bool weight_tiles;
  bool rht_bf16;
};
const PresetRow kTable[] = {
    {"ufp4", "e1m2", 16, ScaleKind::fp32, true, true, true, true, false, false},
    {"e2m1-ref", "e2m1", 16, ScaleKind::fp32, false, false, true, true, false, false},
    {"nvfp4", "e2m1", 16, ScaleKind::ue4m3, false, false, true, true, true, true},
    {"mxfp4", "e2m1", 32, ScaleKind::ue8m0, false, false, false, false, false, false},
};

TEST(RecipePresets, NamesAreTheSpecsFour) {
  EXPECT_EQ(Recipe::preset_names(), (std::vector<std::string>{"ufp4", "e2m1-ref", "nvfp4", "mxfp4"}));
}

TEST(RecipePresets, EveryOperandOfEveryPassMatchesTheTable) {
  int checked = 0;
  for (const PresetRow& row : kTable) {
    SCOPED_TRACE(row.name);
    const Recipe r = Recipe::preset(row.name);
    EXPECT_EQ(r.name, row.name);
    const bool rht_on[3] = {row.rht_fwd_y, row.rht_bwd_dx, row.rht_bwd_dw};
    for (Pass p : kPasses)
      for (Operand o : {Operand::a, Operand::b}) {
        const QuantConfig c = r.operand(p, o);
        const std::string role = operand_role(p, o);
        SCOPED_TRACE(std::string(pass_name(p)) + (o == Operand::a ? " A " : " B ") + role);
        EXPECT_STREQ(c.format.name, row.format);
        EXPECT_EQ(c.block, row.block);
        EXPECT_EQ(c.scale, row.scale);
        // RHT: d = 16 on both operands of the listed passes, none elsewhere.
        EXPECT_EQ(c.rht, rht_on[int(p)] ? 16 : 0);
        EXPECT_EQ(c.rht_signs.size(), size_t(c.rht));
        EXPECT_EQ(c.rht_bf16, rht_on[int(p)] && row.rht_bf16);
        // SR only on dY (the A operand of bwd_dx and bwd_dw).
        EXPECT_EQ(c.rounding, row.sr_dy && role == "bwd_dy" ? Rounding::sr : Rounding::rtne);
        // NVFP4's 16x16 tiles only on the weight (B of fwd_y and of bwd_dx).
        EXPECT_EQ(c.tile2d, row.weight_tiles && role == "fwd_w");
        ++checked;
      }
  }
  EXPECT_EQ(checked, 24);
}

// The presets that rotate carry 16 valid signs; nvfp4 must match Transformer Engine, so it uses TE's
// fixed vector (docs/spec.md §3). (The sign choice of ufp4 / e2m1-ref is not pinned by the spec.)
TEST(RecipePresets, RotatingPresetsUseValidSigns) {
  for (const char* name : {"ufp4", "e2m1-ref", "nvfp4"}) {
    const Recipe r = Recipe::preset(name);
    ASSERT_EQ(r.rht, 16) << name;
    ASSERT_EQ(r.rht_signs.size(), 16u) << name;
    for (float s : r.rht_signs) EXPECT_TRUE(s == 1.0f || s == -1.0f) << name;
  }
  EXPECT_EQ(Recipe::preset("nvfp4").rht_signs, rht_signs_te(16));
}

// Operands are the roles the linear layer's three GEMMs read.
TEST(RecipePresets, OperandRoles) {
  EXPECT_STREQ(operand_role(Pass::fwd_y, Operand::a), "fwd_x");
  EXPECT_STREQ(operand_role(Pass::fwd_y, Operand::b), "fwd_w");
  EXPECT_STREQ(operand_role(Pass::bwd_dx, Operand::a), "bwd_dy");
  EXPECT_STREQ(operand_role(Pass::bwd_dx, Operand::b), "fwd_w");
  EXPECT_STREQ(operand_role(Pass::bwd_dw, Operand::a), "bwd_dy");
  EXPECT_STREQ(operand_role(Pass::bwd_dw, Operand::b), "fwd_x");
  EXPECT_STREQ(pass_name(Pass::fwd_y), "fwd_y");
  EXPECT_STREQ(pass_name(Pass::bwd_dx), "bwd_dx");
  EXPECT_STREQ(pass_name(Pass::bwd_dw), "bwd_dw");
}

// SR streams differ between every (pass, operand) and between GEMMs (the stream argument).
TEST(RecipePresets, SrStreamsAreDistinct) {
  const Recipe r = Recipe::preset("ufp4");
  std::set<uint32_t> streams;
  for (uint32_t g : {0u, 1u, 2u})
    for (Pass p : kPasses)
      for (Operand o : {Operand::a, Operand::b}) streams.insert(r.operand(p, o, g).stream);
  EXPECT_EQ(streams.size(), 18u);
}

// The table of named recipes: unique names, the presets first, every ablation a change of one preset's RHT passes
// or rounding alone, and the arms of the paper's ablation study numbered 1..n without a gap.
TEST(RecipeTable, AblationsChangeOnlyRhtPassesOrRoundingOfAPreset) {
  const std::vector<RecipeRow>& table = recipe_table();
  std::set<std::string> names;
  std::set<int> arms;
  std::vector<std::string> presets, all;
  for (const RecipeRow& row : table) {
    SCOPED_TRACE(row.recipe.name);
    EXPECT_TRUE(names.insert(row.recipe.name).second);
    all.push_back(row.recipe.name);
    if (row.study != 0) {
      EXPECT_TRUE(arms.insert(row.study).second);
    }
    EXPECT_FALSE(row.what.empty());
    if (row.kind == RecipeKind::preset) {
      EXPECT_EQ(all.size(), presets.size() + 1) << "presets come first";
      presets.push_back(row.recipe.name);
      EXPECT_EQ(row.base, row.recipe.name);
      continue;
    }
    const Recipe base = Recipe::preset(row.base);
    EXPECT_NE(std::find(Recipe::preset_names().begin(), Recipe::preset_names().end(), row.base),
              Recipe::preset_names().end());
    EXPECT_NE(row.study, 0);
    const Recipe& r = row.recipe;
    EXPECT_TRUE(r.rht_on != base.rht_on || r.rounding != base.rounding) << "changes nothing";
    EXPECT_EQ(std::string(r.format.name), base.format.name);
    EXPECT_EQ(std::tie(r.block, r.scale, r.weight_tile2d, r.rht, r.rht_signs, r.rht_bf16, r.seed),
              std::tie(base.block, base.scale, base.weight_tile2d, base.rht, base.rht_signs, base.rht_bf16, base.seed));
  }
  EXPECT_EQ(presets, Recipe::preset_names());
  EXPECT_EQ(all, Recipe::names());
  ASSERT_FALSE(arms.empty());
  EXPECT_EQ(*arms.begin(), 1);
  EXPECT_EQ(*arms.rbegin(), int(arms.size()));
}

// The ablations, operand by operand, as their names say (docs/spec.md §8): RHT per pass and rounding per operand.
TEST(RecipeTable, AblationsAreWhatTheirNamesSay) {
  using R = Rounding;
  const R n = R::rtne, s = R::sr;
  struct Want {
    const char* name;
    std::array<int, 3> rht;
    std::array<R, 6> rounding;  // pass order, a then b
  };
  const Want wants[] = {
      {"ufp4-rht-none", {0, 0, 0}, {n, n, s, n, s, n}},      {"ufp4-rht-wgrad", {0, 0, 16}, {n, n, s, n, s, n}},
      {"ufp4-rht-fwd-wgrad", {16, 0, 16}, {n, n, s, n, s, n}}, {"ufp4-sr-none", {16, 16, 16}, {n, n, n, n, n, n}},
      {"ufp4-sr-grads", {16, 16, 16}, {n, n, s, s, s, s}},    {"e2m1-rht-all", {16, 16, 16}, {n, n, s, n, s, n}},
  };
  for (const Want& w : wants) {
    SCOPED_TRACE(w.name);
    const Recipe r = Recipe::preset(w.name);
    for (Pass p : kPasses)
      for (Operand o : {Operand::a, Operand::b}) {
        const QuantConfig c = r.operand(p, o);
        EXPECT_EQ(c.rht, w.rht[size_t(p)]);
        EXPECT_EQ(c.rht_signs, c.rht ? rht_signs_te(16) : std::vector<float>{});
        EXPECT_EQ(c.rounding, w.rounding[size_t(p) * 2 + size_t(o)]);
      }
  }
}

TEST(RecipePresets, UnknownNameThrows) {
  try {
    Recipe::preset("fp4-unknown");
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("fp4-unknown"), std::string::npos) << m;
    EXPECT_NE(m.find("ufp4"), std::string::npos) << m;  // lists the known names, ablations too
    EXPECT_NE(m.find("e2m1-rht-all"), std::string::npos) << m;
  }
  EXPECT_THROW(Recipe::preset(""), std::invalid_argument);
  EXPECT_THROW(Recipe::preset("NVFP4"), std::invalid_argument);
}

// pass_operands: shapes and transposes, checked against the three products written out directly:
//   fwd_y = X W^T [tokens, out], bwd_dx = dY W [tokens, in], bwd_dw = dY^T X [out, in].
TEST(PassOperands, ShapesAndTransposes) {
  const int64_t T = 3, I = 5, O = 4;
  std::vector<float> x(T * I), w(O * I), dy(T * O);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i + 1);
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(100 + i);
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = float(1000 + i);
  const auto f = pass_operands(Pass::fwd_y, x.data(), w.data(), dy.data(), T, I, O);
  EXPECT_EQ(std::tie(f.M, f.N, f.K), std::make_tuple(T, O, I));
  EXPECT_EQ(f.a, x);
  EXPECT_EQ(f.b, w);
  const auto dx = pass_operands(Pass::bwd_dx, x.data(), w.data(), dy.data(), T, I, O);
  EXPECT_EQ(std::tie(dx.M, dx.N, dx.K), std::make_tuple(T, I, O));
  EXPECT_EQ(dx.a, dy);
  for (int64_t i = 0; i < I; ++i)
    for (int64_t o = 0; o < O; ++o) EXPECT_EQ(dx.b[i * O + o], w[o * I + i]);
  const auto dw = pass_operands(Pass::bwd_dw, x.data(), w.data(), dy.data(), T, I, O);
  EXPECT_EQ(std::tie(dw.M, dw.N, dw.K), std::make_tuple(O, I, T));
  for (int64_t o = 0; o < O; ++o)
    for (int64_t t = 0; t < T; ++t) EXPECT_EQ(dw.a[o * T + t], dy[t * O + o]);
  for (int64_t i = 0; i < I; ++i)
    for (int64_t t = 0; t < T; ++t) EXPECT_EQ(dw.b[i * T + t], x[t * I + i]);

  // The products (integers below 2^53: exact in float64).
  const auto y = gemm_f64(f.a.data(), f.b.data(), f.M, f.N, f.K);
  const auto gx = gemm_f64(dx.a.data(), dx.b.data(), dx.M, dx.N, dx.K);
  const auto gw = gemm_f64(dw.a.data(), dw.b.data(), dw.M, dw.N, dw.K);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < O; ++o) {
      double s = 0;
      for (int64_t i = 0; i < I; ++i) s += double(x[t * I + i]) * w[o * I + i];
      EXPECT_EQ(y[t * O + o], s);
    }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < I; ++i) {
      double s = 0;
      for (int64_t o = 0; o < O; ++o) s += double(dy[t * O + o]) * w[o * I + i];
      EXPECT_EQ(gx[t * I + i], s);
    }
  for (int64_t o = 0; o < O; ++o)
    for (int64_t i = 0; i < I; ++i) {
      double s = 0;
      for (int64_t t = 0; t < T; ++t) s += double(dy[t * O + o]) * x[t * I + i];
      EXPECT_EQ(gw[o * I + i], s);
    }
}

TEST(PassOperands, TransposeHelper) {
  const std::vector<float> a = {1, 2, 3, 4, 5, 6};  // [2, 3]
  EXPECT_EQ(transpose(a.data(), 2, 3), (std::vector<float>{1, 4, 2, 5, 3, 6}));
}

// docs/spec.md §12's words: the first two Philox4x32-10 words (low first) under key = seed and counter
// (step low, step high, "STEP", 0); distinct for neighbouring steps and seeds.
TEST(TrainingSeed, IsTheDocumentedPhiloxDerivation) {
  std::set<uint64_t> seen;
  for (uint64_t seed : {0ull, 1ull, 0x123456789abcdefull})
    for (uint64_t step : {0ull, 1ull, 2ull, 1000ull, 0x100000000ull}) {
      const uint32_t k[2] = {uint32_t(seed), uint32_t(seed >> 32)};
      const uint32_t c[4] = {uint32_t(step), uint32_t(step >> 32), 0x53544550u, 0u};
      uint32_t o[4];
      Philox4x32::generate(c, k, o);
      EXPECT_EQ(training_seed(seed, step), uint64_t(o[0]) | (uint64_t(o[1]) << 32)) << seed << " " << step;
      seen.insert(training_seed(seed, step));
    }
  EXPECT_EQ(seen.size(), 15u);
}

// The typed settings on top of a recipe (settings.hpp): what each one sets, and the combination rules' messages
// (the command line's text is read into these by cli/knobs.cpp; tests/cli checks that reading).
TEST(OperandSettings, SetOnTopOfTheRecipe) {
  const QuantConfig base = Recipe::preset("nvfp4").operand(Pass::bwd_dw, Operand::a, 0);
  OperandSettings s;
  s.recipe = "nvfp4";
  EXPECT_EQ(operand_config(s, Pass::bwd_dw, Operand::a).label(), base.label());
  s.format = parse_format("int4");
  s.rht = 32;
  s.rht_seed = 7;
  s.seed = 3;
  s.stream = 2;
  const QuantConfig c = operand_config(s, Pass::bwd_dw, Operand::a);
  EXPECT_EQ(std::string(c.format.name), "int4");
  EXPECT_EQ(c.rht, 32);
  EXPECT_EQ(c.rht_signs, rht_signs_from_seed(32, 7));
  EXPECT_EQ(c.scale, base.scale);
  EXPECT_EQ(c.seed, 3u);
  EXPECT_EQ(c.stream, 2u * 8 + uint32_t(Pass::bwd_dw) * 2 + uint32_t(Operand::a));
  OperandSettings te;
  te.rht_signs_te = true;  // no size given: Transformer Engine's 16
  EXPECT_EQ(operand_config(te, Pass::fwd_y, Operand::a).rht_signs, rht_signs_te(16));
}

TEST(OperandSettings, CombinationFaultsAreOneLine) {
  const auto fault = [](const OperandSettings& s) {
    try {
      operand_config(s, Pass::fwd_y, Operand::a);
    } catch (const SettingsError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  OperandSettings a;
  a.rht = 16;
  a.rht_signs = std::vector<float>{1, -1};
  EXPECT_EQ(fault(a), "--rht-signs gives 2 signs but the RHT size is 16");
  a.rht_signs = std::vector<float>(16, 0.5f);
  EXPECT_EQ(fault(a), "--rht-signs: sign 1 is '0.5', not +1 or -1");
  a.rht_seed = 1;
  EXPECT_EQ(fault(a), "give --rht-signs or --rht-seed, not both");
  OperandSettings b;
  b.rht = 24;
  EXPECT_EQ(fault(b), "--rht: " + rht_size_fault(24) + " (none or 0: RHT off)");
  b.rht = 32;
  EXPECT_NE(fault(b).find("needs --rht-signs or --rht-seed"), std::string::npos);
  b.rht_signs_te = true;
  EXPECT_NE(fault(b).find("--rht-signs te: "), std::string::npos);
  OperandSettings c;
  c.rht_bf16 = true;
  EXPECT_EQ(fault(c), "--rht-bf16 needs an RHT (--rht D)");
  c = OperandSettings{};
  c.tile2d = true;
  c.block = 32;
  EXPECT_EQ(fault(c), "--tile2d (16x16 scale tiles) needs block 16, not 32");
  c = OperandSettings{};
  c.recipe = "nvfp5";
  EXPECT_EQ(fault(c).rfind("unknown recipe 'nvfp5'", 0), 0u);
  EXPECT_EQ(role_operand("fwd_w", Pass::fwd_y), Operand::b);
  EXPECT_EQ(role_pass("bwd_dy"), Pass::bwd_dx);
}

}  // namespace
}  // namespace fp4lab::test
