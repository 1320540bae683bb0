#include "fp4lab/recipe.hpp"

#include <algorithm>
#include <stdexcept>

#include "fp4lab/text.hpp"
#include "fp4lab/philox.hpp"
#include "fp4lab/rht.hpp"

namespace fp4lab {

const char* pass_name(Pass p) {
  switch (p) {
    case Pass::fwd_y: return "fwd_y";
    case Pass::bwd_dx: return "bwd_dx";
    default: return "bwd_dw";
  }
}

const char* operand_role(Pass p, Operand o) {
  switch (p) {
    case Pass::fwd_y: return o == Operand::a ? "fwd_x" : "fwd_w";
    case Pass::bwd_dx: return o == Operand::a ? "bwd_dy" : "fwd_w";
    default: return o == Operand::a ? "bwd_dy" : "fwd_x";
  }
}

namespace {
constexpr Rounding kRn = Rounding::rtne, kSr = Rounding::sr;
constexpr PassRounding kSrDy = {{{kRn, kRn}, {kSr, kRn}, {kSr, kRn}}};      // SR on dY (operand a of the backward)
constexpr PassRounding kRtne = {{{kRn, kRn}, {kRn, kRn}, {kRn, kRn}}};
constexpr PassRounding kSrGrads = {{{kRn, kRn}, {kSr, kSr}, {kSr, kSr}}};   // SR on every backward operand
constexpr std::array<bool, 3> kRhtAll{true, true, true}, kRhtWgrad{false, false, true},
    kRhtFwdWgrad{true, false, true}, kRhtNone{false, false, false};
constexpr RecipeKind kPreset = RecipeKind::preset, kAblation = RecipeKind::ablation;

// The table. Every RHT is Transformer Engine's 16 signs (docs/spec.md §3); an ablation differs from its base only
// in rht_on and rounding (recipe_test checks it), so its `what` can name the change alone.
struct Row {
  const char* name;
  RecipeKind kind;
  const char* base;
  int study;
  ElemFormat format;
  int block;
  ScaleKind scale;
  bool weight_tile2d;
  int rht;
  std::array<bool, 3> rht_on;
  bool rht_bf16;
  PassRounding rounding;
  const char* what;
};
constexpr ScaleKind kFp32 = ScaleKind::fp32, kUe4m3 = ScaleKind::ue4m3, kUe8m0 = ScaleKind::ue8m0;
constexpr Row kRows[] = {
    // name, kind, base, study, format, block, scale, tile2d, rht, rht_on, rht_bf16, rounding, what
    {"ufp4", kPreset, "ufp4", 4, kE1M2, 16, kFp32, false, 16, kRhtAll, false, kSrDy,
     "E1M2, FP32 scales, RHT on all three GEMMs, SR on dY (the paper's recipe)"},
    {"e2m1-ref", kPreset, "e2m1-ref", 0, kE2M1, 16, kFp32, false, 16, kRhtWgrad, false, kSrDy,
     "E2M1, FP32 scales, RHT on bwd_dw, SR on dY (the paper's E2M1 baseline)"},
    {"nvfp4", kPreset, "nvfp4", 0, kE2M1, 16, kUe4m3, true, 16, kRhtWgrad, true, kSrDy,
     "Transformer Engine's NVFP4 recipe"},
    {"mxfp4", kPreset, "mxfp4", 0, kE2M1, 32, kUe8m0, false, 0, kRhtNone, false, kRtne, "OCP MXFP4"},
    {"ufp4-rht-none", kAblation, "ufp4", 1, kE1M2, 16, kFp32, false, 16, kRhtNone, false, kSrDy,
     "ufp4 without RHT"},
    {"ufp4-rht-wgrad", kAblation, "ufp4", 2, kE1M2, 16, kFp32, false, 16, kRhtWgrad, false, kSrDy,
     "ufp4 with RHT on bwd_dw only"},
    {"ufp4-rht-fwd-wgrad", kAblation, "ufp4", 3, kE1M2, 16, kFp32, false, 16, kRhtFwdWgrad, false, kSrDy,
     "ufp4 with RHT on fwd_y and bwd_dw"},
    {"ufp4-sr-none", kAblation, "ufp4", 5, kE1M2, 16, kFp32, false, 16, kRhtAll, false, kRtne,
     "ufp4 with round-to-nearest-even everywhere"},
    {"ufp4-sr-grads", kAblation, "ufp4", 6, kE1M2, 16, kFp32, false, 16, kRhtAll, false, kSrGrads,
     "ufp4 with SR on every operand of the two gradient GEMMs"},
    {"e2m1-rht-all", kAblation, "e2m1-ref", 7, kE2M1, 16, kFp32, false, 16, kRhtAll, false, kSrDy,
     "e2m1-ref with RHT on all three GEMMs"},
};

std::vector<std::string> names_of(bool presets_only) {
  std::vector<std::string> v;
  for (const Row& r : kRows)
    if (!presets_only || r.kind == kPreset) v.push_back(r.name);
  return v;
}
}  // namespace

const char* recipe_kind_name(RecipeKind k) { return k == RecipeKind::preset ? "preset" : "ablation"; }

const std::vector<RecipeRow>& recipe_table() {
  static const std::vector<RecipeRow> table = [] {
    std::vector<RecipeRow> t;
    for (const Row& row : kRows) {
      Recipe r;
      r.name = row.name;
      r.format = row.format;
      r.block = row.block;
      r.scale = row.scale;
      r.weight_tile2d = row.weight_tile2d;
      r.rht = row.rht;
      r.rht_on = row.rht_on;
      if (row.rht != 0) r.rht_signs = rht_signs_te(row.rht);
      r.rht_bf16 = row.rht_bf16;
      r.rounding = row.rounding;
      t.push_back({std::move(r), row.kind, row.base, row.study, row.what});
    }
    return t;
  }();
  return table;
}

const std::vector<std::string>& Recipe::preset_names() {
  static const std::vector<std::string> names = names_of(true);
  return names;
}

const std::vector<std::string>& Recipe::names() {
  static const std::vector<std::string> all = names_of(false);
  return all;
}

Recipe Recipe::preset(const std::string& name) {
  for (const RecipeRow& row : recipe_table())
    if (row.recipe.name == name) return row.recipe;
  std::string known;
  for (const auto& n : names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown recipe '" + shown(name) + "' (known: " + known + ")");
}

QuantConfig Recipe::operand(Pass p, Operand o, uint32_t stream) const {
  QuantConfig c;
  c.format = format;
  c.block = block;
  c.scale = scale;
  const std::string role = operand_role(p, o);
  c.tile2d = weight_tile2d && role == "fwd_w";
  if (rht_on[size_t(p)] && rht != 0) {
    c.rht = rht;
    c.rht_signs = rht_signs;
    c.rht_bf16 = rht_bf16;
  }
  c.rounding = rounding[size_t(p)][size_t(o)];
  c.seed = seed;
  c.sr_draw = sr_draw;
  c.stream = stream * 8u + uint32_t(p) * 2u + uint32_t(o);
  return c;
}

std::vector<float> transpose(const float* x, int64_t rows, int64_t cols) {
  std::vector<float> t(size_t(rows * cols));
  constexpr int64_t T = 32;  // tiles keep both the reads and the writes in cache
#pragma omp parallel for schedule(static)
  for (int64_t r0 = 0; r0 < rows; r0 += T)
    for (int64_t c0 = 0; c0 < cols; c0 += T)
      for (int64_t r = r0; r < std::min(rows, r0 + T); ++r)
        for (int64_t c = c0; c < std::min(cols, c0 + T); ++c) t[c * rows + r] = x[r * cols + c];
  return t;
}

PassGeometry pass_geometry(Pass p, int64_t tokens, int64_t in, int64_t out) {
  switch (p) {
    case Pass::fwd_y: return {tokens, out, in};   // X . W^T
    case Pass::bwd_dx: return {tokens, in, out};  // dY . W
    default: return {out, in, tokens};            // dY^T . X
  }
}

PassOperands pass_operands(Pass p, const float* x, const float* w, const float* dy, int64_t tokens, int64_t in,
                           int64_t out) {
  PassOperands o;
  const PassGeometry g = pass_geometry(p, tokens, in, out);
  o.M = g.M; o.N = g.N; o.K = g.K;
  switch (p) {
    case Pass::fwd_y:
      o.a.assign(x, x + tokens * in);
      o.b.assign(w, w + out * in);
      break;
    case Pass::bwd_dx:
      o.a.assign(dy, dy + tokens * out);
      o.b = transpose(w, out, in);
      break;
    case Pass::bwd_dw:
      o.a = transpose(dy, tokens, out);
      o.b = transpose(x, tokens, in);
      break;
  }
  return o;
}

uint64_t training_seed(uint64_t seed, uint64_t step) {
  const uint32_t k[2] = {uint32_t(seed), uint32_t(seed >> 32)};
  const uint32_t c[4] = {uint32_t(step), uint32_t(step >> 32), kStepStream, 0u};
  uint32_t o[4];
  Philox4x32::generate(c, k, o);
  return uint64_t(o[0]) | (uint64_t(o[1]) << 32);
}

}  // namespace fp4lab
