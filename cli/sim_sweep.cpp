// fp4lab sim --sweep FILE: many `fp4lab sim` runs described by one TOML file, spread over MPI ranks
// (fp4lab/dist/dist.hpp), written as one JSON and one CSV identical for any number of ranks.
//
// Sweep file: TOML (docs/mpi.md, example sim/experiments/sweep.toml), read by sweep_reader.cpp.
#include <omp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <functional>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <set>

#include "commands.hpp"
#include "faults.hpp"  // and fp4lab/dist/dist.hpp
#include "files.hpp"
#include "fp4lab/io/files.hpp"
#include "fp4lab/sim/simulator.hpp"
#include "options.hpp"
#include "sim_run.hpp"
#include "sweep_reader.hpp"

namespace fp4lab::cli {

namespace {

using Run = SweepRun;

// A run of the sweep file, parsed once (before any runs) into the typed run it executes: its options as the command
// line spells them, and the run or the fault its options have (raised when the run's turn comes, as a run that
// fails does, so that the first fault in run order is the one reported).
struct Parsed {
  std::vector<std::string> args;
  std::optional<SimRun> run;  // none: it runs nothing (--help)
  std::exception_ptr fault;
};
Parsed parse_run(const Run& r) {
  Parsed p;
  p.args = r.args();
  Invocation sub;
  sub.command = "sim";
  sub.args = p.args;
  sub.command_line = "fp4lab sim";
  for (const auto& a : sub.args) sub.command_line += " " + a;
  try {
    p.run = parse_sim_run(sub, /*in_sweep=*/true);
  } catch (...) {
    p.fault = std::current_exception();
  }
  return p;
}

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


// The CSV's further columns of one report, beyond the fixed totals: energy by unit (energy_UNIT_pj), each stall
// category's share of the cycles (stall_CAT_share, as the text report prints them), bytes at every memory level
// (LEVEL_bytes; dram_read and dram_write are fixed columns), every other number of the total (a model's tokens,
// tokens_per_s, energy_per_token_pj), and every `area...` figure of the report or its total (objects flattened:
// area_KEY).
std::vector<std::pair<std::string, nlohmann::json>> per_run_figures(const nlohmann::json& report) {
  std::vector<std::pair<std::string, nlohmann::json>> out;
  if (!report.is_object() || !report.contains("total") || !report["total"].is_object()) return out;
  const nlohmann::json& total = report["total"];
  if (auto e = total.find("energy_pj"); e != total.end() && e->is_object())
    for (const auto& [k, v] : e->items()) out.emplace_back("energy_" + k + "_pj", v);
  if (auto st = total.find("stall_cycles"); st != total.end() && st->is_object()) {
    const auto c = total.find("cycles");
    const double cycles = c != total.end() && c->is_number() ? c->get<double>() : 0.0;
    for (const auto& [k, v] : st->items())
      out.emplace_back("stall_" + k + "_share", cycles > 0 && v.is_number() ? nlohmann::json(v.get<double>() / cycles)
                                                                            : nlohmann::json());
  }
  if (auto by = total.find("bytes"); by != total.end() && by->is_object())
    for (const auto& [k, v] : by->items())
      if (k != "dram_read" && k != "dram_write") out.emplace_back(k + "_bytes", v);
  for (const auto& [k, v] : total.items())  // e.g. a model's tokens, tokens_per_s, energy_per_token_pj
    if (v.is_number() && k != "cycles" && k != "time_us" && k != "macs" && k != "mac_util" && k != "energy_total_pj" &&
        k.rfind("area", 0) != 0)
      out.emplace_back(k, v);
  std::function<void(const std::string&, const nlohmann::json&)> flat = [&](const std::string& name, const nlohmann::json& v) {
    if (v.is_object())
      for (const auto& [k, x] : v.items()) flat(name + "_" + k, x);
    else if (!v.is_array())
      out.emplace_back(name, v);
  };
  for (const nlohmann::json* o : {&report, &total})
    for (const auto& [k, v] : o->items())
      if (k.rfind("area", 0) == 0) flat(k, v);
  return out;
}

// One run of the sweep: its item (name, args, report as CBOR: doubles travel as raw bits). Throws as the run does.
dist::Item run_one(const std::vector<Run>& runs, const std::vector<Parsed>& parsed, size_t i) {
  const Parsed& p = parsed[i];
  if (p.fault) std::rethrow_exception(p.fault);
  nlohmann::json rep;
  if (p.run) execute_sim_run(*p.run, &rep);
  const nlohmann::json item = {{"name", runs[i].name}, {"args", p.args}, {"report", rep}};
  const std::vector<uint8_t> cbor = nlohmann::json::to_cbor(item);
  return {i, std::string(cbor.begin(), cbor.end())};
}

// Runs `which` (indices into runs, in order) in this process, stopping at the first fault as one process does.
// `done` counts the runs finished by every worker of this process (shared memory), `of` is their number.
void run_serial(const std::vector<Run>& runs, const std::vector<Parsed>& parsed, const std::vector<size_t>& which,
                bool tty,
                std::chrono::steady_clock::time_point t0, const std::string& who, std::atomic<size_t>& done, size_t of,
                const std::function<void(dist::Item&&)>& done_item, dist::Fault& fault) {
  for (size_t i : which) {
    try {
      done_item(run_one(runs, parsed, i));
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const size_t k = ++done;
      if (tty) std::cerr << fmt("sim sweep: [%zu/%zu] %s (%s, %.1f s)\n", k, of, printable(runs[i].name).c_str(), who.c_str(), s);
    } catch (...) {
      fault.index = i;
      fault.code = describe(std::current_exception(), "sim", fault.msg);
      fault.msg = "sweep run '" + runs[i].name + "': " + fault.msg;
      return;
    }
  }
}

// Worker processes for one process's runs: OMP_NUM_THREADS of them (fp4lab/io/threads.hpp's rule; unset: one per core),
// at most one per run, and one under MPI (its ranks already fill the cores). Processes, not threads: SystemC keeps
// one simulation kernel per process (sim/include/fp4lab/sim/simulator.hpp).
int local_workers(size_t runs) {
  if (dist::size() > 1) return 1;
  return int(std::max<size_t>(1, std::min<size_t>(size_t(std::max(1, omp_get_max_threads())), runs)));
}

bool write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= size_t(w);
  }
  return true;
}

