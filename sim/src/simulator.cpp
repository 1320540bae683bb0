#include "fp4lab/sim/simulator.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <systemc>
#include <unordered_map>

#include "fp4lab/gemm.hpp"
#include "tcu.hpp"

// libsystemc's own main() refers to sc_main. fp4lab has its own main and drives the kernel with sc_start, so
// this entry point is only there for the linker; reaching it means something called libsystemc's main.
int sc_main(int, char**) { return 1; }

namespace fp4lab::sim {

bool mac_native(MacKind kind, const ElemFormat& f) {
  if (kind == MacKind::dual) return true;
  const bool e2m1_family = f.ebits == 2 && f.mbits == 1;  // e2m1, e2m1_max2
  const bool e1m2_family = f.ebits == 1 && f.mbits == 2;  // e1m2, int4 (the same integer grid)
  return kind == MacKind::e2m1 ? e2m1_family : e1m2_family;
}

namespace detail {

// Tile-level L2 and buffer keys: tensor id, tile row, k-step.
enum TensorId : uint64_t { kSrcA = 1, kSrcB, kRotA, kRotB, kQA, kQB, kOut, kUA, kUB };
inline uint64_t key(uint64_t tensor, int64_t row_tile, int64_t k_tile) {
  return (tensor << 48) | (uint64_t(row_tile) << 24) | uint64_t(k_tile);
}

enum class PhaseKind { amax, rht, quant, rht_quant, unpack, gemm };

// Bytes of the unpacked integer view of a quantised operand slice (one byte an element) and its FP32 block scales.
inline int64_t unpacked_bytes(const QuantConfig& q, int64_t rows, int64_t cols) {
  return rows * cols + rows * (cols / q.block) * 4;
}

struct OperandPlan {
  QuantConfig q;
  int64_t rows = 0;
  int tile_rows = 0;
  bool rht = false, sr = false, ue4m3 = false;
  int rht_stages = 0, rht_ops_per_elem = 0;
  uint64_t src = 0, rot = 0, qt = 0, u8 = 0;
};

struct Counters {  // work handed out by the scheduler, for the report
  double buf_read = 0, buf_write = 0;
};

class Plan {
 public:
  Plan(const Config& c, const GemmJob& j) : cfg(c), job(j) {
    for (int o = 0; o < 2; ++o) {
      OperandPlan& p = op[o];
      p.q = o == 0 ? j.a : j.b;
      p.rows = o == 0 ? j.M : j.N;
      p.tile_rows = o == 0 ? c.tile_m : c.tile_n;
      p.rht = p.q.rht > 0;
      p.sr = p.q.rounding == Rounding::sr;
      p.ue4m3 = p.q.scale == ScaleKind::ue4m3;
      if (p.rht) {
        int lg = 0;
        while ((1 << lg) < p.q.rht) ++lg;
        p.rht_stages = lg + 1;  // butterfly stages, then the 1/sqrt(d) multiply
        // 1/sqrt(d) is a power of two for d = 4^n (an exponent decrement); otherwise a real multiply.
        p.rht_ops_per_elem = lg + (lg % 2 == 0 ? 0 : 1);
      }
      p.src = o == 0 ? kSrcA : kSrcB;
      p.rot = o == 0 ? kRotA : kRotB;
      p.qt = o == 0 ? kQA : kQB;
      p.u8 = o == 0 ? kUA : kUB;
    }
    operands = j.kind == JobKind::quantize ? 1 : 2;
    unpack = c.unpack_launches > 0 && c.prep != PrepMode::frontend;
    mt = ceil_div(j.M, c.tile_m);
    nt = ceil_div(j.N, c.tile_n);
    kt = ceil_div(j.K, c.tile_k);
    int n_rht = 0, n_amax = 0;
    for (int o = 0; o < operands; ++o) {
      n_rht += op[o].rht;
      n_amax += op[o].ue4m3;
    }
    // One kernel per operand and pass (as fp4lab's CUDA quantiser runs), an unpack pass of unpack.launches
    // kernels, one GEMM kernel.
    auto add = [&](PhaseKind k, int kernels) {
      phases.push_back(k);
      launches.push_back(kernels);
    };
    const bool prep = j.kind == JobKind::step || j.kind == JobKind::quantize;
    if (prep) switch (c.prep) {
      case PrepMode::frontend:
        if (n_amax) add(PhaseKind::amax, n_amax);
        break;
      case PrepMode::fused:
        if (n_amax) add(PhaseKind::amax, n_amax);
        add(PhaseKind::rht_quant, operands);
        break;
      case PrepMode::unfused:
        if (n_rht) add(PhaseKind::rht, n_rht);
        if (n_amax) add(PhaseKind::amax, n_amax);
        add(PhaseKind::quant, operands);
        break;
      case PrepMode::none:
        break;
    }
    if (unpack && j.kind != JobKind::quantize && j.kind != JobKind::mma) add(PhaseKind::unpack, c.unpack_launches);
    if (j.kind != JobKind::quantize && j.kind != JobKind::unpack) add(PhaseKind::gemm, 1);
    // Grouped raster order: groups of raster_group tile rows, column by column inside a group.
    for (int64_t g = 0; g < mt; g += c.raster_group)
      for (int64_t n = 0; n < nt; ++n)
        for (int64_t m = g; m < std::min<int64_t>(g + c.raster_group, mt); ++m) tiles.emplace_back(m, n);
    // Operand buffer: the streaming slots come first; what is left holds whole operand panels (tile rows x K,
    // quantised) for reuse by the TCU's next tiles.
    const int64_t slot = c.prep == PrepMode::frontend
                             ? int64_t(c.tile_m + c.tile_n) * c.tile_k * c.input_bytes
                             : gemm_bytes(op[0].q, c.tile_m, c.tile_k) + gemm_bytes(op[1].q, c.tile_n, c.tile_k);
    resident_bytes = std::max<int64_t>(0, c.buffer_bytes - int64_t(c.buffer_slots) * slot);
    panel_bytes[0] = gemm_bytes(op[0].q, std::min<int64_t>(c.tile_m, j.M), j.K);
    panel_bytes[1] = gemm_bytes(op[1].q, std::min<int64_t>(c.tile_n, j.N), j.K);
  }
  // Bytes of an operand slice as the GEMM reads it: unpacked integer views, or the packed quantised operand.
  int64_t gemm_bytes(const QuantConfig& q, int64_t rows, int64_t cols) const {
    return unpack ? unpacked_bytes(q, rows, cols) : quantised_bytes(q, rows, cols);
  }

