// The TCU's units (internal to sim/), threads of the event kernel (kernel.hpp). Time is kept in whole cycles of
// the configured clock: every delay a unit adds is its occupancy (work / lanes, rounded up) or its latency, both in cycles from the
// configuration, turned into picoseconds by Clock. Tiles travel as Tokens through bounded TokenQueues; a unit
// that cannot hand a token on blocks, which is the back-pressure. Operand-buffer slots and output-tile
// accumulators are Credits held from fetch to the MAC array and from the accumulator to write-back.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

#include "fp4lab/quantize.hpp"
#include "fp4lab/sim/config.hpp"
#include "fp4lab/sim/datapath.hpp"
#include "kernel.hpp"

namespace fp4lab::sim::detail {

// Whole cycles of the configured clock on the kernel's picosecond time.
struct Clock {
  Kernel* k = nullptr;
  uint64_t period = 1;  // picoseconds
  int64_t now() const { return int64_t(k->now / period); }
  uint64_t span(int64_t cycles) const { return period * uint64_t(cycles); }
  // co_await clk.cycles(c): wait c cycles (none if c <= 0); clk.until(cycle): wait until that cycle.
  struct Wait {
    Kernel::WaitTime w;
    bool skip;
    bool await_ready() const noexcept { return skip; }
    void await_suspend(std::coroutine_handle<> h) const { w.await_suspend(h); }
    void await_resume() const noexcept {}
  };
  Wait cycles(int64_t c) const { return {k->wait_for(c > 0 ? span(c) : 0), c <= 0}; }
  Wait until(int64_t cycle) const { return cycles(cycle - now()); }
};
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// Whole cycles to do `work` at `rate` per cycle (a rate may be fractional; a whole one gives ceil_div exactly).
inline int64_t cycles_for(int64_t work, double rate) {
  const double whole = std::floor(rate);
  if (whole == rate) return ceil_div(work, int64_t(whole));
  return int64_t(std::ceil(double(work) / rate - 1e-9));
}

// What held a k-step tile up on its way to the MAC array (the last unit that made it wait).
enum class Blame : uint8_t { bandwidth = 0, rht = 1, quant = 2 };

struct Token {
  enum class Kind : uint8_t { step, chunk, tile_done, marker };
  Kind kind = Kind::step;
  struct Read {
    uint64_t key;
    int64_t bytes;
  };
  Read rd[2]{};
  int nrd = 0;
  uint64_t wr_key = 0;
  int64_t wr_bytes = 0;
  int64_t rht_elems = 0, rht_ops = 0;  // elements through the butterfly; adds/subtracts (+ scale multiplies)
  double share = 1;                    // the unit rates this token gets, in the slot's own lanes (see Plan::share)
  int rht_stages = 0;                  // log2 d + 1
  int64_t q_elems = 0;                 // elements quantised with RTNE (or amax-scanned)
  int64_t q_sr_elems[std::size(kSrDraws)] = {};  // with SR, by draw (SrDraw): a Philox block per sr_draw_group
  int64_t beats = 0;                   // block dot products of kMacWidth elements (unit beats)
  int64_t acc_ops = 0;                 // block scale-and-accumulates (+ the final multiplies on the last k-step)
  bool fused = false;                  // both operands' block scales are UE4M3 or UE8M0: acc.fused_lanes apply
  int64_t buf_read = 0, buf_write = 0;
  bool credit = false;                 // holds an operand-buffer slot until the MAC array is done with it
  bool first_k = false, last_k = false;
  int64_t m0 = 0, n0 = 0, k0 = 0;
  int tm = 0, tn = 0, tk = 0;
  std::shared_ptr<int32_t[]> p;              // block products, MAC array -> accumulator (--check)
  std::shared_ptr<std::vector<float>> out;  // finished output tile, accumulator -> write-back (--check)
  int64_t ready = 0;                   // cycle at which the token's data is usable downstream
  Blame blame = Blame::bandwidth;
};

// A waiting thread is woken by a delta notification. An event is notified only while a thread waits on it: a
// notification nobody waits for wakes nobody, and each event here has one waiting thread at most (one producer,
// one consumer), which runs at most once a delta, so skipping those notifications changes no process order.
// A thread takes a token with `while (q->empty()) co_await q->data(); Token t = q->pop();` and hands one on
// with `while (q->full()) co_await q->space(); q->push(std::move(t));`.
class TokenQueue {
 public:
  TokenQueue(Kernel& k, size_t capacity) : k_(k), ring_(capacity) {}
  bool empty() const { return n_ == 0; }
  bool full() const { return n_ == ring_.size(); }
  Kernel::WaitEvent data() { return k_.wait(data_); }
  Kernel::WaitEvent space() { return k_.wait(space_); }
  void push(Token&& t) {
    ring_[(head_ + n_) % ring_.size()] = std::move(t);
    ++n_;
    if (!data_.waiters.empty()) k_.notify(data_, 0);
  }
  Token pop() {
    Token t = std::move(ring_[head_]);
    head_ = (head_ + 1) % ring_.size();
    --n_;
    if (!space_.waiters.empty()) k_.notify(space_, 0);
    return t;
  }

