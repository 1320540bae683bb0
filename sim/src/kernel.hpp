// The event kernel the TCU model runs on (internal to sim/): the part of SystemC 2.3.4's scheduler that the model
// uses -- threads waiting on events or for a time, delta and timed notifications -- with SystemC's order of
// execution kept exactly, so that every cycle count is the one the SystemC kernel gives. Threads are C++20
// coroutines: a switch is a function call, where a SystemC thread switch saves and restores a whole stack.
//
// The order rules kept (SystemC 2.3.4, sc_simcontext.cpp, sc_event.cpp, sc_pq.cpp):
//  - an evaluation phase runs the runnable threads first in, first out; a thread runs until it waits;
//  - then the delta notifications fire, the last notified first; an event wakes its waiting threads in the
//    order sc_event::trigger walks them (the first, then the last, the one before it, ...);
//  - when no thread is runnable, time moves to the earliest timed notification; those due then are taken out
//    of a binary heap (sc_ppq, its exact sift order, which decides the order among equal times) and fire;
//  - a delta notification of an event already notified is dropped; a timed one is dropped if the event is
//    due earlier, else replaces the later one.
// Nothing here notifies immediately, so no thread becomes runnable during an evaluation phase.
#pragma once

#include <coroutine>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

namespace fp4lab::sim::detail {

struct Proc;
struct Timed;

struct Event {
  enum class Pending : uint8_t { none, delta, timed };
  std::vector<Proc*> waiters;
  Pending pending = Pending::none;
  Timed* timed = nullptr;
};

struct Timed {
  Event* ev = nullptr;  // null once cancelled
  uint64_t at = 0;      // picoseconds
};

// A thread: the body is a coroutine that never returns (an endless loop waiting for work).
struct Task {
  struct promise_type {
    std::exception_ptr error;
    Task get_return_object() { return Task{std::coroutine_handle<promise_type>::from_promise(*this)}; }
    std::suspend_always initial_suspend() noexcept { return {}; }
    std::suspend_always final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { error = std::current_exception(); }
  };
  explicit Task(std::coroutine_handle<promise_type> h = {}) : h(h) {}
  Task(Task&& o) noexcept : h(std::exchange(o.h, {})) {}
  Task& operator=(Task&& o) noexcept {
    std::swap(h, o.h);
    return *this;
  }
  ~Task() {
    if (h) h.destroy();
  }
  std::coroutine_handle<promise_type> h;
};

// A lazily produced sequence: `while (g.next()) use(g.value());` runs the body up to its next co_yield.
template <class T>
struct Generator {
  struct promise_type {
    T* value = nullptr;
    std::exception_ptr error;
    Generator get_return_object() { return Generator{std::coroutine_handle<promise_type>::from_promise(*this)}; }
    std::suspend_always initial_suspend() noexcept { return {}; }
    std::suspend_always final_suspend() noexcept { return {}; }
    std::suspend_always yield_value(T& v) noexcept {
      value = &v;
      return {};
    }
    void return_void() {}
    void unhandled_exception() { error = std::current_exception(); }
  };
  explicit Generator(std::coroutine_handle<promise_type> h) : h(h) {}
  Generator(Generator&& o) noexcept : h(std::exchange(o.h, {})) {}
  Generator(const Generator&) = delete;
  ~Generator() {
    if (h) h.destroy();
  }
  bool next() {
    h.resume();
    if (h.promise().error) std::rethrow_exception(std::exchange(h.promise().error, nullptr));
    return !h.done();
  }
  T& value() { return *h.promise().value; }
  std::coroutine_handle<promise_type> h;
};

struct Proc {
  Task task;
  Event timeout;  // SystemC's per-thread timeout event: wait(time) is a timed notification of it
  bool runnable = false;
};

class Kernel {
 public:
  uint64_t now = 0;  // picoseconds
  Proc* current = nullptr;

  Kernel() : heap_(1, nullptr) {}
  ~Kernel() {
    for (size_t i = 1; i <= size_; ++i) delete heap_[i];
    for (Timed* t : free_) delete t;
  }
  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;

  // Runs a new thread's body up to its first wait (SystemC's initialisation phase; each thread here starts by
  // waiting on an event of its own, so the order they start in does not matter).
  void start(Proc& p, Task&& t) {
    p.task = std::move(t);
    resume(p);
  }

  // sc_event::notify(SC_ZERO_TIME) (dt 0) and sc_event::notify(t).
  void notify(Event& e, uint64_t dt) {
    if (e.pending == Event::Pending::delta) return;
    if (dt == 0) {
      if (e.pending == Event::Pending::timed) cancel(e);
      deltas_.push_back(&e);
      e.pending = Event::Pending::delta;
      return;
    }
    if (e.pending == Event::Pending::timed) {
      if (e.timed->at <= now + dt) return;
      cancel(e);
    }
    add_timed(e, now + dt);
  }

