#include "fp4lab/layer_analysis.hpp"

#include "fp4lab/gemm.hpp"

namespace fp4lab {

std::string AnalysisSetting::label() const {
  return std::string(format.name) + (rht ? " rht" + std::to_string(rht) : " no-rht");
}

namespace {
QuantConfig config_of(const AnalysisSetting& s) {
  QuantConfig c;
  c.format = s.format;
  c.block = s.block;
  c.scale = s.scale;
  c.rht = s.rht;
  c.rht_signs = s.rht_signs;
  return c;
}

struct Quantised {
  QTensor q;
  std::vector<float> seen, deq;  // what the quantiser saw (rotated or not) and the dequantised values
};
Quantised quantise(const float* x, int64_t rows, int64_t cols, const QuantConfig& c) {
  Quantised r{quantize(x, rows, cols, c), rotate(x, rows, cols, c), {}};
  r.deq = r.q.dequantize();
  return r;
}

double alpha_of(const Quantised& q) { return shrinkage_alpha(q.seen.data(), q.deq.data(), int64_t(q.seen.size())); }

GemmResult gemm_result(Pass p, const PassOperands& o, const QuantConfig& ca, const QuantConfig& cb,
                       const std::vector<double>& ref) {
  const Quantised a = quantise(o.a.data(), o.M, o.K, ca), b = quantise(o.b.data(), o.N, o.K, cb);
  const std::vector<float> c = gemm(a.q, b.q);
  double dot = 0, nn = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    dot += double(c[i]) * ref[i];
    nn += ref[i] * ref[i];
  }
  GemmResult g;
  g.pass = pass_name(p);
  g.format = ca.format.name;
  g.rht = ca.rht;
  g.sqnr_db = sqnr_db(ref.data(), c.data(), int64_t(c.size()));
  g.eta = alpha_of(a) * alpha_of(b);
  g.eta_measured = nn == 0 ? 1.0 : dot / nn;
  return g;
}
}  // namespace

std::vector<TensorResult> analyze_tensors(const LayerView& l, const AnalysisSetting& s) {
  const QuantConfig c = config_of(s);
  struct T { const char* role; const float* p; int64_t rows, cols; };
  const T ts[] = {{"fwd_x", l.x, l.tokens, l.in}, {"fwd_w", l.w, l.out, l.in}, {"bwd_dy", l.dy, l.tokens, l.out}};
  std::vector<TensorResult> out;
  for (const T& t : ts) {
    const Quantised q = quantise(t.p, t.rows, t.cols, c);
    TensorResult r;
    r.role = t.role;
    r.format = s.format.name;
    r.rht = s.rht;
    r.sqnr_db = sqnr_db(q.seen.data(), q.deq.data(), int64_t(q.seen.size()));
    r.beff = beff(q.q);
    r.alpha = alpha_of(q);
    r.bias_per_level = empirical_bias(q.q, q.seen.data());
    out.push_back(std::move(r));
  }
  return out;
}

PassRefs gemm_references(const LayerView& l) {
  PassRefs refs;
  for (Pass p : kPasses) {
    const PassOperands o = pass_operands(p, l.x, l.w, l.dy, l.tokens, l.in, l.out);
    refs.push_back(gemm_f64(o.a.data(), o.b.data(), o.M, o.N, o.K));
  }
  return refs;
}

std::vector<GemmResult> analyze_gemms(const LayerView& l, const AnalysisSetting& s, const PassRefs& refs) {
  const QuantConfig c = config_of(s);
  std::vector<GemmResult> out;
  for (Pass p : kPasses) {
    const PassOperands o = pass_operands(p, l.x, l.w, l.dy, l.tokens, l.in, l.out);
    out.push_back(gemm_result(p, o, c, c, refs[size_t(p)]));
  }
  return out;
}

std::vector<GemmResult> analyze_recipe(const LayerView& l, const Recipe& r, uint32_t stream, const PassRefs& refs) {
  std::vector<GemmResult> out;
  for (Pass p : kPasses) {
    const PassOperands o = pass_operands(p, l.x, l.w, l.dy, l.tokens, l.in, l.out);
    GemmResult g = gemm_result(p, o, r.operand(p, Operand::a, stream), r.operand(p, Operand::b, stream), refs[size_t(p)]);
    g.format = r.format.name;
    g.recipe = r.name;
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace fp4lab