 private:
  Kernel& k_;
  std::vector<Token> ring_;  // a fixed ring of `capacity` tokens
  size_t head_ = 0, n_ = 0;
  Event data_, space_;
};

// `while (!c->available()) co_await c->freed(); c->take();`
class Credits {
 public:
  Credits(Kernel& k, int n) : k_(k), n_(n) {}
  bool available() const { return n_ > 0; }
  Kernel::WaitEvent freed() { return k_.wait(ev_); }
  void take() { --n_; }
  void release() {
    ++n_;
    if (!ev_.waiters.empty()) k_.notify(ev_, 0);
  }

 private:
  Kernel& k_;
  int n_;
  Event ev_;
};

// All TCUs of a phase (a separate pass, or the GEMM) hand in their last write; the next phase starts when the
// last of them is in memory -- a kernel boundary.
class Barrier {
 public:
  Barrier(int n, Clock clk) : evs(size_t(n)), n_(n), clk_(clk) {}
  void arrive(int64_t done) {
    latest_ = std::max(latest_, done);
    if (++arrived_ < n_) return;
    releases.push_back(latest_);
    // One event per TCU, notified in TCU order: the order the schedulers wake in is then the same in every
    // phase of every job, whatever order they arrived in -- and so is the order of their same-cycle requests
    // at the shared memory, which keeps a job's result independent of the jobs run before it.
    const int64_t wait = latest_ - clk_.now();
    for (Event& e : evs) clk_.k->notify(e, wait > 0 ? clk_.span(wait) : 0);
    arrived_ = 0;
    latest_ = 0;
  }
  std::vector<Event> evs;
  std::vector<int64_t> releases;  // release cycle of every phase since the last reset

 private:
  int n_, arrived_ = 0;
  int64_t latest_ = 0;
  Clock clk_;
};

// ---- memory system ---------------------------------------------------------------------------------

// A port of given bandwidth and latency, shared first come first served. Its occupancy is kept in fractional
// cycles (exact bandwidth); the data is usable at the next whole cycle after the transfer plus the latency.
struct Channel {
  double bandwidth = 1;
  int64_t latency = 0;
  double free = 0, busy = 0;
  struct Done {
    int64_t transferred, usable;
  };
  Done transfer(int64_t now, int64_t bytes, double cost = 1) {  // cost: port time per byte, in read bytes
    const double start = std::max(double(now), free);
    const double t = double(bytes) * cost / bandwidth;
    free = start + t;
    busy += t;
    const int64_t end = int64_t(std::ceil(free - 1e-9));
    return {end, end + latency};
  }
};

// Tile-granular LRU: a key is (tensor, tile row, k-step); the capacity is in bytes.
class Lru {
 public:
  explicit Lru(int64_t capacity) : cap_(capacity) {}
  bool hit(uint64_t key) {
    auto it = map_.find(key);
    if (it == map_.end()) return false;
    list_.splice(list_.begin(), list_, it->second);
    return true;
  }
  void insert(uint64_t key, int64_t bytes) {
    if (hit(key) || bytes > cap_) return;
    while (used_ + bytes > cap_) {
      used_ -= list_.back().second;
      map_.erase(list_.back().first);
      list_.pop_back();
    }
    list_.emplace_front(key, bytes);
    map_[key] = list_.begin();
    used_ += bytes;
  }
  void clear() {
    list_.clear();
    map_.clear();
    used_ = 0;
  }

