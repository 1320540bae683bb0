// The Verilated RTL block MAC (rtl/fp4_mac_unit.sv, dual-format, Verilator --sc, wrapped by
// fp4lab::rtl::ScMac) as the TCU model's datapath: `fp4lab sim --check --rtl`. The RTL keeps its accumulator
// and runs on its own clock, so it computes whole output tiles after the timed run (Granularity::output_tile)
// and never moves the timing model's clock while a job is being timed.
#include <stdexcept>
#include <systemc>

#include "fp4lab/rtl/sc_mac.hpp"
#include "fp4lab/sim/datapath.hpp"

namespace fp4lab::sim {

namespace {

// Hosts the RTL MAC in the Simulator's kernel: a clock that ticks only while tiles are being computed (so the
// kernel still runs dry between jobs) and a thread that feeds the tiles through ScMac::run_tile.
class RtlHost : public sc_core::sc_module {
 public:
  SC_HAS_PROCESS(RtlHost);
  explicit RtlHost(sc_core::sc_module_name n) : sc_module(n), mac("rtl_mac"), clk("clk") {
    mac.clk(clk);
    SC_THREAD(clock);
    SC_THREAD(runner);
  }
  rtl::ScMac mac;
  const QTensor *a = nullptr, *b = nullptr;
  const std::vector<OutputTile>* tiles = nullptr;
  float* c = nullptr;
  bool done = false;
  std::string error;
  sc_core::sc_event go;

 private:
  sc_core::sc_signal<bool> clk;
  sc_core::sc_event tick_on;
  bool ticking = false;
  void clock() {
    const sc_core::sc_time half(0.5, sc_core::SC_NS);  // the RTL's own time; no timing result reads it
    while (true) {
      sc_core::wait(tick_on);
      while (ticking) {
        clk.write(true);
        sc_core::wait(half);
        clk.write(false);
        sc_core::wait(half);
      }
    }
  }
  void runner() {
    std::vector<float> out;
    while (true) {
      sc_core::wait(go);
      ticking = true;
      tick_on.notify(sc_core::SC_ZERO_TIME);
      try {
        const int64_t N = b->rows;
        for (const OutputTile& t : *tiles) {
          out.resize(size_t(t.tm) * t.tn);
          mac.run_tile(*a, *b, t.m0, t.tm, t.n0, t.tn, out.data());
          for (int i = 0; i < t.tm; ++i)
            std::copy_n(out.data() + size_t(i) * t.tn, t.tn, c + (t.m0 + i) * N + t.n0);
        }
      } catch (const std::exception& e) {
        error = e.what();
      }
      ticking = false;
      done = true;
    }
  }
};

class RtlDatapath final : public Datapath {
 public:
  std::string name() const override { return "rtl"; }
  Granularity granularity() const override { return Granularity::output_tile; }
  void block_dots(const TileStep&, int32_t*) override { refuse(); }
  void scale_accumulate(const TileStep&, const int32_t*, float*) override { refuse(); }
  void finish(const float*, int64_t, float, float, float*) override { refuse(); }
  void elaborate() override {
    host_ = std::make_unique<RtlHost>("rtl_host");
  }
  void unelaborate() override { host_.reset(); }
  void output_tiles(const QTensor& a, const QTensor& b, const std::vector<OutputTile>& tiles, float* c) override {
    if (!host_) throw std::logic_error("RTL datapath used outside a Simulator");
    RtlHost& h = *host_;
    h.a = &a;
    h.b = &b;
    h.tiles = &tiles;
    h.c = c;
    h.done = false;
    h.error.clear();
    h.go.notify(sc_core::SC_ZERO_TIME);
    sc_core::sc_start();  // runs until the runner is done and the clock has stopped
    if (!h.error.empty()) throw std::invalid_argument("RTL MAC: " + h.error);
    if (!h.done) throw std::logic_error("RTL MAC: the simulation stopped before the last tile");
  }

 private:
  std::unique_ptr<RtlHost> host_;
  [[noreturn]] static void refuse() { throw std::logic_error("the RTL datapath computes whole output tiles"); }
};

}  // namespace

std::shared_ptr<Datapath> make_rtl_datapath() { return std::make_shared<RtlDatapath>(); }

}  // namespace fp4lab::sim
