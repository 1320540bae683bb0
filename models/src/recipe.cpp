#include "fp4lab/recipe.hpp"

#include <algorithm>
#include <stdexcept>

#include "fp4lab/knobs.hpp"
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

const std::vector<std::string>& Recipe::preset_names() {
  static const std::vector<std::string> names = {"ufp4", "e2m1-ref", "nvfp4", "mxfp4"};
  return names;
}

Recipe Recipe::preset(const std::string& name) {
  Recipe r;
  r.name = name;
  if (name == "ufp4") {  // the paper's recipe: uniform grid, RHT on all three GEMMs, SR on dY
    r.format = kE1M2;
    r.rht = 16;
    r.rht_on = {true, true, true};
    r.rht_signs = rht_signs_te(16);
    r.sr_dy = true;
  } else if (name == "e2m1-ref") {  // the paper's baseline: RHT on wgrad only
    r.format = kE2M1;
    r.rht = 16;
    r.rht_on = {false, false, true};
    r.rht_signs = rht_signs_te(16);
    r.sr_dy = true;
  } else if (name == "nvfp4") {  // Transformer Engine's NVFP4 recipe
    r.format = kE2M1;
    r.scale = ScaleKind::ue4m3;
    r.weight_tile2d = true;
    r.rht = 16;
    r.rht_on = {false, false, true};
    r.rht_signs = rht_signs_te(16);
    r.rht_bf16 = true;
    r.sr_dy = true;
  } else if (name == "mxfp4") {  // OCP MX
    r.format = kE2M1;
    r.block = 32;
    r.scale = ScaleKind::ue8m0;
  } else {
    std::string known;
    for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
    throw std::invalid_argument("unknown recipe '" + shown(name) + "' (known: " + known + ")");
  }
  return r;
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
  c.rounding = (sr_dy && role == "bwd_dy") ? Rounding::sr : Rounding::rtne;
  c.seed = seed;
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
