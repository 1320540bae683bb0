// The timing harness of the CUDA kernels, for the benches and the simulator's validation set (fp4lab cuda bench,
// qbench, timings): CUDA-event medians after a warm-up, short calls batched (into a CUDA graph where the call
// allows it), inputs rotated through buffers larger than the L2, and the device-to-device copy every figure is
// read against. Nothing here prints; the front-ends lay the figures out.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fp4lab/cuda/device.hpp"
#include "fp4lab/cuda/kernels.hpp"
#include "fp4lab/quantize.hpp"
#include "fp4lab/recipe.hpp"

namespace fp4lab::cuda {

// A non-blocking stream (it does not wait for the legacy stream), destroyed with the object; close() destroys it
// early and throws Error on a fault the stream's work left behind.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void close();

 private:
  cudaStream_t s_ = nullptr;
};

struct Timer {
  cudaStream_t s;
  cudaEvent_t e0, e1;
  explicit Timer(cudaStream_t st) : s(st) {
    check(cudaEventCreate(&e0), "cudaEventCreate");
    check(cudaEventCreate(&e1), "cudaEventCreate");
  }
  ~Timer() {
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  // Median over `reps` of the time of one call of f(i), in microseconds. Short calls run `batch` at a time,
  // captured into a CUDA graph (launch gaps out of the figure) unless `graph` is false, and the time is divided by
  // `batch`. f(i) must issue its work on the timer's stream; i counts the calls, so that f can rotate its inputs.
  template <class F>
  double median_us(F&& f, int reps, int batch = 1, bool graph = true) {
    for (int i = 0; i < 2; ++i) f(i);  // warm-up: allocations, module load, attributes
    check(cudaStreamSynchronize(s), "warm-up");
    cudaGraphExec_t exec = nullptr;
    if (batch > 1 && graph) {
      cudaGraph_t g;
      check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      for (int i = 0; i < batch; ++i) f(i);
      check(cudaStreamEndCapture(s, &g), "cudaStreamEndCapture");
      check(cudaGraphInstantiate(&exec, g, 0), "cudaGraphInstantiate");
      cudaGraphDestroy(g);
      check(cudaGraphLaunch(exec, s), "cudaGraphLaunch");  // warm the graph
    }
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
      check(cudaEventRecord(e0, s), "cudaEventRecord");
      if (exec)
        check(cudaGraphLaunch(exec, s), "cudaGraphLaunch");
      else
        for (int i = 0; i < batch; ++i) f(r * batch + i);
      check(cudaEventRecord(e1, s), "cudaEventRecord");
      check(cudaEventSynchronize(e1), "cudaEventSynchronize");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
      t.push_back(1000.0 * ms / batch);
    }
    if (exec) cudaGraphExecDestroy(exec);
    samples = t;  // in run order
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
  std::vector<double> samples;  // the last median_us call's per-call times, microseconds, in run order
};

// The recipe's grid, block and scale with RTNE and no RHT; the same with the fused RHT-16 (Transformer Engine's
// signs), as bench and timings time them.
QuantConfig plain_config(const Recipe& r);
QuantConfig rht16_config(const QuantConfig& plain);

// Inputs like training tensors: mostly Gaussian, a few large outliers (so block scales vary).
std::vector<float> random_tensor(int64_t n, uint64_t seed);
// A device tensor of n values drawn like random_tensor: one host draw of at most 4 Mi values, repeated on the
// device (a kernel's time does not depend on which values repeat, and drawing billions on the host takes minutes).
Buffer<float> device_random(int64_t n, uint64_t seed);
// The same as BF16 bit patterns (each value rounded to nearest even).
Buffer<uint16_t> device_random_bf16(int64_t n, uint64_t seed);

// ---- the copy baseline ----------------------------------------------------------------------------------------------
// One device-to-device copy of `bytes` between two fresh buffers, timed one call at a time: its median and the
// bandwidth it gives, bytes read + bytes written.
struct CopyTime {
  double us = 0, gbs = 0;
};
CopyTime time_copy(Timer& T, size_t bytes, int reps);

// Copies of several sizes whose source and destination walk through buffers of `span` bytes (at least 1 GiB), so
// that small copies do not stay in the L2; short copies run as CUDA-graph batches.
class CopyWalk {
 public:
  explicit CopyWalk(size_t span);
  struct Time {
    double us = 0;  // median per copy
    int batch = 1;  // copies per timed launch (graph when > 1)
  };
  Time time(Timer& T, int64_t bytes, int reps);  // per-copy samples in T.samples

