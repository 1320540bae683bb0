// fp4lab analyze: the docs/spec.md §6 analyses of every GEMM in a trace — per tensor (fwd_x, fwd_w, bwd_dy)
// and per training GEMM (fwd_y, bwd_dx, bwd_dw), for each grid with and without RHT — as the paper's Q1
// table on stdout and analysis JSON v1 on request. With no --trace it runs on the bundled trace.
#include <exception>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "commands.hpp"
#include "files.hpp"
#include "fp4lab/crmath.hpp"
#include "fp4lab/io/safetensors.hpp"
#include "fp4lab/layer_analysis.hpp"
#include "fp4lab/rht.hpp"
#include "mpi_dist.hpp"
#include "options.hpp"

#ifndef FP4LAB_DEFAULT_TRACE
#define FP4LAB_DEFAULT_TRACE "workloads/tiny-lm/step_005000"
#endif

namespace fp4lab::cli {

namespace {
// The trace analyze reads without --trace, found when it runs (a checkout or build folder may move): $FP4LAB_TRACE;
// else the bundled trace of the checkout the executable sits in (build*/bin/fp4lab, two folders up); else that of
// the checkout it was built from.
std::string default_trace() {
  if (const char* e = std::getenv("FP4LAB_TRACE"); e && *e) return e;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path t = exe.parent_path().parent_path().parent_path() / "workloads/tiny-lm/step_005000";
    if (std::filesystem::is_directory(t, ec)) return t.string();
  }
  return FP4LAB_DEFAULT_TRACE;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

std::string db(double v) { return sqnr_text(v, 10, 2); }  // "  21.96 dB", or "     exact" for no error

Json level_json(const std::vector<EmpiricalLevel>& levels) {
  Json bias = Json::array(), counts = Json::array(), values = Json::array();
  for (const auto& l : levels) {
    bias.push_back(l.mean_error);
    counts.push_back(l.count);
    values.push_back(l.level);
  }
  return {{"bias_per_level", bias}, {"level_counts", counts}, {"levels", values}};
}
}  // namespace

int cmd_analyze(const Invocation& inv) {
  po::options_description desc("fp4lab analyze options");
  desc.add_options()
      ("trace",
       po::value<std::vector<std::string>>()
           ->multitoken()
           ->default_value(std::vector<std::string>{default_trace()}, default_trace())
           ->value_name("DIR|FILE .."),
       "trace v1 folders or files, e.g. several steps of a run (default: $FP4LAB_TRACE, else the bundled trace "
       "workloads/tiny-lm/step_005000 of the checkout holding this executable)")
      ("formats", po::value<std::string>()->default_value("e2m1,e1m2")->value_name("F,.."), "grids to compare")
      ("rht", po::value<std::string>()->default_value("none,16")->value_name("D,.."),
       "RHT settings to compare: none (or 0) and Hadamard sizes (powers of two, 16 to 128)")
      ("rht-signs", po::value<std::string>()->value_name("S1,..,SD|te"),
       "RHT signs (default te, Transformer Engine's, for d = 16; seeded for other sizes)")
      ("rht-seed", po::value<std::string>()->default_value("0")->value_name("S"),
       "seed of the RHT signs for sizes without --rht-signs other than 16")
      ("block", po::value<int>()->default_value(16)->value_name("B"), "block size along the reduction dimension")
      ("scale", po::value<std::string>()->default_value("fp32")->value_name("S"),
       "block scale fp32|ue4m3|ue8m0|ue8m0-ceil (docs/spec.md §6 pins fp32 amax/gmax)")
      ("recipe", po::value<std::string>()->value_name("R,..|all"),
       "also run the three GEMMs under these training recipes (ufp4, e2m1-ref, nvfp4, mxfp4)")
      ("seed", po::value<std::string>()->default_value("0")->value_name("S"), "stochastic-rounding seed of recipe runs");
  add_common_options(desc);
  po::variables_map vm;
  if (!parse_args(inv, desc, "[--trace DIR] [--formats e2m1,e1m2] [--rht none,16] [--recipe R,..] [--json FILE|-]", vm))
    return kExitOk;
  const JsonOut json(vm);

  // Settings to compare: formats x RHT sizes.
  std::vector<ElemFormat> formats;
  for (const auto& f : split_list(vm["formats"].as<std::string>())) {
    formats.push_back(parse_format(f));
    for (size_t i = 0; i + 1 < formats.size(); ++i)
      if (std::string(formats[i].name) == formats.back().name)
        usage_error("--formats: " + std::string(formats.back().name) + " is given twice");
  }
  if (formats.empty()) usage_error("--formats lists no format");
  std::vector<int> rhts;
  for (const auto& r : split_list(vm["rht"].as<std::string>())) {
    rhts.push_back(parse_rht(r, "rht"));
    if (std::count(rhts.begin(), rhts.end(), rhts.back()) > 1)
      usage_error("--rht: " + (rhts.back() ? std::to_string(rhts.back()) : std::string("none")) + " is given twice");
  }
  if (rhts.empty()) usage_error("--rht lists no setting");
  const int block = vm["block"].as<int>();
  if (block != 16 && block != 32) usage_error("--block: block size must be 16 or 32, not " + std::to_string(block));
  const ScaleKind scale = parse_scale(vm["scale"].as<std::string>());
  const uint64_t rht_seed = uint_option(vm, "rht-seed", UINT64_MAX);
  std::vector<AnalysisSetting> settings;
  for (const ElemFormat& f : formats)
    for (int d : rhts) {
      AnalysisSetting s;
      s.format = f;
      s.rht = d;
      s.block = block;
      s.scale = scale;
      if (d != 0) {
          if (vm.count("rht-signs")) s.rht_signs = parse_rht_signs(vm["rht-signs"].as<std::string>(), d);
        else s.rht_signs = d == 16 ? rht_signs_te(16) : rht_signs_from_seed(d, rht_seed);
      }
      settings.push_back(s);
    }
  std::vector<Recipe> recipes;
  if (vm.count("recipe")) {
    const std::string r = vm["recipe"].as<std::string>();
    for (const auto& name : r == "all" ? Recipe::preset_names() : split_list(r)) {
      try {
        recipes.push_back(Recipe::preset(name));
      } catch (const std::invalid_argument& e) {
        usage_error(std::string("--recipe: ") + e.what());
      }
      recipes.back().seed = uint_option(vm, "seed", UINT64_MAX);
    }
  }

  // Knob combinations are usage faults, found on a shape every valid knob accepts (as operand_config does).
  for (const AnalysisSetting& s : settings) {
    try {
      validate(s.config(), 16, 128);
    } catch (const std::invalid_argument& e) {
      usage_error(std::string(e.what()) + " (setting " + s.label() + ")");
    }
  }

  const std::vector<std::string> trace_paths = vm["trace"].as<std::vector<std::string>>();
  const bool multi = trace_paths.size() > 1;  // entries then name their folder
  std::string trace_path;
  for (const auto& p : trace_paths) trace_path += (trace_path.empty() ? "" : ", ") + p;
  // Every rank opens every header (no tensor data: cheap) so that all see the same record list; agreed on,
  // so a folder one rank cannot read fails the whole job at once.
  std::vector<std::unique_ptr<io::Trace>> traces;
  dist::agree("analyze", [&] {
    for (const auto& p : trace_paths) {
      traces.push_back(std::make_unique<io::Trace>(p, block));  // validates every header and shape up front
      if (traces.back()->records().empty()) data_error(p, "the trace holds no GEMM records");
    }
  });
  struct Ref {
    size_t trace;
    const io::TraceRecord* rec;
  };
  std::vector<Ref> refs;  // every folder's records in order: the single-process order
  std::vector<uint64_t> sizes;
  std::map<std::string, std::string> seen;  // a record's file, canonical -> as given: one file analysed once
  for (size_t ti = 0; ti < traces.size(); ++ti)
    for (const io::TraceRecord& r : traces[ti]->records()) {
      std::error_code ec;
      const std::string canon = std::filesystem::weakly_canonical(r.file, ec).string() + "\n" + r.gemm;
      if (auto [it, fresh] = seen.emplace(ec ? r.file + "\n" + r.gemm : canon, r.file); !fresh)
        usage_error("--trace: gemm '" + printable(r.gemm) + "' of " + printable(r.file) + " is given twice (also as " +
                    printable(it->second) + ")");
      refs.push_back({ti, &r});
      sizes.push_back(uint64_t(r.tokens * r.in + r.out * r.in + r.tokens * r.out));
    }
  // Records by operand size, largest first, to the least-loaded rank (cli/mpi_dist.hpp).
  const std::vector<int> owner = dist::assign(sizes, dist::size());
  // Every operand of every GEMM against every setting's and recipe's block and RHT sizes, before any work
  // (a record that fails would otherwise surface only after the records before it were analysed).
  std::vector<std::string> inputs(trace_paths.begin(), trace_paths.end());
  for (const Ref& ref : refs) {
    const io::TraceRecord& rec = *ref.rec;
    inputs.push_back(rec.file);
    for (Pass pass : kPasses) {
      const PassGeometry g = pass_geometry(pass, rec.tokens, rec.in, rec.out);
      struct Use { std::string what; QuantConfig cfg; Operand operand; };
      std::vector<Use> uses;
      for (Operand o : {Operand::a, Operand::b}) {
        for (const AnalysisSetting& s : settings) uses.push_back({s.label(), s.config(), o});
        for (const Recipe& r : recipes) uses.push_back({"recipe " + r.name, r.operand(pass, o, 0), o});
      }
      for (const Use& u : uses) {
        const int64_t rows = u.operand == Operand::a ? g.M : g.N;
        try {
          validate(u.cfg, rows, g.K);
        } catch (const std::invalid_argument& e) {
          data_error(printable(rec.file), "gemm '" + printable(rec.gemm) + "' " + pass_name(pass) + " operand " +
                                              (u.operand == Operand::a ? "A" : "B") + " [" + std::to_string(rows) +
                                              ", " + std::to_string(g.K) + "] under " + u.what + ": " + e.what());
        }
      }
    }
  }
  check_outputs(vm, {}, inputs);

  Json tensors = Json::array(), gemms = Json::array();
  // Q1 table rows: per (gemm, role) the SQNR and B_eff of each setting; per (gemm, pass) the GEMM SQNR.
  struct Row { std::string gemm, what; std::vector<double> sqnr, beff, eta; };
  std::vector<Row> trows, grows;
  std::map<std::string, double> log_eta_sum;  // setting -> sum of log eta over fwd_y (the K-GEMM decay)
  const Progress progress("analyze");
  int64_t elements = 0;
  const size_t n = refs.size();
  // Each record's results travel to rank 0 as CBOR (doubles as raw IEEE bits, infinities kept), where they
  // are merged in record order exactly as one process merges them.
  auto rows_json = [](const std::vector<Row>& rows) {
    Json a = Json::array();
    for (const Row& r : rows) a.push_back({r.gemm, r.what, r.sqnr, r.beff, r.eta});
    return a;
  };
  // This rank's records, and all their work as one task list that both threads take from in order: per record
  // its load (with the transposed operands), its three float64 reference products, then every (setting or
  // recipe, pass), heaviest first -- with RHT, and of fwd_y (two tensors' statistics) -- so that no thread waits
  // at the end of each record while the other finishes, and the next record loads while this one computes.
  // Every (setting or recipe, pass) is independent (the inner OpenMP regions then run serially); a task waits
  // only for its record's load and its pass's reference, both handed out before it (the schedule goes in order).
  // At most about two records are in memory: a record's operands are freed by its last task.
  std::vector<size_t> my;
  for (size_t ri = 0; ri < n; ++ri)
    if (owner[ri] == dist::rank()) my.push_back(ri);
  const size_t tasks = 3 * (settings.size() + recipes.size());
  std::vector<size_t> order(tasks);
  for (size_t t = 0; t < tasks; ++t) order[t] = t;
  auto weight = [&](size_t t) {
    const size_t job = t / 3;
    const bool rht = job < settings.size() ? settings[job].rht != 0 : true;
    return (rht ? 2 : 1) * (t % 3 == 0 ? 3 : t % 3 == 1 ? 2 : 1);
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return weight(a) > weight(b); });
  struct RecordWork {
    io::Trace::Layer layer;
    std::unique_ptr<LayerOperands> lo;
    std::vector<LayerResults> by_task;      // a recipe task's one GEMM in gemms
    std::vector<std::exception_ptr> faults;  // [0] the load, [1..3] the references, [4 + t] task t
    bool skipped = false;                    // not loaded: an earlier record failed
    std::atomic<bool> loaded{false}, ref_ready[3] = {false, false, false};
    std::atomic<size_t> left{0};             // slots after the load still running
  };
  const size_t per = 4 + tasks;
  std::vector<RecordWork> work(my.size());
  for (RecordWork& w : work) {
    w.by_task.resize(tasks);
    w.faults.resize(per);
    w.left = per - 1;
  }
  // A rank stops at its first fault, as one process does: records after the first failed one are skipped.
  std::atomic<size_t> first_fault{SIZE_MAX};
  auto note_fault = [&](size_t k) {
    for (size_t f = first_fault.load(); k < f && !first_fault.compare_exchange_weak(f, k);) {
    }
  };
  std::atomic<size_t> done{0};
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t g = 0; g < my.size() * per; ++g) {
    const size_t k = g / per, slot = g % per, ri = my[k];
    RecordWork& w = work[k];
    const io::TraceRecord& rec = *refs[ri].rec;
    if (slot == 0) {  // the load: every other slot of the record waits for it, so it always signals
      if (k > first_fault.load()) {
        w.skipped = true;
      } else {
        try {
          progress.step(++done, my.size(),
                        dist::size() > 1 ? rec.gemm + " (rank " + std::to_string(dist::rank()) + ")" : rec.gemm);
          w.layer = traces[refs[ri].trace]->load(rec);
          w.lo = std::make_unique<LayerOperands>(
              LayerView{w.layer.x.data(), w.layer.w.data(), w.layer.dy.data(), rec.tokens, rec.in, rec.out},
              /*with_refs=*/false);
        } catch (...) {
          w.faults[0] = std::current_exception();
          note_fault(k);
        }
      }
      w.loaded.store(true, std::memory_order_release);
      continue;
    }
    while (!w.loaded.load(std::memory_order_acquire)) std::this_thread::yield();
    const bool run = !w.skipped && !w.faults[0];
    if (slot <= 3) {  // a reference product: tasks of its pass wait for it, so it always signals
      if (run) {
        try {
          w.lo->compute_ref(kPasses[slot - 1]);
        } catch (...) {
          w.faults[slot] = std::current_exception();
          note_fault(k);
        }
      }
      w.ref_ready[slot - 1].store(true, std::memory_order_release);
    } else if (run && k <= first_fault.load()) {
      const size_t t = order[slot - 4], job = t / 3, pi = t % 3;
      const Pass p = kPasses[pi];
      try {
        std::vector<float> c;
        if (job < settings.size()) w.by_task[t] = analyze_setting_pass(*w.lo, settings[job], p, c);
        else w.by_task[t].gemms.push_back(analyze_recipe_pass(*w.lo, recipes[job - settings.size()], uint32_t(ri), p, c));
        while (!w.ref_ready[pi].load(std::memory_order_acquire)) std::this_thread::yield();
        if (!w.faults[1 + pi]) compare_gemm(w.by_task[t].gemms.back(), c, w.lo->refs[pi]);
      } catch (...) {
        w.faults[4 + t] = std::current_exception();
        note_fault(k);
      }
    }
    if (--w.left == 0) {  // the record's last slot: its operands are no longer needed
      w.lo.reset();
      w.layer = io::Trace::Layer{};
    }
  }

  // This rank's results, record by record, as one process produces them.
  std::vector<dist::Item> items;
  dist::Fault fault;
  for (size_t k = 0; k < my.size(); ++k) {
    const size_t ri = my[k];
    const io::TraceRecord& rec = *refs[ri].rec;
    const std::string& tpath = trace_paths[refs[ri].trace];
    // A folder given as "t1/" is named by "t1": lexically_normal keeps the trailing separator as an empty name.
    std::filesystem::path tp = std::filesystem::path(tpath).lexically_normal();
    if (!tp.has_filename() && tp.has_parent_path()) tp = tp.parent_path();
    const std::string gname = multi ? tp.filename().string() + ":" + rec.gemm : rec.gemm;
    std::vector<LayerResults>& by_task = work[k].by_task;
    try {
      if (work[k].faults[0]) std::rethrow_exception(work[k].faults[0]);
      for (size_t i = 1; i < per; ++i)
        if (work[k].faults[i]) {
          try {
            std::rethrow_exception(work[k].faults[i]);
          } catch (const std::exception& e) {
            data_error(rec.file, "gemm '" + rec.gemm + "': " + e.what());
          }
        }
      const int64_t rec_elements = rec.tokens * rec.in + rec.out * rec.in + rec.tokens * rec.out;
      Json rec_tensors = Json::array(), rec_gemms = Json::array();
      auto head = [&] { return multi ? Json{{"trace", tpath}, {"gemm", rec.gemm}} : Json{{"gemm", rec.gemm}}; };
      std::vector<Row> tr(3), gr(3);
      std::map<std::string, double> sqnr_no_rht;  // format/role -> SQNR without RHT, for the delta
      // Every task succeeded (a fault ended above), so each recipe task holds its GEMM.
      std::vector<LayerResults> by_setting(settings.size());
      std::vector<std::vector<GemmResult>> by_recipe(recipes.size());
      for (size_t t = 0; t < tasks; ++t) {
        const size_t job = t / 3;
        if (job < settings.size()) by_setting[job].append(std::move(by_task[t]));
        else by_recipe[job - settings.size()].push_back(std::move(by_task[t].gemms.front()));
      }
      for (size_t si = 0; si < settings.size(); ++si) {
        const LayerResults& res = by_setting[si];
        for (const TensorResult& t : res.tensors) {
          const size_t i = t.role == "fwd_x" ? 0 : t.role == "fwd_w" ? 1 : 2;
          tr[i].gemm = gname;
          tr[i].what = t.role;
          tr[i].sqnr.push_back(t.sqnr_db);
          tr[i].beff.push_back(t.beff);
          Json j = head();
          j.update(Json{{"role", t.role}, {"format", t.format}, {"rht", t.rht},
                        {"sqnr_db", t.sqnr_db}, {"beff", t.beff}, {"alpha", t.alpha}});
          const std::string key = t.format + "/" + t.role;
          if (t.rht == 0) sqnr_no_rht[key] = t.sqnr_db;
          else if (sqnr_no_rht.count(key)) j["delta_sqnr_db"] = t.sqnr_db - sqnr_no_rht[key];
          j.update(level_json(t.bias_per_level));
          j["tokens"] = rec.tokens;
          rec_tensors.push_back(j);
        }
        for (const GemmResult& g : res.gemms) {
          const size_t i = g.pass == "fwd_y" ? 0 : g.pass == "bwd_dx" ? 1 : 2;
          gr[i].gemm = gname;
          gr[i].what = g.pass;
          gr[i].sqnr.push_back(g.sqnr_db);
          gr[i].eta.push_back(g.eta);
          Json j = head();
          j.update(Json{{"pass", g.pass}, {"format", g.format}, {"rht", g.rht},
                        {"sqnr_db", g.sqnr_db}, {"eta", g.eta}, {"eta_measured", g.eta_measured},
                        {"delta", 1.0 - g.eta}});
          rec_gemms.push_back(j);
        }
      }
      for (const auto& rg : by_recipe)
        for (const GemmResult& g : rg) {
          Json j = head();
          j.update(Json{{"pass", g.pass}, {"format", g.format}, {"recipe", g.recipe},
                        {"rht", g.rht},
                        {"sqnr_db", g.sqnr_db}, {"eta", g.eta}, {"eta_measured", g.eta_measured},
                        {"delta", 1.0 - g.eta}});
          rec_gemms.push_back(j);
        }
      const Json item = {{"tensors", rec_tensors}, {"gemms", rec_gemms}, {"trows", rows_json(tr)},
                         {"grows", rows_json(gr)}, {"elements", rec_elements}};
      const std::vector<uint8_t> cbor = Json::to_cbor(item);
      items.push_back({ri, std::string(cbor.begin(), cbor.end())});
    } catch (...) {
      // gather() names the first fault in record order.
      fault.index = ri;
      fault.code = dist::describe(std::current_exception(), "analyze", fault.msg);
      break;
    }
  }
  const std::vector<std::string> results = dist::gather("analyze", std::move(items), fault);
  if (!dist::root()) return kExitOk;  // rank 0 writes the one report
  auto rows_from = [](const Json& a, std::vector<Row>& out) {
    for (const Json& r : a)
      out.push_back({r[0].get<std::string>(), r[1].get<std::string>(), r[2].get<std::vector<double>>(),
                     r[3].get<std::vector<double>>(), r[4].get<std::vector<double>>()});
  };
  for (const std::string& b : results) {
    const Json r = Json::from_cbor(b);
    for (const Json& j : r["tensors"]) tensors.push_back(j);
    for (const Json& j : r["gemms"]) gemms.push_back(j);
    rows_from(r["trows"], trows);
    rows_from(r["grows"], grows);
    elements += r["elements"].get<int64_t>();
  }
  // The decay, summed in record order and setting order as the rows were produced.
  for (const Row& r : grows)
    if (r.what == "fwd_y")
      for (size_t si = 0; si < settings.size(); ++si) log_eta_sum[settings[si].label()] += cr::log(r.eta[si]);
  const double seconds = progress.seconds();

  // Where the paper's inversion appears: E2M1 ahead without RHT, E1M2 ahead with it.
  auto find = [&](const char* f, int d) -> int {
    for (size_t i = 0; i < settings.size(); ++i)
      if (std::string(settings[i].format.name) == f && settings[i].rht == d) return int(i);
    return -1;
  };
  int rht_d = 0;
  for (int d : rhts) if (d) { rht_d = d; break; }
  const int e2_0 = find("e2m1", 0), e2_r = find("e2m1", rht_d), e1_0 = find("e1m2", 0), e1_r = find("e1m2", rht_d);
  const bool can_invert = rht_d && e2_0 >= 0 && e2_r >= 0 && e1_0 >= 0 && e1_r >= 0;
  auto inverted = [&](const Row& r) {
    return r.sqnr[e2_0] > r.sqnr[e1_0] && r.sqnr[e1_r] > r.sqnr[e2_r];
  };
  Json inversion = Json::object();
  if (can_invert) {
    Json tl = Json::array(), gl = Json::array();
    for (const Row& r : trows) if (inverted(r)) tl.push_back(r.gemm + "/" + r.what);
    for (const Row& r : grows) if (inverted(r)) gl.push_back(r.gemm + "/" + r.what);
    inversion = {{"rht", rht_d}, {"tensors", tl}, {"tensors_total", trows.size()},
                 {"gemms", gl}, {"gemms_total", grows.size()}};
  }
  Json decay = Json::object();
  for (const auto& [label, s] : log_eta_sum) decay[label] = {{"product_eta_fwd_y", cr::exp(s)}};

  if (json.table()) {
    std::cout << fmt("fp4lab analyze: %s — %zu GEMMs, %lld elements, 1x%d blocks, %s scales, RTNE (%.1f s)\n\n",
                     printable(trace_path).c_str(), n, (long long)elements, block, scale_name(scale), seconds);
    // One column width for every setting, wide enough for its longest header ("Beff e2m1 no-rht"), so no
    // header is cut and the cells line up under it.
    int w = 14;
    for (const auto& s : settings) w = std::max(w, int(("Beff " + s.label()).size()));
    auto header = [&](const char* title, bool with_beff) {
      std::cout << title << "\n" << fmt("%-26s %-7s", "gemm", "");
      for (const auto& s : settings) std::cout << fmt(" %*s", w, s.label().c_str());
      if (can_invert) std::cout << fmt(" %8s %8s", "dE2M1", "dE1M2");
      if (with_beff) for (const auto& s : settings) std::cout << fmt(" %*s", w, ("Beff " + s.label()).c_str());
      std::cout << "\n";
    };
    auto row = [&](const Row& r, bool with_beff) {
      std::cout << fmt("%-26s %-7s", printable(r.gemm).c_str(), r.what.c_str());
      for (double v : r.sqnr) std::cout << fmt(" %*s", w, db(v).c_str());
      if (can_invert)
        std::cout << " " << delta_text(r.sqnr[e2_r] - r.sqnr[e2_0], 8, 2) << " " << delta_text(r.sqnr[e1_r] - r.sqnr[e1_0], 8, 2);
      if (with_beff) for (double v : r.beff) std::cout << fmt(" %*.3f", w, v);
      if (can_invert && inverted(r)) std::cout << "  inversion";
      std::cout << "\n";
    };
    header("Tensor SQNR (dB; with RHT against the rotated tensor), d = SQNR(RHT) - SQNR(none), and B_eff", true);
    for (const Row& r : trows) row(r, true);
    std::cout << "\n";
    header("GEMM-output SQNR (dB) against the float64 product of the unquantised operands", false);
    for (const Row& r : grows) row(r, false);
    if (can_invert)
      std::cout << fmt("\nInversion (E2M1 ahead without RHT, E1M2 ahead with RHT-%d): %zu of %zu tensors, %zu of %zu GEMMs\n",
                       rht_d, inversion["tensors"].size(), trows.size(), inversion["gemms"].size(), grows.size());
    std::cout << "\nShrinkage through the forward chain: prod(eta) over fwd_y GEMMs = exp(-sum delta)\n";
    for (const auto& [label, s] : log_eta_sum) std::cout << fmt("  %-16s %.6f\n", label.c_str(), cr::exp(s));
    if (!recipes.empty()) {
      std::cout << "\nTraining recipes (each pass with the recipe's own operand settings)\n";
      for (const auto& g : gemms)
        if (g.contains("recipe"))
          std::cout << fmt("  %-10s %-26s %-7s SQNR %s  eta %.6f\n", g["recipe"].get<std::string>().c_str(),
                           printable(g["gemm"].get<std::string>()).c_str(), g["pass"].get<std::string>().c_str(),
                           db(g["sqnr_db"].get<double>()).c_str(), g["eta"].get<double>());
    }
  }

  Json settings_json = Json::array();
  for (const auto& s : settings)
    settings_json.push_back({{"format", s.format.name}, {"rht", s.rht}, {"rht_signs", signs_string(s.rht_signs)}});
  Json recipes_json = Json::array();
  for (const auto& r : recipes) recipes_json.push_back(r.name);
  json.write({{"fp4lab.analysis.version", 1},
              {"config", {{"trace", multi ? Json(trace_paths) : Json(trace_paths.front())}, {"block", block}, {"scale", scale_name(scale)}, {"rounding", "rtne"},
                          {"settings", settings_json}, {"recipes", recipes_json}, {"command", inv.command_line},
                          {"seconds", seconds}, {"elements", elements}}},
              {"tensors", tensors},
              {"gemms", gemms},
              {"inversion", inversion},
              {"decay", decay}});
  return kExitOk;
}

}  // namespace fp4lab::cli
