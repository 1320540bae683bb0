// fp4lab CPU benchmark: every figure is printed beside a baseline measured in the same run.
//
//  1. Bit-exact block-scaled GEMM (fp4lab::gemm, pre-quantised operands) vs Eigen's FP32 SGEMM on the same
//     M, N, K with the same thread count; plus the scalar reference contract's rate for context. The fast
//     output is bit-compared against reference::gemm_contract on a sub-block of every shape.
//  2. Quantisation with RHT-16 vs without, on the same tensor.
// Times are medians over --reps repetitions after one warm-up, baseline and candidate run alternately.
// Exit status 1 if any bit comparison fails.
// GCC 12 warns inside its own AVX-512 intrinsics as Eigen inlines them (PR 105593, the
// _mm512_undefined_* passthroughs); the pragma covers the intrinsic headers Eigen pulls in first.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wunused-variable"
#include <Eigen/Dense>
#pragma GCC diagnostic pop
#include <boost/program_options.hpp>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "fp4lab/gemm.hpp"
#include "fp4lab/quantize.hpp"
#include "fp4lab/rht.hpp"
#include "reference/contract_gemm.hpp"
#include "src/gemm_kernels.hpp"

namespace po = boost::program_options;
using namespace fp4lab;

namespace {

double seconds(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// CPU seconds of the whole process (all threads) spent in fn: unlike wall time it does not grow while other
// processes hold the cores, so on a loaded machine it is the steadier figure for a ratio.
double cpu_seconds(const std::function<void()>& fn) {
  timespec t0, t1;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
  fn();
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
  return double(t1.tv_sec - t0.tv_sec) + 1e-9 * double(t1.tv_nsec - t0.tv_nsec);
}

double median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
}

// Median times of several functions (a baseline first, then candidates), run in turn after one warm-up each
// so that load from other processes on a shared machine falls on all of them alike.
std::vector<double> median_times(int reps, const std::vector<std::function<void()>>& fns) {
  for (const auto& f : fns) f();
  std::vector<std::vector<double>> t(fns.size());
  for (int r = 0; r < reps; ++r)
    for (size_t i = 0; i < fns.size(); ++i) t[i].push_back(seconds(fns[i]));
  std::vector<double> m;
  for (auto& v : t) m.push_back(median(v));
  return m;
}

std::vector<float> random_normal(int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

// Rows [r0, r0 + n) of a quantised tensor, as a tensor of its own.
QTensor row_slice(const QTensor& q, int64_t r0, int64_t n) {
  QTensor s = q;
  s.rows = n;
  s.codes.assign(q.codes.begin() + r0 * q.cols, q.codes.begin() + (r0 + n) * q.cols);
  s.scales.assign(q.scales.begin() + r0 * q.kblocks(), q.scales.begin() + (r0 + n) * q.kblocks());
  if (!q.scale_codes.empty())
    s.scale_codes.assign(q.scale_codes.begin() + r0 * q.kblocks(), q.scale_codes.begin() + (r0 + n) * q.kblocks());
  return s;
}

// Bit-compares C (M x N, from the fast path) with the reference contract on the first and last `edge`
// rows and columns (the last ones cover partial tiles). Returns the number of outputs compared, or -1
// on the first mismatch (printed).
int64_t verify_corners(const QTensor& a, const QTensor& b, const std::vector<float>& c, int64_t edge) {
  const int64_t M = a.rows, N = b.rows;
  int64_t checked = 0;
  for (int64_t m0 : {int64_t(0), std::max<int64_t>(0, M - edge)})
    for (int64_t n0 : {int64_t(0), std::max<int64_t>(0, N - edge)}) {
      const int64_t mm = std::min(edge, M - m0), nn = std::min(edge, N - n0);
      const auto ref = reference::gemm_contract(row_slice(a, m0, mm), row_slice(b, n0, nn));
      for (int64_t i = 0; i < mm; ++i)
        for (int64_t j = 0; j < nn; ++j) {
          const float x = c[(m0 + i) * N + n0 + j], y = ref[i * nn + j];
          if (std::memcmp(&x, &y, 4) != 0) {
            std::printf("MISMATCH at (%lld, %lld): fast %.9g reference %.9g\n", (long long)(m0 + i),
                        (long long)(n0 + j), double(x), double(y));
            return -1;
          }
          ++checked;
        }
    }
  return checked;
}

struct Shape {
  const char* name;
  int64_t M, N, K;
};

}  // namespace

int main(int argc, char** argv) {
  int reps = 5, threads = 2;
  std::string json_path;
  po::options_description desc("fp4lab bench options");
  desc.add_options()("help,h", "show this help")(
      "reps", po::value<int>(&reps)->default_value(5), "timed repetitions per figure (median is reported)")(
      "threads", po::value<int>(&threads)->default_value(2), "OpenMP threads for fp4lab and Eigen")(
      "quick", "small shapes only (a smoke run)")("json", po::value<std::string>(&json_path),
                                                  "also write the figures as JSON to this file");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    po::notify(vm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench: %s\n", e.what());
    return 2;
  }
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  if (reps < 1 || threads < 1) {
    std::fprintf(stderr, "bench: --reps and --threads must be at least 1\n");
    return 2;
  }
  const bool quick = vm.count("quick") > 0;
  omp_set_num_threads(threads);
  Eigen::setNbThreads(threads);
  std::string json = "{\"threads\": " + std::to_string(threads) + ", \"reps\": " + std::to_string(reps) +
                     ", \"gemm_path\": \"" + detail::gemm_path_name(detail::gemm_best_path()) + "\", \"gemm\": [";
  bool all_exact = true;

  // Other processes' load skews wall-clock figures (ratios less so: compared runs alternate); say what it was.
  double load[3] = {0, 0, 0};
  getloadavg(load, 3);
  std::printf("fp4lab bench: %d thread(s) (Eigen %d), median of %d reps, GEMM path %s, %d CPUs, load average %.2f\n\n",
              threads, Eigen::nbThreads(), reps, detail::gemm_path_name(detail::gemm_best_path()), omp_get_num_procs(),
              load[0]);

  // ---- 1. GEMM ------------------------------------------------------------------------------------
  const std::vector<Shape> shapes =
      quick ? std::vector<Shape>{{"small", 256, 256, 512}}
            : std::vector<Shape>{{"square", 2048, 2048, 2048},
                                 {"fwd_y", 4096, 2048, 512},    // tokens x out x in
                                 {"bwd_dw", 512, 2048, 4096}};  // out x in x tokens
  std::printf("Block-scaled GEMM (block 16, fp32 scales, bit-exact contract) vs Eigen SGEMM (FP32, FMA)\n");
  std::printf("fp4 = fp4lab::gemm (packs both operands, allocates and zero-fills its FP32 result);\n"
              "fp4 into C = the same kernels writing into a reused buffer, as Eigen writes into its preallocated C.\n");
  std::printf("GMAC/s; ratios are Eigen time / fp4 time.\n");
  std::printf("%-7s %-15s %-5s %8s %11s %8s %10s %11s  %s\n", "shape", "MxNxK", "fmt", "fp4", "fp4 into C", "Eigen",
              "fp4/Eigen", "into/Eigen", "bit-exact vs reference (sub-blocks)");
  bool first_json = true;
  for (const Shape& s : shapes) {
    const double macs = double(s.M) * double(s.N) * double(s.K);
    const auto xa = random_normal(s.M * s.K, 1), xb = random_normal(s.N * s.K, 2);
    // Eigen baseline: C[M,N] = A[M,K] . B[K,N], column-major as Eigen prefers.
    Eigen::MatrixXf ea = Eigen::Map<const Eigen::MatrixXf>(xa.data(), s.M, s.K);
    Eigen::MatrixXf eb = Eigen::Map<const Eigen::MatrixXf>(xb.data(), s.K, s.N);
    Eigen::MatrixXf ec(s.M, s.N);
    for (const ElemFormat& f : {kE1M2, kE2M1}) {
      QuantConfig cfg;
      cfg.format = f;
      cfg.block = 16;
      cfg.scale = ScaleKind::fp32;
      const QTensor qa = quantize(xa.data(), s.M, s.K, cfg), qb = quantize(xb.data(), s.N, s.K, cfg);
      std::vector<float> c, c2(size_t(s.M * s.N));
      const auto t = median_times(reps, {[&] { ec.noalias() = ea * eb; }, [&] { c = gemm(qa, qb); },
                                         [&] { detail::gemm_into(detail::gemm_best_path(), qa, qb, c2.data()); }});
      const double t_eigen = t[0], t_fp4 = t[1], t_into = t[2];
      const int64_t checked = verify_corners(qa, qb, c, 24);
      all_exact = all_exact && checked > 0;
      char dims[64];
      std::snprintf(dims, sizeof dims, "%lldx%lldx%lld", (long long)s.M, (long long)s.N, (long long)s.K);
      const bool same_into = std::memcmp(c.data(), c2.data(), c.size() * 4) == 0;  // both paths, same bits
      all_exact = all_exact && same_into;
      std::printf("%-7s %-15s %-5s %8.1f %11.1f %8.1f %9.2fx %10.2fx  %s (%lld outputs)\n", s.name, dims, f.name,
                  macs / t_fp4 / 1e9, macs / t_into / 1e9, macs / t_eigen / 1e9, t_eigen / t_fp4, t_eigen / t_into,
                  checked > 0 && same_into ? "yes" : "NO", (long long)std::max<int64_t>(checked, 0));
      json += std::string(first_json ? "" : ", ") + "{\"shape\": \"" + dims + "\", \"format\": \"" + f.name +
              "\", \"fp4_gmacs\": " + std::to_string(macs / t_fp4 / 1e9) +
              ", \"fp4_into_gmacs\": " + std::to_string(macs / t_into / 1e9) +
              ", \"eigen_sgemm_gmacs\": " + std::to_string(macs / t_eigen / 1e9) +
              ", \"ratio\": " + std::to_string(t_eigen / t_fp4) + ", \"bit_exact\": " + (checked > 0 ? "true" : "false") + "}";
      first_json = false;
    }
  }
  json += "]";

  // Context: the scalar reference contract (single thread, one output and one block at a time).
  {
    const int64_t M = 128, N = 128, K = 512;
    QuantConfig cfg;
    cfg.format = kE1M2;
    const auto xa = random_normal(M * K, 3), xb = random_normal(N * K, 4);
    const QTensor qa = quantize(xa.data(), M, K, cfg), qb = quantize(xb.data(), N, K, cfg);
    std::vector<float> r, c;
    const auto t = median_times(std::min(reps, 3), {[&] { r = reference::gemm_contract(qa, qb); }, [&] { c = gemm(qa, qb); }});
    const double t_ref = t[0], t_fast = t[1];
    const bool same = std::memcmp(r.data(), c.data(), r.size() * 4) == 0;
    all_exact = all_exact && same;
    const double macs = double(M) * N * K;
    std::printf("\nreference::gemm_contract (scalar, 1 thread) %lldx%lldx%lld e1m2: %.2f GMAC/s; fp4lab::gemm %.1f "
                "GMAC/s (%.0fx); whole output bit-identical: %s\n",
                (long long)M, (long long)N, (long long)K, macs / t_ref / 1e9, macs / t_fast / 1e9, t_ref / t_fast,
                same ? "yes" : "NO");
    json += ", \"reference_gmacs\": " + std::to_string(macs / t_ref / 1e9);
  }
  std::printf("bit-exact: %s\n", all_exact ? "yes" : "NO");

  // ---- 2. Quantisation with and without RHT -----------------------------------------------------
  {
    const int64_t R = quick ? 1024 : 4096, C = quick ? 1024 : 4096;
    const auto x = random_normal(R * C, 5);
    QuantConfig plain;
    plain.format = kE1M2;
    plain.scale = ScaleKind::fp32;
    QuantConfig rht = plain;
    rht.rht = 16;
    rht.rht_signs = rht_signs_te(16);
    // Cheap runs: take more of them, and CPU time beside wall time (see cpu_seconds).
    const int qreps = std::max(reps, 15);
    const auto t = median_times(qreps, {[&] { (void)quantize(x.data(), R, C, plain); },
                                        [&] { (void)quantize(x.data(), R, C, rht); }});
    const double t_plain = t[0], t_rht = t[1];
    std::vector<double> cp, cr;
    for (int r = 0; r < qreps; ++r) {
      cp.push_back(cpu_seconds([&] { (void)quantize(x.data(), R, C, plain); }));
      cr.push_back(cpu_seconds([&] { (void)quantize(x.data(), R, C, rht); }));
    }
    const double c_plain = median(cp), c_rht = median(cr);
    const double gel = double(R) * C / 1e9;
    std::printf("\nQuantise %lldx%lld e1m2 fp32 scales, block 16, median of %d:\n"
                "  wall: plain %.1f ms (%.2f Gelem/s), RHT-16 %.1f ms (%.2f Gelem/s), RHT/plain = %.3fx (goal <= 1.15x)\n"
                "  CPU time (all threads): plain %.1f ms, RHT-16 %.1f ms, RHT/plain = %.3fx\n",
                (long long)R, (long long)C, qreps, t_plain * 1e3, gel / t_plain, t_rht * 1e3, gel / t_rht,
                t_rht / t_plain, c_plain * 1e3, c_rht * 1e3, c_rht / c_plain);
    json += ", \"quantize\": {\"shape\": \"" + std::to_string(R) + "x" + std::to_string(C) +
            "\", \"plain_ms\": " + std::to_string(t_plain * 1e3) + ", \"rht16_ms\": " + std::to_string(t_rht * 1e3) +
            ", \"ratio\": " + std::to_string(t_rht / t_plain) + ", \"plain_cpu_ms\": " + std::to_string(c_plain * 1e3) +
            ", \"rht16_cpu_ms\": " + std::to_string(c_rht * 1e3) + ", \"cpu_ratio\": " + std::to_string(c_rht / c_plain) + "}";

    // Stochastic rounding under every SR draw (docs/spec.md §4), beside plain RTNE in the same run.
    QuantConfig sr4 = plain;
    sr4.rounding = Rounding::sr;
    sr4.seed = 7;
    sr4.sr_draw = SrDraw::philox4;
    QuantConfig sr1 = sr4, sr16 = sr4;
    sr1.sr_draw = SrDraw::philox1;
    sr16.sr_draw = SrDraw::philox16;
    const auto ts = median_times(qreps, {[&] { (void)quantize(x.data(), R, C, plain); },
                                         [&] { (void)quantize(x.data(), R, C, sr4); },
                                         [&] { (void)quantize(x.data(), R, C, sr1); },
                                         [&] { (void)quantize(x.data(), R, C, sr16); }});
    std::printf("  SR: plain %.1f ms, SR philox4 %.1f ms (%.2fx plain), SR philox1 %.1f ms (%.2fx plain), "
                "SR philox16 %.1f ms (%.2fx plain); philox1/philox4 = %.2fx\n",
                ts[0] * 1e3, ts[1] * 1e3, ts[1] / ts[0], ts[2] * 1e3, ts[2] / ts[0], ts[3] * 1e3, ts[3] / ts[0],
                ts[2] / ts[1]);
    json += ", \"quantize_sr\": {\"plain_ms\": " + std::to_string(ts[0] * 1e3) + ", \"philox4_ms\": " +
            std::to_string(ts[1] * 1e3) + ", \"philox1_ms\": " + std::to_string(ts[2] * 1e3) +
            ", \"philox16_ms\": " + std::to_string(ts[3] * 1e3) + "}";
  }
  getloadavg(load, 3);
  std::printf("load average at the end: %.2f\n", load[0]);
  json += ", \"bit_exact\": " + std::string(all_exact ? "true" : "false") + "}\n";
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    if (!(out << json)) {
      std::fprintf(stderr, "bench: cannot write %s\n", json_path.c_str());
      return 2;
    }
  }
  return all_exact ? 0 : 1;
}