  const Config& cfg;
  const GemmJob& job;
  OperandPlan op[2];
  int64_t mt = 0, nt = 0, kt = 0;
  int operands = 2;     // 1: operand A alone (a quantise kernel)
  bool unpack = false;  // the GEMM reads unpacked integer views
  std::vector<PhaseKind> phases;
  std::vector<int> launches;  // kernels each phase launches
  std::vector<std::pair<int64_t, int64_t>> tiles;
  int64_t resident_bytes = 0, panel_bytes[2] = {0, 0};
  Counters counters;

  // The tokens TCU `tcu` takes through phase `phase`, made as the scheduler hands them on.
  Generator<Token> emit(size_t phase, int tcu) {
    return phases[phase] == PhaseKind::gemm ? emit_gemm(tcu) : emit_pass(phases[phase], tcu);
  }

 private:
  int64_t tk_at(int64_t kk) const { return std::min<int64_t>(cfg.tile_k, job.K - kk * cfg.tile_k); }
  int64_t rows_at(int o, int64_t r) const {
    return std::min<int64_t>(op[o].tile_rows, op[o].rows - r * op[o].tile_rows);
  }

  void add_read(Token& t, uint64_t k, int64_t bytes) {
    t.rd[t.nrd++] = {k, bytes};
  }
  void add_quant(Token& t, const OperandPlan& p, int64_t elems) {
    if (!p.sr)
      t.q_elems += elems;
    else
      t.q_sr_elems[int(p.q.sr_draw)] += elems;
  }
  void add_rht(Token& t, const OperandPlan& p, int64_t elems) {
    t.rht_elems += elems;
    t.rht_ops += elems * p.rht_ops_per_elem;
    t.rht_stages = std::max(t.rht_stages, p.rht_stages);
  }

  // A separate pass's work items over operand o: item_count(o) of them, item(o, i) = (key row, key column, rows,
  // columns). Tile-shaped (a tile's rows by a k-step) by default; with pass.elems, runs of that many consecutive
  // elements of the row-major operand, as a GPU kernel's CTAs cover it (the last run shorter).
  int64_t item_count(int o) const {
    return cfg.pass_elems > 0 ? ceil_div(op[o].rows * job.K, cfg.pass_elems) : ceil_div(op[o].rows, op[o].tile_rows) * kt;
  }
  std::array<int64_t, 4> item(int o, int64_t i) const {
    if (cfg.pass_elems > 0)
      return {i >> 20, i & ((int64_t(1) << 20) - 1), 1, std::min<int64_t>(cfg.pass_elems, op[o].rows * job.K - i * cfg.pass_elems)};
    const int64_t r = i / kt, kk = i % kt;
    return {r, kk, rows_at(o, r), tk_at(kk)};
  }

