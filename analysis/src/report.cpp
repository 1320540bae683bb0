// The analysis JSON v1 and the exact serialisation of one record's results (trace_analysis.hpp).
#include "fp4lab/knobs.hpp"
#include "fp4lab/trace_analysis.hpp"

namespace fp4lab {

namespace {
using Json = nlohmann::ordered_json;

// An entry's first keys: the trace it came from (when several are given) and its gemm.
Json head(const AnalysisResult& r, size_t trace, const std::string& gemm) {
  return r.traces.size() > 1 ? Json{{"trace", r.traces[trace]}, {"gemm", gemm}} : Json{{"gemm", gemm}};
}

// The serialised form of a record: arrays in field order (CBOR keeps doubles as their bits).
Json row_json(const AnalysisRow& r) { return Json::array({r.gemm, r.what, r.sqnr, r.beff, r.eta}); }
AnalysisRow row_from(const Json& j) {
  return {j[0].get<std::string>(), j[1].get<std::string>(), j[2].get<std::vector<double>>(),
          j[3].get<std::vector<double>>(), j[4].get<std::vector<double>>()};
}
Json gemm_result_json(const GemmResult& g) {
  return Json::array({g.pass, g.format, g.recipe, g.rht, g.sqnr_db, g.eta, g.eta_measured});
}
GemmResult gemm_result_from(const Json& j) {
  GemmResult g;
  g.pass = j[0].get<std::string>();
  g.format = j[1].get<std::string>();
  g.recipe = j[2].get<std::string>();
  g.rht = j[3].get<int>();
  g.sqnr_db = j[4].get<double>();
  g.eta = j[5].get<double>();
  g.eta_measured = j[6].get<double>();
  return g;
}
}  // namespace

std::string to_bytes(const RecordResult& r) {
  Json tensors = Json::array(), gemms = Json::array(), trows = Json::array(), grows = Json::array();
  for (const TensorEntry& e : r.tensors) {
    Json levels = Json::array();
    for (const EmpiricalLevel& l : e.t.bias_per_level) levels.push_back({l.index, l.level, l.count, l.mean_error});
    tensors.push_back({e.trace, e.gemm, e.t.role, e.t.format, e.t.rht, e.t.sqnr_db, e.t.beff, e.t.alpha, levels,
                       e.delta_sqnr_db ? Json(*e.delta_sqnr_db) : Json(), e.tokens});
  }
  for (const GemmEntry& e : r.gemms) gemms.push_back({e.trace, e.gemm, gemm_result_json(e.g)});
  for (const AnalysisRow& row : r.tensor_rows) trows.push_back(row_json(row));
  for (const AnalysisRow& row : r.gemm_rows) grows.push_back(row_json(row));
  const std::vector<uint8_t> cbor = Json::to_cbor(Json::array({tensors, gemms, trows, grows, r.elements}));
  return std::string(cbor.begin(), cbor.end());
}

RecordResult record_from_bytes(const std::string& bytes) {
  const Json j = Json::from_cbor(bytes);
  RecordResult r;
  for (const Json& t : j[0]) {
    TensorEntry e;
    e.trace = t[0].get<size_t>();
    e.gemm = t[1].get<std::string>();
    e.t.role = t[2].get<std::string>();
    e.t.format = t[3].get<std::string>();
    e.t.rht = t[4].get<int>();
    e.t.sqnr_db = t[5].get<double>();
    e.t.beff = t[6].get<double>();
    e.t.alpha = t[7].get<double>();
    for (const Json& l : t[8])
      e.t.bias_per_level.push_back({l[0].get<int>(), l[1].get<double>(), l[2].get<int64_t>(), l[3].get<double>()});
    if (!t[9].is_null()) e.delta_sqnr_db = t[9].get<double>();
    e.tokens = t[10].get<int64_t>();
    r.tensors.push_back(std::move(e));
  }
  for (const Json& g : j[1]) r.gemms.push_back({g[0].get<size_t>(), g[1].get<std::string>(), gemm_result_from(g[2])});
  for (const Json& row : j[2]) r.tensor_rows.push_back(row_from(row));
  for (const Json& row : j[3]) r.gemm_rows.push_back(row_from(row));
  r.elements = j[4].get<int64_t>();
  return r;
}

Json analysis_json(const AnalysisResult& r, const std::string& command) {
  Json tensors = Json::array(), gemms = Json::array();
  for (const TensorEntry& e : r.tensors) {
    const TensorResult& t = e.t;
    Json j = head(r, e.trace, e.gemm);
    j.update(Json{{"role", t.role}, {"format", t.format}, {"rht", t.rht},
                  {"sqnr_db", t.sqnr_db}, {"beff", t.beff}, {"alpha", t.alpha}});
    if (e.delta_sqnr_db) j["delta_sqnr_db"] = *e.delta_sqnr_db;
    Json bias = Json::array(), counts = Json::array(), values = Json::array();
    for (const EmpiricalLevel& l : t.bias_per_level) {
      bias.push_back(l.mean_error);
      counts.push_back(l.count);
      values.push_back(l.level);
    }
    j.update(Json{{"bias_per_level", bias}, {"level_counts", counts}, {"levels", values}});
    j["tokens"] = e.tokens;
    tensors.push_back(j);
  }
  for (const GemmEntry& e : r.gemms) {
    const GemmResult& g = e.g;
    Json j = head(r, e.trace, e.gemm);
    if (g.recipe.empty())
      j.update(Json{{"pass", g.pass}, {"format", g.format}, {"rht", g.rht},
                    {"sqnr_db", g.sqnr_db}, {"eta", g.eta}, {"eta_measured", g.eta_measured},
                    {"delta", 1.0 - g.eta}});
    else
      j.update(Json{{"pass", g.pass}, {"format", g.format}, {"recipe", g.recipe}, {"rht", g.rht},
                    {"sqnr_db", g.sqnr_db}, {"eta", g.eta}, {"eta_measured", g.eta_measured},
                    {"delta", 1.0 - g.eta}});
    gemms.push_back(j);
  }
  Json inversion = Json::object();
  if (r.inversion)
    inversion = {{"rht", r.inversion->rht}, {"tensors", r.inversion->tensors},
                 {"tensors_total", r.inversion->tensors_total}, {"gemms", r.inversion->gemms},
                 {"gemms_total", r.inversion->gemms_total}};
  Json decay = Json::object();
  for (const auto& [label, v] : r.decay) decay[label] = {{"product_eta_fwd_y", v}};
  Json settings = Json::array();
  for (const auto& s : r.plan.settings)
    settings.push_back({{"format", s.format.name}, {"rht", s.rht}, {"rht_signs", signs_string(s.rht_signs)}});
  Json recipes = Json::array();
  for (const auto& rc : r.plan.recipes) recipes.push_back(rc.name);
  return {{"fp4lab.analysis.version", 1},
          {"config", {{"trace", r.traces.size() > 1 ? Json(r.traces) : Json(r.traces.front())},
                      {"block", r.plan.block}, {"scale", scale_name(r.plan.scale)}, {"rounding", "rtne"},
                      {"settings", settings}, {"recipes", recipes}, {"command", command},
                      {"seconds", r.seconds}, {"elements", r.elements}}},
          {"tensors", tensors},
          {"gemms", gemms},
          {"inversion", inversion},
          {"decay", decay}};
}

}  // namespace fp4lab