// This process's runs: in the process itself with one worker, else dealt to forked workers by weight (as ranks
// are, dist::assign), each sending its items back through a pipe. The results and the fault reported are those
// of one process: items are merged by index, and a fault is the one at the lowest index (each worker stops at its
// first, and the single process would have met the lowest first).
// `memo_hits` receives the GEMM jobs the workers answered from the job memo.
void run_local(const std::vector<Run>& runs, const std::vector<Parsed>& parsed, const std::vector<size_t>& mine,
               bool tty,
               std::chrono::steady_clock::time_point t0, std::vector<dist::Item>& items, dist::Fault& fault,
               uint64_t& memo_hits) {
  const int W = local_workers(mine.size());
  const std::string rank = "rank " + std::to_string(dist::rank());
  if (W <= 1) {
    std::atomic<size_t> done{0};
    run_serial(runs, parsed, mine, tty, t0, rank, done, mine.size(),
               [&](dist::Item&& it) { items.push_back(std::move(it)); },
               fault);
    memo_hits = sim::Simulator::cached_jobs();
    return;
  }
  // The progress count and memo hits every worker adds to (lock-free, so shared between processes).
  static_assert(std::atomic<size_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free);
  struct Shared {
    std::atomic<size_t> done{0};
    std::atomic<uint64_t> hits{0};
  };
  void* shared = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) throw std::runtime_error(std::string("cannot start sweep workers: ") + std::strerror(errno));
  Shared* counts = new (shared) Shared;
  std::atomic<size_t>* done = &counts->done;
  // Runs that differ only in energy.* or area.* keys time alike: they go to one worker, whose job memo then
  // prices the later ones without simulating them. Groups are dealt by weight as ranks are (dist::assign).
  std::map<std::string, size_t> group_of;
  std::vector<size_t> group(mine.size());
  std::vector<uint64_t> weights;
  for (size_t j = 0; j < mine.size(); ++j) {
    std::string g;
    for (const auto& [k, v] : runs[mine[j]].opts)
      if (k.rfind("energy.", 0) != 0 && k.rfind("area.", 0) != 0) g += k + '\0' + v + '\0';
    const auto [it, fresh] = group_of.emplace(g, group_of.size());
    if (fresh) weights.push_back(0);
    group[j] = it->second;
    weights[it->second] += run_weight(runs[mine[j]]);
  }
  const std::vector<int> group_worker = dist::assign(weights, W);
  std::vector<int> worker(mine.size());
  for (size_t j = 0; j < mine.size(); ++j) worker[j] = group_worker[group[j]];
  std::cout.flush();
  std::cerr.flush();
  struct Child {
    pid_t pid;
    int fd;
    std::string buf;
  };
  std::vector<Child> kids;
  for (int w = 0; w < W; ++w) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error(std::string("cannot start sweep workers: ") + std::strerror(errno));
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error(std::string("cannot start sweep workers: ") + std::strerror(errno));
    if (pid == 0) {
      ::close(fds[0]);
      for (const Child& k : kids) ::close(k.fd);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the sweep
      omp_set_num_threads(1);               // the workers are the sweep's OMP_NUM_THREADS threads
      std::vector<size_t> which;
      for (size_t j = 0; j < mine.size(); ++j)
        if (worker[j] == w) which.push_back(mine[j]);
      // Records: 'I' [u64 index][u64 length][bytes], or 'F' [u64 index][u64 code][u64 length][message].
      bool ok = true;
      dist::Fault f;
      run_serial(runs, parsed, which, tty, t0, "worker " + std::to_string(w + 1), *done, mine.size(),
                 [&](dist::Item&& it) {
        const uint64_t head[2] = {it.index, it.bytes.size()};
        ok = ok && write_all(fds[1], "I", 1) && write_all(fds[1], reinterpret_cast<const char*>(head), sizeof head) &&
             write_all(fds[1], it.bytes.data(), it.bytes.size());
      }, f);
      if (f.index != SIZE_MAX) {
        const uint64_t head[3] = {f.index, uint64_t(int64_t(f.code)), f.msg.size()};
        ok = ok && write_all(fds[1], "F", 1) && write_all(fds[1], reinterpret_cast<const char*>(head), sizeof head) &&
             write_all(fds[1], f.msg.data(), f.msg.size());
      }
      ok = ok && write_all(fds[1], "E", 1);
      std::cerr.flush();
      counts->hits += sim::Simulator::cached_jobs();
      ::_exit(ok ? 0 : 1);
    }
    ::close(fds[1]);
    kids.push_back({pid, fds[0], {}});
  }
  // Read every pipe as it fills (a worker blocks on a full pipe), then parse each worker's records.
  std::vector<pollfd> open;
  for (const Child& k : kids) open.push_back({k.fd, POLLIN, 0});
  for (size_t left = kids.size(); left > 0;) {
    if (::poll(open.data(), open.size(), -1) < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("sweep workers: poll: ") + std::strerror(errno));
    }
    for (size_t k = 0; k < open.size(); ++k) {
      if (open[k].fd < 0 || !(open[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char chunk[1 << 16];
      const ssize_t n = ::read(open[k].fd, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n > 0) {
        kids[k].buf.append(chunk, size_t(n));
        continue;
      }
      ::close(open[k].fd);
      open[k].fd = -1;
      --left;
    }
  }
  std::string died;
  for (size_t k = 0; k < kids.size(); ++k) {
    int status = 0;
    while (::waitpid(kids[k].pid, &status, 0) < 0 && errno == EINTR) {
    }
    const std::string& b = kids[k].buf;
    bool complete = false;
    for (size_t p = 0; p < b.size() && !complete;) {
      const char tag = b[p++];
      if (tag == 'E') {
        complete = true;
      } else if (tag == 'I' && p + 16 <= b.size()) {
        uint64_t head[2];
        std::memcpy(head, b.data() + p, sizeof head);
        p += sizeof head;
        if (p + head[1] > b.size()) break;
        items.push_back({size_t(head[0]), b.substr(p, size_t(head[1]))});
        p += size_t(head[1]);
      } else if (tag == 'F' && p + 24 <= b.size()) {
        uint64_t head[3];
        std::memcpy(head, b.data() + p, sizeof head);
        p += sizeof head;
        if (p + head[2] > b.size()) break;
        if (head[0] < fault.index) fault = {size_t(head[0]), int(int64_t(head[1])), b.substr(p, size_t(head[2]))};
        p += size_t(head[2]);
      } else {
        break;
      }
    }
    if (!complete && died.empty())
      died = WIFSIGNALED(status) ? std::string("ended by signal ") + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")"
                                 : "ended without its results (exit status " + std::to_string(WEXITSTATUS(status)) + ")";
  }
  memo_hits = counts->hits.load();
  ::munmap(shared, sizeof(Shared));
  if (!died.empty()) throw std::runtime_error("a sweep worker process " + died);
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
      ("no-job-cache", "simulate every GEMM job, even one an earlier run of the sweep has simulated with the same "
       "timing inputs (the memo gives the same reports, bit for bit; this checks it)")
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
  sim::Simulator::cache_jobs(!vm.count("no-job-cache"));
  std::vector<size_t> mine;
  for (size_t i = 0; i < runs.size(); ++i)
    if (owner[i] == dist::rank()) mine.push_back(i);
  std::vector<dist::Item> items;
  dist::Fault fault;
  uint64_t memo_hits = 0;
  // This rank's runs, parsed once, before the workers start (they inherit the typed runs).
  std::vector<Parsed> parsed(runs.size());
  for (size_t i : mine) parsed[i] = parse_run(runs[i]);
  run_local(runs, parsed, mine, tty, t0, items, fault, memo_hits);
  const std::vector<std::string> results = dist::gather(std::move(items), fault);
  if (!dist::root()) return kExitOk;

  // One JSON of every run's report, and one CSV row per run: its options, then the totals, then every further
  // per-run figure of the report (per_run_figures), columns in the order they first appear.
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
  std::vector<std::vector<std::pair<std::string, nlohmann::json>>> figures;
  std::vector<std::string> extra;
  std::set<std::string> extra_seen;
  for (size_t i = 0; i < results.size(); ++i) {
    all.push_back(nlohmann::json::from_cbor(results[i]));
    figures.push_back(per_run_figures(all.back()["report"]));
    for (const auto& [c, v] : figures.back())
      if (extra_seen.insert(c).second) extra.push_back(c);
  }
  std::string csv = "name";
  for (const auto& k : keys) csv += "," + csv_field(k);
  for (const auto& [c, path] : totals) csv += "," + c;
  for (const auto& c : extra) csv += "," + csv_field(c);
  csv += "\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const nlohmann::json& item = all[i];
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
    std::map<std::string, const nlohmann::json*> mine;
    for (const auto& [c, v] : figures[i]) mine[c] = &v;
    for (const auto& c : extra) {
      const auto it = mine.find(c);
      csv += "," + (it == mine.end() ? std::string() : csv_field(it->second->is_string() ? it->second->get<std::string>() : it->second->dump()));
    }
    csv += "\n";
  }
  nlohmann::ordered_json out = {{"fp4lab.sweep.version", 1}, {"sweep", file}, {"meta", meta}, {"runs", all}};
  write_text_atomic(prefix + ".json", out.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  write_text_atomic(prefix + ".csv", csv);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (tty)
    std::cerr << fmt("sim sweep: %zu runs in %.1f s on %d rank%s, %llu GEMM jobs priced from the job memo%s: "
                     "%s.json, %s.csv\n", runs.size(), s, dist::size(), dist::size() > 1 ? "s" : "",
                     (unsigned long long)memo_hits, dist::size() > 1 ? " on rank 0" : "", printable(prefix).c_str(),
                     printable(prefix).c_str());
  return kExitOk;
}

}  // namespace fp4lab::cli
