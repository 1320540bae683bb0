#include "fp4lab/layer_analysis.hpp"

#include "fp4lab/gemm.hpp"

#include <algorithm>
#include <exception>
#include <optional>
#include <stdexcept>

namespace fp4lab {

std::string AnalysisSetting::label() const {
  return std::string(format.name) + (rht ? " rht" + std::to_string(rht) : " no-rht");
}

namespace {
std::vector<float> held(const float* x, int64_t rows, int64_t cols, int64_t limit) {
  return x && rows * cols <= limit ? transpose(x, rows, cols) : std::vector<float>();
}

// An operand's rows [r0, ..) as an operand of the float64 reference.
F64Operand f64_operand(const LayerOperands::Operand& o, int64_t r0) {
  F64Operand f;
  if (o.bf16) f.bf16 = o.bf16 + r0 * o.row_stride();
  else f.f32 = o.p + r0 * o.row_stride();
  f.row = o.row_stride();
  f.col = o.col_stride();
  return f;
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
  gemm_f64(f64_operand(a, 0), f64_operand(b, 0), a.rows, b.rows, a.cols, refs[size_t(p)]);
}

void LayerOperands::Operand::rows_into(int64_t r0, int64_t n, float* dst) const {
  if (!transposed) {
    if (!bf16) std::copy(p + r0 * cols, p + (r0 + n) * cols, dst);
    else
      for (int64_t i = 0; i < n * cols; ++i) dst[i] = bf16_to_f32(bf16[r0 * cols + i]);
    return;
  }
  // Row r of the operand is column r of its source: each source row gives one element of each of the n rows.
  for (int64_t c = 0; c < cols; ++c) {
    if (!bf16) {
      const float* src = p + c * rows + r0;
      for (int64_t i = 0; i < n; ++i) dst[i * cols + c] = src[i];
    } else {
      const uint16_t* src = bf16 + c * rows + r0;
      for (int64_t i = 0; i < n; ++i) dst[i * cols + c] = bf16_to_f32(src[i]);
    }
  }
}

std::pair<LayerOperands::Operand, LayerOperands::Operand> LayerOperands::pass(Pass p) const {
  const PassGeometry g = pass_geometry(p, l.tokens, l.in, l.out);
  // A transpose not held: the source, read transposed.
  auto t = [&](const std::vector<float>& held, const float* src, const uint16_t* src16, int64_t rows) {
    return held.empty() ? Operand{src, rows, g.K, true, src16} : Operand{held.data(), rows, g.K};
  };
  switch (p) {
    case Pass::fwd_y: return {{l.x, g.M, g.K, false, l.x16}, {l.w, g.N, g.K, false, l.w16}};
    case Pass::bwd_dx: return {{l.dy, g.M, g.K, false, l.dy16}, t(wt, l.w, l.w16, g.N)};
    default: return {t(dyt, l.dy, l.dy16, g.M), t(xt, l.x, l.x16, g.N)};
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
// An operand quantised a panel of rows at a time (quantize_rows: the bits of quantize() over the whole, stochastic
// rounding keyed by element index in the whole, ue4m3 under the whole's amax, found first), each panel's statistics
// taken as it comes, in row order as over the whole. Panels are whole 16-row groups (16x16 tiles stay whole) of
// about `panel` elements, read as FP32 from wherever the operand lies (transposed, BF16). next() hands out the
// codes of a chunk of several panels, so that a caller can multiply a large operand a chunk at a time.
class PanelQuantiser {
 public:
  PanelQuantiser(const LayerOperands::Operand& o, const QuantConfig& c, bool with_bias, int64_t panel)
      : o_(o), c_(c), panel_(std::max<int64_t>(16, panel / o.cols / 16 * 16)) {
    validate(c, o.rows, o.cols);  // shape faults name the whole operand
    plain_ = c;
    plain_.rht = 0;
    plain_.rht_bf16 = false;
    if (with_bias) bias_.emplace(c.format);
    if (c.scale == ScaleKind::ue4m3)
      for (int64_t r0 = 0; r0 < o.rows; r0 += panel_rows()) {
        const int64_t n = std::min(panel_rows(), o.rows - r0);
        amax_ = std::max(amax_, tensor_amax(seen(r0, n), n, o.cols, plain_, r0));
      }
  }
  int64_t panel_rows() const { return panel_; }
  int64_t next_row() const { return row_; }
  // The next n rows' codes and scales (a QTensor of n rows; n a multiple of panel_rows() but at the end).
  QTensor next(int64_t n) {
    QTensor q;
    for (int64_t r0 = row_; r0 < row_ + n; r0 += panel_rows()) {
      const int64_t k = std::min(panel_rows(), row_ + n - r0), at = r0 - row_;
      const float* y = seen(r0, k);
      const QTensor p = quantize_rows(y, r0, k, o_.cols, plain_, amax_);
      if (at == 0) {
        q = p;
        // The whole operand's n rows, under c_: rotated, if not by the quantiser itself.
        q.meta() = OperandMeta::of(c_, n, o_.cols);
        q.codes.resize(size_t(n * o_.cols));
        q.scales.resize(size_t(n * p.kblocks()));
        if (!p.scale_codes.empty()) q.scale_codes.resize(q.scales.size());
      } else {
        std::copy(p.codes.begin(), p.codes.end(), q.codes.begin() + at * o_.cols);
        std::copy(p.scales.begin(), p.scales.end(), q.scales.begin() + at * p.kblocks());
        std::copy(p.scale_codes.begin(), p.scale_codes.end(), q.scale_codes.begin() + at * p.kblocks());
      }
      if (bias_) bias_->add(q, y, at, k, m_);
      else m_.add(y, q, at, k);
    }
    row_ += n;
    return q;
  }
  // The statistics of every row handed out (all of them), with q as the codes (none, where the caller multiplied
  // them a chunk at a time: then only q's format is set).
  Quantised finish(QTensor q) {
    Quantised r;
    r.q = std::move(q);
    r.q.format = c_.format;
    r.m = m_.sum();
    if (bias_) {
      r.bias = bias_->levels();
      r.beff = bias_->beff();
    }
    return r;
  }

 private:
  // Rows [r0, r0 + n) as the quantiser sees them: read as FP32, then rotated when RHT is on.
  const float* seen(int64_t r0, int64_t n) {
    const float* y = o_.p + r0 * o_.cols;
    if (o_.transposed || o_.bf16) {
      rows_.resize(size_t(n * o_.cols));
      o_.rows_into(r0, n, rows_.data());
      y = rows_.data();
    }
    if (c_.rht == 0) return y;
    rotate(y, n, o_.cols, c_, rotated_, r0);
    return rotated_.data();
  }
  const LayerOperands::Operand& o_;
  const QuantConfig& c_;
  int64_t panel_;  // rows
  QuantConfig plain_;  // what quantize_rows is given: the values are rotated already
  float amax_ = 0;
  int64_t row_ = 0;
  MomentsSum m_;
  std::optional<BiasSum> bias_;
  F32Buffer rows_, rotated_;  // one panel's, their memory reused by the next
};

// The statistics compare the codes with what the quantiser saw: the operand, or the operand rotated. Rotating
// first and quantising the rotated values without RHT is exactly quantize() with RHT (the rotation is its first
// step). A small operand in memory is rotated once, whole, and the copy kept for the statistics (3% faster on the
// bundled trace than rotating twice); a large one, or one read transposed or from BF16, a panel at a time.
Quantised quantise(const LayerOperands::Operand& o, const QuantConfig& c, bool with_bias,
                   const LayerOperands::Panels& sizes) {
  constexpr int64_t kWholeCopy = int64_t(1) << 20;  // elements (4 MB of floats)
  if (o.transposed || o.bf16 || (c.rht != 0 && o.rows * o.cols > kWholeCopy)) {
    PanelQuantiser pq(o, c, with_bias, sizes.panel);
    QTensor q = pq.next(o.rows);
    return pq.finish(std::move(q));
  }
  Quantised r;
  MomentsSum m;
  std::optional<BiasSum> bias;
  if (with_bias) bias.emplace(c.format);
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
  r.q.meta() = OperandMeta::of(c, o.rows, o.cols);  // c's operand: rotated, if not by quantize() itself
  if (bias) bias->add(r.q, seen, 0, o.rows, m);
  else m.add(seen, r.q, 0, o.rows);
  r.m = m.sum();
  if (bias) {
    r.bias = bias->levels();
    r.beff = bias->beff();
  }
  return r;
}

// The GEMM of a pass, C = A . B^T into c, with the operands' statistics. An operand of more than chunk_above
// elements (the larger, when both are) is quantised and multiplied a chunk of rows at a time, its codes never whole
// in memory: rows of A give rows of C, rows of B columns; every output is its own sum, so the same bits. The faults
// are the whole path's, in its order: A's quantisation, B's, then the product's overflow (checked whole).
void quantise_and_multiply(const LayerOperands& l, const LayerOperands::Operand& a, const QuantConfig& ca,
                           bool bias_a, const LayerOperands::Operand& b, const QuantConfig& cb, bool bias_b,
                           Quantised& qa, Quantised& qb, F32Buffer& c) {
  const LayerOperands::Panels& sz = l.panels;
  const int64_t ea = a.rows * a.cols, eb = b.rows * b.cols;
  const bool chunk_a = ea > sz.chunk_above && ea >= eb, chunk_b = !chunk_a && eb > sz.chunk_above;
  if (!chunk_a && !chunk_b) {
    qa = quantise(a, ca, bias_a, sz);
    qb = quantise(b, cb, bias_b, sz);
    gemm(qa.q, qb.q, c);
    return;
  }
  const int64_t M = a.rows, N = b.rows;
  c.resize(size_t(M * N));
  if (chunk_a) {
    std::exception_ptr b_fault;  // raised once A is quantised, as the whole path would
    try {
      qb = quantise(b, cb, bias_b, sz);
    } catch (...) {
      b_fault = std::current_exception();
    }
    PanelQuantiser pq(a, ca, bias_a, sz.panel);
    const int64_t chunk = std::max<int64_t>(1, sz.chunk / a.cols / pq.panel_rows()) * pq.panel_rows();
    while (pq.next_row() < M) {
      const int64_t r0 = pq.next_row();
      const QTensor part = pq.next(std::min(chunk, M - r0));
      if (!b_fault) gemm_columns(part, qb.q, c.data() + r0 * N, N, 0);
    }
    if (b_fault) std::rethrow_exception(b_fault);
    qa = pq.finish(QTensor());
  } else {
    qa = quantise(a, ca, bias_a, sz);
    PanelQuantiser pq(b, cb, bias_b, sz.panel);
    const int64_t chunk = std::max<int64_t>(1, sz.chunk / b.cols / pq.panel_rows()) * pq.panel_rows();
    while (pq.next_row() < N) {
      const int64_t r0 = pq.next_row();
      gemm_columns(qa.q, pq.next(std::min(chunk, N - r0)), c.data(), N, r0);
    }
    qb = pq.finish(QTensor());
  }
  check_gemm_output(c.data(), M, N);
}

// The GEMM's entry of a pass; its comparison with the reference is compare_gemm's.
GemmResult gemm_result(Pass p, const Quantised& a, const Quantised& b) {
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

namespace {
// Rows [from, from + n) of `have` (rows [h0, h0 + have.rows) of an operand) followed by `more`, as one QTensor.
QTensor rows_then(const QTensor& have, int64_t from, const QTensor& more) {
  const int64_t keep = have.rows - from;
  if (keep <= 0) return more;
  QTensor q = have.rows_panel(from, keep);
  q.rows += more.rows;
  q.codes.insert(q.codes.end(), more.codes.begin(), more.codes.end());
  q.scales.insert(q.scales.end(), more.scales.begin(), more.scales.end());
  q.scale_codes.insert(q.scale_codes.end(), more.scale_codes.begin(), more.scale_codes.end());
  return q;
}
}  // namespace

std::vector<LayerResults> analyze_pass_in_panels(const LayerOperands& l, Pass p,
                                                 const std::vector<AnalysisSetting>& settings,
                                                 const std::vector<Recipe>& recipes, uint32_t stream,
                                                 int64_t panel_rows) {
  const auto [a, b] = l.pass(p);
  // Each job's B is quantised whole; its A a panel of rows at a time as the reference panels need them
  // (PanelQuantiser: the bits and statistics of the whole), so that no job's A codes are ever whole in memory.
  struct Job {
    QuantConfig ca, cb;
    bool bias_a;
    std::optional<PanelQuantiser> pa;
    Quantised qb;
    QTensor have;     // A's codes of rows [h0, h0 + have.rows)
    int64_t h0 = 0;
    MomentsSum cmp;  // of the quantised output against the reference
  };
  std::vector<Job> jobs(settings.size() + recipes.size());
  for (size_t i = 0; i < settings.size(); ++i) {
    jobs[i].ca = jobs[i].cb = settings[i].config();
    jobs[i].bias_a = p != Pass::bwd_dw;
  }
  for (size_t i = 0; i < recipes.size(); ++i) {
    Job& j = jobs[settings.size() + i];
    j.ca = recipes[i].operand(p, Operand::a, stream);
    j.cb = recipes[i].operand(p, Operand::b, stream);
    j.bias_a = false;
  }
  const int64_t M = a.rows, N = b.rows, K = a.cols;
  // Panels of about 4 MB of reference and output (12 bytes per element), each reference panel computed once for
  // every job; the moments add up in row-major order across panels, as over the whole product.
  const int64_t panel = panel_rows > 0 ? panel_rows : std::max<int64_t>(1, (int64_t(4) << 20) / (12 * N));
  // Jobs go in groups whose B codes together stay within panels.group elements (a job alone may exceed it), each
  // group making the reference panels again: a few jobs' B, not every job's, are in memory at once.
  try {
    for (size_t g0 = 0, g1 = 0; g0 < jobs.size(); g0 = g1) {
      for (g1 = g0 + 1; g1 < jobs.size() && int64_t(g1 + 1 - g0) * N * K <= l.panels.group;) ++g1;
      for (size_t i = g0; i < g1; ++i) {
        Job& j = jobs[i];
        j.pa.emplace(a, j.ca, j.bias_a, l.panels.panel);
        j.qb = quantise(b, j.cb, i < settings.size() && p == Pass::fwd_y, l.panels);
      }
      F64Buffer ref;  // one panel's, its memory reused by the next
      for (int64_t r0 = 0; r0 < M; r0 += panel) {
        const int64_t n = std::min(panel, M - r0);
        gemm_f64(f64_operand(a, r0), f64_operand(b, 0), n, N, K, ref);
        for (size_t i = g0; i < g1; ++i) {
          Job& j = jobs[i];
          if (const int64_t need = r0 + n - (j.h0 + j.have.rows); need > 0) {
            const int64_t pr = j.pa->panel_rows();
            const QTensor more = j.pa->next(std::min((need + pr - 1) / pr * pr, M - j.pa->next_row()));
            j.have = rows_then(j.have, r0 - j.h0, more);
            j.h0 = r0;
          }
          const std::vector<float> c = gemm_rows(j.have, r0 - j.h0, n, j.qb.q);
          j.cmp.add(ref.data(), c.data(), n * N);
        }
      }
      for (size_t i = g0; i < g1; ++i) {  // their codes are done with; their statistics stay
        jobs[i].have = QTensor();
        QTensor done;
        done.format = jobs[i].qb.q.format;
        jobs[i].qb.q = std::move(done);
      }
    }
  } catch (...) {
    // The first fault in the order of quantising each job's A whole, then its B: found again that way.
    for (size_t i = 0; i < jobs.size(); ++i) {
      quantise(a, jobs[i].ca, jobs[i].bias_a, l.panels);
      quantise(b, jobs[i].cb, i < settings.size() && p == Pass::fwd_y, l.panels);
    }
    throw;
  }
  std::vector<LayerResults> out;
  for (size_t i = 0; i < jobs.size(); ++i) {
    Job& j = jobs[i];
    const Quantised qa = j.pa->finish(QTensor());
    const Moments m = j.cmp.sum();
    if (i < settings.size()) {
      out.push_back(setting_pass_results(p, settings[i], qa, j.qb));
    } else {
      const Recipe& r = recipes[i - settings.size()];
      GemmResult g;
      g.pass = pass_name(p);
      g.eta = qa.m.alpha() * j.qb.m.alpha();
      g.format = r.format.name;
      g.recipe = r.name;
      g.rht = j.ca.rht;
      LayerResults lr;
      lr.gemms.push_back(std::move(g));
      out.push_back(std::move(lr));
    }
    out.back().gemms.back().sqnr_db = m.sqnr_db();
    out.back().gemms.back().eta_measured = m.alpha();
  }
  return out;
}

LayerResults analyze_setting_pass(const LayerOperands& l, const AnalysisSetting& s, Pass p, F32Buffer& cout) {
  const QuantConfig c = s.config();
  const auto [a, b] = l.pass(p);
  // fwd_y's A and B and bwd_dx's A are tensor results too, which report the empirical bias.
  Quantised qa, qb;
  quantise_and_multiply(l, a, c, p != Pass::bwd_dw, b, c, p == Pass::fwd_y, qa, qb, cout);
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
  Quantised qa, qb;
  quantise_and_multiply(l, a, ca, false, b, cb, false, qa, qb, c);
  GemmResult g = gemm_result(p, qa, qb);
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
