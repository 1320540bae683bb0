// The numerics monitor's statistics of one quantised operand in one pass (fp4lab.torch.monitor on CUDA), in a fixed
// order so that a repeat gives the same bits.
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>

#include "common.cuh"

namespace fp4lab::cuda {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kBlocks = 264;  // a fixed grid: the summation order depends on n alone, not on the device

struct Partial {
  double sig, noise;
  float amax;
  unsigned long long flushed, saturated;
};

// max |x| that keeps a NaN once seen, as torch's infinity norm does.
__device__ __forceinline__ float nan_max(float m, float a) { return (a > m || a != a) ? a : m; }

__device__ __forceinline__ void combine(Partial& p, const Partial& o) {
  p.sig += o.sig;
  p.noise += o.noise;
  p.amax = nan_max(p.amax, o.amax);
  p.flushed += o.flushed;
  p.saturated += o.saturated;
}

// Tree reduction of a block's partials in shared memory, always in the same order.
__device__ void block_reduce(Partial& p, Partial* sh) {
  sh[threadIdx.x] = p;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) combine(sh[threadIdx.x], sh[threadIdx.x + s]);
    __syncthreads();
  }
  p = sh[0];
}

__global__ void __launch_bounds__(kThreads) stats_kernel(const float* x, const float* ref, const float* dq,
                                                         const uint8_t* codes, int64_t n, int64_t nbytes,
                                                         unsigned sat_mask, Partial* partials) {
  __shared__ Partial sh[kThreads];
  Partial p{0.0, 0.0, 0.0f, 0, 0};
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    const double r = ref[i], d = r - double(dq[i]);  // each term as the host computes it in FP64
    p.sig += r * r;
    p.noise += d * d;
    p.amax = nan_max(p.amax, fabsf(x[i]));
    p.flushed += (dq[i] == 0.0f && ref[i] != 0.0f) ? 1u : 0u;
  }
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < nbytes; i += stride) {
    const unsigned b = codes[i];
    p.saturated += ((sat_mask >> (b & 15u)) & 1u) + ((sat_mask >> (b >> 4)) & 1u);
  }
  block_reduce(p, sh);
  if (threadIdx.x == 0) partials[blockIdx.x] = p;
}

__global__ void __launch_bounds__(kThreads) finish_kernel(const Partial* partials, double* out) {
  __shared__ Partial sh[kThreads];
  Partial p{0.0, 0.0, 0.0f, 0, 0};
  for (unsigned b = threadIdx.x; b < kBlocks; b += kThreads) combine(p, partials[b]);
  block_reduce(p, sh);
  if (threadIdx.x == 0) {
    out[0] = p.sig;
    out[1] = p.noise;
    out[2] = double(p.amax);
    out[3] = double(p.flushed);
    out[4] = double(p.saturated);
  }
}

}  // namespace

void operand_stats(const float* d_x, const float* d_ref, const float* d_dq, const uint8_t* d_codes, int64_t n,
                   unsigned saturated_codes, double* d_out, OperandStatsWorkspace& ws, cudaStream_t s) {
  if (n < 0) throw std::invalid_argument("operand_stats(): negative element count");
  if (saturated_codes > 0xFFFFu) throw std::invalid_argument("operand_stats(): the code mask has 16 bits");
  ws.partials.resize(kBlocks * sizeof(Partial));
  auto* partials = reinterpret_cast<Partial*>(ws.partials.data());
  stats_kernel<<<kBlocks, kThreads, 0, s>>>(d_x, d_ref, d_dq, d_codes, n, (n + 1) / 2, saturated_codes, partials);
  check_launch("operand_stats stats_kernel");
  finish_kernel<<<1, kThreads, 0, s>>>(partials, d_out);
  check_launch("operand_stats finish_kernel");
}

}  // namespace fp4lab::cuda