 private:
  int64_t cap_, used_ = 0;
  std::list<std::pair<uint64_t, int64_t>> list_;
  std::unordered_map<uint64_t, std::list<std::pair<uint64_t, int64_t>>::iterator> map_;
};

// DRAM behind an optional L2. Reads that hit the L2 are served by its port; misses by DRAM and then kept in
// the L2. Writes go through to DRAM and are kept in the L2 too (so an unfused pass's intermediate can be
// read back from it). Keys carry a tensor id, so the L2 holds tiles, not addresses.
// read and write return when the transfer has left the port and when its data is usable.
class Memory {
 public:
  explicit Memory(const Config& c) : l2_(c.l2.bytes) {
    dram.bandwidth = c.dram.bandwidth;
    dram.latency = c.dram.latency;
    write_cost_ = c.dram.write_cost;
    has_l2_ = c.l2.bytes > 0;
    if (has_l2_) {
      l2.bandwidth = c.l2.bandwidth;
      l2.latency = c.l2.latency;
    }
  }
  Channel::Done read(int64_t now, uint64_t key, int64_t bytes) {
    if (has_l2_ && l2_.hit(key)) {
      l2_read += bytes;
      return l2.transfer(now, bytes);
    }
    dram_read += bytes;
    if (has_l2_) {
      l2_.insert(key, bytes);
      l2_write += bytes;
    }
    return dram.transfer(now, bytes);
  }
  Channel::Done write(int64_t now, uint64_t key, int64_t bytes) {
    dram_write += bytes;
    if (has_l2_) {
      l2_.insert(key, bytes);
      l2_write += bytes;
    }
    return dram.transfer(now, bytes, write_cost_);
  }
  void reset(int64_t now) {  // a new GEMM: cold cache, counters zero
    l2_.clear();
    dram.busy = l2.busy = 0;
    dram.free = std::max(dram.free, double(now));
    l2.free = std::max(l2.free, double(now));
    dram_read = dram_write = l2_read = l2_write = 0;
  }
  Channel dram, l2;
  double dram_read = 0, dram_write = 0, l2_read = 0, l2_write = 0;

