// Helpers of the fp4lab cuda subcommands (cmd_cuda_*.cpp). The first part is host code, in every build; the
// second (timing, device inputs) exists where the CUDA kernels are built (FP4LAB_CLI_HAS_CUDA).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fp4lab/quantize.hpp"
#include "fp4lab/recipe.hpp"

#ifdef FP4LAB_CLI_HAS_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>

#include "fp4lab/cuda/kernels.hpp"
#endif

namespace fp4lab::cli::gpu {

// A named recipe preset; an unknown name is a usage fault (exit 2), as --recipe is for every subcommand.
Recipe preset(const std::string& name);

// Called once the arguments and inputs are checked, before any GPU work: throws cli::Error with kExitNoCuda in a
// build without CUDA, and with kExitNoDevice where no usable CUDA device is found.
#ifdef FP4LAB_CLI_HAS_CUDA
void require_gpu();
#else
[[noreturn]] void require_gpu();
#endif

// The recipe's grid, block and scale with RTNE and no RHT; the same with the fused RHT-16 (Transformer Engine's
// signs), as bench and timings time them.
QuantConfig plain_config(const Recipe& r);
QuantConfig rht16_config(const QuantConfig& plain);

#ifdef FP4LAB_CLI_HAS_CUDA
namespace fc = fp4lab::cuda;

struct Timer {
  cudaStream_t s;
  cudaEvent_t e0, e1;
  explicit Timer(cudaStream_t st) : s(st) {
    fp4lab::cuda::check(cudaEventCreate(&e0), "cudaEventCreate");
    fp4lab::cuda::check(cudaEventCreate(&e1), "cudaEventCreate");
  }
  ~Timer() {
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  // Median over `reps` of the time of one call of f, in microseconds. Short calls run `batch` at a time, captured
  // into a CUDA graph (launch gaps out of the figure) unless `graph` is false, and the time is divided by `batch`.
  template <class F>
  double median_us(F&& f, int reps, int batch = 1, bool graph = true) {
    for (int i = 0; i < 2; ++i) f(i);  // warm-up: allocations, module load, attributes
    fp4lab::cuda::check(cudaStreamSynchronize(s), "warm-up");
    cudaGraphExec_t exec = nullptr;
    if (batch > 1 && graph) {
      cudaGraph_t g;
      fp4lab::cuda::check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      for (int i = 0; i < batch; ++i) f(i);
      fp4lab::cuda::check(cudaStreamEndCapture(s, &g), "cudaStreamEndCapture");
      fp4lab::cuda::check(cudaGraphInstantiate(&exec, g, 0), "cudaGraphInstantiate");
      cudaGraphDestroy(g);
      fp4lab::cuda::check(cudaGraphLaunch(exec, s), "cudaGraphLaunch");  // warm the graph
    }
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
      fp4lab::cuda::check(cudaEventRecord(e0, s), "cudaEventRecord");
      if (exec)
        fp4lab::cuda::check(cudaGraphLaunch(exec, s), "cudaGraphLaunch");
      else
        for (int i = 0; i < batch; ++i) f(r * batch + i);
      fp4lab::cuda::check(cudaEventRecord(e1, s), "cudaEventRecord");
      fp4lab::cuda::check(cudaEventSynchronize(e1), "cudaEventSynchronize");
      float ms = 0;
      fp4lab::cuda::check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
      t.push_back(1000.0 * ms / batch);
    }
    if (exec) cudaGraphExecDestroy(exec);
    samples = t;  // in run order
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
  std::vector<double> samples;  // the last median_us call's per-call times, microseconds, in run order
};

// Inputs like training tensors: mostly Gaussian, a few large outliers (so block scales vary).

// Inputs like training tensors: mostly Gaussian, a few large outliers (so block scales vary).
std::vector<float> random_tensor(int64_t n, uint64_t seed);
std::string fixed(double x, int prec = 1);        // fixed-point text
std::string pad(const std::string& s, size_t w);  // right-aligned in w columns

// A device tensor of n values drawn like random_tensor: one host draw of at most 4 Mi values, repeated on the
// device (a kernel's time does not depend on which values repeat, and drawing billions on the host takes minutes).
fc::Buffer<float> device_random(int64_t n, uint64_t seed);

// Quantiser timings of one [rows, K] FP32 operand: plain, fused RHT + quantise, unfused (RHT pass, then the plain
// quantiser). Inputs rotate through enough copies that one pass over them is 4x the L2; short calls run as a
// CUDA-graph batch that visits them all.
struct QuantTimes {
  double plain_us = 0, fused_us = 0, unfused_us = 0;
  std::vector<double> plain_samples, fused_samples, unfused_samples;
  double bytes = 0;  // FP32 in + codes + scales out
  int batch = 1, buffers = 1;
};
QuantTimes time_quantize(Timer& T, const fc::DeviceInfo& dev, double copy_gbs, int64_t rows, int64_t K,
                         const QuantConfig& plain, const QuantConfig& rot, int reps, cudaStream_t s);

// One GEMM shape's operands (A [M, K], B [N, K], quantised under gc), output and workspace, and the batch its
// timing runs in: calls under ~2 ms (at an assumed 200 TOPS) repeat in batches.
struct GemmCase {
  fc::Buffer<float> dc;
  fc::DQTensor qa, qb;
  fc::GemmWorkspace gws;
  double flops = 0;
  int batch = 1;
  GemmCase(const QuantConfig& gc, int64_t M, int64_t N, int64_t K, cudaStream_t s);
};
#endif

}  // namespace fp4lab::cli::gpu
