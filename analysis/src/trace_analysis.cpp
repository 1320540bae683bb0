// The analysis of a trace: options, the opened records, the record loop and the merge (trace_analysis.hpp).
#include "fp4lab/trace_analysis.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include <omp.h>

#include "fp4lab/crmath.hpp"
#include "fp4lab/recipe.hpp"
#include "fp4lab/philox.hpp"
#include "fp4lab/rht.hpp"

namespace fp4lab {

namespace {
[[noreturn]] void usage_fault(const std::string& msg) { throw AnalysisError(true, msg); }
[[noreturn]] void data_fault(const std::string& file, const std::string& msg) {
  throw AnalysisError(false, file.empty() ? msg : file + ": " + msg);
}

// A folder given as "t1/" is named by "t1": lexically_normal keeps the trailing separator as an empty name.
std::string folder_name(const std::string& trace) {
  std::filesystem::path tp = std::filesystem::path(trace).lexically_normal();
  if (!tp.has_filename() && tp.has_parent_path()) tp = tp.parent_path();
  return tp.filename().string();
}
}  // namespace

uint64_t record_identity_hash(const std::string& gemm, const std::string* step) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64: offset basis, then per byte xor and multiply by the prime
  auto add = [&h](unsigned char byte) { h = (h ^ byte) * 0x100000001b3ull; };
  for (char c : gemm) add(static_cast<unsigned char>(c));
  if (step) {
    add(0xFF);
    for (char c : *step) add(static_cast<unsigned char>(c));
  }
  return h;
}

uint64_t record_sr_seed(uint64_t seed, const std::string& gemm, const std::map<std::string, std::string>& metadata) {
  const auto step = metadata.find("step");
  const uint64_t h = record_identity_hash(gemm, step == metadata.end() ? nullptr : &step->second);
  const uint32_t k[2] = {uint32_t(seed), uint32_t(seed >> 32)};
  const uint32_t c[4] = {uint32_t(h), uint32_t(h >> 32), kRecordStream, 0u};
  uint32_t out[4];
  Philox4x32::generate(c, k, out);
  return uint64_t(out[0]) | (uint64_t(out[1]) << 32);
}

