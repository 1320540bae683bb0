#include "fp4lab/layer_analysis.hpp"

#include "fp4lab/gemm.hpp"

namespace fp4lab {

std::string AnalysisSetting::label() const {
  return std::string(format.name) + (rht ? " rht" + std::to_string(rht) : " no-rht");
}

LayerOperands::LayerOperands(const LayerView& v, bool with_refs)
    : l(v), wt(transpose(v.w, v.out, v.in)), dyt(transpose(v.dy, v.tokens, v.out)), xt(transpose(v.x, v.tokens, v.in)),
      refs(3) {
  if (with_refs)
    for (Pass p : kPasses) compute_ref(p);
}

void LayerOperands::compute_ref(Pass p) {
  const auto [a, b] = pass(p);
  refs[size_t(p)] = gemm_f64(a.p, b.p, a.rows, b.rows, a.cols);
}

std::pair<LayerOperands::Operand, LayerOperands::Operand> LayerOperands::pass(Pass p) const {
  const PassGeometry g = pass_geometry(p, l.tokens, l.in, l.out);
  switch (p) {
    case Pass::fwd_y: return {{l.x, g.M, g.K}, {l.w, g.N, g.K}};
    case Pass::bwd_dx: return {{l.dy, g.M, g.K}, {wt.data(), g.N, g.K}};
    default: return {{dyt.data(), g.M, g.K}, {xt.data(), g.N, g.K}};
  }
}

QuantConfig AnalysisSetting::config() const {
  const AnalysisSetting& s = *this;
  QuantConfig c;
  c.format = s.format;
  c.block = s.block;
  c.scale = s.scale;
  c.rht = s.rht;
  c.rht_signs = s.rht_signs;
  return c;
}

namespace {

struct Quantised {
  std::vector<float> rotated;  // the rotated operand (RHT on only)
  const float* seen = nullptr;  // what the quantiser saw: rotated, or the operand itself
  QTensor q;
  Moments m;  // of the dequantised values against what the quantiser saw
};
// Rotating first and quantising the rotated values without RHT is exactly quantize() with RHT (the
// rotation is its first step); it keeps the rotated copy the analyses compare against.
Quantised quantise(const LayerOperands::Operand& o, const QuantConfig& c) {
  Quantised r;
  r.seen = o.p;
  if (c.rht != 0) {
    r.rotated = rotate(o.p, o.rows, o.cols, c);
    r.seen = r.rotated.data();
  }
  QuantConfig plain = c;
  plain.rht = 0;
  plain.rht_bf16 = false;
  r.q = quantize(r.seen, o.rows, o.cols, plain);
  r.q.rht = c.rht;  // the operand was rotated, if not by quantize() itself
  r.q.rht_signs = c.rht != 0 ? c.rht_signs : std::vector<float>();
  r.m = moments(r.seen, r.q);
  return r;
}

// The GEMM of a pass; its comparison with the reference is compare_gemm's.
GemmResult gemm_result(Pass p, const Quantised& a, const Quantised& b, std::vector<float>& c) {
  c = gemm(a.q, b.q);
  GemmResult g;
  g.pass = pass_name(p);
  g.format = a.q.format.name;
  g.eta = a.m.alpha() * b.m.alpha();
  return g;
}

TensorResult tensor_result(const char* role, const Quantised& q, int rht) {
  TensorResult r;
  r.role = role;
  r.format = q.q.format.name;
  r.rht = rht;
  r.sqnr_db = q.m.sqnr_db();
  r.beff = beff(q.q);
  r.alpha = q.m.alpha();
  r.bias_per_level = empirical_bias(q.q, q.seen);
  return r;
}
}  // namespace

void compare_gemm(GemmResult& g, const std::vector<float>& c, const std::vector<double>& ref) {
  const Moments m = moments(ref.data(), c.data(), int64_t(c.size()));  // SQNR and eta_measured in one pass
  g.sqnr_db = m.sqnr_db();
  g.eta_measured = m.alpha();
}

LayerResults analyze_setting_pass(const LayerOperands& l, const AnalysisSetting& s, Pass p) {
  std::vector<float> c;
  LayerResults out = analyze_setting_pass(l, s, p, c);
  compare_gemm(out.gemms.back(), c, l.refs[size_t(p)]);
  return out;
}

LayerResults analyze_setting_pass(const LayerOperands& l, const AnalysisSetting& s, Pass p, std::vector<float>& cout) {
  const QuantConfig c = s.config();
  const auto [a, b] = l.pass(p);
  const Quantised qa = quantise(a, c), qb = quantise(b, c);
  LayerResults out;
  // fwd_y's A and B are X and W along their last dimension; bwd_dx's A is dY along its last dimension.
  if (p == Pass::fwd_y) {
    out.tensors.push_back(tensor_result("fwd_x", qa, s.rht));
    out.tensors.push_back(tensor_result("fwd_w", qb, s.rht));
  } else if (p == Pass::bwd_dx) {
    out.tensors.push_back(tensor_result("bwd_dy", qa, s.rht));
  }
  GemmResult g = gemm_result(p, qa, qb, cout);
  g.rht = s.rht;
  out.gemms.push_back(std::move(g));
  return out;
}

void LayerResults::append(LayerResults&& part) {
  for (auto& t : part.tensors) tensors.push_back(std::move(t));
  for (auto& g : part.gemms) gemms.push_back(std::move(g));
}

LayerResults analyze_setting(const LayerOperands& l, const AnalysisSetting& s) {
  LayerResults out;
  for (Pass p : kPasses) out.append(analyze_setting_pass(l, s, p));
  return out;
}

GemmResult analyze_recipe_pass(const LayerOperands& l, const Recipe& r, uint32_t stream, Pass p) {
  std::vector<float> c;
  GemmResult g = analyze_recipe_pass(l, r, stream, p, c);
  compare_gemm(g, c, l.refs[size_t(p)]);
  return g;
}

GemmResult analyze_recipe_pass(const LayerOperands& l, const Recipe& r, uint32_t stream, Pass p,
                               std::vector<float>& c) {
  const auto [a, b] = l.pass(p);
  const QuantConfig ca = r.operand(p, Operand::a, stream), cb = r.operand(p, Operand::b, stream);
  GemmResult g = gemm_result(p, quantise(a, ca), quantise(b, cb), c);
  g.format = r.format.name;
  g.recipe = r.name;
  g.rht = ca.rht;
  return g;
}

std::vector<GemmResult> analyze_recipe(const LayerOperands& l, const Recipe& r, uint32_t stream) {
  std::vector<GemmResult> out;
  for (Pass p : kPasses) out.push_back(analyze_recipe_pass(l, r, stream, p));
  return out;
}

}  // namespace fp4lab
