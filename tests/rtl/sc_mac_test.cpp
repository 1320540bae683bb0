// SystemC co-simulation of the RTL block MAC (Verilator --sc, wrapped by fp4lab::rtl::ScMac): GEMM tiles
// quantised by the golden model for every recipe preset and pass stream through the Verilated SystemC
// module on a 1 GHz clock and must equal reference::gemm_contract bit for bit. With --workloads DIR the
// tiles come from the bundled trace instead of random data (and a missing trace is a failure).
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <systemc>

#include "fp4lab/io/safetensors.hpp"
#include "fp4lab/recipe.hpp"
#include "fp4lab/rtl/sc_mac.hpp"
#include "fp4lab/scale.hpp"
#include "reference/contract_gemm.hpp"

namespace {

using namespace fp4lab;

struct Tile {
  std::string what;
  QTensor a, b;
};

struct Bench : sc_core::sc_module {
  sc_core::sc_clock clk{"clk", 1, sc_core::SC_NS};
  rtl::ScMac mac{"mac"};
  std::vector<Tile> tiles;
  uint64_t outputs = 0, mismatches = 0;

  explicit Bench(sc_core::sc_module_name n, std::vector<Tile> t) : sc_module(n), tiles(std::move(t)) {
    mac.clk(clk);
    SC_HAS_PROCESS(Bench);
    SC_THREAD(run);
  }

  void run() {
    for (const Tile& t : tiles) {
      const std::vector<float> want = reference::gemm_contract(t.a, t.b);
      std::vector<float> got(want.size());
      const uint64_t cycles = mac.run_tile(t.a, t.b, 0, t.a.rows, 0, t.b.rows, got.data());
      for (size_t i = 0; i < want.size(); ++i) {
        ++outputs;
        if (f32_bits(want[i]) != f32_bits(got[i]) && ++mismatches <= 10)
          std::fprintf(stderr, "[sc_mac] MISMATCH %s output (%zu, %zu): want %08x (%.9g) got %08x (%.9g)\n",
                       t.what.c_str(), size_t(i / size_t(t.b.rows)), size_t(i % size_t(t.b.rows)), f32_bits(want[i]),
                       double(want[i]), f32_bits(got[i]), double(got[i]));
      }
      std::printf("[sc_mac] %-34s %lldx%lld outputs, K=%lld: %llu cycles\n", t.what.c_str(), (long long)t.a.rows,
                  (long long)t.b.rows, (long long)t.a.cols, (unsigned long long)cycles);
    }
    sc_core::sc_stop();
  }
};

// Operands of a tile for every preset and pass: from the trace when given, else heavy-tailed random data.
std::vector<Tile> make_tiles(const std::string& workloads) {
  std::vector<Tile> tiles;
  const int64_t tm = 16, tn = 16;
  io::Trace::Layer layer;
  io::TraceRecord rec;
  if (!workloads.empty()) {
    const io::Trace trace(workloads);
    if (trace.records().empty()) throw std::runtime_error(workloads + ": the trace holds no linear-layer records");
    rec = trace.records().back();
    layer = trace.load(rec);
  } else {
    rec.tokens = 64;
    rec.in = 128;
    rec.out = 64;
    std::mt19937_64 rng(7);
    std::student_t_distribution<float> heavy(3.0f);
    for (auto* v : {&layer.x, &layer.w, &layer.dy}) v->resize(size_t(rec.tokens * std::max(rec.in, rec.out)));
    for (auto* v : {&layer.x, &layer.w, &layer.dy})
      for (float& e : *v) e = heavy(rng);
  }
  for (const std::string& name : Recipe::preset_names()) {
    const Recipe r = Recipe::preset(name);
    for (Pass p : kPasses) {
      const PassOperands ops =
          pass_operands(p, layer.x.data(), layer.w.data(), layer.dy.data(), rec.tokens, rec.in, rec.out);
      const int64_t m = std::min(tm, ops.M), n = std::min(tn, ops.N);
      QuantConfig ca = r.operand(p, Operand::a, 1), cb = r.operand(p, Operand::b, 2);
      if (ca.tile2d && m % 16) ca.tile2d = false;
      if (cb.tile2d && n % 16) cb.tile2d = false;
      Tile t;
      t.what = (workloads.empty() ? std::string("random ") : rec.gemm + " ") + name + "/" + pass_name(p);
      t.a = quantize(ops.a.data(), m, ops.K, ca);
      t.b = quantize(ops.b.data(), n, ops.K, cb);
      tiles.push_back(std::move(t));
    }
  }
  return tiles;
}

}  // namespace

int sc_main(int argc, char** argv) {
  std::string workloads;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--workloads") == 0 && i + 1 < argc) {
      workloads = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--workloads TRACE_DIR]\n", argv[0]);
      return 2;
    }
  }
  std::vector<Tile> tiles;
  try {
    tiles = make_tiles(workloads);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sc_mac_test: %s\n", e.what());
    return 1;
  }
  Bench bench("bench", std::move(tiles));
  sc_core::sc_start();
  std::printf("[sc_mac] %llu outputs checked, %llu mismatches, %llu beats in %llu cycles (latency %d)\n",
              (unsigned long long)bench.outputs, (unsigned long long)bench.mismatches,
              (unsigned long long)bench.mac.beats(), (unsigned long long)bench.mac.cycles(), rtl::ScMac::latency());
  if (bench.outputs == 0) {
    std::fprintf(stderr, "sc_mac_test: checked zero outputs\n");
    return 1;
  }
  return bench.mismatches == 0 ? 0 : 1;
}