AnalysisPlan plan_analysis(const AnalysisOptions& o) {
  AnalysisPlan plan;
  // Settings to compare: formats x RHT sizes.
  for (size_t i = 0; i < o.formats.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (std::string(o.formats[j].name) == o.formats[i].name)
        usage_fault("--formats: " + std::string(o.formats[i].name) + " is given twice");
  if (o.formats.empty()) usage_fault("--formats lists no format");
  for (size_t i = 0; i < o.rht.size(); ++i) {
    const int d = o.rht[i];
    if (d != 0 && !rht_size_ok(d)) usage_fault("--rht: " + rht_size_fault(d) + " (none or 0: RHT off)");
    if (std::count(o.rht.begin(), o.rht.begin() + i, d) > 0)
      usage_fault("--rht: " + (d ? std::to_string(d) : std::string("none")) + " is given twice");
  }
  if (o.rht.empty()) usage_fault("--rht lists no setting");
  if (!block_size_ok(o.block)) usage_fault("--block: " + block_size_fault(o.block));
  plan.block = o.block;
  plan.scale = o.scale;
  for (const ElemFormat& f : o.formats)
    for (int d : o.rht) {
      AnalysisSetting s;
      s.format = f;
      s.rht = d;
      s.block = plan.block;
      s.scale = plan.scale;
      if (d != 0 && !o.rht_signs) {
        s.rht_signs = d == 16 ? rht_signs_te(16) : rht_signs_from_seed(d, o.rht_seed);
      } else if (d != 0 && o.rht_signs->te) {
        try {
          s.rht_signs = rht_signs_te(d);
        } catch (const std::invalid_argument& e) {
          usage_fault(std::string("--rht-signs te: ") + e.what());
        }
      } else if (d != 0) {
        const std::vector<float>& v = o.rht_signs->signs;
        for (size_t i = 0; i < v.size(); ++i)
          if (v[i] != 1.0f && v[i] != -1.0f)
            usage_fault("--rht-signs: sign " + std::to_string(i + 1) + " is not +1 or -1");
        if (int(v.size()) != d)
          usage_fault("--rht-signs gives " + std::to_string(v.size()) + " signs but the RHT size is " +
                      std::to_string(d));
        s.rht_signs = v;
      }
      plan.settings.push_back(s);
    }
  if (o.recipes)
    for (const std::string& name : *o.recipes) {
      try {
        plan.recipes.push_back(Recipe::preset(name));
      } catch (const std::invalid_argument& e) {
        usage_fault(std::string("--recipe: ") + e.what());
      }
      plan.recipes.back().seed = o.seed;
      plan.recipes.back().sr_draw = o.sr_draw;
    }
  // Knob combinations are usage faults, found on a shape every valid knob accepts (as operand_config does).
  for (const AnalysisSetting& s : plan.settings) {
    try {
      validate(s.config(), 16, 128);
    } catch (const std::invalid_argument& e) {
      usage_fault(std::string(e.what()) + " (setting " + s.label() + ")");
    }
  }
  for (int d : o.rht)
    if (d) {
      plan.inversion_rht = d;
      break;
    }
  return plan;
}

TraceAnalysis::TraceAnalysis(std::vector<std::string> traces, AnalysisPlan plan)
    : traces_(std::move(traces)), plan_(std::move(plan)) {
  for (const auto& p : traces_) {
    open_.push_back(std::make_unique<io::Trace>(p, plan_.block));  // validates every header and shape up front
    if (open_.back()->records().empty()) data_fault(p, "the trace holds no GEMM records");
  }
  std::map<std::string, std::string> seen;  // a record's file, canonical -> as given: one file analysed once
  for (size_t ti = 0; ti < open_.size(); ++ti)
    for (const io::TraceRecord& r : open_[ti]->records()) {
      std::error_code ec;
      const std::string canon = std::filesystem::weakly_canonical(r.file, ec).string() + "\n" + r.gemm;
      if (auto [it, fresh] = seen.emplace(ec ? r.file + "\n" + r.gemm : canon, r.file); !fresh)
        usage_fault("--trace: gemm '" + r.gemm + "' of " + r.file + " is given twice (also as " + it->second + ")");
      refs_.push_back({ti, &r});
    }
}

TraceAnalysis::~TraceAnalysis() = default;

std::vector<uint64_t> TraceAnalysis::record_sizes() const {
  std::vector<uint64_t> sizes;
  for (const Ref& ref : refs_) {
    const io::TraceRecord& r = *ref.rec;
    sizes.push_back(uint64_t(r.tokens * r.in + r.out * r.in + r.tokens * r.out));
  }
  return sizes;
}

std::vector<std::string> TraceAnalysis::inputs() const {
  std::vector<std::string> in(traces_.begin(), traces_.end());
  for (const Ref& ref : refs_) in.push_back(ref.rec->file);
  return in;
}

void TraceAnalysis::validate() const {
  for (const Ref& ref : refs_) {
    const io::TraceRecord& rec = *ref.rec;
    for (Pass pass : kPasses) {
      const PassGeometry g = pass_geometry(pass, rec.tokens, rec.in, rec.out);
      struct Use {
        std::string what;
        QuantConfig cfg;
        Operand operand;
      };
      std::vector<Use> uses;
      for (Operand o : {Operand::a, Operand::b}) {
        for (const AnalysisSetting& s : plan_.settings) uses.push_back({s.label(), s.config(), o});
        for (const Recipe& r : plan_.recipes) uses.push_back({"recipe " + r.name, r.operand(pass, o, 0), o});
      }
      for (const Use& u : uses) {
        const int64_t rows = u.operand == Operand::a ? g.M : g.N;
        try {
          fp4lab::validate(u.cfg, rows, g.K);
        } catch (const std::invalid_argument& e) {
          data_fault(rec.file, "gemm '" + rec.gemm + "' " + pass_name(pass) +
                                                  " operand " + (u.operand == Operand::a ? "A" : "B") + " [" +
                                                  std::to_string(rows) + ", " + std::to_string(g.K) + "] under " +
                                                  u.what + ": " + e.what());
        }
      }
    }
  }
}

RecordBatch TraceAnalysis::analyze(const std::vector<size_t>& my, const AnalysisProgress& progress) const {
  const std::vector<AnalysisSetting>& settings = plan_.settings;
  const std::vector<Recipe>& recipes = plan_.recipes;
  const bool multi = traces_.size() > 1;  // entries then name their folder
  // All the records' work as one task list that both threads take from in order: per record its load (with the
  // transposed operands), its three float64 reference products, then every (setting or recipe, pass), heaviest
  // first -- with RHT, and of fwd_y (two tensors' statistics) -- so that no thread waits at the end of each record
  // while the other finishes, and the next record loads while this one computes. Every (setting or recipe, pass)
  // is independent (the inner OpenMP regions then run serially); a task waits only for its record's load and its
  // pass's reference, both handed out before it (the schedule goes in order). At most about two records are in
  // memory: a record's operands are freed by its last task.
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
    std::vector<LayerResults> by_task;       // a recipe task's one GEMM in gemms
    RecordResult result;                     // made from by_task by the record's last slot
    std::vector<std::exception_ptr> faults;  // [0] the load, [1..3] the references, [4 + t] task t
    bool skipped = false;                    // not loaded: an earlier record failed
    std::atomic<bool> loaded{false}, ref_ready[3] = {false, false, false};
    std::atomic<size_t> left{0};  // slots after the load still running
    std::atomic<bool> freed{false};  // its operands are gone (its last slot ended)
  };
  std::vector<uint64_t> sizes;  // elements of each record's three tensors
  for (size_t ri : my) {
    const io::TraceRecord& r = *refs_[ri].rec;
    sizes.push_back(uint64_t(r.tokens * r.in + r.out * r.in + r.tokens * r.out));
  }
  // What a large record's analysis holds beside its operands is kept to about half of them as FP32 (2 bytes per
  // element), shared by the running threads: on a large FP32 record a task's share, not every job's quantised B
  // nor a whole reference, then sets the peak (1.85 times a 32 MiB record above the binary's footprint, 1.64 at
  // 48 MiB; holding them took 3.4 and 2.5). The cost is time: a pass's reference made again for each group of
  // jobs (2.6 times the wall time at 48 MiB, 1.4 at 80 MiB).
  const double threads = std::max(1, omp_get_max_threads());
  auto share = [&](size_t k) { return 2.0 * double(sizes[k]) / threads; };  // bytes per running task
  // A pass is analysed in panels by its reference slot, all jobs together (analyze_pass_in_panels: its reference
  // and outputs are never whole in memory), where its float64 reference (8 bytes per output) is over 32 MB and
  // with the FP32 outputs of two running tasks (4 bytes per output each) would outweigh every job's quantised B
  // (under 1.25 bytes per element; A is quantised a panel at a time), or where the reference and one output
  // (12 bytes per output) are over 16 MB and over the task's share. Others keep one task per job, their reference
  // made once and held.
  auto in_panels = [&](size_t k, size_t pi) {
    const io::TraceRecord& rec = *refs_[my[k]].rec;
    const PassGeometry g = pass_geometry(kPasses[pi], rec.tokens, rec.in, rec.out);
    const double ref = 8.0 * double(g.M) * double(g.N), operand_b = double(g.N) * double(g.K);
    return (ref > 32e6 && 2 * ref > operand_b * double(settings.size() + recipes.size())) ||
           1.5 * ref > std::max(16e6, share(k));
  };
  // In panels a job holds its quantised B (1.25 bytes per element) and, while it multiplies, a packed copy (1.5):
  // jobs go in groups whose B fit the task's share beside one packed B and a panel (at least one job a group,
  // each group making the reference panels again), and panels hold at most an eighth of the share.
  auto panel_setup = [&](size_t k, LayerOperands& lo) {
    const io::TraceRecord& rec = *refs_[my[k]].rec;
    const double b_max = double(std::max(rec.out, rec.tokens)) * double(rec.in);
    const double fit = (share(k) * 7 / 8 - 1.5 * b_max) / 1.25;
    lo.panels.group = std::min(lo.panels.group, int64_t(std::max(0.0, fit)));
  };
  auto panel_rows = [&](size_t k, size_t pi) {  // 0: analyze_pass_in_panels' own (about 4 MB)
    const io::TraceRecord& rec = *refs_[my[k]].rec;
    const PassGeometry g = pass_geometry(kPasses[pi], rec.tokens, rec.in, rec.out);
    const double panel = share(k) / 8;
    return panel >= double(4 << 20) ? int64_t(0) : std::max<int64_t>(16, int64_t(panel / (12.0 * double(g.N))));
  };
  const size_t per = 4 + tasks;
  std::vector<RecordWork> work(my.size());
  // A record's recipes draw SR under a seed from its identity (record_sr_seed), as GEMM 0: never from its place
  // among the records, so that what else is analysed with it cannot change its figures.
  auto keyed = [&](const Recipe& r, size_t k) {
    const Ref& ref = refs_[my[k]];
    Recipe out = r;
    out.seed = record_sr_seed(r.seed, ref.rec->gemm, open_[ref.trace]->metadata(ref.rec->file));
    return out;
  };
  constexpr double kOverlapBytes = 256e6;
  for (RecordWork& w : work) {
    w.by_task.resize(tasks);
    w.faults.resize(per);
    w.left = per - 1;
  }
  // Analysis stops at the first fault, as one process going in order does: records after it are skipped.
  std::atomic<size_t> first_fault{SIZE_MAX};
  auto note_fault = [&](size_t k) {
    for (size_t f = first_fault.load(); k < f && !first_fault.compare_exchange_weak(f, k);) {
    }
  };
  // A record's task results in report order: per setting its tensors and GEMMs, then its recipe GEMMs. Made by the
  // record's last slot, so that a long trace holds each record's compact result rather than all its task results.
  auto finish = [&](size_t k) {
    const size_t ri = my[k];
    const io::TraceRecord& rec = *refs_[ri].rec;
    const size_t trace = refs_[ri].trace;
    const std::string gname = multi ? folder_name(traces_[trace]) + ":" + rec.gemm : rec.gemm;
    std::vector<LayerResults>& by_task = work[k].by_task;
    RecordResult out;
    out.elements = rec.tokens * rec.in + rec.out * rec.in + rec.tokens * rec.out;
    out.tensor_rows.resize(3);
    out.gemm_rows.resize(3);
    std::map<std::string, double> sqnr_no_rht;  // format/role -> SQNR without RHT, for the delta
    // Every task succeeded (finish runs only then), so each recipe task holds its GEMM.
    std::vector<LayerResults> by_setting(settings.size());
    std::vector<std::vector<GemmResult>> by_recipe(recipes.size());
    for (size_t t = 0; t < tasks; ++t) {
      const size_t job = t / 3;
      if (job < settings.size()) by_setting[job].append(std::move(by_task[t]));
      else by_recipe[job - settings.size()].push_back(std::move(by_task[t].gemms.front()));
    }
    for (size_t si = 0; si < settings.size(); ++si) {
      for (TensorResult& t : by_setting[si].tensors) {
        AnalysisRow& row = out.tensor_rows[t.role == "fwd_x" ? 0 : t.role == "fwd_w" ? 1 : 2];
        row.gemm = gname;
        row.what = t.role;
        row.sqnr.push_back(t.sqnr_db);
        row.beff.push_back(t.beff);
        TensorEntry e;
        e.trace = trace;
        e.gemm = rec.gemm;
        const std::string key = t.format + "/" + t.role;
        if (t.rht == 0) sqnr_no_rht[key] = t.sqnr_db;
        else if (sqnr_no_rht.count(key)) e.delta_sqnr_db = t.sqnr_db - sqnr_no_rht[key];
        e.tokens = rec.tokens;
        e.t = std::move(t);
        out.tensors.push_back(std::move(e));
      }
      for (GemmResult& g : by_setting[si].gemms) {
        AnalysisRow& row = out.gemm_rows[g.pass == "fwd_y" ? 0 : g.pass == "bwd_dx" ? 1 : 2];
        row.gemm = gname;
        row.what = g.pass;
        row.sqnr.push_back(g.sqnr_db);
        row.eta.push_back(g.eta);
        out.gemms.push_back({trace, rec.gemm, std::move(g)});
      }
    }
    for (auto& rg : by_recipe)
      for (GemmResult& g : rg) out.gemms.push_back({trace, rec.gemm, std::move(g)});
    work[k].result = std::move(out);
    by_task = std::vector<LayerResults>();
  };
  std::atomic<size_t> done{0};
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t g = 0; g < my.size() * per; ++g) {
    const size_t k = g / per, slot = g % per, ri = my[k];
    RecordWork& w = work[k];
    const io::TraceRecord& rec = *refs_[ri].rec;
    if (slot == 0) {  // the load: every other slot of the record waits for it, so it always signals
      // A record loads while the one before it computes, unless the two together are large: their FP32 operands
      // and transposes (8 bytes per element each) would then double the memory a large trace needs. It waits for
      // the record before to free its operands instead; that record's slots were all handed out before this one,
      // so the wait ends, and the cost is an idle thread during a large record's last task.
      if (k > 0 && 8.0 * double(sizes[k] + sizes[k - 1]) > kOverlapBytes)
        while (!work[k - 1].freed.load(std::memory_order_acquire)) std::this_thread::yield();
      if (k > first_fault.load()) {
        w.skipped = true;
      } else {
        try {
          const size_t started = ++done;
          if (progress) progress(started, my.size(), rec.gemm);
          // A large BF16 tensor stays BF16 in memory and is widened a panel at a time, rather than copied to FP32
          // whole (twice its size): the tensors whose transposes are not held either.
          // Transposes are held up to 4 MB of floats: a larger one would add its size to the record's.
          constexpr int64_t kHeld = int64_t(1) << 20;
          io::Trace::Layer& ly = w.layer;
          ly = open_[refs_[ri].trace]->load(rec, uint64_t(kHeld));
          auto f32 = [](const std::vector<float>& v, const uint16_t* v16) { return v16 ? nullptr : v.data(); };
          w.lo = std::make_unique<LayerOperands>(
              LayerView{f32(ly.x, ly.x16), f32(ly.w, ly.w16), f32(ly.dy, ly.dy16), rec.tokens, rec.in, rec.out,
                        ly.x16, ly.w16, ly.dy16},
              /*with_refs=*/false, kHeld);
          panel_setup(k, *w.lo);
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
          const size_t pi = slot - 1;
          if (!in_panels(k, pi)) {
            w.lo->compute_ref(kPasses[pi]);
          } else {  // every job of the pass, here: its tasks find their results made
            std::vector<Recipe> rk;
            for (const Recipe& rc : recipes) rk.push_back(keyed(rc, k));
            std::vector<LayerResults> r = analyze_pass_in_panels(*w.lo, kPasses[pi], settings, rk, 0, panel_rows(k, pi));
            for (size_t job = 0; job < r.size(); ++job) w.by_task[job * 3 + pi] = std::move(r[job]);
          }
        } catch (...) {
          w.faults[slot] = std::current_exception();
          note_fault(k);
        }
      }
      w.ref_ready[slot - 1].store(true, std::memory_order_release);
    } else if (run && k <= first_fault.load() && !in_panels(k, order[slot - 4] % 3)) {
      const size_t t = order[slot - 4], job = t / 3, pi = t % 3;
      const Pass p = kPasses[pi];
      try {
        F32Buffer c;
        if (job < settings.size()) w.by_task[t] = analyze_setting_pass(*w.lo, settings[job], p, c);
        else
          w.by_task[t].gemms.push_back(
              analyze_recipe_pass(*w.lo, keyed(recipes[job - settings.size()], k), 0, p, c));
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
      w.freed.store(true, std::memory_order_release);
      // Not past the first fault: a later record's task slots were skipped, so it has no results to finish.
      if (run && k < first_fault.load() &&
          std::none_of(w.faults.begin(), w.faults.end(), [](const std::exception_ptr& f) { return bool(f); })) {
        try {
          finish(k);
        } catch (...) {  // out of memory: no exception may leave the parallel loop
          w.faults[0] = std::current_exception();
          note_fault(k);
        }
      }
    }
  }

  // The results, record by record, up to the first fault.
  RecordBatch batch;
  for (size_t k = 0; k < my.size(); ++k) {
    const size_t ri = my[k];
    const io::TraceRecord& rec = *refs_[ri].rec;
    try {
      if (work[k].faults[0]) std::rethrow_exception(work[k].faults[0]);
      for (size_t i = 1; i < per; ++i)
        if (work[k].faults[i]) {
          try {
            std::rethrow_exception(work[k].faults[i]);
          } catch (const std::exception& e) {
            data_fault(rec.file, "gemm '" + rec.gemm + "': " + e.what());
          }
        }
    } catch (...) {
      batch.fault_at = k;
      batch.fault = std::current_exception();
      break;
    }
    batch.results.push_back(std::move(work[k].result));
  }
  return batch;
}

