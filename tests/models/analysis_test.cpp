// Pinned analyses (analysis.hpp, docs/spec.md §6): shrinkage bias (analytic and empirical), SQNR,
// B_eff and the shrinkage factor, on hand-worked cases.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "fp4lab/analysis.hpp"
#include "fp4lab/crmath.hpp"
#include "fp4lab/gemm.hpp"
#include "fp4lab/layer_analysis.hpp"
#include "fp4lab/quantize.hpp"
#include "fp4lab/recipe.hpp"
#include "fp4lab/rht.hpp"
#include "test_util.hpp"

namespace fp4lab::test {
namespace {

struct BiasTable {
  ElemFormat f;
  double left[8], right[8], bias[8];  // half-gaps l_i, r_i and (l_i - r_i)/2, by hand from the levels
};

// Half-gaps from docs/spec.md §1's levels; level 0's bin starts at 0, the top level's bin is one-sided.
const BiasTable kBias[] = {
    // e2m1: 0 .5 1 1.5 2 3 4 6
    {kE2M1,
     {0, .25, .25, .25, .25, .5, .5, 1},
     {.25, .25, .25, .25, .5, .5, 1, 0},
     {-.125, 0, 0, 0, -.125, 0, -.25, .5}},
    // e1m2: step .25
    {kE1M2,
     {0, .125, .125, .125, .125, .125, .125, .125},
     {.125, .125, .125, .125, .125, .125, .125, 0},
     {-.0625, 0, 0, 0, 0, 0, 0, .0625}},
    // int4: step 1
    {kInt4, {0, .5, .5, .5, .5, .5, .5, .5}, {.5, .5, .5, .5, .5, .5, .5, 0}, {-.25, 0, 0, 0, 0, 0, 0, .25}},
    // e2m1_max2: 0 .5 1 1.5 2
    {kE2M1Max2, {0, .25, .25, .25, .25}, {.25, .25, .25, .25, 0}, {-.125, 0, 0, 0, .125}},
};

// The paper's number: E2M1 level 2 has bin [1.75, 2.5], half-gaps 0.25 / 0.5, bias -0.125.
TEST(AnalyticBias, PaperE2M1LevelTwo) {
  const auto b = analytic_bias(kE2M1);
  ASSERT_EQ(b.size(), 8u);
  EXPECT_EQ(b[4].level, 2.0);
  EXPECT_EQ(b[4].left_halfgap, 0.25);
  EXPECT_EQ(b[4].right_halfgap, 0.5);
  EXPECT_EQ(b[4].bias, -0.125);
  EXPECT_EQ(b[4].level - b[4].left_halfgap, 1.75);
  EXPECT_EQ(b[4].level + b[4].right_halfgap, 2.5);
}

TEST(AnalyticBias, InteriorE1M2LevelsAreUnbiased) {
  const auto b = analytic_bias(kE1M2);
  ASSERT_EQ(b.size(), 8u);
  for (int i = 1; i < 7; ++i) EXPECT_EQ(b[i].bias, 0.0) << i;
}

TEST(AnalyticBias, EveryLevelOfEveryFormat) {
  int checked = 0;
  for (const BiasTable& t : kBias) {
    SCOPED_TRACE(t.f.name);
    const auto b = analytic_bias(t.f);
    ASSERT_EQ(int(b.size()), t.f.num_levels());
    for (int i = 0; i < t.f.num_levels(); ++i) {
      EXPECT_EQ(b[i].index, i);
      EXPECT_EQ(b[i].level, double(t.f.level(i)));
      EXPECT_EQ(b[i].left_halfgap, t.left[i]) << i;
      EXPECT_EQ(b[i].right_halfgap, t.right[i]) << i;
      EXPECT_EQ(b[i].bias, t.bias[i]) << i;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 8 + 8 + 8 + 5);
}

// 10^6 values uniform over [-gmax, gmax] (random signs), fp32 scale, 1x16 blocks, RTNE.
// Given the block max M, the other 15 values are uniform on [0, M] in magnitude, so after dividing by
// dec = M/gmax they are uniform on [0, gmax]: each non-top level's mean error is its analytic bias,
// a uniform error over a bin of width l+r, standard deviation (l+r)/sqrt(12). Tolerance: 5 standard
// errors, 5 (l+r) / sqrt(12 n_i), plus 1e-6 for the FP32 division.
// The top level also holds every block's max, which lands exactly on gmax (error ~0): its expected mean
// is (n_top - n_blocks)/n_top * l/2, with tolerance 5 (l/sqrt(12)) sqrt(n_top - n_blocks) / n_top + 1e-6.
TEST(EmpiricalBias, UniformInputMatchesAnalytic) {
  const int64_t rows = 62500, cols = 16;  // 10^6 values, 62500 blocks
  for (const BiasTable& t : kBias) {
    SCOPED_TRACE(t.f.name);
    Rng rng(0xB1A5);
    const float gmax = t.f.gmax();
    std::vector<float> x(size_t(rows * cols));
    for (auto& v : x) v = rng.uniform(0, gmax) * (rng.next() & 1 ? -1.0f : 1.0f);
    QuantConfig cfg;
    cfg.format = t.f;
    const QTensor q = quantize(x.data(), rows, cols, cfg);
    const auto eb = empirical_bias(q, x.data());
    ASSERT_EQ(int(eb.size()), t.f.num_levels());
    int64_t total = 0;
    for (int i = 0; i < t.f.num_levels(); ++i) {
      const double l = t.left[i], r = t.right[i];
      const int64_t n = eb[i].count;
      total += n;
      ASSERT_GT(n, 10000) << "level " << i;
      if (i + 1 < t.f.num_levels()) {
        EXPECT_NEAR(eb[i].mean_error, t.bias[i], 5 * (l + r) / std::sqrt(12.0 * double(n)) + 1e-6) << "level " << i;
      } else {
        const double nu = double(n - rows);
        EXPECT_NEAR(eb[i].mean_error, nu / double(n) * l / 2, 5 * (l / std::sqrt(12.0)) * std::sqrt(nu) / double(n) + 1e-6)
            << "top level";
      }
    }
    EXPECT_EQ(total, rows * cols);
  }
}

// SQNR: ref (1, 2, 3, 4), q (1, 2, 3, 5): 10 log10(30 / 1) = 14.771212547196624 dB.
// ref (10, 0), q (9, 0): 10 log10(100) = 20 dB. No error: +inf.
TEST(Sqnr, HandCases) {
  const float ref[] = {1, 2, 3, 4}, q[] = {1, 2, 3, 5};
  EXPECT_DOUBLE_EQ(sqnr_db(ref, q, 4), 14.771212547196624);
  const double ref64[] = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(sqnr_db(ref64, q, 4), 14.771212547196624);
  const float r2[] = {10, 0}, q2[] = {9, 0};
  EXPECT_DOUBLE_EQ(sqnr_db(r2, q2, 2), 20.0);
  EXPECT_EQ(sqnr_db(ref, ref, 4), std::numeric_limits<double>::infinity());
}

QTensor with_codes(const ElemFormat& f, std::vector<uint8_t> codes) {
  QTensor q;
  q.format = f;
  q.rows = 1;
  q.cols = int64_t(codes.size());
  q.block = 16;
  q.codes = std::move(codes);
  q.scales.assign(size_t(q.cols / 16 + 1), 1.0f);
  return q;
}

// B_eff = exp(-sum p log p) / K: uniform occupancy of the K magnitude bins -> 1 (signs do not matter);
// one bin -> 1/K; two equal bins -> 2/K.
TEST(Beff, HandCases) {
  std::vector<uint8_t> uni;
  for (int i = 0; i < 8; ++i) uni.insert(uni.end(), {uint8_t(i), uint8_t(8 | i)});
  EXPECT_NEAR(beff(with_codes(kE2M1, uni)), 1.0, 1e-15);
  EXPECT_NEAR(beff(with_codes(kE1M2, uni)), 1.0, 1e-15);
  EXPECT_DOUBLE_EQ(beff(with_codes(kE2M1, std::vector<uint8_t>(16, 0b1'011))), 1.0 / 8);
  std::vector<uint8_t> two(16, 2);
  for (int i = 0; i < 8; ++i) two[i] = 0b1'101;
  EXPECT_NEAR(beff(with_codes(kInt4, two)), 2.0 / 8, 1e-15);
  // e2m1_max2 has K = 5 bins.
  std::vector<uint8_t> five;
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 5; ++i) five.push_back(uint8_t(i));
  EXPECT_NEAR(beff(with_codes(kE2M1Max2, five)), 1.0, 1e-15);
  EXPECT_DOUBLE_EQ(beff(with_codes(kE2M1Max2, std::vector<uint8_t>(16, 4))), 1.0 / 5);
}

// alpha = <Q(A), A> / |A|^2: ref (1, 2), q (1, 1.5) -> (1 + 3) / 5 = 0.8; exact copy -> 1; q = 0 -> 0;
// a zero reference defines alpha = 1 (nothing shrinks).
TEST(ShrinkageAlpha, HandCases) {
  const float ref[] = {1, 2}, q[] = {1, 1.5f}, zero[] = {0, 0};
  EXPECT_DOUBLE_EQ(shrinkage_alpha(ref, q, 2), 0.8);
  EXPECT_DOUBLE_EQ(shrinkage_alpha(ref, ref, 2), 1.0);
  EXPECT_DOUBLE_EQ(shrinkage_alpha(ref, zero, 2), 0.0);
  EXPECT_DOUBLE_EQ(shrinkage_alpha(zero, q, 2), 1.0);
}

// moments() on a QTensor dequantises on the fly; it must give the same bits as moments() on the dequantised
// copy (same lanes, same order), and agree with a plain serial double sum to rounding. A length that is not a
// multiple of the 8 lanes exercises the tail. Blocks of 16 and 32, ue4m3 (a global_dec != 1) and fp32 scales.
TEST(Moments, OnTheFlyEqualsDequantisedCopy) {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> g(0.0f, 3.0f);
  for (int block : {16, 32})
    for (ScaleKind sk : {ScaleKind::fp32, ScaleKind::ue4m3}) {
      if (sk == ScaleKind::ue4m3 && block == 32) continue;
      const int64_t rows = 24, cols = 96;
      std::vector<float> x(size_t(rows * cols));
      for (float& v : x) v = g(rng);
      QuantConfig c;
      c.format = kE2M1;
      c.block = block;
      c.scale = sk;
      const QTensor q = quantize(x.data(), rows, cols, c);
      const std::vector<float> dq = q.dequantize();
      const Moments a = moments(x.data(), q), b = moments(x.data(), dq.data(), rows * cols);
      EXPECT_EQ(std::bit_cast<uint64_t>(a.ref2), std::bit_cast<uint64_t>(b.ref2));
      EXPECT_EQ(std::bit_cast<uint64_t>(a.err2), std::bit_cast<uint64_t>(b.err2));
      EXPECT_EQ(std::bit_cast<uint64_t>(a.dot), std::bit_cast<uint64_t>(b.dot));
      double r2 = 0, e2 = 0, d = 0;
      for (size_t i = 0; i + 3 < x.size(); ++i) {  // n = rows * cols - 3: a 5-element tail
        r2 += double(x[i]) * x[i];
        e2 += (double(dq[i]) - x[i]) * (double(dq[i]) - x[i]);
        d += double(dq[i]) * x[i];
      }
      const Moments t = moments(x.data(), dq.data(), rows * cols - 3);
      EXPECT_NEAR(t.ref2, r2, 1e-12 * r2);
      EXPECT_NEAR(t.err2, e2, 1e-12 * e2);
      EXPECT_NEAR(t.dot, d, 1e-12 * std::fabs(d));
      EXPECT_EQ(t.sqnr_db(), 10.0 * std::log10(t.ref2 / t.err2));
      EXPECT_EQ(t.alpha(), t.dot / t.ref2);
    }
}

// Backward operands read in place from their untransposed tensors (panels transposed as they are quantised, the
// float64 references read by strides) give the bits of the held transposed copies, under settings and every
// recipe preset: RHT, BF16 rotation, ue4m3's tensor scale (a transposed copy then), ue8m0, block 32, 2-D tiles and
// stochastic rounding (a transposed copy then), on a layer of several panels.
TEST(LayerAnalysis, TransposesReadInPlaceGiveTheHeldCopiesBits) {
  const int64_t T = 256, I = 96, O = 4128;  // dY^T [4128, 256] and W^T [96, 4128]: several panels each
  std::mt19937 rng(7);
  std::student_t_distribution<float> heavy(3.0f);
  std::vector<float> x(size_t(T * I)), w(size_t(O * I)), dy(size_t(T * O));
  for (auto* v : {&x, &w, &dy})
    for (float& e : *v) e = heavy(rng);
  const LayerView view{x.data(), w.data(), dy.data(), T, I, O};
  const LayerOperands held(view), in_place(view, true, /*held_transpose=*/0);
  ASSERT_FALSE(held.xt.empty());
  ASSERT_TRUE(in_place.xt.empty() && in_place.dyt.empty() && in_place.wt.empty());
  auto bits = [](double v) { return std::bit_cast<uint64_t>(v); };
  std::vector<AnalysisSetting> settings(4);
  settings[0].format = kE2M1;
  settings[1].rht = 16;
  settings[1].rht_signs = rht_signs_te(16);
  settings[2].format = kE2M1;
  settings[2].rht = 32;
  settings[2].rht_signs = rht_signs_from_seed(32, 1);
  settings[2].block = 32;
  settings[3].scale = ScaleKind::ue8m0;
  for (const AnalysisSetting& s : settings)
    for (Pass p : kPasses) {
      const LayerResults a = analyze_setting_pass(in_place, s, p), b = analyze_setting_pass(held, s, p);
      ASSERT_EQ(a.tensors.size(), b.tensors.size());
      for (size_t t = 0; t < a.tensors.size(); ++t) {
        EXPECT_EQ(bits(a.tensors[t].sqnr_db), bits(b.tensors[t].sqnr_db)) << s.label() << " " << a.tensors[t].role;
        EXPECT_EQ(bits(a.tensors[t].beff), bits(b.tensors[t].beff));
        EXPECT_EQ(bits(a.tensors[t].alpha), bits(b.tensors[t].alpha));
        for (size_t i = 0; i < a.tensors[t].bias_per_level.size(); ++i)
          EXPECT_EQ(bits(a.tensors[t].bias_per_level[i].mean_error), bits(b.tensors[t].bias_per_level[i].mean_error));
      }
      EXPECT_EQ(bits(a.gemms.at(0).sqnr_db), bits(b.gemms.at(0).sqnr_db)) << s.label() << " " << pass_name(p);
      EXPECT_EQ(bits(a.gemms.at(0).eta), bits(b.gemms.at(0).eta));
      EXPECT_EQ(bits(a.gemms.at(0).eta_measured), bits(b.gemms.at(0).eta_measured));
    }
  for (const std::string& name : Recipe::preset_names())
    for (Pass p : kPasses) {
      const Recipe r = Recipe::preset(name);
      const GemmResult a = analyze_recipe_pass(in_place, r, 3, p), b = analyze_recipe_pass(held, r, 3, p);
      EXPECT_EQ(bits(a.sqnr_db), bits(b.sqnr_db)) << name << " " << pass_name(p);
      EXPECT_EQ(bits(a.eta), bits(b.eta));
      EXPECT_EQ(bits(a.eta_measured), bits(b.eta_measured));
    }
  // The float64 reference read by strides, and in panels of rows of a transposed operand.
  for (Pass p : kPasses) {
    EXPECT_EQ(in_place.refs[size_t(p)], held.refs[size_t(p)]) << pass_name(p);
    const std::vector<LayerResults> a = analyze_pass_in_panels(in_place, p, settings, {}, 3, /*panel_rows=*/5);
    const std::vector<LayerResults> b = analyze_pass_in_panels(held, p, settings, {}, 3, /*panel_rows=*/5);
    for (size_t s = 0; s < settings.size(); ++s)
      EXPECT_EQ(bits(a[s].gemms.at(0).sqnr_db), bits(b[s].gemms.at(0).sqnr_db)) << pass_name(p);
  }
}

// The correctly rounded functions the statistics are defined with (docs/spec.md §6.1), against values rounded
// by hand from their exact expansions (hex literals: the double nearest the true value).
// The memory-bounded forms give the same bits as the whole-tensor ones: analyze_pass_in_panels (reference and
// outputs a few rows at a time, all jobs of a pass together) against analyze_setting_pass / analyze_recipe_pass with
// the whole reference, on a layer whose X is large enough (> 2^20 elements) for the statistics to re-rotate it a
// panel at a time, under settings and recipes that cover RHT, BF16 rotation, ue4m3's tensor scale, 2-D tiles and SR.
TEST(LayerAnalysis, PanelsGiveTheWholeTensorsBits) {
  const int64_t T = 1024, I = 1040, O = 32;
  std::mt19937 rng(5);
  std::student_t_distribution<float> heavy(3.0f);
  std::vector<float> x(size_t(T * I)), w(size_t(O * I)), dy(size_t(T * O));
  for (auto* v : {&x, &w, &dy})
    for (float& e : *v) e = heavy(rng);
  LayerOperands lo(LayerView{x.data(), w.data(), dy.data(), T, I, O});
  std::vector<AnalysisSetting> settings(2);
  settings[0].format = kE2M1;
  settings[1].rht = 16;
  settings[1].rht_signs = rht_signs_te(16);
  const std::vector<Recipe> recipes = {Recipe::preset("nvfp4"), Recipe::preset("ufp4")};
  auto bits = [](double v) { return std::bit_cast<uint64_t>(v); };
  auto same_gemm = [&](const GemmResult& a, const GemmResult& b) {
    EXPECT_EQ(a.pass, b.pass);
    EXPECT_EQ(a.format, b.format);
    EXPECT_EQ(a.recipe, b.recipe);
    EXPECT_EQ(a.rht, b.rht);
    EXPECT_EQ(bits(a.sqnr_db), bits(b.sqnr_db)) << a.pass << " " << a.format << " " << a.recipe;
    EXPECT_EQ(bits(a.eta), bits(b.eta));
    EXPECT_EQ(bits(a.eta_measured), bits(b.eta_measured));
  };
  // All jobs in one group, then each job in its own (the reference made again per group).
  for (const int64_t group : {lo.panels.group, int64_t(1)})
  for (Pass p : kPasses) {
    lo.panels.group = group;
    const std::vector<LayerResults> got = analyze_pass_in_panels(lo, p, settings, recipes, 3, /*panel_rows=*/7);
    ASSERT_EQ(got.size(), settings.size() + recipes.size());
    for (size_t s = 0; s < settings.size(); ++s) {
      const LayerResults want = analyze_setting_pass(lo, settings[s], p);
      ASSERT_EQ(got[s].tensors.size(), want.tensors.size());
      for (size_t t = 0; t < want.tensors.size(); ++t) {
        const TensorResult &a = got[s].tensors[t], &b = want.tensors[t];
        EXPECT_EQ(a.role, b.role);
        EXPECT_EQ(bits(a.sqnr_db), bits(b.sqnr_db)) << a.role;
        EXPECT_EQ(bits(a.beff), bits(b.beff));
        EXPECT_EQ(bits(a.alpha), bits(b.alpha));
        ASSERT_EQ(a.bias_per_level.size(), b.bias_per_level.size());
        for (size_t i = 0; i < a.bias_per_level.size(); ++i) {
          EXPECT_EQ(a.bias_per_level[i].count, b.bias_per_level[i].count);
          EXPECT_EQ(bits(a.bias_per_level[i].mean_error), bits(b.bias_per_level[i].mean_error));
        }
      }
      same_gemm(got[s].gemms.at(0), want.gemms.at(0));
    }
    for (size_t r = 0; r < recipes.size(); ++r)
      same_gemm(got[settings.size() + r].gemms.at(0), analyze_recipe_pass(lo, recipes[r], 3, p));
  }
  // The rotated statistics of X (a panel at a time, above) against a whole rotated copy, by hand.
  QuantConfig c = settings[1].config();
  const std::vector<float> rx = rotate(x.data(), T, I, c);
  const QTensor q = quantize(x.data(), T, I, c);
  const LayerResults fwd = analyze_setting_pass(lo, settings[1], Pass::fwd_y);
  EXPECT_EQ(bits(fwd.tensors[0].sqnr_db), bits(moments(rx.data(), q).sqnr_db()));
  const std::vector<EmpiricalLevel> bias = empirical_bias(q, rx.data());
  for (size_t i = 0; i < bias.size(); ++i)
    EXPECT_EQ(bits(fwd.tensors[0].bias_per_level[i].mean_error), bits(bias[i].mean_error));
  // A panel of a product is those rows of the whole product, and an overflow names its row in the whole.
  const QTensor qw = quantize(w.data(), O, I, c);
  const std::vector<float> whole = gemm(q, qw), rows = gemm_rows(q, 100, 9, qw);
  EXPECT_EQ(rows, std::vector<float>(whole.begin() + 100 * O, whole.begin() + 109 * O));
  EXPECT_THROW(gemm_rows(q, q.rows - 2, 3, qw), std::invalid_argument);  // past the last row
}

TEST(CorrectlyRounded, KnownValues) {
  EXPECT_EQ(cr::log(2.0), 0x1.62e42fefa39efp-1);    // ln 2 = 0.693147180559945309417...
  EXPECT_EQ(cr::exp(1.0), 0x1.5bf0a8b145769p+1);    // e = 2.718281828459045235360...
  EXPECT_EQ(cr::log10(2.0), 0x1.34413509f79ffp-2);  // log10 2 = 0.301029995663981195213...
  EXPECT_EQ(cr::log10(1000.0), 3.0);
  EXPECT_EQ(cr::log(1.0), 0.0);
  EXPECT_EQ(cr::exp(0.0), 1.0);
  EXPECT_EQ(cr::log(0.0), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(cr::log(-1.0)));
  // Subnormal results are rounded once: e^-745 is 0.571 of the smallest subnormal 2^-1074, so it rounds up to
  // it; e^-746 is 0.210 of it and rounds to 0.
  EXPECT_EQ(cr::exp(-745.0), 0x1p-1074);
  EXPECT_EQ(cr::exp(-746.0), 0.0);
  EXPECT_EQ(cr::exp(710.0), std::numeric_limits<double>::infinity());
}

// A layer read from BF16 bit patterns in place, every operand quantised and multiplied a chunk of rows at a time
// (chunks and panels that do not divide the rows), gives the bits of the FP32 copies held whole: tensor and GEMM
// results under settings and every recipe preset (RHT 16-64 with BF16 rotation, ue4m3's tensor scale, ue8m0,
// block 16 and 32, 2-D tiles, stochastic rounding), the float64 references, and the passes analysed in panels.
TEST(LayerAnalysis, Bf16ChunkedOperandsGiveTheHeldFp32CopiesBits) {
  const int64_t T = 1088, I = 320, O = 64;
  std::mt19937 rng(13);
  std::student_t_distribution<float> heavy(3.0f);
  std::vector<uint16_t> x16(size_t(T * I)), w16(size_t(O * I)), dy16(size_t(T * O));
  std::vector<float> x(x16.size()), w(w16.size()), dy(dy16.size());
  for (auto [b, f] : {std::pair{&x16, &x}, std::pair{&w16, &w}, std::pair{&dy16, &dy}})
    for (size_t i = 0; i < b->size(); ++i) {
      (*b)[i] = f32_to_bf16(heavy(rng));
      (*f)[i] = bf16_to_f32((*b)[i]);
    }
  const LayerOperands held(LayerView{x.data(), w.data(), dy.data(), T, I, O});
  LayerOperands chunked(LayerView{nullptr, nullptr, nullptr, T, I, O, x16.data(), w16.data(), dy16.data()}, false, 0);
  // Panels of 16 rows; chunks of 3 panels of X^T (320 = 6 x 48 + 32) and of 10 of X (1088 = 6 x 160 + 128).
  chunked.panels = {0, 3 * 16 * T, 4096};
  for (Pass p : kPasses) chunked.compute_ref(p);
  auto bits = [](double v) { return std::bit_cast<uint64_t>(v); };
  for (Pass p : kPasses) EXPECT_EQ(chunked.refs[size_t(p)], held.refs[size_t(p)]) << pass_name(p);
  std::vector<AnalysisSetting> settings(5);
  settings[0].format = kE2M1;
  settings[1].rht = 16;
  settings[1].rht_signs = rht_signs_te(16);
  settings[2].format = kE2M1;
  settings[2].rht = 64;
  settings[2].rht_signs = rht_signs_from_seed(64, 1);
  settings[2].block = 32;
  settings[3].scale = ScaleKind::ue8m0;
  settings[3].rht = 32;
  settings[3].rht_signs = rht_signs_from_seed(32, 2);
  settings[4].scale = ScaleKind::ue4m3;
  settings[4].format = kE2M1;
  settings[4].rht = 16;
  settings[4].rht_signs = rht_signs_te(16);
  auto same_gemm = [&](const GemmResult& a, const GemmResult& b, const std::string& what) {
    EXPECT_EQ(a.format, b.format) << what;
    EXPECT_EQ(bits(a.sqnr_db), bits(b.sqnr_db)) << what;
    EXPECT_EQ(bits(a.eta), bits(b.eta)) << what;
    EXPECT_EQ(bits(a.eta_measured), bits(b.eta_measured)) << what;
  };
  for (const AnalysisSetting& s : settings)
    for (Pass p : kPasses) {
      const std::string what = s.label() + " " + pass_name(p);
      const LayerResults a = analyze_setting_pass(chunked, s, p), b = analyze_setting_pass(held, s, p);
      ASSERT_EQ(a.tensors.size(), b.tensors.size());
      for (size_t t = 0; t < a.tensors.size(); ++t) {
        EXPECT_EQ(a.tensors[t].format, b.tensors[t].format);
        EXPECT_EQ(bits(a.tensors[t].sqnr_db), bits(b.tensors[t].sqnr_db)) << what << " " << a.tensors[t].role;
        EXPECT_EQ(bits(a.tensors[t].beff), bits(b.tensors[t].beff)) << what;
        EXPECT_EQ(bits(a.tensors[t].alpha), bits(b.tensors[t].alpha)) << what;
        ASSERT_EQ(a.tensors[t].bias_per_level.size(), b.tensors[t].bias_per_level.size());
        for (size_t i = 0; i < a.tensors[t].bias_per_level.size(); ++i) {
          EXPECT_EQ(a.tensors[t].bias_per_level[i].count, b.tensors[t].bias_per_level[i].count) << what;
          EXPECT_EQ(bits(a.tensors[t].bias_per_level[i].mean_error), bits(b.tensors[t].bias_per_level[i].mean_error));
        }
      }
      same_gemm(a.gemms.at(0), b.gemms.at(0), what);
    }
  // Every named recipe, ablations too: ufp4-sr-grads puts SR on X^T, the chunked operand of bwd_dw.
  std::vector<Recipe> recipes;
  for (const std::string& name : Recipe::names()) recipes.push_back(Recipe::preset(name));
  for (const Recipe& r : recipes)
    for (Pass p : kPasses)
      same_gemm(analyze_recipe_pass(chunked, r, 3, p), analyze_recipe_pass(held, r, 3, p), r.name + pass_name(p));
  for (Pass p : kPasses) {
    const std::vector<LayerResults> a = analyze_pass_in_panels(chunked, p, settings, recipes, 3, /*panel_rows=*/100);
    const std::vector<LayerResults> b = analyze_pass_in_panels(held, p, settings, recipes, 3, /*panel_rows=*/100);
    for (size_t j = 0; j < a.size(); ++j) same_gemm(a[j].gemms.at(0), b[j].gemms.at(0), pass_name(p));
  }
}

}  // namespace
}  // namespace fp4lab::test