  // A work item's share of its TCU's units, in units of one slot's: the TCU's slots that have work split them
  // (slot s sits on TCU s mod tcu.count), so an item alone on its TCU runs at the whole TCU's rate, as a lone
  // CTA has its SM to itself. `items` work items dealt round-robin keep slots 0 .. items-1 busy. For a pass's
  // items this holds throughout; for GEMM tiles, in the last round (the tail wave).
  double share(int slot, int64_t items) const {
    const int per = cfg.tcus / cfg.ctas, tcu = slot % per;
    int busy = 0;
    for (int k = 0; k < cfg.ctas; ++k) busy += int64_t(tcu) + int64_t(k) * per < items;
    return double(cfg.ctas) / std::max(busy, 1);
  }

  Generator<Token> emit_pass(PhaseKind kind, int tcu) {
    const bool unfused = cfg.prep == PrepMode::unfused;
    auto takes_part = [&](int o) {
      return !(kind == PhaseKind::amax && !op[o].ue4m3) && !(kind == PhaseKind::rht && !op[o].rht);
    };
    int64_t items = 0;
    for (int o = 0; o < operands; ++o)
      if (takes_part(o)) items += item_count(o);
    const double my_share = share(tcu, items);
    int64_t before = 0;  // items of the operands before this one: items are dealt round-robin across both
    for (int o = 0; o < operands; ++o) {
      const OperandPlan& p = op[o];
      if (!takes_part(o)) continue;
      const int64_t n = item_count(o), first = ((tcu - before) % cfg.tcus + cfg.tcus) % cfg.tcus;
      before += n;
      for (int64_t i = first; i < n; i += cfg.tcus) {
        const auto [r, kk, rows, cols] = item(o, i);
        const int64_t elems = rows * cols, raw = elems * cfg.input_bytes;
        Token t;
        t.kind = Token::Kind::chunk;
        t.credit = true;
        t.share = my_share;
        t.buf_write = t.buf_read = raw;
        switch (kind) {
          case PhaseKind::amax:  // the per-tensor amax of NVFP4's global scale (of the rotated values)
            add_read(t, key(unfused && p.rht ? p.rot : p.src, r, kk), raw);
            if (!unfused && p.rht) add_rht(t, p, elems);
            t.q_elems = elems;
            break;
          case PhaseKind::rht:
            add_read(t, key(p.src, r, kk), raw);
            add_rht(t, p, elems);
            t.wr_key = key(p.rot, r, kk);
            t.wr_bytes = raw;
            break;
          case PhaseKind::quant:
            add_read(t, key(p.rht ? p.rot : p.src, r, kk), raw);
            add_quant(t, p, elems);
            t.wr_key = key(p.qt, r, kk);
            t.wr_bytes = quantised_bytes(p.q, rows, cols);
            break;
          case PhaseKind::rht_quant:
            add_read(t, key(p.src, r, kk), raw);
            if (p.rht) add_rht(t, p, elems);
            add_quant(t, p, elems);
            t.wr_key = key(p.qt, r, kk);
            t.wr_bytes = quantised_bytes(p.q, rows, cols);
            break;
          case PhaseKind::unpack:  // packed codes and scales in, one-byte integers and FP32 scales out
            add_read(t, key(p.qt, r, kk), quantised_bytes(p.q, rows, cols));
            t.wr_key = key(p.u8, r, kk);
            t.wr_bytes = unpacked_bytes(p.q, rows, cols);
            t.buf_write = t.buf_read = t.wr_bytes;
            break;
          case PhaseKind::gemm:
            break;
        }
        counters.buf_write += double(t.buf_write);
        counters.buf_read += double(t.buf_read);
        co_yield t;
      }
    }
  }

