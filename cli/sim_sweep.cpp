// fp4lab sim --sweep FILE: many `fp4lab sim` runs described by one TOML file, spread over MPI ranks
// (cli/mpi_dist.hpp), written as one JSON and one CSV identical for any number of ranks.
//
// Sweep file (TOML; docs/mpi.md, example sim/experiments/sweep.toml):
//   [meta]        free-form values, copied into the results JSON
//   [defaults]    options of every run: `fp4lab sim --KEY VALUE` (e.g. config, recipe, "mac.kind")
//   [[grid]]      one group of runs: its keys on top of [defaults]; every key given a list varies, and the
//                 group runs the cartesian product (keys in alphabetical order, the last varying fastest).
//                 `name` is the run name, with {KEY} replaced by the run's value of KEY.
// Values are strings, integers, floats or booleans (true: the switch --KEY; false: left out). Dotted keys
// (prep.mode = "fused") and quoted ones ("prep.mode" = "fused") mean the same option.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include "commands.hpp"
#include "files.hpp"
#include "fp4lab/io/files.hpp"
#include "mpi_dist.hpp"
#include "options.hpp"

#ifdef FP4LAB_HAVE_TOMLPP
#include <toml++/toml.h>
#endif

namespace fp4lab::cli {

int run_sim(const Invocation& inv, nlohmann::json* capture);  // cmd_sim.cpp

namespace {

// docs/mpi.md: a sweep of more runs is refused before any is built; a longer run name likewise.
constexpr uint64_t kMaxSweepRuns = 100000;
constexpr size_t kMaxSweepName = 1024;

struct Run {
  std::string name;
  std::map<std::string, std::string> opts;  // option -> value text ("" with a switch)
  std::set<std::string> switches;
  std::vector<std::string> args() const {
    std::vector<std::string> a;
    for (const auto& [k, v] : opts) {
      a.push_back("--" + k);
      if (!switches.count(k)) a.push_back(v);
    }
    return a;
  }
};

#ifdef FP4LAB_HAVE_TOMLPP
// The value text of a scalar node; usage error for anything else.
std::string scalar_text(const std::string& file, const std::string& key, const toml::node& n, bool* is_switch) {
  *is_switch = false;
  if (auto s = n.value_exact<std::string>()) return *s;
  if (auto i = n.value_exact<int64_t>()) return std::to_string(*i);
  if (auto d = n.value_exact<double>()) return fmt("%.17g", *d);  // round-trips exactly through the parser
  if (auto b = n.value_exact<bool>()) {
    *is_switch = true;
    return *b ? "true" : "false";
  }
  usage_error(file + ": key '" + key + "': values are strings, numbers or booleans");
}

// Flattens a table into option -> node (nested tables joined with '.'). One key spelt twice in one table
// (prep.mode = .. and "prep.mode" = ..) is refused: which one wins would be an accident of the spelling.
void flatten(const std::string& file, const toml::table& t, const std::string& prefix,
             std::map<std::string, const toml::node*>& out) {
  for (auto&& [k, v] : t) {
    const std::string key = prefix + std::string(k.str());
    if (const toml::table* sub = v.as_table()) flatten(file, *sub, key + ".", out);
    else if (!out.emplace(key, &v).second) usage_error(file + ": key '" + printable(key) + "' is given twice");
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
      usage_error(file + ": grid " + std::to_string(grid) + ": name '" + printable(tpl) + "' names a key the grid does "
                  "not set: {" + printable(key) + (close == std::string::npos ? "" : "}"));
    out += it->second;
    i = close + 1;
  }
  if (out.size() > kMaxSweepName)
    usage_error(file + ": grid " + std::to_string(grid) + ": a run name is " + std::to_string(out.size()) +
                " bytes long (at most " + std::to_string(kMaxSweepName) + ")");
  return out;
}
#endif

std::vector<Run> read_sweep(const std::string& file, nlohmann::ordered_json& meta) {
#ifndef FP4LAB_HAVE_TOMLPP
  (void)meta;
  usage_error(file + ": this build has no TOML reader (install libtomlplusplus-dev and rebuild)");
#else
  // Read as a regular file first: a FIFO would block, and a folder would be reported as a parse error.
  const std::string text = io::read_regular_file(file, "sweep file");
  toml::table doc;
  try {
    doc = toml::parse(text, file);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    usage_error(fmt("%s:%u:%u: %s", file.c_str(), unsigned(b.line), unsigned(b.column), std::string(e.description()).c_str()));
  }
  for (auto&& [k, v] : doc) {
    const std::string key(k.str());
    if (key != "meta" && key != "defaults" && key != "grid")
      usage_error(file + ": unknown top-level key '" + key + "' (known: meta, defaults, grid)");
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
        usage_error(file + ": grid " + std::to_string(gi + 1) + ": key '" + k + "' is not an option of one run "
                    "(the sweep's own options go on the command line)");
      const toml::array* a = n->as_array();
      if (k != "name" && a && !a->empty()) runs_here = std::min<uint64_t>(runs_here * a->size(), kMaxSweepRuns + 1);
    }
    total = std::min<uint64_t>(total + runs_here, kMaxSweepRuns + 1);
    if (total > kMaxSweepRuns)
      usage_error(file + ": the sweep has more than " + std::to_string(kMaxSweepRuns) + " runs (grid " +
                  std::to_string(gi + 1) + " reaches the limit); split it into several sweeps");
  }
  std::vector<Run> runs;
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
      auto add = [&](const toml::node& x) {
        bool sw;
        std::string t = scalar_text(file, k, x, &sw);
        vs.emplace_back(std::move(t), sw);
      };
      if (const toml::array* a = n->as_array()) {
        if (a->empty()) usage_error(file + ": grid " + std::to_string(gi + 1) + ": key '" + k + "' lists no values");
        for (const toml::node& x : *a) add(x);
      } else {
        add(*n);
      }
      axis.push_back(k);
      values.push_back(std::move(vs));
    }
    std::vector<size_t> at(axis.size(), 0);
    for (bool more = true; more;) {
      Run r;
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
        usage_error(file + ": two runs are named '" + name + "' (add the varying keys to the grid's name)");
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
#endif
}

// Relative cost of a run, to balance ranks: the bytes of its workload (a trace replays tensors; a shape list
// is cheap), ten times that with --check (every output computed twice). Same on every rank: the file sizes.
uint64_t run_weight(const Run& r) {
  namespace fs = std::filesystem;
  uint64_t bytes = 1;
  std::error_code ec;
  for (const char* k : {"trace", "shapes"})
    if (auto it = r.opts.find(k); it != r.opts.end()) {
      const fs::path p(it->second);
      if (fs::is_directory(p, ec)) {
        for (fs::directory_iterator d(p, ec), e; !ec && d != e; d.increment(ec))
          if (d->is_regular_file(ec)) bytes += uint64_t(d->file_size(ec));
      } else {
        const auto s = fs::file_size(p, ec);
        if (!ec) bytes += uint64_t(s);
      }
    }
  return r.opts.count("check") ? 10 * bytes : bytes;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace

bool sim_sweep_requested(const Invocation& inv) {
  for (const std::string& a : inv.args)
    if (a == "--sweep" || a.rfind("--sweep=", 0) == 0) return true;
  return false;
}

int cmd_sim_sweep(const Invocation& inv) {
  po::options_description desc("fp4lab sim --sweep options");
  desc.add_options()
      ("sweep", po::value<std::string>()->required()->value_name("FILE"), "TOML sweep file (docs/mpi.md)")
      ("out", po::value<std::string>()->value_name("PREFIX"),
       "write PREFIX.json and PREFIX.csv (default: the sweep file's name without .toml, in the current folder)")
      ("help,h", "this help");
  po::variables_map vm;
  for (const std::string& a : inv.args) refuse_placeholders(a, "command line");
  po::store(po::command_line_parser(inv.args).options(desc).style(kCommandLineStyle).run(), vm);
  if (vm.count("help")) {
    if (dist::root())
      std::cout << "usage: fp4lab sim --sweep FILE [--out PREFIX]   (under mpirun -np N: runs spread over ranks)\n\n"
                << desc;
    return kExitOk;
  }
  po::notify(vm);
  const std::string file = vm["sweep"].as<std::string>();
  const std::string prefix =
      vm.count("out") ? vm["out"].as<std::string>() : std::filesystem::path(file).stem().string();
  if (prefix.empty()) usage_error("--out needs a file name prefix");

  nlohmann::ordered_json meta;
  const std::vector<Run> runs = read_sweep(file, meta);
  // Before the runs, not after them; a run's own input files (trace, shapes, config) count as inputs too.
  std::vector<std::string> inputs = {file};
  for (const Run& r : runs)
    for (const char* k : {"trace", "shapes", "config"})
      if (auto it = r.opts.find(k); it != r.opts.end()) inputs.push_back(it->second);
  std::sort(inputs.begin(), inputs.end());
  inputs.erase(std::unique(inputs.begin(), inputs.end()), inputs.end());
  check_outputs(vm, {prefix + ".json", prefix + ".csv"}, inputs);
  std::vector<uint64_t> weights;
  for (const Run& r : runs) weights.push_back(run_weight(r));
  const std::vector<int> owner = dist::assign(weights, dist::size());
  if (dist::root())
    std::cerr << fmt("sim sweep: %s: %zu runs on %d rank%s\n", file.c_str(), runs.size(), dist::size(),
                     dist::size() > 1 ? "s" : "");

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<dist::Item> items;
  dist::Fault fault;
  size_t mine = 0, done = 0;
  for (int o : owner) mine += o == dist::rank();
  for (size_t i = 0; i < runs.size(); ++i) {
    if (owner[i] != dist::rank()) continue;
    const Run& r = runs[i];
    Invocation sub;
    sub.command = "sim";
    sub.args = r.args();
    sub.command_line = "fp4lab sim";
    for (const auto& a : sub.args) sub.command_line += " " + a;
    try {
      nlohmann::json rep;
      run_sim(sub, &rep);
      const nlohmann::json item = {{"name", r.name}, {"args", sub.args}, {"report", rep}};
      const std::vector<uint8_t> cbor = nlohmann::json::to_cbor(item);  // doubles travel as raw bits
      items.push_back({i, std::string(cbor.begin(), cbor.end())});
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::cerr << fmt("sim sweep: [%zu/%zu] %s (rank %d, %.1f s)\n", ++done, mine, r.name.c_str(), dist::rank(), s);
    } catch (...) {
      fault.index = i;
      fault.code = dist::describe(std::current_exception(), "sim", fault.msg);
      fault.msg = "sweep run '" + r.name + "': " + fault.msg;
      break;
    }
  }
  const std::vector<std::string> results = dist::gather("sim", std::move(items), fault);
  if (!dist::root()) return kExitOk;

  // One JSON of every run's report, and one CSV row per run: its options, then the totals.
  nlohmann::json all = nlohmann::json::array();
  std::set<std::string> keys;
  for (const Run& r : runs)
    for (const auto& [k, v] : r.opts) keys.insert(k);
  const std::vector<std::pair<std::string, std::vector<std::string>>> totals = {
      {"cycles", {"cycles"}},       {"time_us", {"time_us"}},
      {"macs", {"macs"}},           {"mac_util", {"mac_util"}},
      {"energy_total_pj", {"energy_total_pj"}},
      {"dram_read_bytes", {"bytes", "dram_read"}}, {"dram_write_bytes", {"bytes", "dram_write"}},
      {"checked_outputs", {"check", "outputs"}},   {"mismatches", {"check", "mismatches"}}};
  std::string csv = "name";
  for (const auto& k : keys) csv += "," + csv_field(k);
  for (const auto& [c, path] : totals) csv += "," + c;
  csv += "\n";
  for (size_t i = 0; i < results.size(); ++i) {
    nlohmann::json item = nlohmann::json::from_cbor(results[i]);
    csv += csv_field(runs[i].name);
    for (const auto& k : keys) {
      const auto it = runs[i].opts.find(k);
      csv += "," + (it == runs[i].opts.end() ? std::string() : csv_field(runs[i].switches.count(k) ? "true" : it->second));
    }
    const nlohmann::json& total = item["report"]["total"];
    for (const auto& [c, path] : totals) {
      const nlohmann::json* v = &total;
      for (const auto& p : path) v = v && v->is_object() && v->contains(p) ? &(*v)[p] : nullptr;
      csv += "," + (v ? v->dump() : std::string());  // nlohmann's shortest round-trip form of doubles
    }
    csv += "\n";
    all.push_back(std::move(item));
  }
  nlohmann::ordered_json out = {{"fp4lab.sweep.version", 1}, {"sweep", file}, {"meta", meta}, {"runs", all}};
  write_text_atomic(prefix + ".json", out.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  write_text_atomic(prefix + ".csv", csv);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cerr << fmt("sim sweep: %zu runs in %.1f s on %d rank%s: %s.json, %s.csv\n", runs.size(), s, dist::size(),
                   dist::size() > 1 ? "s" : "", prefix.c_str(), prefix.c_str());
  return kExitOk;
}

}  // namespace fp4lab::cli