  // sc_start(): runs until no notification is left; time stays at the last one. With `until` (sc_start(d) from
  // time now: until = now + d), stops before notifications due later and leaves the time at `until`.
  void run(uint64_t until = std::numeric_limits<uint64_t>::max(), bool to_time = false) {
    uint64_t t = now;
    do {
      crunch();
      t = now;
      do {
        if (!next_time(t) || t > until) goto out;
        if (t > now) now = t;
        do {
          Timed* et = extract_top();
          Event* e = et->ev;
          free_.push_back(et);
          if (e) trigger(*e);
        } while (size_ > 0 && heap_[1]->at == t);
      } while (runq_.empty());
    } while (t < until);
  out:
    if (to_time && now < until) now = until;
  }

  // Awaitables: wait(e) and wait(time) of the current thread.
  struct WaitEvent {
    Kernel& k;
    Event& e;
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<>) const { e.waiters.push_back(k.current); }
    void await_resume() const noexcept {}
  };
  struct WaitTime {
    Kernel& k;
    uint64_t dt;
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<>) const {
      Proc* p = k.current;
      k.add_timed(p->timeout, k.now + dt);  // notify_internal: the timeout event has nothing pending
      p->timeout.waiters.push_back(p);
    }
    void await_resume() const noexcept {}
  };
  WaitEvent wait(Event& e) { return {*this, e}; }
  WaitTime wait_for(uint64_t dt) { return {*this, dt}; }

 private:
  std::vector<Proc*> runq_, running_;
  std::vector<Event*> deltas_;
  std::vector<Timed*> heap_;  // 1-based binary heap, as sc_ppq
  size_t size_ = 0;
  std::vector<Timed*> free_;

  void resume(Proc& p) {
    current = &p;
    p.task.h.resume();
    current = nullptr;
    if (p.task.h.promise().error) std::rethrow_exception(std::exchange(p.task.h.promise().error, nullptr));
    if (p.task.h.done()) throw std::logic_error("a simulation thread returned");
  }

  // Evaluation and delta phases until no thread is runnable (sc_simcontext::crunch).
  void crunch() {
    while (true) {
      while (!runq_.empty()) {
        running_.swap(runq_);
        for (Proc* p : running_) {
          p->runnable = false;
          resume(*p);
        }
        running_.clear();
      }
      for (size_t i = deltas_.size(); i-- > 0;) trigger(*deltas_[i]);
      deltas_.clear();
      if (runq_.empty()) break;
    }
  }

  // sc_event::trigger with sc_thread_process::trigger_dynamic for a thread waiting on one event or a time:
  // each waiter leaves the list (the last moving into its place) and becomes runnable.
  void trigger(Event& e) {
    e.pending = Event::Pending::none;
    e.timed = nullptr;
    std::vector<Proc*>& w = e.waiters;
    for (size_t n = w.size(); n > 0;) {
      Proc* p = w[0];
      w[0] = w[n - 1];
      --n;
      w.pop_back();
      if (!p->runnable) {
        p->runnable = true;
        runq_.push_back(p);
      }
    }
  }

  void cancel(Event& e) {
    e.timed->ev = nullptr;
    e.timed = nullptr;
    e.pending = Event::Pending::none;
  }
  void add_timed(Event& e, uint64_t at) {
    Timed* t;
    if (free_.empty()) {
      t = new Timed;
    } else {
      t = free_.back();
      free_.pop_back();
    }
    t->ev = &e;
    t->at = at;
    insert(t);
    e.timed = t;
    e.pending = Event::Pending::timed;
  }
  bool next_time(uint64_t& t) {
    while (size_ > 0) {
      if (heap_[1]->ev) {
        t = heap_[1]->at;
        return true;
      }
      free_.push_back(extract_top());
    }
    return false;
  }

  // sc_ppq_base with sc_notify_time_compare: earlier is "larger".
  static int cmp(const Timed* a, const Timed* b) { return a->at < b->at ? 1 : a->at > b->at ? -1 : 0; }
  void insert(Timed* elem) {
    ++size_;
    if (heap_.size() <= size_) heap_.resize(size_ + 1);
    size_t i = size_;
    while (i > 1 && cmp(heap_[i >> 1], elem) < 0) {
      heap_[i] = heap_[i >> 1];
      i >>= 1;
    }
    heap_[i] = elem;
  }
  Timed* extract_top() {
    Timed* top = heap_[1];
    heap_[1] = heap_[size_];
    --size_;
    heapify(1);
    return top;
  }
  void heapify(size_t i) {
    size_t l;
    while (l = i << 1, l <= size_) {
      size_t largest = cmp(heap_[l], heap_[i]) > 0 ? l : i;
      const size_t r = l + 1;
      if (r <= size_ && cmp(heap_[r], heap_[largest]) > 0) largest = r;
      if (largest == i) break;
      std::swap(heap_[i], heap_[largest]);
      i = largest;
    }
  }
};

}  // namespace fp4lab::sim::detail
