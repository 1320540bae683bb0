#include "fp4lab/sim/run.hpp"

#include <chrono>
#include <cstdio>
#include <cstring>

#include "fp4lab/gemm.hpp"
#include "fp4lab/scale.hpp"

namespace fp4lab::sim {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

bool wanted(const RunOptions& opt, Pass p) {
  for (Pass q : opt.passes)
    if (q == p) return true;
  return false;
}
void report_progress(const RunOptions& opt, size_t done, size_t total, const GemmJob& j) {
  if (opt.progress) opt.progress(done, total, j.name());
}
Report make_report(const Simulator& sim, const std::string& source, const RunOptions& opt) {
  Report r;
  r.config = sim.config().to_json();
  r.peak_macs_per_cycle = sim.config().peak_macs_per_cycle();
  r.area = area_json(sim.config());
  r.datapath = sim.datapath().name();
  r.recipe = opt.recipe;
  r.source = source;
  r.checked = opt.check;
  return r;
}
}  // namespace

int64_t count_mismatches(const std::vector<float>& got, const std::vector<float>& want, int64_t cols,
                         std::string* first) {
  if (got.size() != want.size()) {
    if (first) *first = "output sizes differ: " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
    return int64_t(std::max(got.size(), want.size()));
  }
  int64_t n = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (f32_bits(got[i]) == f32_bits(want[i])) continue;
    if (n == 0 && first) {
      char b[160];
      std::snprintf(b, sizeof b, "C[%lld, %lld]: sim %a (0x%08x), golden %a (0x%08x)", (long long)(int64_t(i) / cols),
                    (long long)(int64_t(i) % cols), double(got[i]), f32_bits(got[i]), double(want[i]),
                    f32_bits(want[i]));
      *first = b;
    }
    ++n;
  }
  return n;
}

Report run_shapes(Simulator& sim, const std::vector<LayerShape>& layers, const std::string& source,
                  const RunOptions& opt) {
  Report rep = make_report(sim, source, opt);
  rep.checked = false;
  const size_t total = layers.size() * opt.passes.size();
  size_t done = 0;
  for (size_t i = 0; i < layers.size(); ++i)
    for (const GemmJob& j : training_gemms(layers[i], opt.quant, uint32_t(i)))
      if (wanted(opt, j.pass)) {
        report_progress(opt, ++done, total, j);
        rep.jobs.push_back(sim.run(j));
      }
  return rep;
}

Report run_kernel(Simulator& sim, JobKind kind, const std::vector<int64_t>& dims, const RunOptions& opt) {
  const size_t want = kind == JobKind::quantize ? 2 : 3;
  if (dims.size() != want)
    throw std::invalid_argument(std::string("kernel ") + job_kind_name(kind) + " takes a shape of " +
                                (want == 2 ? "rows x K" : "M x N x K"));
  std::string shape;
  for (int64_t d : dims) {
    if (!shape.empty()) shape += 'x';
    shape += std::to_string(d);
  }
  GemmJob j;
  j.kind = kind;
  j.layer = std::string(job_kind_name(kind)) + "." + shape;
  j.pass = opt.passes.empty() ? Pass::fwd_y : opt.passes.front();
  j.M = dims[0];
  j.N = want == 2 ? dims[0] : dims[1];  // a quantise kernel has no operand B
  j.K = dims.back();
  j.a = opt.quant(j.pass, Operand::a, 0);
  j.b = want == 2 ? j.a : opt.quant(j.pass, Operand::b, 0);
  Report rep = make_report(sim, "kernel " + j.layer, opt);
  rep.checked = false;
  rep.jobs.push_back(sim.run(j));
  return rep;
}

Report run_trace(Simulator& sim, const io::Trace& trace, const std::string& source, const RunOptions& opt,
                 RunTimes* times) {
  const auto t_all = Clock::now();
  RunTimes tm;
  const double dp0 = sim.datapath_seconds();
  Report rep = make_report(sim, source, opt);
  const std::vector<io::TraceRecord>& records = trace.records();
  const bool resized = !opt.record_shapes.empty();
  if (resized && opt.record_shapes.size() != records.size())
    throw std::invalid_argument("record_shapes: " + std::to_string(opt.record_shapes.size()) + " shapes for " +
                                std::to_string(records.size()) + " records");
  const size_t total = records.size() * opt.passes.size();
  size_t done = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    const io::TraceRecord& rec = records[i];
    const uint32_t gemm_id = uint32_t(i);  // the record's position: its SR GEMM id, as in fp4lab analyze
    const LayerShape shape{rec.gemm, rec.tokens, rec.in, rec.out, 1};
    const std::vector<GemmJob> jobs = training_gemms(shape, opt.quant, gemm_id);
    const std::vector<GemmJob> timed = resized ? training_gemms(opt.record_shapes[i], opt.quant, gemm_id) : jobs;
    if (!opt.check) {
      for (const GemmJob& j : timed)
        if (wanted(opt, j.pass)) {
          report_progress(opt, ++done, total, j);
          rep.jobs.push_back(sim.run(j));
        }
      continue;
    }
    auto t = Clock::now();
    const io::Trace::Layer layer = trace.load(rec);
    tm.load += since(t);
    for (size_t k = 0; k < jobs.size(); ++k) {
      const GemmJob& j = jobs[k];
      if (!wanted(opt, j.pass)) continue;
      report_progress(opt, ++done, total, j);
      t = Clock::now();
      const PassOperands ops =
          pass_operands(j.pass, layer.x.data(), layer.w.data(), layer.dy.data(), rec.tokens, rec.in, rec.out);
      const QTensor qa = quantize(ops.a.data(), ops.M, ops.K, j.a);
      const QTensor qb = quantize(ops.b.data(), ops.N, ops.K, j.b);
      tm.quantise += since(t);
      std::vector<float> c;
      JobReport r = sim.run(j, qa, qb, c);
      t = Clock::now();
      const std::vector<float> want = gemm(qa, qb);
      tm.reference += since(t);
      if (resized) {
        // The captured GEMM was computed and checked; the report times the layer at its full size.
        r = sim.run(timed[k]);
      }
      r.checked = true;
      r.outputs_checked = int64_t(want.size());
      r.mismatches = count_mismatches(c, want, j.N, &r.first_mismatch);
      rep.jobs.push_back(std::move(r));
    }
  }
  tm.datapath = sim.datapath_seconds() - dp0;
  tm.total = since(t_all);
  if (times) *times = tm;
  return rep;
}

}  // namespace fp4lab::sim
