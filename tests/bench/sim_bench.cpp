// fp4lab_sim_bench: speed of the TCU model.
//  1. Timing only: one 8192^3 GEMM on the h100-class configuration (prep modes none and fused), wall and CPU
//     seconds and the number of k-step tiles simulated.
//  2. --check on a trace (default: the bundled workloads/tiny-lm/step_005000), against the golden model alone
//     measured in the same run: quantise both operands and run fp4lab::gemm for each of the three GEMMs of
//     every record -- the work a golden-only replay of the trace does.
// Usage: fp4lab_sim_bench [--root DIR] [--trace DIR] [--recipe R] [--config NAME] [--repeat N]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>

#include "fp4lab/gemm.hpp"
#include "fp4lab/recipe.hpp"
#include "fp4lab/sim/run.hpp"
#include "sim_config.hpp"  // cli/: sim/configs/*.cfg read as the command line reads them

using namespace fp4lab;
using namespace fp4lab::sim;

namespace {
struct Stopwatch {
  std::chrono::steady_clock::time_point w = std::chrono::steady_clock::now();
  std::clock_t c = std::clock();
  double wall() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - w).count(); }
  double cpu() const { return double(std::clock() - c) / CLOCKS_PER_SEC; }  // all threads of the process
};
}  // namespace

int main(int argc, char** argv) {
  std::string root = FP4LAB_ROOT, trace_dir, recipe_name = "ufp4", cfg_name = "h100-class";
  int repeat = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--root") root = v;
    else if (k == "--trace") trace_dir = v;
    else if (k == "--recipe") recipe_name = v;
    else if (k == "--config") cfg_name = v;
    else if (k == "--repeat") repeat = std::stoi(v);
    else {
      std::fprintf(stderr, "fp4lab_sim_bench: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (trace_dir.empty()) trace_dir = root + "/workloads/tiny-lm/step_005000";
  const Recipe recipe = Recipe::preset(recipe_name);
  const auto quant = [&recipe](Pass p, Operand o, uint32_t gemm = 0) { return recipe.operand(p, o, gemm); };

  std::printf("== 1. timing only, one 8192^3 GEMM (ufp4 fwd_y), config h100-class ==\n");
  for (const char* mode : {"none", "fused"}) {
    const Config cfg =
        fp4lab::cli::load_sim_config(root + "/sim/configs/h100-class.cfg", {std::string("prep.mode=") + mode});
    GemmJob j;
    j.layer = "square";
    j.M = j.N = j.K = 8192;
    j.a = quant(Pass::fwd_y, Operand::a);
    j.b = quant(Pass::fwd_y, Operand::b);
    double best_wall = 1e30, best_cpu = 1e30;
    JobReport r;
    for (int k = 0; k < repeat; ++k) {
      Simulator sim(cfg);
      const Stopwatch sw;
      r = sim.run(j);
      best_wall = std::min(best_wall, sw.wall());
      best_cpu = std::min(best_cpu, sw.cpu());
    }
    const double steps = 64.0 * 32 * 64;  // (8192/128) x (8192/256) tiles x 8192/128 k-steps
    std::printf("prep.mode=%-6s  wall %.3f s  cpu %.3f s  (best of %d; budget 2 s)  %.0f k-step tiles, %.2f us each;"
                "  modelled %lld cycles = %.1f us\n",
                mode, best_wall, best_cpu, repeat, steps, 1e6 * best_wall / steps, (long long)r.cycles, r.time_us);
  }

  std::printf("\n== 2. --check on %s, recipe %s, config %s ==\n", trace_dir.c_str(), recipe_name.c_str(),
              cfg_name.c_str());
  const io::Trace trace(trace_dir, recipe.block);
  double golden_best = 1e30, check_best = 1e30, timing_best = 1e30;
  RunTimes best{};
  int64_t mismatches = 0, outputs = 0;
  for (int k = 0; k < repeat; ++k) {
    {  // golden model alone: load, quantise, fp4lab::gemm
      const Stopwatch sw;
      uint32_t gemm_id = 0;
      for (const auto& rec : trace.records()) {
        const auto layer = trace.load(rec);
        const uint32_t g = gemm_id++;
        for (Pass p : kPasses) {
          const PassOperands ops = pass_operands(p, layer.x.data(), layer.w.data(), layer.dy.data(), rec.tokens,
                                                 rec.in, rec.out);
          const QTensor qa = quantize(ops.a.data(), ops.M, ops.K, quant(p, Operand::a, g));
          const QTensor qb = quantize(ops.b.data(), ops.N, ops.K, quant(p, Operand::b, g));
          volatile float sink = gemm(qa, qb)[0];
          (void)sink;
        }
      }
      golden_best = std::min(golden_best, sw.wall());
    }
    const Config cfg = fp4lab::cli::load_sim_config(root + "/sim/configs/" + cfg_name + ".cfg");
    {  // the simulator with --check
      Simulator sim(cfg);
      RunOptions o;
      o.recipe = recipe_name;
      o.quant = quant;
      o.check = true;
      RunTimes t;
      const Report rep = run_trace(sim, trace, trace_dir, o, &t);
      if (t.total < check_best) {
        check_best = t.total;
        best = t;
      }
      mismatches = rep.total_mismatches();
      outputs = rep.total_checked();
    }
    {  // the simulator, timing only
      Simulator sim(cfg);
      RunOptions o;
      o.recipe = recipe_name;
      o.quant = quant;
      const Stopwatch sw;
      run_trace(sim, trace, trace_dir, o);
      timing_best = std::min(timing_best, sw.wall());
    }
  }
  const double golden_work = best.load + best.quantise + best.reference;
  const double timing_layer = best.total - golden_work - best.datapath;
  std::printf("golden model alone (load + quantise + fp4lab::gemm, 3 GEMMs x %zu records): %.3f s\n",
              trace.records().size(), golden_best);
  std::printf("sim --check total: %.3f s = golden work %.3f s (load %.3f, quantise %.3f, reference gemm %.3f)\n"
              "                    + simulated datapath %.3f s (MAC array + accumulator through GoldenDatapath)\n"
              "                    + timing layer %.3f s\n",
              best.total, golden_work, best.load, best.quantise, best.reference, best.datapath, timing_layer);
  std::printf("timing layer / golden model alone: %.1f%% (target <= 25%%);  sim --check / golden alone: %.2fx\n",
              100.0 * timing_layer / golden_best, best.total / golden_best);
  std::printf("sim timing only (no tensors read): %.3f s;  check: %lld mismatches in %lld outputs\n", timing_best,
              (long long)mismatches, (long long)outputs);
  return mismatches == 0 && outputs > 0 ? 0 : 1;
}
