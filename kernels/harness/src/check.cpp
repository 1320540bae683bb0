#include "fp4lab/cuda/check.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <utility>

#include "fp4lab/gemm.hpp"
#include "fp4lab/text.hpp"

namespace fp4lab::cuda {

namespace {

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// The tallies of one share and the mismatches it keeps.
struct Comparer {
  int show;
  const CheckEvents& events;
  CheckResult& r;
  std::map<std::string, int> shown;  // per category

  Tally& tally(const std::string& what) {
    Tally& x = r.tallies[what];
    x.what = what;
    return x;
  }
  void mismatch(Tally& x, Mismatch m) {
    ++x.mismatched;
    if (shown[x.what]++ < show) {
      m.what = x.what;
      if (events.mismatch) events.mismatch(m);
      r.mismatches.push_back(std::move(m));
    }
  }
  static Mismatch sizes_differ(const std::string& where, bool floats, size_t golden, size_t gpu) {
    Mismatch m;
    m.where = where;
    m.floats = floats;
    m.sizes = true;
    m.golden_size = golden;
    m.gpu_size = gpu;
    return m;
  }
  static Mismatch at(const std::string& where, bool floats, size_t i, int64_t cols, uint32_t golden, uint32_t gpu) {
    Mismatch m;
    m.where = where;
    m.floats = floats;
    m.row = int64_t(i) / cols;
    m.col = int64_t(i) % cols;
    m.golden = golden;
    m.gpu = gpu;
    return m;
  }
  // Codes, scale codes: bytes.
  void bytes(const std::string& what, const std::string& where, const std::vector<uint8_t>& gold,
             const std::vector<uint8_t>& gpu, int64_t cols) {
    Tally& x = tally(what);
    if (gold.size() != gpu.size()) return mismatch(x, sizes_differ(where, false, gold.size(), gpu.size()));
    for (size_t i = 0; i < gold.size(); ++i) {
      ++x.compared;
      if (gold[i] != gpu[i]) mismatch(x, at(where, false, i, cols, gold[i], gpu[i]));
    }
  }
  // FP32 values by bit pattern; two NaNs count as equal but are tallied (CheckResult's Tally).
  void floats(const std::string& what, const std::string& where, const std::vector<float>& gold,
              const std::vector<float>& gpu, int64_t cols) {
    Tally& x = tally(what);
    if (gold.size() != gpu.size()) return mismatch(x, sizes_differ(where, true, gold.size(), gpu.size()));
    for (size_t i = 0; i < gold.size(); ++i) {
      ++x.compared;
      if (std::isnan(gold[i]) && std::isnan(gpu[i])) {
        ++x.nan_pairs;
        continue;
      }
      if (bits(gold[i]) != bits(gpu[i])) mismatch(x, at(where, true, i, cols, bits(gold[i]), bits(gpu[i])));
    }
  }
  void tensor(const std::string& where, const QTensor& gold, const QTensor& gpu) {
    bytes("codes", where, gold.codes, gpu.codes, gold.cols);
    floats("scales", where, gold.scales, gpu.scales, gold.kblocks());
    bytes("scale codes", where, gold.scale_codes, gpu.scale_codes, gold.kblocks());
    floats("global scale", where, {gold.global_dec}, {gpu.global_dec}, 1);
  }
};

}  // namespace

uint64_t CheckResult::compared() const {
  uint64_t n = 0;
  for (const auto& [k, x] : tallies) n += x.compared;
  return n;
}

uint64_t CheckResult::mismatched() const {
  uint64_t n = 0;
  for (const auto& [k, x] : tallies) n += x.mismatched;
  return n;
}

std::string CheckResult::to_bytes() const {
  nlohmann::ordered_json part = {{"fault_index", fault_index ? nlohmann::ordered_json(*fault_index) : nullptr},
                                 {"fault", fault},
                                 {"native", {native.compared, native.out_of_bound, native.worst}},
                                 {"tallies", nlohmann::ordered_json::array()}};
  for (const auto& [k, x] : tallies) part["tallies"].push_back({x.what, x.compared, x.mismatched, x.nan_pairs});
  return part.dump();
}

CheckResult CheckResult::from_bytes(const std::string& bytes) {
  const nlohmann::json p = nlohmann::json::parse(bytes);
  CheckResult r;
  if (!p["fault_index"].is_null()) r.fault_index = p["fault_index"].get<size_t>();
  r.fault = p["fault"].get<std::string>();
  r.native = {p["native"][0].get<uint64_t>(), p["native"][1].get<uint64_t>(), p["native"][2].get<double>()};
  for (const nlohmann::json& t : p["tallies"]) {
    Tally& x = r.tallies[t[0].get<std::string>()];
    x = {t[0].get<std::string>(), t[1].get<uint64_t>(), t[2].get<uint64_t>(), t[3].get<uint64_t>()};
  }
  return r;
}

CheckResult merge(const std::vector<CheckResult>& parts) {
  CheckResult sum;
  for (const CheckResult& p : parts) {
    if (p.fault_index && (!sum.fault_index || *p.fault_index < *sum.fault_index)) {
      sum.fault_index = p.fault_index;
      sum.fault = p.fault;
    }
    sum.native.compared += p.native.compared;
    sum.native.out_of_bound += p.native.out_of_bound;
    sum.native.worst = std::max(sum.native.worst, p.native.worst);
    for (const auto& [k, t] : p.tallies) {
      Tally& x = sum.tallies[k];
      x.what = t.what;
      x.compared += t.compared;
      x.mismatched += t.mismatched;
      x.nan_pairs += t.nan_pairs;
    }
  }
  return sum;
}

ConformanceCheck::ConformanceCheck(std::vector<std::unique_ptr<io::Trace>> traces, CheckOptions options)
    : opt_(std::move(options)), traces_(std::move(traces)) {
  for (const auto& t : traces_)
    for (const auto& r : t->records()) {
      if (opt_.limit > 0 && refs_.size() >= size_t(opt_.limit)) break;
      refs_.push_back({t.get(), &r});
      sizes_.push_back(uint64_t(r.tokens * r.in + r.out * r.in + r.tokens * r.out));
    }
}

ConformanceCheck::~ConformanceCheck() = default;

bool ConformanceCheck::native_ready(std::string* why) { return native_device_ok(why); }

CheckResult ConformanceCheck::run(const std::vector<int>& owner, int me, bool native,
                                  const CheckEvents& events) const {
  CheckResult res;
  Comparer ck{opt_.show, events, res, {}};
  const Recipe& recipe = opt_.recipe;
  QuantWorkspace ws;
  GemmWorkspace gws;
  Buffer<float> dx, dc;
  auto check_record = [&](size_t ri) {
    const io::TraceRecord& rec = *refs_[ri].rec;
    const io::Trace::Layer L = refs_[ri].trace->load(rec);
    for (Pass pass : kPasses) {
      const PassOperands ops = pass_operands(pass, L.x.data(), L.w.data(), L.dy.data(), rec.tokens, rec.in, rec.out);
      const std::string name = printable(rec.gemm) + "." + pass_name(pass);  // echoed: escaped
      const QuantConfig ca = recipe.operand(pass, Operand::a, uint32_t(ri));
      const QuantConfig cb = recipe.operand(pass, Operand::b, uint32_t(ri));
      QTensor ga, gb;
      std::vector<float> gc;
      try {
        ga = fp4lab::quantize(ops.a.data(), ops.M, ops.K, ca);
        gb = fp4lab::quantize(ops.b.data(), ops.N, ops.K, cb);
        gc = fp4lab::gemm(ga, gb);
      } catch (const std::invalid_argument& e) {  // the data's fault (e.g. an RHT that overflows FP32)
        const std::string msg = "gemm '" + rec.gemm + "' " + pass_name(pass) + ": " + e.what();
        throw io::Error(rec.file.empty() ? msg : rec.file + ": " + msg);
      }

      DQTensor qa, qb;
      auto quantise_both_paths = [&](const std::vector<float>& x, int64_t rows, const QuantConfig& cfg,
                                     const QTensor& gold, DQTensor& out, const char* role) {
        dx.upload(x);
        if (cfg.rht != 0) {  // the unfused form first, then the fused one (kept for the GEMM)
          quantize(dx.data(), rows, ops.K, cfg, out, ws, nullptr, RhtPath::unfused);
          ck.tensor(name + " " + role + " (" + cfg.label() + ", unfused RHT)", gold, to_host(out));
        }
        quantize(dx.data(), rows, ops.K, cfg, out, ws, nullptr, RhtPath::fused);
        ck.tensor(name + " " + role + " (" + cfg.label() + ")", gold, to_host(out));
      };
      quantise_both_paths(ops.a, ops.M, ca, ga, qa, "A");
      quantise_both_paths(ops.b, ops.N, cb, gb, qb, "B");

      dc.resize(size_t(ops.M * ops.N));
      if (opt_.gemm != CheckedGemm::reference) {
        dc.fill_bytes(0xFF);  // poison: an unwritten output cannot pass
        gemm_fast(qa, qb, dc.data(), gws);
        ck.floats("gemm fast", name + " C", gc, dc.to_host(), ops.N);
      }
      if (opt_.gemm != CheckedGemm::fast) {
        dc.fill_bytes(0xFF);
        gemm_reference(qa, qb, dc.data());
        ck.floats("gemm reference", name + " C", gc, dc.to_host(), ops.N);
      }
      if (native && native_supported(qa, qb)) {
        dc.fill_bytes(0xFF);
        gemm_native_sm100(qa, qb, dc.data(), gws);
        const std::vector<float> nc = dc.to_host();
        const std::vector<double> tol = native_tolerance(ga, gb);
        for (size_t i = 0; i < nc.size(); ++i) {
          ++res.native.compared;
          const double err = std::fabs(double(nc[i]) - double(gc[i]));
          if (!(err <= tol[i])) ++res.native.out_of_bound;
          res.native.worst = std::max(res.native.worst, tol[i] > 0 ? err / tol[i] : (err > 0 ? INFINITY : 0.0));
        }
      }
      if (events.gemm) events.gemm({ri, name, ops.M, ops.N, ops.K, ca, cb});
    }
  };
  for (size_t ri = 0; ri < refs_.size(); ++ri) {
    if (owner[ri] != me) continue;
    // A bad file (or a device fault) ends this share; the merge keeps the first in record order.
    try {
      check_record(ri);
    } catch (const std::exception& e) {
      res.fault_index = ri;
      res.fault = e.what();
      break;
    }
  }
  return res;
}

}  // namespace fp4lab::cuda
