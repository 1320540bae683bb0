// fp4lab sim --sweep FILE: many `fp4lab sim` runs described by one TOML file, spread over MPI ranks
// (cli/mpi_dist.hpp), written as one JSON and one CSV identical for any number of ranks.
//
// Sweep file: TOML (docs/mpi.md, example sim/experiments/sweep.toml), read by sweep_reader.cpp.
#include <unistd.h>

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
#include "sweep_reader.hpp"

namespace fp4lab::cli {

int run_sim(const Invocation& inv, nlohmann::json* capture);  // cmd_sim.cpp

namespace {

using Run = SweepRun;

// The sweep file's runs (sweep_reader.cpp), or the one-line reason it has none as a usage fault.
std::vector<Run> read_sweep(const std::string& file, nlohmann::ordered_json& meta) {
#ifndef FP4LAB_HAVE_TOMLPP
  (void)meta;
  usage_error(file + ": this build has no TOML reader (install libtomlplusplus-dev and rebuild)");
#else
  // Read as a regular file first: a FIFO would block, and a folder would be reported as a parse error.
  const std::string text = io::read_regular_file(file, "sweep file");
  try {
    return parse_sweep(text, file, meta);
  } catch (const SweepError& e) {
    usage_error(e.what());
  }
#endif
}

// Relative cost of a run, to balance ranks: the bytes of its workload (a trace replays tensors; a shape list
// is cheap), ten times that with --check (every output computed twice). Same on every rank: the file sizes.
uint64_t run_weight(const Run& r) {
  namespace fs = std::filesystem;
  uint64_t bytes = 1;
  std::error_code ec;
  for (const char* k : {"trace", "shapes", "model"})
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
  for (const std::string& v : {file, prefix})  // recorded in the results JSON, as every option value (options.cpp)
    if (!valid_utf8(v)) usage_error("'" + printable(v) + "' is not valid UTF-8 (fp4lab records paths and names in UTF-8)");

  nlohmann::ordered_json meta;
  const std::vector<Run> runs = read_sweep(file, meta);
  // Before the runs, not after them; a run's own input files (trace, shapes, model, config) count as inputs too.
  std::vector<std::string> inputs = {file};
  for (const Run& r : runs)
    for (const char* k : {"trace", "shapes", "model", "config"})
      if (auto it = r.opts.find(k); it != r.opts.end()) inputs.push_back(it->second);
  std::sort(inputs.begin(), inputs.end());
  inputs.erase(std::unique(inputs.begin(), inputs.end()), inputs.end());
  check_outputs(vm, {prefix + ".json", prefix + ".csv"}, inputs);
  std::vector<uint64_t> weights;
  for (const Run& r : runs) weights.push_back(run_weight(r));
  const std::vector<int> owner = dist::assign(weights, dist::size());
  // Progress goes to a terminal only, as every run's (cli/options.hpp Progress): a captured stderr holds nothing
  // but a failure's one line.
  const bool tty = ::isatty(STDERR_FILENO) == 1;
  if (dist::root() && tty)
    std::cerr << fmt("sim sweep: %s: %zu runs on %d rank%s\n", printable(file).c_str(), runs.size(), dist::size(),
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
      ++done;
      if (tty) std::cerr << fmt("sim sweep: [%zu/%zu] %s (rank %d, %.1f s)\n", done, mine, printable(r.name).c_str(), dist::rank(), s);
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
  if (tty)
    std::cerr << fmt("sim sweep: %zu runs in %.1f s on %d rank%s: %s.json, %s.csv\n", runs.size(), s, dist::size(),
                     dist::size() > 1 ? "s" : "", printable(prefix).c_str(), printable(prefix).c_str());
  return kExitOk;
}

}  // namespace fp4lab::cli