 private:
  size_t span_;
  Buffer<uint8_t> c0_, c1_;
};

// ---- the FP32 quantiser ---------------------------------------------------------------------------------------------
// Quantiser timings of one [rows, K] FP32 operand: plain, fused RHT + quantise, unfused (RHT pass, then the plain
// quantiser). Inputs rotate through enough copies that one pass over them is 4x the L2; short calls run as a
// CUDA-graph batch that visits them all.
struct QuantTimes {
  double plain_us = 0, fused_us = 0, unfused_us = 0;
  std::vector<double> plain_samples, fused_samples, unfused_samples;
  double bytes = 0;  // FP32 in + codes + scales out
  int batch = 1, buffers = 1;
};
QuantTimes time_quantize(Timer& T, const DeviceInfo& dev, double copy_gbs, int64_t rows, int64_t K,
                         const QuantConfig& plain, const QuantConfig& rot, int reps);

// ---- the BF16 quantiser ---------------------------------------------------------------------------------------------
// The variants qbench times per recipe: plain (the recipe's grid, block and scale, RTNE), rht16 (fused RHT-16 with
// the recipe's BF16 rounding), sr (stochastic rounding, philox4), sr1 (the same under philox1, the original
// draw: one Philox block per element), sr16 (under philox16: a block per sixteen elements, 8 bits each), rht16-sr
// (both: a training step's dY under ufp4) and rht16-sr16 (the same under philox16).
struct Bf16Variants {
  QuantConfig plain, rht16, sr, sr1, rht16_sr, sr16, rht16_sr16;
};
Bf16Variants bf16_variants(const Recipe& r);
// How the operand X [R, C] is quantised: along C (row-wise), X^T along R read in place (transposed), or the route
// the transposed read replaces: a copy of X, then the row-wise quantiser on it (copy_row). fake_row and
// fake_transposed: the fake quantiser of a training step's fast GEMMs (fake_quantize), BF16 dequantised values
// out instead of codes and scales; fake_both: both of them from one read (fake_quantize_both, the same config).
enum class Bf16Layout { row_wise, transposed, copy_row, fake_row, fake_transposed, fake_both };

// One BF16 operand shape [R, C]: its inputs rotated through buffers over 4x the L2 (at least two), and the batch
// every timing runs in (as a CUDA graph).
class Bf16QuantBench {
 public:
  Bf16QuantBench(const DeviceInfo& dev, int64_t R, int64_t C);
  int batch() const { return batch_; }
  int buffers() const { return nbuf_; }
  // Bytes a quantiser moves under cfg: BF16 in, packed codes, FP32 decoded scales (and scale codes) out, + 4; for
  // the fake layouts BF16 in and BF16 out (out twice for fake_both).
  double bytes(const QuantConfig& cfg, Bf16Layout layout = Bf16Layout::row_wise) const;
  // The copy that moves the bytes of a quantiser call: `bytes` rounded down to a multiple of 16, half read and half
  // written (bytes / 2 copied device to device from the rotating inputs); measured once per byte count.
  CopyTime copy(Timer& T, double bytes, int reps);
  double time(Timer& T, const QuantConfig& cfg, Bf16Layout layout, int reps);  // samples in T.samples

 private:
  int64_t R_, C_;
  int nbuf_, batch_;
  std::vector<Buffer<uint16_t>> xs_;
  Buffer<uint16_t> xt_;  // the copy of the replaced transposed route; the fake layouts' output
  Buffer<uint16_t> xt2_;  // fake_both's transposed output
  Buffer<float> bound_, bound_t_;  // fake_both's magnitude bounds, as the torch layer asks for them
  Buffer<uint8_t> dst_;
  DQTensor q_;
  QuantWorkspace ws_, ws_t_;
  std::map<size_t, double> copy_us_;
};

// ---- the block-scaled GEMM ------------------------------------------------------------------------------------------
// One GEMM shape's operands (A [M, K], B [N, K], quantised under gc from device_random draws), output and
// workspace, and the batch its timings run in: calls under ~2 ms (at an assumed 200 TOPS) repeat in batches. Every
// timing is a plain launch loop (no graph), as a training step issues the calls, on the timer's stream.
struct GemmCase {
  Buffer<float> dc;
  DQTensor qa, qb;
  GemmWorkspace gws;
  double flops = 0;
  int batch = 1;
  GemmCase(const QuantConfig& gc, int64_t M, int64_t N, int64_t K, cudaStream_t s);

  // Runs the default variant's unpack pass on stream s and tells whether these operands' scales take the fused
  // epilogue (synchronises s).
  bool prepare_fused(cudaStream_t s);
  double time_unpack(Timer& T, int reps, int variant = -1);  // the prepare pass (views of `variant`)
  double time_mma(Timer& T, int reps, int variant);          // the mma kernel on prepared views
  double time_mma_unfused(Timer& T, int reps, int variant);  // the same with the separate multiply and add
  double time_fast(Timer& T, int reps, int variant);         // the whole call: unpack + mma
  // cuBLAS BF16 on operands of this shape drawn like random_tensor (BF16 in, FP32 out).
  double time_cublas_bf16(Timer& T, CublasBf16& cublas, int reps);

 private:
  int64_t M_, N_, K_;
};

}  // namespace fp4lab::cuda