 private:
  bool has_l2_ = false;
  double write_cost_ = 1;
  Lru l2_;
};

// ---- functional state of a --check run ----------------------------------------------------------------
struct Functional {
  Datapath* dp = nullptr;
  const QTensor *a = nullptr, *b = nullptr;
  std::vector<float>* c = nullptr;
  float ga = 1, gb = 1;
  double seconds = 0;  // wall time inside Datapath calls
  bool on() const { return c != nullptr; }
  TileStep step(const Token& t) const {
    const int64_t K = a->cols, KB = a->kblocks(), B = a->block;
    return TileStep{a->format, b->format, a->codes.data() + t.m0 * K + t.k0, K, b->codes.data() + t.n0 * K + t.k0, K,
                    a->scales.data() + t.m0 * KB + t.k0 / B, KB, b->scales.data() + t.n0 * KB + t.k0 / B, KB,
                    t.tm, t.tn, int(t.tk / B), int(B)};
  }
  template <class F>
  void timed(F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

// ---- units -------------------------------------------------------------------------------------------

// Issues the reads of a token as soon as it holds a buffer slot; the token is usable when the last read lands.
class Fetch {
 public:
  Memory* mem = nullptr;
  TokenQueue *in = nullptr, *out = nullptr;
  Credits* slots = nullptr;
  int64_t busy = 0;  // cycles with at least one read in flight
  Proc proc;
  explicit Fetch(Clock clk) : clk_(clk) {}
  void start() { clk_.k->start(proc, run()); }
  void reset() { busy = 0; covered_ = clk_.now(); }

 private:
  Clock clk_;
  int64_t covered_ = 0;
  Task run() {
    while (true) {
      while (in->empty()) co_await in->data();
      Token t = in->pop();
      if (t.credit) {
        while (!slots->available()) co_await slots->freed();
        slots->take();
      }
      const int64_t now = clk_.now();
      int64_t ready = now;
      for (int i = 0; i < t.nrd; ++i) ready = std::max(ready, mem->read(now, t.rd[i].key, t.rd[i].bytes).usable);
      if (ready > std::max(now, covered_)) busy += ready - std::max(now, covered_);
      covered_ = std::max(covered_, ready);
      t.ready = ready;
      t.blame = Blame::bandwidth;
      while (out->full()) co_await out->space();
      out->push(std::move(t));
    }
  }
};

// A pipelined unit: a token occupies it for occupancy(t) cycles and its result is usable latency(t) cycles
// after that. A token that had to wait for this unit (rather than for its own data) is blamed on it.
class Stage {
 public:
  TokenQueue *in = nullptr, *out = nullptr;
  int64_t busy = 0;
  Proc proc;
  Stage(Clock clk, Blame self) : clk_(clk), self_(self) {}
  virtual ~Stage() = default;
  void start() { clk_.k->start(proc, run()); }
  virtual void reset() { busy = 0; }

 protected:
  Clock clk_;
  Blame self_;
  virtual int64_t occupancy(const Token& t) const = 0;
  virtual int64_t latency(const Token& t) const = 0;
  virtual void work(Token&) {}
  // One wait per token: until the data is there and the unit has done its work. A token with no work for this
  // unit goes straight on (its ready time travels with it), so idle units cost no events.
  Task run() {
    while (true) {
      while (in->empty()) co_await in->data();
      Token t = in->pop();
      const int64_t occ = occupancy(t);
      if (occ > 0) {
        const int64_t now = clk_.now(), start = std::max(now, t.ready);
        if (start > t.ready) t.blame = self_;
        co_await clk_.cycles(start + occ - now);
        busy += occ;
        t.ready = clk_.now() + latency(t);
        work(t);
      }
      while (out->full()) co_await out->space();
      out->push(std::move(t));
    }
  }
};

class RhtUnit : public Stage {
 public:
  RhtUnit(Clock clk, const Config& c) : Stage(clk, Blame::rht), lanes_(c.rht_lanes), stage_(c.rht_stage_latency) {}
  int64_t elems = 0, ops = 0;
  void reset() override { Stage::reset(); elems = ops = 0; }

 protected:
  int64_t occupancy(const Token& t) const override { return cycles_for(t.rht_elems, lanes_ * t.share); }
  int64_t latency(const Token& t) const override { return int64_t(t.rht_stages) * stage_; }
  void work(Token& t) override { elems += t.rht_elems; ops += t.rht_ops; }

 private:
  double lanes_;
  int64_t stage_;
};

class Quantiser : public Stage {
 public:
  Quantiser(Clock clk, const Config& c)
      : Stage(clk, Blame::quant), lanes_(c.quant_lanes), sr_lanes_(c.quant_sr_lanes), lat_(c.quant_latency) {}
  int64_t elems = 0, sr_elems = 0, sr_draws = 0;
  void reset() override { Stage::reset(); elems = sr_elems = sr_draws = 0; }

 protected:
  // quant.sr_lanes is the Philox-limited rate at one block per element; a block per G elements (sr_draw_group)
  // multiplies it by G, up to the RTNE rate (never below philox1's, where a configuration makes SR the faster).
  int64_t occupancy(const Token& t) const override {
    int64_t c = cycles_for(t.q_elems, lanes_ * t.share);
    for (SrDraw d : kSrDraws) {
      const double g = sr_draw_group(d);
      c += cycles_for(t.q_sr_elems[int(d)], std::max(sr_lanes_, std::min(lanes_, g * sr_lanes_)) * t.share);
    }
    return c;
  }
  int64_t latency(const Token&) const override { return lat_; }
  void work(Token& t) override {
    elems += t.q_elems;
    for (SrDraw d : kSrDraws) {
      const int64_t n = t.q_sr_elems[int(d)], g = sr_draw_group(d);
      sr_elems += n;
      sr_draws += (n + g - 1) / g;
    }
  }

 private:
  double lanes_, sr_lanes_;
  int64_t lat_;
};

// The MAC array, with the stall accounting of the report: between two k-steps it notes why it sat idle.
class MacArray {
 public:
  TokenQueue *in = nullptr, *out = nullptr;
  Credits* slots = nullptr;
  Functional* fn = nullptr;
  // per job
  int64_t compute = 0, accumulate = 0, stall[3] = {0, 0, 0}, first_start = -1, last_end = -1;
  double rate = 1;  // block dot products per cycle for the current job's grid
  int64_t blocks = 0;
  Proc proc;
  MacArray(Clock clk, const Config& c)
      : clk_(clk), lat_(c.mac_latency), acc_lanes_(c.acc_lanes), fused_lanes_(c.acc_fused_lanes),
        shared_(c.acc_issue == AccIssue::shared) {}
  void start() { clk_.k->start(proc, run()); }
  void reset() {
    compute = accumulate = blocks = 0;
    stall[0] = stall[1] = stall[2] = 0;
    first_start = last_end = -1;
  }

 private:
  Clock clk_;
  int64_t lat_;
  double acc_lanes_, fused_lanes_;
  bool shared_;  // acc.issue = shared: the k-step's scale-and-accumulates occupy the MAC array too
  Task run() {
    while (true) {
      while (in->empty()) co_await in->data();
      Token t = in->pop();
      if (t.kind != Token::Kind::step) {  // a pass's chunk leaves its staging slot here
        co_await clk_.until(t.ready);
        if (t.credit) slots->release();
        while (out->full()) co_await out->space();
        out->push(std::move(t));
        continue;
      }
      const int64_t now = clk_.now(), s = std::max(now, t.ready);
      if (first_start < 0)
        first_start = s;
      else
        stall[int(t.blame)] += s - last_end;
      const double acc_rate = t.fused ? fused_lanes_ : acc_lanes_;
      const int64_t occ = cycles_for(t.beats, rate * t.share) + (shared_ ? cycles_for(t.acc_ops, acc_rate * t.share) : 0);
      co_await clk_.cycles(s + occ - now);
      compute += occ;
      blocks += t.beats;
      if (fn->on()) {
        const TileStep st = fn->step(t);
        t.p.reset(new int32_t[size_t(t.tm) * t.tn * st.nblk]);
        fn->timed([&] { fn->dp->block_dots(st, t.p.get()); });
      }
      if (t.credit) slots->release();
      t.ready = clk_.now() + lat_;
      const int64_t b0 = clk_.now();
      while (out->full()) co_await out->space();
      out->push(std::move(t));
      accumulate += clk_.now() - b0;
      last_end = clk_.now();
    }
  }
};

// Block scale-and-accumulate into one of acc.tiles output-tile accumulators. A tile's first k-step claims an
// accumulator (waiting while write-back still holds them all); its last k-step also applies the per-tensor
// factor and hands the finished tile to write-back. Pass chunks and markers go straight through.
class Accumulator {
 public:
  TokenQueue *in = nullptr, *out = nullptr;
  Credits* accs = nullptr;
  Functional* fn = nullptr;
  int64_t busy = 0, ops = 0;
  Proc proc;
  Accumulator(Clock clk, const Config& c)
      : clk_(clk), lanes_(c.acc_lanes), fused_lanes_(c.acc_fused_lanes), lat_(c.acc_latency),
        shared_(c.acc_issue == AccIssue::shared),
        buf_(size_t(c.acc_tiles)), free_(size_t(c.acc_tiles), true) {}
  void start() { clk_.k->start(proc, run()); }
  void reset() { busy = ops = 0; }

 private:
  Clock clk_;
  double lanes_, fused_lanes_;
  int64_t lat_;
  bool shared_;  // the MAC array has spent the occupancy already
  std::vector<std::vector<float>> buf_;
  std::vector<bool> free_;
  int current_ = 0;

  Task run() {
    while (true) {
      while (in->empty()) co_await in->data();
      Token t = in->pop();
      if (t.kind != Token::Kind::step) {
        while (out->full()) co_await out->space();
        out->push(std::move(t));
        continue;
      }
      if (t.first_k) {  // claim an accumulator when the tile's first step is here
        co_await clk_.until(t.ready);
        while (!accs->available()) co_await accs->freed();
        accs->take();
        current_ = int(std::find(free_.begin(), free_.end(), true) - free_.begin());
        free_[size_t(current_)] = false;
      }
      const int64_t occ = shared_ ? 0 : cycles_for(t.acc_ops, (t.fused ? fused_lanes_ : lanes_) * t.share),
                    now = clk_.now();
      co_await clk_.cycles(std::max(now, t.ready) + occ - now);
      busy += occ;
      ops += t.acc_ops;
      if (fn->on()) {
        std::vector<float>& acc = buf_[size_t(current_)];
        if (t.first_k) acc.assign(size_t(t.tm) * t.tn, 0.0f);  // acc = +0.0f (contract)
        const TileStep st = fn->step(t);
        fn->timed([&] { fn->dp->scale_accumulate(st, t.p.get(), acc.data()); });
        t.p.reset();
        if (t.last_k) {
          t.out = std::make_shared<std::vector<float>>(acc.size());
          fn->timed([&] { fn->dp->finish(acc.data(), int64_t(acc.size()), fn->ga, fn->gb, t.out->data()); });
        }
      }
      if (!t.last_k) continue;  // consumed into the accumulator
      free_[size_t(current_)] = true;  // the values travel with the token; the credit stays until written
      t.kind = Token::Kind::tile_done;
      t.ready = clk_.now() + lat_;
      while (out->full()) co_await out->space();
      out->push(std::move(t));
    }
  }
};

// Writes finished tiles and pass outputs; on a phase marker, reports to the barrier once its writes are in.
class WriteBack {
 public:
  Memory* mem = nullptr;
  TokenQueue* in = nullptr;
  Credits* accs = nullptr;
  Barrier* barrier = nullptr;
  Functional* fn = nullptr;
  int64_t busy = 0;
  int64_t n_cols = 0;  // N of the current GEMM (functional copy)
  Proc proc;
  explicit WriteBack(Clock clk) : clk_(clk) {}
  void start() { clk_.k->start(proc, run()); }
  void reset() { busy = 0; last_done_ = clk_.now(); }

 private:
  Clock clk_;
  int64_t last_done_ = 0;
  Task run() {
    while (true) {
      while (in->empty()) co_await in->data();
      Token t = in->pop();
      co_await clk_.until(t.ready);
      if (t.kind == Token::Kind::marker) {
        barrier->arrive(std::max(last_done_, clk_.now()));
        continue;
      }
      if (t.wr_bytes > 0) {
        const int64_t now = clk_.now();
        const Channel::Done d = mem->write(now, t.wr_key, t.wr_bytes);
        co_await clk_.until(d.transferred);
        busy += d.transferred - now;
        last_done_ = std::max(last_done_, d.usable);
      }
      if (t.kind == Token::Kind::tile_done) {
        if (fn->on() && t.out)
          for (int i = 0; i < t.tm; ++i)
            std::copy_n(t.out->data() + size_t(i) * t.tn, t.tn, fn->c->data() + (t.m0 + i) * n_cols + t.n0);
        accs->release();
      }
    }
  }
};

}  // namespace fp4lab::sim::detail