AnalysisResult TraceAnalysis::merge(std::vector<RecordResult> results) const {
  AnalysisResult r;
  r.traces = traces_;
  r.plan = plan_;
  for (const RecordResult& rec : results) r.elements += rec.elements;
  r.records = std::move(results);
  const std::vector<AnalysisSetting>& settings = plan_.settings;
  // The decay, summed in record order and setting order as the rows were produced.
  std::map<std::string, double> log_eta_sum;
  for (const RecordResult& rec : r.records)
    for (const AnalysisRow& row : rec.gemm_rows)
      if (row.what == "fwd_y")
        for (size_t si = 0; si < settings.size(); ++si) log_eta_sum[settings[si].label()] += cr::log(row.eta[si]);
  for (const auto& [label, s] : log_eta_sum) r.decay[label] = cr::exp(s);

  // Where the paper's inversion appears: E2M1 ahead without RHT, E1M2 ahead with it.
  auto find = [&](const char* f, int d) -> int {
    for (size_t i = 0; i < settings.size(); ++i)
      if (std::string(settings[i].format.name) == f && settings[i].rht == d) return int(i);
    return -1;
  };
  const int d = plan_.inversion_rht;
  const int e2_0 = find("e2m1", 0), e2_r = find("e2m1", d), e1_0 = find("e1m2", 0), e1_r = find("e1m2", d);
  if (d && e2_0 >= 0 && e2_r >= 0 && e1_0 >= 0 && e1_r >= 0) {
    auto inverted = [&](const AnalysisRow& row) {
      return row.sqnr[size_t(e2_0)] > row.sqnr[size_t(e1_0)] && row.sqnr[size_t(e1_r)] > row.sqnr[size_t(e2_r)];
    };
    Inversion inv;
    inv.rht = d;
    for (const RecordResult& rec : r.records) {
      for (const AnalysisRow& row : rec.tensor_rows)
        if (inverted(row)) inv.tensors.push_back(row.gemm + "/" + row.what);
      inv.tensors_total += rec.tensor_rows.size();
    }
    for (const RecordResult& rec : r.records) {
      for (const AnalysisRow& row : rec.gemm_rows)
        if (inverted(row)) inv.gemms.push_back(row.gemm + "/" + row.what);
      inv.gemms_total += rec.gemm_rows.size();
    }
    r.inversion = std::move(inv);
  }
  return r;
}

AnalysisResult analyze_traces(const AnalysisOptions& o, const AnalysisProgress& progress,
                              const std::function<void(const TraceAnalysis&)>& before_work) {
  AnalysisPlan plan = plan_analysis(o);
  const TraceAnalysis ta(o.traces, std::move(plan));
  ta.validate();
  if (before_work) before_work(ta);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<size_t> all(ta.records());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  RecordBatch b = ta.analyze(all, progress);
  if (b.fault) std::rethrow_exception(b.fault);
  AnalysisResult r = ta.merge(std::move(b.results));
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace fp4lab