  Generator<Token> emit_gemm(int tcu) {
    const bool frontend = cfg.prep == PrepMode::frontend;
    Lru resident(resident_bytes);  // operand panels kept in this TCU's buffer between tiles
    const size_t slots = size_t(cfg.tcus), last_round = (tiles.size() - 1) / slots * slots;
    const double tail_share = share(tcu, int64_t(tiles.size() - last_round));
    for (size_t i = size_t(tcu); i < tiles.size(); i += slots) {
      const auto [mi, ni] = tiles[i];
      const double tile_share = i >= last_round ? tail_share : 1.0;
      const int64_t idx[2] = {mi, ni};
      const int64_t rows[2] = {rows_at(0, mi), rows_at(1, ni)};
      const bool res[2] = {resident.hit(key(kQA, mi, 0)), resident.hit(key(kQB, ni, 0))};
      for (int64_t kk = 0; kk < kt; ++kk) {
        const int64_t tk = tk_at(kk);
        Token t;
        t.kind = Token::Kind::step;
        t.m0 = mi * cfg.tile_m;
        t.n0 = ni * cfg.tile_n;
        t.k0 = kk * cfg.tile_k;
        t.tm = int(rows[0]);
        t.tn = int(rows[1]);
        t.tk = int(tk);
        t.first_k = kk == 0;
        t.last_k = kk == kt - 1;
        for (int o = 0; o < 2; ++o) {
          const OperandPlan& p = op[o];
          const int64_t qbytes = gemm_bytes(p.q, rows[o], tk);
          t.buf_read += qbytes;  // the MAC array reads both tiles every k-step
          if (res[o]) continue;
          const int64_t elems = rows[o] * tk;
          if (frontend) {
            add_read(t, key(p.src, idx[o], kk), elems * cfg.input_bytes);
            if (p.rht) add_rht(t, p, elems);
            add_quant(t, p, elems);
          } else {
            add_read(t, key(unpack ? p.u8 : p.qt, idx[o], kk), qbytes);
          }
          t.buf_write += qbytes;
        }
        t.credit = t.nrd > 0;
        t.share = tile_share;
        t.beats = rows[0] * rows[1] * (tk / kMacWidth);
        t.acc_ops = rows[0] * rows[1] * (tk / op[0].q.block) + (t.last_k ? rows[0] * rows[1] : 0);
        t.fused = fused_form_kinds(op[0].q.scale, op[1].q.scale);
        t.wr_key = key(kOut, mi, ni);
        t.wr_bytes = rows[0] * rows[1] * cfg.output_bytes;
        counters.buf_read += double(t.buf_read);
        counters.buf_write += double(t.buf_write);
        co_yield t;
      }
      resident.insert(key(kQA, mi, 0), panel_bytes[0]);
      resident.insert(key(kQB, ni, 0), panel_bytes[1]);
    }
  }
};

class Scheduler {
 public:
  TokenQueue* out = nullptr;
  Barrier* barrier = nullptr;
  Event go;  // a job starts
  Plan* plan = nullptr;
  int index = 0;
  Proc proc;
  explicit Scheduler(Clock clk) : clk_(clk) {}
  void start() { clk_.k->start(proc, run()); }

