// The analysis JSON v1 and the exact serialisation of one record's results (trace_analysis.hpp).
#include "fp4lab/settings.hpp"
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

namespace {
// One entry of "tensors" or "gemms", built and dumped on its own, so that the report is never held as one JSON
// document (its nodes take several times the size of its text: 3 GB for the 0.5 GB report of 40,000 records).
Json tensor_json(const AnalysisResult& r, const TensorEntry& e) {
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
  return j;
}
Json gemm_json(const AnalysisResult& r, const GemmEntry& e) {
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
  return j;
}
Json config_json(const AnalysisResult& r, const std::string& command) {
  Json settings = Json::array();
  for (const auto& s : r.plan.settings)
    settings.push_back({{"format", s.format.name}, {"rht", s.rht}, {"rht_signs", signs_string(s.rht_signs)}});
  Json recipes = Json::array();
  for (const auto& rc : r.plan.recipes) recipes.push_back(rc.name);
  Json c = {{"trace", r.traces.size() > 1 ? Json(r.traces) : Json(r.traces.front())},
            {"block", r.plan.block}, {"scale", scale_name(r.plan.scale)}, {"rounding", "rtne"},
            {"settings", settings}, {"recipes", recipes}, {"command", command},
            {"seconds", r.seconds}, {"elements", r.elements}};
  // The recipe runs' SR draw (docs/spec.md §4); analyses written before it existed drew philox1.
  if (!r.plan.recipes.empty()) c["sr_draw"] = sr_draw_name(r.plan.recipes.front().sr_draw);
  return c;
}
Json decay_json(const AnalysisResult& r) {
  Json decay = Json::object();
  for (const auto& [label, v] : r.decay) decay[label] = {{"product_eta_fwd_y", v}};
  return decay;
}

// Text as nlohmann's dump(2) writes it (non-finite numbers as null, invalid UTF-8 replaced), for a value nested
// `indent` spaces deep: a nested value's text is its own text with every line after the first indented so.
// (A JSON string never holds a raw newline, so every newline is a line break.)
void put(std::string& out, const Json& v, int indent) {
  const std::string s = v.dump(2, ' ', false, Json::error_handler_t::replace);
  for (char c : s) {
    out += c;
    if (c == '\n') out.append(size_t(indent), ' ');
  }
}
std::string key_text(const char* key) { return Json(key).dump() + ": "; }

// Output in pieces of about this size, so that the text is not held whole either.
constexpr size_t kChunk = 1 << 20;

// An array as the member `key` of an object `indent` spaces deep; `each(item)` calls item(value) for its values in
// order, each made and written on its own.
template <class Each>
void put_array(std::string& out, const JsonSink& sink, const char* key, int indent, Each&& each) {
  out += std::string(size_t(indent), ' ') + key_text(key) + "[";
  bool first = true;
  each([&](const Json& v) {
    out += first ? "\n" : ",\n";
    first = false;
    out.append(size_t(indent + 2), ' ');
    put(out, v, indent + 2);
    if (out.size() >= kChunk) {
      sink(out);
      out.clear();
    }
  });
  if (!first) out += "\n" + std::string(size_t(indent), ' ');
  out += "]";
}
}  // namespace

Json analysis_json(const AnalysisResult& r, const std::string& command) {
  Json tensors = Json::array(), gemms = Json::array();
  for (const RecordResult& rec : r.records)
    for (const TensorEntry& e : rec.tensors) tensors.push_back(tensor_json(r, e));
  for (const RecordResult& rec : r.records)
    for (const GemmEntry& e : rec.gemms) gemms.push_back(gemm_json(r, e));
  Json inversion = Json::object();
  if (r.inversion) {
    inversion = {{"rht", r.inversion->rht}, {"tensors", r.inversion->tensors},
                 {"tensors_total", r.inversion->tensors_total}, {"gemms", r.inversion->gemms},
                 {"gemms_total", r.inversion->gemms_total}};
  }
  return {{"fp4lab.analysis.version", 1},
          {"config", config_json(r, command)},
          {"tensors", tensors},
          {"gemms", gemms},
          {"inversion", inversion},
          {"decay", decay_json(r)}};
}

void write_analysis_json(const AnalysisResult& r, const std::string& command, const Json& tail,
                         const JsonSink& sink) {
  std::string out = "{\n";
  auto member = [&](const char* key, const Json& v) {
    out += "  " + key_text(key);
    put(out, v, 2);
    out += ",\n";
  };
  member("fp4lab.analysis.version", 1);
  member("config", config_json(r, command));
  put_array(out, sink, "tensors", 2, [&](const auto& item) {
    for (const RecordResult& rec : r.records)
      for (const TensorEntry& e : rec.tensors) item(tensor_json(r, e));
  });
  out += ",\n";
  put_array(out, sink, "gemms", 2, [&](const auto& item) {
    for (const RecordResult& rec : r.records)
      for (const GemmEntry& e : rec.gemms) item(gemm_json(r, e));
  });
  out += ",\n";
  if (!r.inversion) {
    out += "  " + key_text("inversion") + "{}";
  } else {  // its lists name a row each: written item by item too
    const Inversion& inv = *r.inversion;
    out += "  " + key_text("inversion") + "{\n    " + key_text("rht");
    put(out, inv.rht, 4);
    out += ",\n";
    put_array(out, sink, "tensors", 4, [&](const auto& item) {
      for (const std::string& row : inv.tensors) item(row);
    });
    out += ",\n    " + key_text("tensors_total");
    put(out, inv.tensors_total, 4);
    out += ",\n";
    put_array(out, sink, "gemms", 4, [&](const auto& item) {
      for (const std::string& row : inv.gemms) item(row);
    });
    out += ",\n    " + key_text("gemms_total");
    put(out, inv.gemms_total, 4);
    out += "\n  }";
  }
  out += ",\n  " + key_text("decay");
  put(out, decay_json(r), 2);
  for (const auto& [k, v] : tail.items()) {
    out += ",\n  " + key_text(k.c_str());
    put(out, v, 2);
  }
  out += "\n}";
  sink(out);
}

}  // namespace fp4lab
