#include "fp4lab/layer_analysis.hpp"

#include "fp4lab/gemm.hpp"

#include <algorithm>
#include <optional>
#include <stdexcept>

namespace fp4lab {

std::string AnalysisSetting::label() const {
  return std::string(format.name) + (rht ? " rht" + std::to_string(rht) : " no-rht");
}

namespace {
std::vector<float> held(const float* x, int64_t rows, int64_t cols, int64_t limit) {
  return rows * cols <= limit ? transpose(x, rows, cols) : std::vector<float>();
}
}  // namespace

LayerOperands::LayerOperands(const LayerView& v, bool with_refs, int64_t held_transpose)
    : l(v), wt(held(v.w, v.out, v.in, held_transpose)), dyt(held(v.dy, v.tokens, v.out, held_transpose)),
      xt(held(v.x, v.tokens, v.in, held_transpose)), refs(3) {
  if (with_refs)
    for (Pass p : kPasses) compute_ref(p);
}

void LayerOperands::compute_ref(Pass p) {
  const auto [a, b] = pass(p);
  gemm_f64(a.p, a.row_stride(), a.col_stride(), b.p, b.row_stride(), b.col_stride(), a.rows, b.rows, a.cols,
           refs[size_t(p)]);
}

std::pair<LayerOperands::Operand, LayerOperands::Operand> LayerOperands::pass(Pass p) const {
  const PassGeometry g = pass_geometry(p, l.tokens, l.in, l.out);
  // A transpose not held: the source, read transposed.
  auto t = [&](const std::vector<float>& held, const float* src, int64_t rows) {
    return held.empty() ? Operand{src, rows, g.K, true} : Operand{held.data(), rows, g.K};
  };
  switch (p) {
    case Pass::fwd_y: return {{l.x, g.M, g.K}, {l.w, g.N, g.K}};
    case Pass::bwd_dx: return {{l.dy, g.M, g.K}, t(wt, l.w, g.N)};
    default: return {t(dyt, l.dy, g.M), t(xt, l.x, g.N)};
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
  QTensor q;
  Moments m;                         // of the dequantised values against what the quantiser saw
  std::vector<EmpiricalLevel> bias;  // with_bias only
  double beff = -1;                  // with_bias only (taken with the bias)
};
// The statistics compare the codes with what the quantiser saw: the operand, or the operand rotated. Rotating
// first and quantising the rotated values without RHT is exactly quantize() with RHT (the rotation is its first
// step). A small operand is rotated once, whole, and the copy kept for the statistics (3% faster on the bundled
// trace than rotating twice). A large one is quantised with its rotation inside quantize() and the rotated values
// made again a panel of rows at a time for the statistics (the same rotation, so the same bits): a whole rotated
// copy would cost four bytes per element per running task.
// Rows [r0, r0 + n) of an operand read transposed from its source, into buf (n x cols).
void transposed_rows(const LayerOperands::Operand& o, int64_t r0, int64_t n, std::vector<float>& buf) {
  buf.resize(size_t(n * o.cols));
  for (int64_t c = 0; c < o.cols; ++c) {
    const float* src = o.p + c * o.rows + r0;
    for (int64_t i = 0; i < n; ++i) buf[size_t(i * o.cols + c)] = src[i];
  }
}

Quantised quantise(const LayerOperands::Operand& o, const QuantConfig& c, bool with_bias);

// An operand read transposed from its source, quantised a panel of rows at a time: without stochastic rounding
// (keyed by element index) or a tensor-wide scale (ue4m3) every row is quantised alone, and panels of whole 16-row
// groups keep the 16x16 tiles whole, so the panels' codes and scales are the whole operand's. Each panel's
// statistics are taken as it is quantised, in row order, as over the whole. Other settings, and a panel that
// faults (so that the message names the element within the whole operand), quantise a transposed copy.
Quantised quantise_transposed(const LayerOperands::Operand& o, const QuantConfig& c, bool with_bias) {
  auto whole = [&] {
    const std::vector<float> t = transpose(o.p, o.cols, o.rows);
    return quantise({t.data(), o.rows, o.cols}, c, with_bias);
  };
  if (c.rounding != Rounding::rtne || c.scale == ScaleKind::ue4m3) return whole();
  try {
    Quantised r;
    MomentsSum m;
    std::optional<BiasSum> bias;
    if (with_bias) bias.emplace(c.format);
    const int64_t panel = std::max<int64_t>(16, (int64_t(1) << 16) / o.cols / 16 * 16);
    std::vector<float> rows;
    F32Buffer rotated;
    QuantConfig plain = c;
    plain.rht = 0;
    plain.rht_bf16 = false;
    for (int64_t r0 = 0; r0 < o.rows; r0 += panel) {
      const int64_t n = std::min(panel, o.rows - r0);
      transposed_rows(o, r0, n, rows);
      const float* seen = rows.data();
      if (c.rht != 0) {
        rotate(rows.data(), n, o.cols, c, rotated);
        seen = rotated.data();
      }
      const QTensor p = quantize(seen, n, o.cols, plain);
      if (r0 == 0) {
        r.q = p;
        r.q.rows = o.rows;
        r.q.codes.resize(size_t(o.rows * o.cols));
        r.q.scales.resize(size_t(o.rows * p.kblocks()));
        if (!p.scale_codes.empty()) r.q.scale_codes.resize(r.q.scales.size());
        r.q.rht = c.rht;  // the operand was rotated, if not by quantize() itself
        r.q.rht_signs = c.rht != 0 ? c.rht_signs : std::vector<float>();
      } else {
        std::copy(p.codes.begin(), p.codes.end(), r.q.codes.begin() + r0 * o.cols);
        std::copy(p.scales.begin(), p.scales.end(), r.q.scales.begin() + r0 * p.kblocks());
        std::copy(p.scale_codes.begin(), p.scale_codes.end(), r.q.scale_codes.begin() + r0 * p.kblocks());
      }
      if (bias) bias->add(r.q, seen, r0, n, m);
      else m.add(seen, r.q, r0, n);
    }
    r.m = m.sum();
    if (bias) {
      r.bias = bias->levels();
      r.beff = bias->beff();
    }
    return r;
  } catch (const std::invalid_argument&) {
    return whole();
  }
}

Quantised quantise(const LayerOperands::Operand& o, const QuantConfig& c, bool with_bias) {
  constexpr int64_t kWholeCopy = int64_t(1) << 20;  // elements (4 MB of floats)
  if (o.transposed) return quantise_transposed(o, c, with_bias);
  Quantised r;
  MomentsSum m;
  std::optional<BiasSum> bias;
  if (with_bias) bias.emplace(c.format);
  if (c.rht == 0 || o.rows * o.cols <= kWholeCopy) {
    F32Buffer rotated;
    const float* seen = o.p;
    if (c.rht != 0) {
      rotate(o.p, o.rows, o.cols, c, rotated);
      seen = rotated.data();
    }
    QuantConfig plain = c;
    plain.rht = 0;
    plain.rht_bf16 = false;
    r.q = quantize(seen, o.rows, o.cols, plain);
    r.q.rht = c.rht;  // the operand was rotated, if not by quantize() itself
    r.q.rht_signs = c.rht != 0 ? c.rht_signs : std::vector<float>();
    if (bias) bias->add(r.q, seen, 0, o.rows, m);
    else m.add(seen, r.q, 0, o.rows);
  } else {
    r.q = quantize(o.p, o.rows, o.cols, c);
    // About 256 kB of floats per panel, in whole 16-row groups (the rows of a 16x16 tile stay together).
    const int64_t panel = std::max<int64_t>(16, (int64_t(1) << 16) / o.cols / 16 * 16);
    F32Buffer rotated;  // one panel's, its memory reused by the next
    for (int64_t r0 = 0; r0 < o.rows; r0 += panel) {
      const int64_t n = std::min(panel, o.rows - r0);
      rotate(o.p + r0 * o.cols, n, o.cols, c, rotated);
      if (bias) bias->add(r.q, rotated.data(), r0, n, m);
      else m.add(rotated.data(), r.q, r0, n);
    }
  }
  r.m = m.sum();
  if (bias) {
    r.bias = bias->levels();
    r.beff = bias->beff();
  }
  return r;
}

// The GEMM of a pass; its comparison with the reference is compare_gemm's.
GemmResult gemm_result(Pass p, const Quantised& a, const Quantised& b, F32Buffer& c) {
  gemm(a.q, b.q, c);
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
  r.beff = q.beff >= 0 ? q.beff : beff(q.q);
  r.alpha = q.m.alpha();
  r.bias_per_level = q.bias;
  return r;
}
}  // namespace

void compare_gemm(GemmResult& g, const F32Buffer& c, const F64Buffer& ref) {
  const Moments m = moments(ref.data(), c.data(), int64_t(c.size()));  // SQNR and eta_measured in one pass
  g.sqnr_db = m.sqnr_db();
  g.eta_measured = m.alpha();
}

LayerResults analyze_setting_pass(const LayerOperands& l, const AnalysisSetting& s, Pass p) {
  F32Buffer c;
  LayerResults out = analyze_setting_pass(l, s, p, c);
  compare_gemm(out.gemms.back(), c, l.refs[size_t(p)]);
  return out;
}

namespace {
// A setting's pass but its GEMM output: the tensor results (fwd_y's A and B are X and W along their last
// dimension, bwd_dx's A is dY along its last dimension) and the GEMM's entry, its sqnr_db and eta_measured to come.
LayerResults setting_pass_results(Pass p, const AnalysisSetting& s, const Quantised& qa, const Quantised& qb) {
  LayerResults out;
  if (p == Pass::fwd_y) {
    out.tensors.push_back(tensor_result("fwd_x", qa, s.rht));
    out.tensors.push_back(tensor_result("fwd_w", qb, s.rht));
  } else if (p == Pass::bwd_dx) {
    out.tensors.push_back(tensor_result("bwd_dy", qa, s.rht));
  }
  GemmResult g;
  g.pass = pass_name(p);
  g.format = qa.q.format.name;
  g.eta = qa.m.alpha() * qb.m.alpha();
  g.rht = s.rht;
  out.gemms.push_back(std::move(g));
  return out;
}
}  // namespace

std::vector<LayerResults> analyze_pass_in_panels(const LayerOperands& l, Pass p,
                                                 const std::vector<AnalysisSetting>& settings,
                                                 const std::vector<Recipe>& recipes, uint32_t stream,
                                                 int64_t panel_rows) {
  const auto [a, b] = l.pass(p);
  struct Job {
    Quantised qa, qb;
    MomentsSum cmp;  // of the quantised output against the reference
  };
  std::vector<Job> jobs;
  std::vector<LayerResults> out;
  for (const AnalysisSetting& s : settings) {
    const QuantConfig c = s.config();
    jobs.push_back({quantise(a, c, p != Pass::bwd_dw), quantise(b, c, p == Pass::fwd_y), {}});
    out.push_back(setting_pass_results(p, s, jobs.back().qa, jobs.back().qb));
  }
  for (const Recipe& r : recipes) {
    const QuantConfig ca = r.operand(p, Operand::a, stream), cb = r.operand(p, Operand::b, stream);
    jobs.push_back({quantise(a, ca, false), quantise(b, cb, false), {}});
    GemmResult g;
    g.pass = pass_name(p);
    g.eta = jobs.back().qa.m.alpha() * jobs.back().qb.m.alpha();
    g.format = r.format.name;
    g.recipe = r.name;
    g.rht = ca.rht;
    LayerResults lr;
    lr.gemms.push_back(std::move(g));
    out.push_back(std::move(lr));
  }
  // Panels of about 4 MB of reference and output (12 bytes per element), each reference panel computed once for
  // every job; the moments add up in row-major order across panels, as over the whole product.
  const int64_t M = a.rows, N = b.rows, K = a.cols;
  const int64_t panel = panel_rows > 0 ? panel_rows : std::max<int64_t>(1, (int64_t(4) << 20) / (12 * N));
  F64Buffer ref;  // one panel's, its memory reused by the next
  for (int64_t r0 = 0; r0 < M; r0 += panel) {
    const int64_t n = std::min(panel, M - r0);
    gemm_f64(a.p + r0 * a.row_stride(), a.row_stride(), a.col_stride(), b.p, b.row_stride(), b.col_stride(), n, N, K,
             ref);
    for (Job& j : jobs) {
      const std::vector<float> c = gemm_rows(j.qa.q, r0, n, j.qb.q);
      j.cmp.add(ref.data(), c.data(), n * N);
    }
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Moments m = jobs[i].cmp.sum();
    out[i].gemms.back().sqnr_db = m.sqnr_db();
    out[i].gemms.back().eta_measured = m.alpha();
  }
  return out;
}

LayerResults analyze_setting_pass(const LayerOperands& l, const AnalysisSetting& s, Pass p, F32Buffer& cout) {
  const QuantConfig c = s.config();
  const auto [a, b] = l.pass(p);
  // fwd_y's A and B and bwd_dx's A are tensor results too, which report the empirical bias.
  const Quantised qa = quantise(a, c, p != Pass::bwd_dw), qb = quantise(b, c, p == Pass::fwd_y);
  gemm(qa.q, qb.q, cout);
  return setting_pass_results(p, s, qa, qb);
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
  F32Buffer c;
  GemmResult g = analyze_recipe_pass(l, r, stream, p, c);
  compare_gemm(g, c, l.refs[size_t(p)]);
  return g;
}

GemmResult analyze_recipe_pass(const LayerOperands& l, const Recipe& r, uint32_t stream, Pass p,
                               F32Buffer& c) {
  const auto [a, b] = l.pass(p);
  const QuantConfig ca = r.operand(p, Operand::a, stream), cb = r.operand(p, Operand::b, stream);
  GemmResult g = gemm_result(p, quantise(a, ca, false), quantise(b, cb, false), c);
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