 private:
  Clock clk_;
  Task run() {
    while (true) {
      co_await clk_.k->wait(go);
      for (size_t ph = 0; ph < plan->phases.size(); ++ph) {
        co_await clk_.cycles(plan->launches[ph] * plan->cfg.launch_cycles());  // the phase's kernel launches
        for (Generator<Token> g = plan->emit(ph, index); g.next();) {
          while (out->full()) co_await out->space();
          out->push(std::move(g.value()));
        }
        Token m;
        m.kind = Token::Kind::marker;
        m.ready = clk_.now();
        while (out->full()) co_await out->space();
        out->push(std::move(m));
        co_await clk_.k->wait(barrier->evs[size_t(index)]);
      }
    }
  }
};

struct Tcu {
  TokenQueue q_sched, q_fetch, q_rht, q_quant, q_mac, q_acc;
  Credits slots, accs;
  std::unique_ptr<Scheduler> sched;
  std::unique_ptr<Fetch> fetch;
  std::unique_ptr<RhtUnit> rht;
  std::unique_ptr<Quantiser> quant;
  std::unique_ptr<MacArray> mac;
  std::unique_ptr<Accumulator> acc;
  std::unique_ptr<WriteBack> wb;
  Tcu(int i, const Config& c, Clock clk, Memory& mem, Barrier& bar, Functional& fn)
      : q_sched(*clk.k, 1), q_fetch(*clk.k, 1), q_rht(*clk.k, 1), q_quant(*clk.k, 1), q_mac(*clk.k, 1),
        q_acc(*clk.k, 1), slots(*clk.k, c.buffer_slots), accs(*clk.k, c.acc_tiles) {
    sched = std::make_unique<Scheduler>(clk);
    fetch = std::make_unique<Fetch>(clk);
    rht = std::make_unique<RhtUnit>(clk, c);
    quant = std::make_unique<Quantiser>(clk, c);
    mac = std::make_unique<MacArray>(clk, c);
    acc = std::make_unique<Accumulator>(clk, c);
    wb = std::make_unique<WriteBack>(clk);
    sched->out = &q_sched;
    sched->barrier = &bar;
    sched->index = i;
    fetch->in = &q_sched;
    fetch->out = &q_fetch;
    fetch->slots = &slots;
    fetch->mem = &mem;
    rht->in = &q_fetch;
    rht->out = &q_rht;
    quant->in = &q_rht;
    quant->out = &q_quant;
    mac->in = &q_quant;
    mac->out = &q_mac;
    mac->slots = &slots;
    mac->fn = &fn;
    acc->in = &q_mac;
    acc->out = &q_acc;
    acc->accs = &accs;
    acc->fn = &fn;
    wb->in = &q_acc;
    wb->accs = &accs;
    wb->barrier = &bar;
    wb->fn = &fn;
    wb->mem = &mem;
    // Each thread runs to its first wait (SystemC's initialisation phase).
    sched->start();
    fetch->start();
    rht->start();
    quant->start();
    mac->start();
    acc->start();
    wb->start();
  }
  void reset() {
    fetch->reset();
    rht->reset();
    quant->reset();
    mac->reset();
    acc->reset();
    wb->reset();
  }
};

struct Model {
  sc_core::sc_simcontext* context = nullptr;  // SystemC's, for a datapath that elaborates modules (the RTL)
  Kernel kernel;                              // the TCU model's (destroyed after the units waiting in it)
  Clock clk;
  std::unique_ptr<Memory> mem;
  std::unique_ptr<Barrier> barrier;
  std::vector<std::unique_ptr<Tcu>> tcus;
  Functional fn;
};

}  // namespace detail

namespace {
std::atomic<bool> g_alive{false};

// Simulator::cache_jobs: reports of timing-only jobs by their timing inputs (timing_key).
struct JobCache {
  struct Entry {
    JobReport r;
    JobCounters work;
  };
  bool on = false;
  uint64_t hits = 0;
  std::unordered_map<std::string, Entry> map;
  static constexpr size_t kMaxEntries = 200000;  // a few kB each; a sweep that outgrows it starts afresh
  void store(const std::string& k, const JobReport& r, const JobCounters& w) {
    if (map.size() >= kMaxEntries) map.clear();
    map.emplace(k, Entry{r, w});
  }
};
JobCache& job_cache() {
  static JobCache c;
  return c;
}

// Everything a timing-only job's cycles, stalls, busy shares and bytes depend on: the configuration less the keys
// that only price it (energy.*, area.*), its name, and mac.kind (the model sees it only as `native`); the job's
// kind, shape and operand formats and SR draws (not its SR seeds or RHT signs: timing never reads values); and the cycle it
// starts at.
std::string timing_key(const Config& cfg, const GemmJob& job, bool native, int64_t t0) {
  nlohmann::json c = cfg.to_json();
  for (auto it = c.begin(); it != c.end();) {
    const std::string& k = it.key();
    if (k.rfind("energy.", 0) == 0 || k.rfind("area.", 0) == 0 || k == "name" || k == "mac.kind")
      it = c.erase(it);
    else
      ++it;
  }
  std::ostringstream o;
  o << c.dump() << '|' << native << '|' << t0 << '|' << int(job.kind) << '|' << job.M << 'x' << job.N << 'x' << job.K;
  for (const QuantConfig* q : {&job.a, &job.b})
    o << '|' << q->format.name << ',' << q->block << ',' << q->tile2d << ',' << int(q->scale) << ',' << q->rht << ','
      << q->rht_bf16 << ',' << int(q->rounding) << ',' << int(q->sr_draw);
  return o.str();
}
}  // namespace

bool Simulator::cache_jobs(bool on) {
  const bool was = job_cache().on;
  job_cache().on = on;
  if (!on) job_cache().map.clear();
  return was;
}

uint64_t Simulator::cached_jobs() { return job_cache().hits; }

// The model runs on the per-slot configuration: tcu.count x tcu.ctas TCUs, each with its share of the units.
Simulator::Simulator(const Config& cfg, std::shared_ptr<Datapath> datapath)
    : cfg_(cfg), slot_((cfg.validate(), cfg.per_slot())), dp_(std::move(datapath)) {
  if (!dp_) throw std::invalid_argument("Simulator needs a Datapath");
  if (g_alive.exchange(true)) throw std::invalid_argument("only one fp4lab::sim::Simulator may exist at a time");
  using namespace sc_core;
  model_ = std::make_unique<detail::Model>();
  // A fresh kernel context, so that this process can elaborate a new module hierarchy.
  model_->context = new sc_simcontext();
  sc_curr_simcontext = model_->context;
  sc_default_global_context = model_->context;
  // 1 ps, the time precision of the Verilated RTL too. Units count whole cycles (Clock), so rounding the period
  // to picoseconds (546 ps at 1.83 GHz) changes no cycle count; reported times use the exact clock.
  sc_set_time_resolution(1, SC_PS);
  model_->clk.k = &model_->kernel;
  model_->clk.period = std::max<uint64_t>(1, uint64_t(std::llround(1e3 / slot_.clock_ghz)));
  model_->mem = std::make_unique<detail::Memory>(slot_);
  model_->barrier = std::make_unique<detail::Barrier>(slot_.tcus, model_->clk);
  model_->fn.dp = dp_.get();
  dp_->elaborate();
  for (int i = 0; i < slot_.tcus; ++i)
    model_->tcus.push_back(
        std::make_unique<detail::Tcu>(i, slot_, model_->clk, *model_->mem, *model_->barrier, model_->fn));
  // The model's threads have run to their first wait (Tcu). A datapath's SystemC modules (the RTL) run their
  // initialisation phase; with none, there is nothing for SystemC to run.
  if (!sc_get_top_level_objects().empty()) sc_start(SC_ZERO_TIME);
}

Simulator::~Simulator() {
  if (model_) {
    sc_core::sc_simcontext* ctx = model_->context;
    dp_->unelaborate();
    model_->tcus.clear();
    model_->barrier.reset();
    model_->mem.reset();
    model_.reset();
    delete ctx;
    sc_core::sc_curr_simcontext = nullptr;
    sc_core::sc_default_global_context = nullptr;
  }
  g_alive = false;
}

double Simulator::datapath_seconds() const { return model_->fn.seconds; }

JobReport Simulator::run(const GemmJob& job) { return run_impl(job, nullptr, nullptr, nullptr); }

JobReport Simulator::run(const GemmJob& job, const QTensor& a, const QTensor& b, std::vector<float>& c) {
  if (a.rows != job.M || b.rows != job.N || a.cols != job.K || b.cols != job.K)
    throw std::invalid_argument(job.name() + ": operand shapes do not match the job's M, N, K");
  check_gemm_operands(a, b);
  return run_impl(job, &a, &b, &c);
}

// Simulated time is SystemC's 64-bit picosecond counter and cycles are int64: a job that could run past either
// (a huge shape on a slow memory) would wrap and report a small cycle count. It is refused before it runs,
// against a generous bound: every k-step tile paying every unit's occupancy and latency in series, with the
// memory shared by all TCUs, plus the separate passes over both operands and the output write-back.
void Simulator::check_time_range(const GemmJob& job, bool native, int64_t t0) const {
  const Config& c = slot_;
  const double mt = std::ceil(double(job.M) / c.tile_m), nt = std::ceil(double(job.N) / c.tile_n),
               kt = std::ceil(double(job.K) / c.tile_k);
  const double tiles = mt * nt * kt;
  const double bw = c.l2.bytes > 0 ? std::min(c.dram.bandwidth, c.l2.bandwidth) : c.dram.bandwidth;
  const double elems = (double(c.tile_m) + c.tile_n) * c.tile_k;
  const double blocks = double(c.tile_m) * c.tile_n * c.tile_k / kMacWidth;
  const double rate = native ? double(c.mac_units) : c.mac_units * c.mac_fallback_rate;
  const double latency = double(c.dram.latency) + double(c.l2.latency) + 8.0 * c.rht_stage_latency + c.quant_latency +
                         c.mac_latency + c.acc_latency + 1;
  const double per_tile = elems * (c.input_bytes + 1) * c.tcus / bw + elems / c.rht_lanes +
                          elems / std::min(c.quant_lanes, c.quant_sr_lanes) + blocks / rate +
                          blocks / std::min(c.acc_lanes, c.acc_fused_lanes) + latency + c.tcus;
  const double operands = (double(job.M) + double(job.N)) * double(job.K);
  const double passes = 4 * operands * (c.input_bytes + 1) / bw + 4 * operands;  // amax, RHT, quantise passes
  const double out = double(job.M) * double(job.N) * c.output_bytes * c.tcus / bw + mt * nt * latency;
  const double cycles = double(t0) + 2 * (tiles * per_tile + passes + out);
  const double period_ps = std::max(1.0, std::round(1e3 / c.clock_ghz));
  constexpr double kLimit = 4.0e18;  // below 2^63 (cycles) and 2^64 (picoseconds), with margin
  constexpr double kMaxTiles = double(1 << 28);  // the plan lists every output tile; beyond this a run takes hours
  if (!(tiles < kMaxTiles) || !(cycles < kLimit) || !(cycles * period_ps < kLimit)) {
    std::ostringstream o;
    o << job.name() << ": too large to simulate: " << tiles << " k-step tiles and up to " << cycles
      << " cycles at " << c.clock_ghz << " GHz (limits 2^28 tiles, 4e18 cycles and 4e18 ps of simulated time; "
      << "raise dram.bandwidth or split the job)";
    throw std::invalid_argument(o.str());
  }
}

// The energy of a simulated job from the work it did (also for a job answered from the cache, priced with this
// configuration's energy table and area).
void Simulator::price(JobReport& r, const JobCounters& k) const {
  r.energy_pj.clear();
  r.energy_total_pj = 0;
  const Energy& e = slot_.energy;
  const double mac_pj = !r.native                         ? e.mac_fallback
                        : slot_.mac_kind == MacKind::dual ? e.mac_dual
                        : slot_.mac_kind == MacKind::e2m1 ? e.mac_e2m1
                                                         : e.mac_e1m2;
  r.energy_pj = {{"mac", k.blocks * kMacWidth * mac_pj},
                 {"acc", k.acc_ops * e.acc_op},
                 {"rht", k.rht_ops * e.rht_add},
                 {"quant", (k.q_elems + k.sr_elems) * e.quant_elem + k.sr_draws * e.sr_elem},
                 {"dram", (k.dram_read + k.dram_write) * e.dram_byte},
                 {"l2", (k.l2_read + k.l2_write) * e.l2_byte},
                 {"buffer", (k.buf_read + k.buf_write) * e.buffer_byte}};
  // Leakage of every built unit for the job's whole time (mW x us = nJ), whether the unit works or idles.
  if (cfg_.energy.leak_mw_per_mm2 > 0) r.energy_pj["static"] = cfg_.static_mw() * r.time_us * 1e3;
  for (const auto& [key, v] : r.energy_pj) r.energy_total_pj += v;
}

JobReport Simulator::run_impl(const GemmJob& job, const QTensor* qa, const QTensor* qb, std::vector<float>* c) {
  using namespace detail;
  const std::string where = job.name() + ": ";
  if (job.M <= 0 || job.N <= 0 || job.K <= 0) throw std::invalid_argument(where + "M, N and K must be positive");
  if (job.a.block != job.b.block)
    throw std::invalid_argument(where + "operands disagree on the block size");
  if (job.a.format.name != std::string(job.b.format.name))
    throw std::invalid_argument(where + "operands on different grids (" + job.a.format.name + ", " + job.b.format.name +
                                ") are not supported by the MAC array");
  const int block = job.a.block;
  if (job.K % block != 0)
    throw std::invalid_argument(where + "K = " + std::to_string(job.K) + " is not a multiple of the block size " +
                                std::to_string(block));
  for (const QuantConfig* q : {&job.a, &job.b})
    if (q->rht > 0 && (slot_.tile_k % q->rht != 0 || job.K % q->rht != 0))
      throw std::invalid_argument(where + "RHT size " + std::to_string(q->rht) + " must divide K = " +
                                  std::to_string(job.K) + " and tile.k = " + std::to_string(slot_.tile_k));
  const bool native = mac_native(slot_.mac_kind, job.a.format);
  if (!native && slot_.mac_fallback_rate <= 0)
    throw std::invalid_argument(where + std::string("mac.kind = ") + mac_kind_name(slot_.mac_kind) + " has no " +
                                job.a.format.name + " units and mac.fallback_rate is 0");

  Model& m = *model_;
  const int64_t t0 = m.clk.now();
  check_time_range(job, native, t0);
  Plan plan(slot_, job);
  if (plan.phases.empty())
    throw std::invalid_argument(where + "kernel '" + job_kind_name(job.kind) + "' has nothing to run under this "
                                "configuration (quantize needs prep.mode fused or unfused; unpack needs "
                                "unpack.launches > 0)");
  std::optional<std::string> cache_key;
  if (job_cache().on && qa == nullptr) {
    cache_key = timing_key(cfg_, job, native, t0);
    if (const auto hit = job_cache().map.find(*cache_key); hit != job_cache().map.end()) {
      // The model's clock moves on as if the job had run: the next job starts at the same cycle either way.
      m.kernel.run(m.kernel.now + m.clk.span(hit->second.r.cycles), true);
      if (m.clk.now() != t0 + hit->second.r.cycles) throw std::logic_error(where + "clock out of step with a cached job");
      ++job_cache().hits;
      JobReport r = hit->second.r;
      r.name = job.name();
      r.layer = job.layer;
      r.pass = pass_name(job.pass);
      r.count = job.count;
      price(r, hit->second.work);
      return r;
    }
  }
  m.mem->reset(t0);
  m.barrier->releases.clear();
  // A k-step datapath computes as the tiles pass; an output-tile one (cycle-level RTL) after the timed run.
  const bool per_step = dp_->granularity() == Datapath::Granularity::k_step;
  m.fn.a = qa;
  m.fn.b = qb;
  m.fn.c = per_step ? c : nullptr;
  if (c) {
    c->assign(size_t(job.M * job.N), 0.0f);
    m.fn.ga = tensor_factor(qa->format, qa->global_dec);
    m.fn.gb = tensor_factor(qb->format, qb->global_dec);
  }
  for (auto& t : m.tcus) {
    t->reset();
    t->sched->plan = &plan;
    t->mac->rate = native ? double(slot_.mac_units) : slot_.mac_units * slot_.mac_fallback_rate;
    t->wb->n_cols = job.N;
  }
  for (auto& t : m.tcus) m.kernel.notify(t->sched->go, 0);  // in TCU order, see Barrier
  m.kernel.run();
  m.fn.c = nullptr;
  if (m.barrier->releases.size() != plan.phases.size())
    throw std::logic_error(where + "simulation stopped after " + std::to_string(m.barrier->releases.size()) + " of " +
                           std::to_string(plan.phases.size()) + " phases (internal deadlock)");
  if (c && !per_step) {
    std::vector<OutputTile> tiles;
    tiles.reserve(plan.tiles.size());
    for (const auto& [mi, ni] : plan.tiles)
      tiles.push_back({mi * slot_.tile_m, ni * slot_.tile_n, int(std::min<int64_t>(slot_.tile_m, job.M - mi * slot_.tile_m)),
                       int(std::min<int64_t>(slot_.tile_n, job.N - ni * slot_.tile_n))});
    // The datapath's SystemC modules run on SystemC's clock, from the model's time on, and the model's time
    // then goes on from theirs (a SystemC model shares one clock).
    const uint64_t sc_now = sc_core::sc_time_stamp().value();
    if (m.kernel.now > sc_now) sc_core::sc_start(sc_core::sc_time::from_value(m.kernel.now - sc_now));
    m.fn.timed([&] { dp_->output_tiles(*qa, *qb, tiles, c->data()); });
    m.kernel.now = std::max(m.kernel.now, uint64_t(sc_core::sc_time_stamp().value()));
  }

  const int64_t end = m.barrier->releases.back();
  const int64_t gemm_start = plan.phases.size() > 1 ? m.barrier->releases[plan.phases.size() - 2] : t0;
  JobReport r;
  r.name = job.name();
  r.layer = job.layer;
  r.pass = pass_name(job.pass);
  r.kernel = job_kind_name(job.kind);
  r.M = job.M;
  r.N = job.N;
  r.K = job.K;
  r.format = job.a.format.name;
  r.scale = scale_name(job.a.scale);
  r.block = block;
  r.rht = std::max(job.a.rht, job.b.rht);
  r.prep_mode = prep_mode_name(slot_.prep);
  r.native = native;
  r.count = job.count;
  r.cycles = end - t0;
  r.prep_cycles = gemm_start - t0;
  r.time_us = double(r.cycles) * slot_.period_ns() / 1000.0;
  r.macs = plan.phases.back() == PhaseKind::gemm ? double(job.M) * double(job.N) * double(job.K) : 0.0;
  r.mac_util = r.cycles > 0 ? r.macs / (double(slot_.peak_macs_per_cycle()) * double(r.cycles)) : 0;

  const double T = double(slot_.tcus), cyc = double(std::max<int64_t>(r.cycles, 1));
  double fetch = 0, rht = 0, quant = 0, mac = 0, acc = 0, wb = 0;
  double rht_ops = 0, q_elems = 0, sr_elems = 0, sr_draws = 0, acc_ops = 0, blocks = 0;
  for (const std::string& s : stall_categories()) r.stalls[s] = 0;
  for (auto& t : m.tcus) {
    fetch += double(t->fetch->busy);
    rht += double(t->rht->busy);
    quant += double(t->quant->busy);
    mac += double(t->mac->compute);
    acc += double(t->acc->busy);
    wb += double(t->wb->busy);
    rht_ops += double(t->rht->ops);
    q_elems += double(t->quant->elems);
    sr_elems += double(t->quant->sr_elems);
    sr_draws += double(t->quant->sr_draws);
    acc_ops += double(t->acc->ops);
    blocks += double(t->mac->blocks);
    const MacArray& a = *t->mac;
    r.stalls["prep"] += double(gemm_start - t0);
    if (a.first_start < 0) {
      r.stalls["idle"] += double(end - gemm_start);
      continue;
    }
    r.stalls["fill"] += double(a.first_start - gemm_start);
    r.stalls["compute"] += double(a.compute);
    r.stalls["bandwidth"] += double(a.stall[0]);
    r.stalls["rht"] += double(a.stall[1]);
    r.stalls["quant"] += double(a.stall[2]);
    r.stalls["accumulate"] += double(a.accumulate);
    r.stalls["tail"] += double(end - a.last_end);
  }
  for (auto& [k, v] : r.stalls) v /= T;
  r.busy = {{"fetch", fetch / (T * cyc)}, {"rht", rht / (T * cyc)},   {"quant", quant / (T * cyc)},
            {"mac", mac / (T * cyc)},     {"acc", acc / (T * cyc)},   {"writeback", wb / (T * cyc)},
            {"dram", m.mem->dram.busy / cyc}, {"l2", m.mem->l2.busy / cyc}};
  r.bytes = {{"dram_read", m.mem->dram_read},      {"dram_write", m.mem->dram_write},
             {"l2_read", m.mem->l2_read},          {"l2_write", m.mem->l2_write},
             {"buffer_read", plan.counters.buf_read}, {"buffer_write", plan.counters.buf_write}};
  const JobCounters work{blocks, acc_ops, rht_ops, q_elems, sr_elems, sr_draws, m.mem->dram_read, m.mem->dram_write,
                         m.mem->l2_read, m.mem->l2_write, plan.counters.buf_read, plan.counters.buf_write};
  price(r, work);
  if (cache_key) job_cache().store(*cache_key, r, work);
  return r;
}

}  // namespace fp4lab::sim
