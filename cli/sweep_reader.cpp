#include "sweep_reader.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>

#include <toml++/toml.h>

#include "fp4lab/text.hpp"

namespace fp4lab::cli {

namespace {

[[noreturn]] void usage_error(const std::string& msg) { throw SweepError(msg); }

// The value text of a scalar node; usage error for anything else.
std::string scalar_text(const std::string& file, const std::string& key, const toml::node& n, bool* is_switch) {
  *is_switch = false;
  if (auto s = n.value_exact<std::string>()) return *s;
  if (auto i = n.value_exact<int64_t>()) return std::to_string(*i);
  if (auto d = n.value_exact<double>()) {
    // The shortest text that reads back as the same double (2.8, not 2.7999999999999998): it names runs, and the
    // run's option parser gets the very same number from it.
    char buf[32];
    const auto res = std::to_chars(buf, buf + sizeof buf, *d);
    return std::string(buf, res.ptr);
  }
  if (auto b = n.value_exact<bool>()) {
    *is_switch = true;
    return *b ? "true" : "false";
  }
  usage_error(file + ": key '" + shown(key) + "': values are strings, numbers or booleans");
}

// Flattens a table into option -> node (nested tables joined with '.'). One key spelt twice in one table
// (prep.mode = .. and "prep.mode" = ..) is refused: which one wins would be an accident of the spelling.
void flatten(const std::string& file, const toml::table& t, const std::string& prefix,
             std::map<std::string, const toml::node*>& out) {
  for (auto&& [k, v] : t) {
    const std::string key = prefix + std::string(k.str());
    if (const toml::table* sub = v.as_table()) flatten(file, *sub, key + ".", out);
    else if (!out.emplace(key, &v).second) usage_error(file + ": key '" + shown(key) + "' is given twice");
  }
}

// Keys a sweep cannot set: options of the sweep or of the program, not of one simulator run.
bool refused_key(const std::string& k) {
  return k == "help" || k == "h" || k == "version" || k == "json" || k == "sweep" || k == "out";
}

// A run's name: the template with each {KEY} replaced by the run's value of KEY, read once from left to right,
// so text put in is never scanned again (a value holding "{recipe}" stays as it is).
std::string expand_name(const std::string& file, size_t grid, const std::string& tpl,
                        const std::map<std::string, std::string>& value) {
  std::string out;
  for (size_t i = 0; i < tpl.size();) {
    if (tpl[i] != '{') {
      out += tpl[i++];
      continue;
    }
    const size_t close = tpl.find('}', i);
    const std::string key = tpl.substr(i + 1, close == std::string::npos ? std::string::npos : close - i - 1);
    const auto it = value.find(key);
    if (close == std::string::npos || it == value.end())
      usage_error(file + ": grid " + std::to_string(grid) + ": name '" + shown(tpl) + "' names a key the grid does "
                  "not set: {" + shown(key) + (close == std::string::npos ? "" : "}"));
    out += it->second;
    i = close + 1;
  }
  if (out.size() > kMaxSweepName)
    usage_error(file + ": grid " + std::to_string(grid) + ": a run name is " + std::to_string(out.size()) +
                " bytes long (at most " + std::to_string(kMaxSweepName) + ")");
  return out;
}
}  // namespace

std::vector<SweepRun> parse_sweep(const std::string& text, const std::string& file, nlohmann::ordered_json& meta) {
  toml::table doc;
  try {
    doc = toml::parse(text, file);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    usage_error(file + ":" + std::to_string(b.line) + ":" + std::to_string(b.column) + ": " +
                shown(std::string(e.description())));
  }
  for (auto&& [k, v] : doc) {
    const std::string key(k.str());
    if (key != "meta" && key != "defaults" && key != "grid")
      usage_error(file + ": unknown top-level key '" + shown(key) + "' (known: meta, defaults, grid)");
  }
  meta = nlohmann::ordered_json::object();
  if (const toml::table* m = doc["meta"].as_table()) {
    std::map<std::string, const toml::node*> flat;
    flatten(file, *m, "", flat);
    for (const auto& [k, n] : flat) {
      bool sw;
      meta[k] = scalar_text(file, "meta." + k, *n, &sw);
    }
  }
  std::map<std::string, const toml::node*> defaults;
  if (doc.contains("defaults")) {
    const toml::table* d = doc["defaults"].as_table();
    if (!d) usage_error(file + ": [defaults] must be a table");
    flatten(file, *d, "", defaults);
  }
  const toml::array* grids = doc["grid"].as_array();
  if (!grids || grids->empty()) usage_error(file + ": no [[grid]] tables: the sweep has no runs");

  // Every grid's size, before any run is built: the product of its list lengths, summed over grids.
  uint64_t total = 0;
  for (size_t gi = 0; gi < grids->size(); ++gi) {
    const toml::table* g = (*grids)[gi].as_table();
    if (!g) usage_error(file + ": grid " + std::to_string(gi + 1) + " is not a table");
    std::map<std::string, const toml::node*> keys = defaults, own;
    flatten(file, *g, "", own);
    for (const auto& [k, n] : own) keys[k] = n;
    uint64_t runs_here = 1;
    for (const auto& [k, n] : keys) {
      if (refused_key(k))
        usage_error(file + ": grid " + std::to_string(gi + 1) + ": key '" + shown(k) + "' is not an option of one run "
                    "(the sweep's own options go on the command line)");
      const toml::array* a = n->as_array();
      if (k != "name" && a && !a->empty()) runs_here = std::min<uint64_t>(runs_here * a->size(), kMaxSweepRuns + 1);
    }
    total = std::min<uint64_t>(total + runs_here, kMaxSweepRuns + 1);
    if (total > kMaxSweepRuns)
      usage_error(file + ": the sweep has more than " + std::to_string(kMaxSweepRuns) + " runs (grid " +
                  std::to_string(gi + 1) + " reaches the limit); split it into several sweeps");
  }
  std::vector<SweepRun> runs;
  runs.reserve(size_t(total));
  std::set<std::string> names;
  for (size_t gi = 0; gi < grids->size(); ++gi) {
    const toml::table* g = (*grids)[gi].as_table();
    if (!g) usage_error(file + ": grid " + std::to_string(gi + 1) + " is not a table");
    std::map<std::string, const toml::node*> keys = defaults;
    std::map<std::string, const toml::node*> own;
    flatten(file, *g, "", own);
    for (const auto& [k, n] : own) keys[k] = n;
    std::string name_tpl;
    if (auto it = keys.find("name"); it != keys.end()) {
      auto s = it->second->value_exact<std::string>();
      if (!s) usage_error(file + ": grid " + std::to_string(gi + 1) + ": name must be a string");
      name_tpl = *s;
      keys.erase(it);
    }
    // Axes: each key's list of values (a scalar is a list of one).
    std::vector<std::string> axis;
    std::vector<std::vector<std::pair<std::string, bool>>> values;
    for (const auto& [k, n] : keys) {
      std::vector<std::pair<std::string, bool>> vs;
      const std::string& key = k;  // a lambda cannot capture a structured binding before C++20 compilers
      auto add = [&](const toml::node& x) {
        bool sw;
        std::string t = scalar_text(file, key, x, &sw);
        vs.emplace_back(std::move(t), sw);
      };
      if (const toml::array* a = n->as_array()) {
        if (a->empty()) usage_error(file + ": grid " + std::to_string(gi + 1) + ": key '" + shown(k) + "' lists no values");
        for (const toml::node& x : *a) add(x);
      } else {
        add(*n);
      }
      axis.push_back(k);
      values.push_back(std::move(vs));
    }
    std::vector<size_t> at(axis.size(), 0);
    for (bool more = true; more;) {
      SweepRun r;
      std::map<std::string, std::string> value;
      for (size_t a = 0; a < axis.size(); ++a) {
        const auto& [text, sw] = values[a][at[a]];
        if (!sw || text == "true") r.opts[axis[a]] = sw ? "" : text;
        if (sw) r.switches.insert(axis[a]);
        value[axis[a]] = text;
      }
      std::string name = expand_name(file, gi + 1, name_tpl, value);
      if (name_tpl.empty()) {  // no template: the grid's number and the values that vary
        name = "grid" + std::to_string(gi + 1);
        for (size_t a = 0; a < axis.size(); ++a)
          if (values[a].size() > 1) name += "_" + values[a][at[a]].first;
      }
      if (!names.insert(name).second)
        usage_error(file + ": two runs are named '" + shown(name) + "' (add the varying keys to the grid's name)");
      r.name = name;
      runs.push_back(std::move(r));
      // Odometer: the last axis varies fastest.
      more = false;
      for (size_t a = axis.size(); a-- > 0;) {
        if (++at[a] < values[a].size()) {
          more = true;
          break;
        }
        at[a] = 0;
      }
    }
  }
  return runs;
}

}  // namespace fp4lab::cli
