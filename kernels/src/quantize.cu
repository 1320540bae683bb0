// Quantiser kernels: plain, fused RHT + quantise, the unfused RHT pass, amax passes, and the device<->golden
// layout helpers. All arithmetic is the golden model's (rht_block, round_to_bf16, nvfp4_global_encode,
// block_scale, scale_element, round_rtne, round_sr, random_bits), called from device code.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "common.cuh"
#include "round_fast.cuh"
#include "fp4lab/cuda/kernels.hpp"
#include "fp4lab/philox.hpp"
#include "fp4lab/quantize.hpp"
#include "fp4lab/rht.hpp"
#include "fp4lab/scale.hpp"

namespace fp4lab::cuda {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}
void check_launch(const char* what, bool sync) {
  check(cudaGetLastError(), what);
  if (sync) check(cudaDeviceSynchronize(), what);
}

bool device_available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why) *why = e != cudaSuccess ? std::string(cudaGetErrorString(e)) : std::string("no CUDA device");
    cudaGetLastError();  // clear the sticky "no device" error for later callers
    return false;
  }
  return true;
}

DeviceInfo device_info() {
  DeviceInfo d;
  check(cudaGetDevice(&d.id), "cudaGetDevice");
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, d.id), "cudaGetDeviceProperties");
  d.name = p.name;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.sms = p.multiProcessorCount;
  d.l2_bytes = size_t(p.l2CacheSize);
  d.mem_bytes = p.totalGlobalMem;
  return d;
}

namespace {

constexpr int kThreads = 256;

struct QArgs {
  const void* x;           // float, or BF16 bits (uint16_t): the kernel's T
  int64_t rows, cols;
  uint8_t* codes;          // packed, rows * cols / 2
  float* scales;           // rows * cols / B
  uint8_t* scale_codes;    // null for fp32 scales
  float* global_dec;       // one value, written by thread 0
  const float* block_amax; // tile2d: the tile amax of every block; null = compute in registers
  const unsigned* tensor_amax;  // ue4m3: FP32 bits of amax(tensor); null otherwise
  int* nonfinite;          // bit 0: an input is NaN or Inf; bit 1: its RHT overflowed FP32; null = not checked
  ScaleKind scale;
  Rounding rounding;
  bool rht_bf16;
  uint64_t seed;
  const uint64_t* seed_dev; // non-null: the seed is read here on the device (a captured step's key)
  uint32_t stream;
  float signs[32];         // RHT signs (D entries)
  uint16_t* deq;           // fake quantisation: the dequantised BF16 values [rows, cols]; null = not written
  float value[16];         // decode(format, code), for deq
  const int64_t* row_index; // output row r is row row_index[r] of a larger tensor (SR draws at its element
                            // indices; a negative one sets bit 2 of nonfinite); null: row r is row r
};

// Loads the G consecutive inputs of one thread with 16-byte loads (cols is a multiple of 16, so every group
// starts 64-byte (FP32) or 32-byte (BF16) aligned when the tensor does). BF16 inputs widen exactly to FP32, as
// the golden model's reader does, so a BF16 tensor quantises to the bits its FP32 copy would.
template <int G>
__device__ __forceinline__ void load_group(const float* p, float (&y)[G]) {
  const float4* q = reinterpret_cast<const float4*>(p);
#pragma unroll
  for (int i = 0; i < G / 4; ++i) {
    const float4 v = __ldg(q + i);
    y[4 * i] = v.x;
    y[4 * i + 1] = v.y;
    y[4 * i + 2] = v.z;
    y[4 * i + 3] = v.w;
  }
}
template <int G>
__device__ __forceinline__ void load_group(const uint16_t* p, float (&y)[G]) {
  const uint4* q = reinterpret_cast<const uint4*>(p);
#pragma unroll
  for (int i = 0; i < G / 8; ++i) {
    const uint4 v = __ldg(q + i);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      y[8 * i + 2 * j] = bf16_to_f32(uint16_t(w[j] & 0xFFFFu));
      y[8 * i + 2 * j + 1] = bf16_to_f32(uint16_t(w[j] >> 16));
    }
  }
}

template <int G>
__device__ __forceinline__ void flag_nonfinite(const float (&y)[G], int* flag, int bit) {
  if (!flag) return;
  bool bad = false;
#pragma unroll
  for (int j = 0; j < G; ++j) bad |= !isfinite(y[j]);
  if (bad) atomicOr(flag, bit);
}

// Step 1 of the contract (docs/datapath.md section 2) on the thread's G values: RHT-D per D consecutive
// values with the golden rht_block, then BF16 rounding when the recipe asks (Transformer Engine's order).
template <int G, int D>
__device__ __forceinline__ void rotate_group(float (&y)[G], const float* signs, bool bf16) {
  if constexpr (D > 0) {
#pragma unroll
    for (int s = 0; s < G; s += D) rht_block(y + s, D, signs);
    if (bf16) {
#pragma unroll
      for (int j = 0; j < G; ++j) y[j] = round_to_bf16(y[j]);
    }
  }
}

// Scales and rounds block b of the thread's values into packed nibbles (element e -> bits 4(e%8) of word e/8).
// WIDE: Philox's products as widening multiplies (philox.hpp); the same bits either way.
template <int F, int B, bool FP32, bool RTNE, bool WIDE, int G>
__device__ __forceinline__ void round_block(const float (&y)[G], int b, const BlockScale& bs, ScaleKind kind,
                                            const QArgs& a, uint64_t seed, int64_t base, uint32_t (&packed)[G / 8]) {
#pragma unroll
  for (int j = 0; j < B; ++j) {
    const int e = b * B + j;
    const float v = scale_element(FP32 ? ScaleKind::fp32 : kind, y[e], bs);
    const uint8_t c = RTNE ? detail::round_rtne_fast<F>(v)
                           : detail::round_sr_fast<F>(v, random_bits_in_group<WIDE>(seed, a.stream, uint64_t(base), uint32_t(e)));
    packed[e / 8] |= uint32_t(c) << (4 * (e % 8));
  }
}

// One element, widened to FP32 (the transpose kernel's loads).
__device__ __forceinline__ float load1(const float* p) { return __ldg(p); }
__device__ __forceinline__ float load1(const uint16_t* p) { return bf16_to_f32(__ldg(p)); }

// Quotient and remainder of a group index: 32-bit division where the index fits (64-bit division is a long
// software sequence, paid once per group).
__device__ __forceinline__ void split_index(int64_t g, int64_t per_row, bool small, int64_t& row, int64_t& col) {
  if (small) {
    const uint32_t r = uint32_t(g) / uint32_t(per_row);
    row = r;
    col = int64_t(uint32_t(g) - r * uint32_t(per_row));
  } else {
    row = g / per_row;
    col = g - row * per_row;
  }
}

// Everything after the load, for G consecutive values y of output row `row` from column col0 (output layout
// [a.rows, a.cols]): RHT-D, block amax and scale, rounding, packed codes and scales stored. Shared by the
// row-wise and the transposed kernel, so both run the same golden arithmetic on the same values.
// IDX: a.row_index is set (a template parameter, so that the default kernels are compiled as they were, with their
// registers and speed; the indexed ones are instantiated beside them).
template <int F, int B, int D, int G, bool WIDE = true, bool IDX = false>
__device__ __forceinline__ void quantize_group(float (&y)[G], int64_t row, int64_t col0, const QArgs& a,
                                               float s_enc) {
  constexpr ElemFormat f = kAllFormats[F];
  flag_nonfinite<G>(y, a.nonfinite, 1);
  rotate_group<G, D>(y, a.signs, a.rht_bf16);
  // As fp4lab::quantize: finite inputs near FLT_MAX can rotate to Inf/NaN, which has no code.
  if constexpr (D > 0) flag_nonfinite<G>(y, a.nonfinite, 2);
  const int64_t base = row * a.cols + col0;  // a multiple of G: G divides cols and col0 (the SR groups)
  // The element index SR draws at: the larger tensor's where the row is one of its rows.
  int64_t sr_base = base;
  if constexpr (IDX) {
    const int64_t r = __ldg(a.row_index + row);
    if (r < 0 && a.nonfinite) atomicOr(a.nonfinite, 4);
    sr_base = r * a.cols + col0;
  }
  const float g_dec = a.scale == ScaleKind::ue4m3 ? 1.0f / s_enc : 1.0f;
  if (base == 0 && a.global_dec) *a.global_dec = g_dec;

  const int64_t kb = a.cols / B;
  const uint64_t seed = a.rounding == Rounding::sr && a.seed_dev ? __ldg(a.seed_dev) : a.seed;
  uint32_t packed[G / 8];
#pragma unroll
  for (int w = 0; w < G / 8; ++w) packed[w] = 0;
  float s_dec[G / B];
#pragma unroll
  for (int b = 0; b < G / B; ++b) {
    const int64_t sidx = row * kb + col0 / B + b;
    float amax = 0.0f;
    if (a.block_amax) {
      amax = a.block_amax[sidx];
    } else {
#pragma unroll
      for (int j = 0; j < B; ++j) amax = fmaxf(amax, fabsf(y[b * B + j]));
    }
    const BlockScale bs = block_scale(f, a.scale, amax, s_enc);
    s_dec[b] = bs.dec;
    if (a.scales) a.scales[sidx] = bs.dec;
    if (a.scale_codes) a.scale_codes[sidx] = bs.code;
    // Unswitched by hand so that neither the division of fp32 scales nor Philox runs where it is not needed.
    if (a.scale == ScaleKind::fp32) {
      if (a.rounding == Rounding::rtne)
        round_block<F, B, true, true, WIDE>(y, b, bs, ScaleKind::fp32, a, seed, base, packed);
      else
        round_block<F, B, true, false, WIDE>(y, b, bs, ScaleKind::fp32, a, seed, sr_base, packed);
    } else {
      if (a.rounding == Rounding::rtne)
        round_block<F, B, false, true, WIDE>(y, b, bs, a.scale, a, seed, base, packed);
      else
        round_block<F, B, false, false, WIDE>(y, b, bs, a.scale, a, seed, sr_base, packed);
    }
  }
  if (a.codes) {
    uint8_t* out = a.codes + base / 2;
    if constexpr (G == 16) {
      *reinterpret_cast<uint2*>(out) = make_uint2(packed[0], packed[1]);
    } else {
#pragma unroll
      for (int w = 0; w < G / 16; ++w)
        reinterpret_cast<uint4*>(out)[w] =
            make_uint4(packed[4 * w], packed[4 * w + 1], packed[4 * w + 2], packed[4 * w + 3]);
    }
  }
  if (a.deq) {
    // The dequantiser's arithmetic (dequantize_kernel), on the codes still in registers: fake quantisation reads
    // the input once and writes BF16 once, instead of writing codes and scales and reading them back.
    uint32_t w[G / 2];
#pragma unroll
    for (int e = 0; e < G; e += 2) {
      const float lo = dequant_value(a.value[(packed[e / 8] >> (4 * (e % 8))) & 15u], s_dec[e / B], g_dec);
      const float hi = dequant_value(a.value[(packed[e / 8] >> (4 * (e % 8 + 1))) & 15u], s_dec[e / B], g_dec);
      w[e / 2] = uint32_t(f32_to_bf16(lo)) | (uint32_t(f32_to_bf16(hi)) << 16);
    }
    uint4* o = reinterpret_cast<uint4*>(a.deq + base);
#pragma unroll
    for (int i = 0; i < G / 8; ++i) o[i] = make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
  }
}

// The tensor-level half of ue4m3 (S_enc from amax(tensor)), as fp4lab::quantize computes it.
template <int F>
__device__ __forceinline__ float tensor_encode(const QArgs& a) {
  constexpr ElemFormat f = kAllFormats[F];
  return a.scale == ScaleKind::ue4m3 ? nvfp4_global_encode(f, __uint_as_float(*a.tensor_amax)) : 1.0f;
}

// A group's raw input words: 16-byte loads (cols is a multiple of 16, so every group starts 32-byte (BF16) or
// 64-byte (FP32) aligned when the tensor does).
template <class T, int G>
struct RawGroup {
  uint4 v[G * sizeof(T) / 16];
};
template <class T, int G>
__device__ __forceinline__ void load_raw(const T* p, RawGroup<T, G>& r) {
  const uint4* q = reinterpret_cast<const uint4*>(p);
#pragma unroll
  for (int i = 0; i < G * int(sizeof(T)) / 16; ++i) r.v[i] = __ldg(q + i);
}
// BF16 inputs widen exactly to FP32, as the golden model's reader does, so a BF16 tensor quantises to the bits
// its FP32 copy would.
template <int G>
__device__ __forceinline__ void widen(const RawGroup<float, G>& r, float (&y)[G]) {
#pragma unroll
  for (int i = 0; i < G / 4; ++i) {
    y[4 * i] = __uint_as_float(r.v[i].x);
    y[4 * i + 1] = __uint_as_float(r.v[i].y);
    y[4 * i + 2] = __uint_as_float(r.v[i].z);
    y[4 * i + 3] = __uint_as_float(r.v[i].w);
  }
}
template <int G>
__device__ __forceinline__ void widen(const RawGroup<uint16_t, G>& r, float (&y)[G]) {
#pragma unroll
  for (int i = 0; i < G / 8; ++i) {
    const uint32_t w[4] = {r.v[i].x, r.v[i].y, r.v[i].z, r.v[i].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      y[8 * i + 2 * j] = bf16_to_f32(uint16_t(w[j] & 0xFFFFu));
      y[8 * i + 2 * j + 1] = bf16_to_f32(uint16_t(w[j] >> 16));
    }
  }
}

// The transposed kernels' raw words: G rows of two adjacent columns (one 32-bit word per row for BF16, two for
// FP32). Odd row lengths load element by element (the pair is not aligned); a missing second column reads as 0.
template <class T, int G>
struct RawPairs {
  uint32_t w[G * sizeof(T) / 2];
};
template <int G>
__device__ __forceinline__ void load_pairs(const uint16_t* p, int64_t ld, bool aligned, bool two,
                                           RawPairs<uint16_t, G>& r) {
#pragma unroll
  for (int i = 0; i < G; ++i) {
    if (aligned) {
      r.w[i] = __ldg(reinterpret_cast<const unsigned int*>(p + i * ld));
    } else {
      const uint32_t lo = __ldg(p + i * ld), hi = two ? __ldg(p + i * ld + 1) : 0u;
      r.w[i] = lo | (hi << 16);
    }
  }
}
template <int G>
__device__ __forceinline__ void load_pairs(const float* p, int64_t ld, bool aligned, bool two, RawPairs<float, G>& r) {
#pragma unroll
  for (int i = 0; i < G; ++i) {
    if (aligned) {
      const float2 v = __ldg(reinterpret_cast<const float2*>(p + i * ld));
      r.w[2 * i] = __float_as_uint(v.x);
      r.w[2 * i + 1] = __float_as_uint(v.y);
    } else {
      r.w[2 * i] = __float_as_uint(__ldg(p + i * ld));
      r.w[2 * i + 1] = two ? __float_as_uint(__ldg(p + i * ld + 1)) : 0u;
    }
  }
}
template <int G>
__device__ __forceinline__ void widen_pairs(const RawPairs<uint16_t, G>& r, float (&y0)[G], float (&y1)[G]) {
#pragma unroll
  for (int i = 0; i < G; ++i) {
    y0[i] = bf16_to_f32(uint16_t(r.w[i] & 0xFFFFu));
    y1[i] = bf16_to_f32(uint16_t(r.w[i] >> 16));
  }
}
template <int G>
__device__ __forceinline__ void widen_pairs(const RawPairs<float, G>& r, float (&y0)[G], float (&y1)[G]) {
#pragma unroll
  for (int i = 0; i < G; ++i) {
    y0[i] = __uint_as_float(r.w[2 * i]);
    y1[i] = __uint_as_float(r.w[2 * i + 1]);
  }
}

// Row-wise: one thread quantises one group of G = max(B, D) consecutive elements of a row, its G/B blocks wholly
// in registers; consecutive threads take consecutive groups, so every load and store instruction of a warp covers
// consecutive memory. (A grid of resident blocks striding over the tensor with the next group prefetched was
// measured slower on the H200: more instructions per element, and the kernel is issue-bound, not latency-bound.)
template <class T, int F, int B, int D, bool IDX>
__global__ void __launch_bounds__(kThreads) quantize_kernel(const QArgs a) {
  constexpr int G = B > D ? B : D;
  const int64_t groups_per_row = a.cols / G, n = a.rows * groups_per_row;
  const int64_t g = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (g >= n) return;
  RawGroup<T, G> raw;
  load_raw(static_cast<const T*>(a.x) + g * G, raw);  // row * cols + col0 == g * G
  float y[G];
  widen(raw, y);
  int64_t row, cg;
  split_index(g, groups_per_row, n < (int64_t(1) << 32), row, cg);
  quantize_group<F, B, D, G, true, IDX>(y, row, cg * G, a, tensor_encode<F>(a));
}

// Transposed: quantises X^T for X [a.cols, a.rows] row-major (a.rows x a.cols is the output's shape), without
// materialising X^T. A thread takes two adjacent columns of X and G consecutive rows of them (G loads of two
// adjacent elements); each column's G values are one group of output row = that column, quantised by the same
// quantize_group as the row-wise kernel. A warp's lanes are 8 consecutive row groups x 4 adjacent column pairs, so
// each store instruction writes, per column, 8 adjacent groups' codes (64 bytes) and scales (32 bytes for block
// 16) as whole sectors; with 32 column pairs per lane row each store touched 32 partial sectors. A block
// (32 x kTRows threads) covers 64 columns x kTRows row groups.
constexpr int kTRows = 8;
static_assert(kTRows == 8, "the lane mapping: 8 row groups x 4 column pairs per warp");
template <class T, int F, int B, int D, bool IDX>
__global__ void __launch_bounds__(32 * kTRows) quantize_t_kernel(const QArgs a) {
  constexpr int G = B > D ? B : D;
  const int64_t xcols = a.rows, ngroups = a.cols / G;  // X's row length; groups down a column
  const int64_t j = (int64_t(blockIdx.x) * 32 + threadIdx.y * 4 + (threadIdx.x >> 3)) * 2;
  const int64_t gr = int64_t(blockIdx.y) * kTRows + (threadIdx.x & 7);
  if (j >= xcols || gr >= ngroups) return;
  const bool two = j + 1 < xcols;
  RawPairs<T, G> raw;
  load_pairs<G>(static_cast<const T*>(a.x) + gr * G * xcols + j, xcols, (xcols & 1) == 0, two, raw);
  float y0[G], y1[G];
  widen_pairs<G>(raw, y0, y1);
  const float s_enc = tensor_encode<F>(a);
  // Groups of 32 keep Philox's 64-bit spelling: with the widening multiplies these kernels take 130 registers,
  // over the 128 that hold two blocks per SM, and ran 0.69-0.75x as fast on an H200 (mxfp4, 8192x1024 and
  // 8192x2816); the groups of 16 and the row-wise kernels gain from them (kernels/README.md).
  constexpr bool kWide = G != 32;
  quantize_group<F, B, D, G, kWide, IDX>(y0, j, gr * G, a, s_enc);
  if (two) quantize_group<F, B, D, G, kWide, IDX>(y1, j + 1, gr * G, a, s_enc);
}

struct AmaxArgs {
  const void* x;  // float or BF16 bits, the kernel's T
  int64_t rows, cols;  // the quantised operand's shape (for the transposed kernels, X^T's)
  float* block_amax;   // rows * cols / B, or null
  unsigned* tensor_amax;
  bool rht_bf16;
  float signs[32];
};

// The tensor amax as an atomic maximum of non-negative FP32 bit patterns (their unsigned order is their numeric
// order): reduced over the thread block first, so one atomic per block, not per warp, meets at one address.
__device__ __forceinline__ void block_max_to(unsigned* dst, float m) {
  __shared__ float warp_max[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  const int t = threadIdx.x + threadIdx.y * blockDim.x, nw = (blockDim.x * blockDim.y + 31) / 32;
  if ((t & 31) == 0) warp_max[t >> 5] = m;
  __syncthreads();
  if (t == 0) {
    for (int w = 1; w < nw; ++w) m = fmaxf(m, warp_max[w]);
    if (m > 0.0f) atomicMax(dst, __float_as_uint(m));
  }
}

// Block amaxes of one group of (rotated) values; returns their maximum.
template <int B, int D, int G>
__device__ __forceinline__ float group_amax(float (&y)[G], int64_t row, int64_t col0, const AmaxArgs& a) {
  rotate_group<G, D>(y, a.signs, a.rht_bf16);
  float m = 0.0f;
#pragma unroll
  for (int b = 0; b < G / B; ++b) {
    float bm = 0.0f;
#pragma unroll
    for (int j = 0; j < B; ++j) bm = fmaxf(bm, fabsf(y[b * B + j]));
    if (a.block_amax) a.block_amax[row * (a.cols / B) + col0 / B + b] = bm;
    m = fmaxf(m, bm);
  }
  return m;
}

// Block amax of the (rotated) values and the tensor amax, row-wise (thread layout of quantize_kernel).
template <class T, int B, int D>
__global__ void __launch_bounds__(kThreads) amax_kernel(const AmaxArgs a) {
  constexpr int G = B > D ? B : D;
  const int64_t groups_per_row = a.cols / G, n = a.rows * groups_per_row;
  const int64_t g = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  float m = 0.0f;
  if (g < n) {  // no early return: every thread reaches block_max_to's barrier
    RawGroup<T, G> raw;
    load_raw(static_cast<const T*>(a.x) + g * G, raw);
    float y[G];
    widen(raw, y);
    int64_t row, cg;
    split_index(g, groups_per_row, n < (int64_t(1) << 32), row, cg);
    m = group_amax<B, D, G>(y, row, cg * G, a);
  }
  block_max_to(a.tensor_amax, m);
}

// The same over X^T, reading X [a.cols, a.rows] by columns. A thread block covers quantize_t_kernel's 64 columns
// x kTRows row groups. Without block amaxes a warp takes one row group and 32 column pairs, so each row it loads
// is 128 contiguous bytes (BF16); with them (16x16 tiles), quantize_t_kernel's lane layout, whose block-amax
// stores fill whole sectors. The maximum does not depend on the order.
template <class T, int B, int D>
__global__ void __launch_bounds__(32 * kTRows) amax_t_kernel(const AmaxArgs a) {
  constexpr int G = B > D ? B : D;
  const int64_t xcols = a.rows, ngroups = a.cols / G;
  const bool by_rows = a.block_amax == nullptr;
  const int pair = by_rows ? threadIdx.x : threadIdx.y * 4 + (threadIdx.x >> 3);
  const int rgroup = by_rows ? threadIdx.y : (threadIdx.x & 7);
  const int64_t j = (int64_t(blockIdx.x) * 32 + pair) * 2;
  const int64_t gr = int64_t(blockIdx.y) * kTRows + rgroup;
  float m = 0.0f;
  if (j < xcols && gr < ngroups) {
    const bool two = j + 1 < xcols;
    RawPairs<T, G> raw;
    load_pairs<G>(static_cast<const T*>(a.x) + gr * G * xcols + j, xcols, (xcols & 1) == 0, two, raw);
    float y0[G], y1[G];
    widen_pairs<G>(raw, y0, y1);
    m = group_amax<B, D, G>(y0, j, gr * G, a);
    if (two) m = fmaxf(m, group_amax<B, D, G>(y1, j + 1, gr * G, a));
  }
  block_max_to(a.tensor_amax, m);
}

// 16x16 tiles (NVFP4 weights): every block of a tile takes the maximum over the tile's 16 rows.
__global__ void tile_amax_kernel(float* amax, int64_t rows, int64_t kb) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= (rows / 16) * kb) return;
  const int64_t r0 = (t / kb) * 16, b = t % kb;
  float m = 0.0f;
  for (int r = 0; r < 16; ++r) m = fmaxf(m, amax[(r0 + r) * kb + b]);
  for (int r = 0; r < 16; ++r) amax[(r0 + r) * kb + b] = m;
}

struct RhtArgs {
  const void* x;  // float or BF16 bits, the kernel's T
  float* y;
  int64_t rows, cols;
  bool bf16;
  float signs[kMaxRht];
};

// The unfused form's first pass: one thread rotates one block of D values and writes them back as FP32.
template <class T, int D>
__global__ void __launch_bounds__(kThreads) rht_kernel(const RhtArgs a) {
  const int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= a.rows * a.cols / D) return;
  float y[D];
  load_group<D>(static_cast<const T*>(a.x) + g * D, y);
  rotate_group<D, D>(y, a.signs, a.bf16);
  float4* out = reinterpret_cast<float4*>(a.y + g * D);
#pragma unroll
  for (int i = 0; i < D / 4; ++i) out[i] = make_float4(y[4 * i], y[4 * i + 1], y[4 * i + 2], y[4 * i + 3]);
}

// Every FP32 bit pattern through both roundings; counts disagreements and keeps the smallest failing pattern.
template <int F>
__global__ void rtne_selftest_kernel(unsigned long long* count, unsigned* first, unsigned long long* evaluated) {
  constexpr ElemFormat f = kAllFormats[F];
  const uint64_t t = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned long long bad = 0;
  for (uint64_t i = t * 64; i < t * 64 + 64; ++i) {
    const float v = __uint_as_float(uint32_t(i));
    if (round_rtne(f, v) != detail::round_rtne_fast<F>(v)) {
      ++bad;
      atomicMin(first, uint32_t(i));
    }
  }
  if (bad) atomicAdd(count, bad);
  if ((threadIdx.x & 31) == 0) atomicAdd(evaluated, 64ull * 32);  // 32 lanes x 64 patterns
}

// Every FP32 bit pattern through golden round_sr and round_sr_fast at four random words: 0, all ones, and the
// two either side of the fast path's threshold ceil(t) (both roundings are step functions of r >> 8, so agreeing
// at the two words next to the step means the same step, and at 0 / all ones the same level below and above).
template <int F>
__global__ void sr_selftest_kernel(unsigned long long* count, unsigned* first, unsigned long long* evaluated) {
  constexpr ElemFormat f = kAllFormats[F];
  const uint64_t t0 = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned long long bad = 0;
  for (uint64_t i = t0 * 64; i < t0 * 64 + 64; ++i) {
    const float v = __uint_as_float(uint32_t(i));
    int idx;
    float t;
    detail::sr_split<F>(v, idx, t);
    const float c = ceilf(t);  // t in [0, 2^24): first r >> 8 that rounds down
    const uint32_t thr = c == c ? uint32_t(c) : 0u;
    uint32_t rs[4] = {0u, 0xFFFFFFFFu, 0u, 0u};
    if (thr >= 1 && thr < (1u << 24)) {
      rs[2] = ((thr - 1) << 8) | 0xFFu;
      rs[3] = thr << 8;
    }
    bool ok = true;
#pragma unroll
    for (int k = 0; k < 4; ++k) ok &= round_sr(f, v, rs[k]) == detail::round_sr_fast<F>(v, rs[k]);
    if (!ok) {
      ++bad;
      atomicMin(first, uint32_t(i));
    }
  }
  if (bad) atomicAdd(count, bad);
  if ((threadIdx.x & 31) == 0) atomicAdd(evaluated, 64ull * 32);
}

// ---- dispatch -----------------------------------------------------------------------------------------------
// TR: the transposed kernels (a.rows x a.cols is X^T's shape).
dim3 transposed_grid(int64_t rows, int64_t cols, int G) {
  return dim3(unsigned((rows + 63) / 64), unsigned((cols / G + kTRows - 1) / kTRows));
}

template <class T, int F, int B, int D, bool TR, bool IDX>
void launch_quantize_idx(const QArgs& a, cudaStream_t s) {
  constexpr int G = B > D ? B : D;
  if constexpr (TR)
    quantize_t_kernel<T, F, B, D, IDX><<<transposed_grid(a.rows, a.cols, G), dim3(32, kTRows), 0, s>>>(a);
  else
    quantize_kernel<T, F, B, D, IDX><<<detail::blocks_for(a.rows * (a.cols / G), kThreads), kThreads, 0, s>>>(a);
}
template <class T, int F, int B, int D, bool TR>
void launch_quantize(const QArgs& a, cudaStream_t s) {
  if (a.row_index)
    launch_quantize_idx<T, F, B, D, TR, true>(a, s);
  else
    launch_quantize_idx<T, F, B, D, TR, false>(a, s);
}

template <class T, int F, int B, bool TR>
void launch_quantize_d(int d, const QArgs& a, cudaStream_t s) {
  switch (d) {
    case 0: return launch_quantize<T, F, B, 0, TR>(a, s);
    case 16: return launch_quantize<T, F, B, 16, TR>(a, s);
    case 32: return launch_quantize<T, F, B, 32, TR>(a, s);
  }
  throw std::logic_error("fused RHT size must be 0, 16 or 32");
}

template <class T, int F, bool TR>
void launch_quantize_bd(int block, int d, const QArgs& a, cudaStream_t s) {
  if (block == 16) return launch_quantize_d<T, F, 16, TR>(d, a, s);
  return launch_quantize_d<T, F, 32, TR>(d, a, s);
}

template <class T, bool TR>
void launch_quantize_any(int fmt, int block, int d, const QArgs& a, cudaStream_t s) {
  switch (fmt) {
    case 0: return launch_quantize_bd<T, 0, TR>(block, d, a, s);
    case 1: return launch_quantize_bd<T, 1, TR>(block, d, a, s);
    case 2: return launch_quantize_bd<T, 2, TR>(block, d, a, s);
    case 3: return launch_quantize_bd<T, 3, TR>(block, d, a, s);
  }
  throw std::logic_error("format index out of range");
}

template <class T, int B, int D, bool TR>
void launch_amax(const AmaxArgs& a, cudaStream_t s) {
  constexpr int G = B > D ? B : D;
  if constexpr (TR)
    amax_t_kernel<T, B, D><<<transposed_grid(a.rows, a.cols, G), dim3(32, kTRows), 0, s>>>(a);
  else
    amax_kernel<T, B, D><<<detail::blocks_for(a.rows * (a.cols / G), kThreads), kThreads, 0, s>>>(a);
}
template <class T, bool TR>
void launch_amax_any(int block, int d, const AmaxArgs& a, cudaStream_t s) {
  if (block == 16) {
    if (d == 0) return launch_amax<T, 16, 0, TR>(a, s);
    if (d == 16) return launch_amax<T, 16, 16, TR>(a, s);
    if (d == 32) return launch_amax<T, 16, 32, TR>(a, s);
  } else {
    if (d == 0) return launch_amax<T, 32, 0, TR>(a, s);
    if (d == 16) return launch_amax<T, 32, 16, TR>(a, s);
    if (d == 32) return launch_amax<T, 32, 32, TR>(a, s);
  }
  throw std::logic_error("fused RHT size must be 0, 16 or 32");
}

// y = X^T as FP32 (X [rows, cols], y [cols, rows]) through 32x32 shared-memory tiles: the transposed quantiser's
// route for what it cannot fuse (RHT-64/128, the unfused RHT path).
template <class T>
__global__ void transpose_kernel(const T* x, float* y, int64_t rows, int64_t cols) {
  __shared__ float tile[32][33];
  const int64_t c = int64_t(blockIdx.x) * 32 + threadIdx.x;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t r = int64_t(blockIdx.y) * 32 + i;
    if (r < rows && c < cols) tile[i][threadIdx.x] = load1(x + r * cols + c);
  }
  __syncthreads();
  const int64_t r = int64_t(blockIdx.y) * 32 + threadIdx.x;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t cc = int64_t(blockIdx.x) * 32 + i;
    if (r < rows && cc < cols) y[cc * rows + r] = tile[threadIdx.x][i];
  }
}

void copy_signs(float* dst, int cap, const QuantConfig& cfg) {
  for (int j = 0; j < cap; ++j) dst[j] = j < int(cfg.rht_signs.size()) ? cfg.rht_signs[j] : 1.0f;
}

}  // namespace

template <class T>
void rht_impl(const T* d_x, float* d_y, int64_t rows, int64_t cols, const QuantConfig& cfg, cudaStream_t s) {
  if (cfg.rht == 0) throw std::invalid_argument("rht(): the configuration has no RHT");
  validate(cfg, rows, cols);
  RhtArgs a{};
  a.x = d_x;
  a.y = d_y;
  a.rows = rows;
  a.cols = cols;
  a.bf16 = cfg.rht_bf16;
  copy_signs(a.signs, kMaxRht, cfg);
  const int64_t n = rows * cols / cfg.rht;
  const unsigned grid = detail::blocks_for(n, kThreads);
  switch (cfg.rht) {
    case 16: rht_kernel<T, 16><<<grid, kThreads, 0, s>>>(a); break;
    case 32: rht_kernel<T, 32><<<grid, kThreads, 0, s>>>(a); break;
    case 64: rht_kernel<T, 64><<<grid, kThreads, 0, s>>>(a); break;
    case 128: rht_kernel<T, 128><<<grid, kThreads, 0, s>>>(a); break;
    default: throw std::invalid_argument("RHT size must be 16, 32, 64 or 128, not " + std::to_string(cfg.rht));
  }
  check_launch("rht_kernel");
}

void rht(const float* d_x, float* d_y, int64_t rows, int64_t cols, const QuantConfig& cfg, cudaStream_t s) {
  rht_impl(d_x, d_y, rows, cols, cfg, s);
}

namespace {
// decode(format, code) for the 16 codes (0 for a code the format lacks): the kernels' table of grid values.
void decode_table(const ElemFormat& f, float (&value)[16]) {
  for (int c = 0; c < 16; ++c) value[c] = code_valid(f, uint8_t(c)) ? decode(f, uint8_t(c)) : 0.0f;
}

// Block and tensor amax for the configurations that need them before quantising (ue4m3, 16x16 tiles).
// x is already rotated when d == 0 and the caller took the unfused path. rows x cols is the quantised operand's
// shape; tr: x is its transpose.
template <class T>
void amax_pass(const T* d_x, int64_t rows, int64_t cols, const QuantConfig& cfg, int d, QuantWorkspace& ws,
               bool want_blocks, cudaStream_t s, bool tr = false) {
  ws.tensor_amax.resize(1);
  check(cudaMemsetAsync(ws.tensor_amax.data(), 0, sizeof(unsigned), s), "cudaMemsetAsync");
  AmaxArgs a{};
  a.x = d_x;
  a.rows = rows;
  a.cols = cols;
  a.rht_bf16 = d > 0 && cfg.rht_bf16;
  copy_signs(a.signs, 32, cfg);
  a.tensor_amax = ws.tensor_amax.data();
  if (want_blocks) {
    ws.block_amax.resize(size_t(rows * (cols / cfg.block)));
    a.block_amax = ws.block_amax.data();
  }
  if (tr)
    launch_amax_any<T, true>(cfg.block, d, a, s);
  else
    launch_amax_any<T, false>(cfg.block, d, a, s);
  check_launch("amax_kernel");
  if (want_blocks && cfg.tile2d) {
    const int64_t kb = cols / cfg.block, n = (rows / 16) * kb;
    tile_amax_kernel<<<detail::blocks_for(n, kThreads), kThreads, 0, s>>>(ws.block_amax.data(), rows, kb);
    check_launch("tile_amax_kernel");
  }
}
}  // namespace

void tensor_amax(const float* d_x, int64_t rows, int64_t cols, const QuantConfig& cfg, QuantWorkspace& ws,
                 cudaStream_t s) {
  validate(cfg, rows, cols);
  const int d = (cfg.rht == 16 || cfg.rht == 32) ? cfg.rht : 0;
  if (cfg.rht != 0 && d == 0) throw std::invalid_argument("tensor_amax(): RHT-" + std::to_string(cfg.rht) +
                                                          " is only available unfused; rotate first");
  amax_pass(d_x, rows, cols, cfg, d, ws, false, s);
}

namespace {
__global__ void set_bits_kernel(unsigned* dst, unsigned bits) { *dst = bits; }
unsigned bits_of(float v) {
  unsigned u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}

// The quantise pass over x (T: float or BF16 bits), rotated in registers by RHT-d (d = 0: x is already rotated
// or the configuration has no RHT), after the amax pass the scale kind needs. rows x cols is the output's shape;
// tr: x is [cols, rows] and the output is its transpose's quantisation.
template <class T>
void quantize_pass(const T* x, int d, int fmt, int64_t rows, int64_t cols, const QuantConfig& cfg, DQTensor* out,
                   uint16_t* deq, QuantWorkspace& ws, cudaStream_t s, bool check_finite, int* d_nonfinite_flag,
                   bool tr, const uint64_t* d_seed, const int64_t* d_row_index = nullptr,
                   const float* amax = nullptr) {
  QArgs a{};
  if (out) {
    out->meta() = OperandMeta::of(cfg, rows, cols);
    out->codes.resize(size_t(rows * cols / 2));
    out->scales.resize(size_t(rows * (cols / cfg.block)));
    if (cfg.scale != ScaleKind::fp32)
      out->scale_codes.resize(size_t(rows * (cols / cfg.block)));
    else
      out->scale_codes = Buffer<uint8_t>();
    out->global_dec.resize(1);
    a.codes = out->codes.data();
    a.scales = out->scales.data();
    a.scale_codes = cfg.scale != ScaleKind::fp32 ? out->scale_codes.data() : nullptr;
    a.global_dec = out->global_dec.data();
  }
  a.deq = deq;
  decode_table(cfg.format, a.value);
  a.x = x;
  a.rows = rows;
  a.cols = cols;
  a.scale = cfg.scale;
  a.rounding = cfg.rounding;
  a.rht_bf16 = d > 0 && cfg.rht_bf16;
  a.seed = cfg.seed;
  a.seed_dev = d_seed;
  a.stream = cfg.stream;
  a.row_index = d_row_index;
  copy_signs(a.signs, 32, cfg);

  // A given amax stands in for the tensor's (the pass still runs for 16x16 tiles, whose blocks need it).
  const bool given = amax && cfg.scale == ScaleKind::ue4m3;
  if ((cfg.scale == ScaleKind::ue4m3 && !given) || cfg.tile2d) {
    amax_pass(x, rows, cols, cfg, d, ws, cfg.tile2d, s, tr);
    a.tensor_amax = ws.tensor_amax.data();
    if (cfg.tile2d) a.block_amax = ws.block_amax.data();
  }
  if (given) {
    ws.tensor_amax.resize(1);
    // A launch argument, not a copy from pageable memory (which would wait for the stream) nor a pinned one.
    set_bits_kernel<<<1, 1, 0, s>>>(ws.tensor_amax.data(), bits_of(*amax));
    check_launch("set_bits_kernel");
    a.tensor_amax = ws.tensor_amax.data();
  }
  if (check_finite) {
    ws.nonfinite.resize(1);
    check(cudaMemsetAsync(ws.nonfinite.data(), 0, sizeof(int), s), "cudaMemsetAsync");
    a.nonfinite = ws.nonfinite.data();
  } else {
    a.nonfinite = d_nonfinite_flag;
  }
  if (tr)
    launch_quantize_any<T, true>(fmt, cfg.block, d, a, s);
  else
    launch_quantize_any<T, false>(fmt, cfg.block, d, a, s);
  check_launch("quantize_kernel");
  if (check_finite) {
    int bad = 0;
    check(cudaMemcpyAsync(&bad, ws.nonfinite.data(), sizeof(int), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(s), "quantize");
    if (bad & 1) throw std::invalid_argument("input tensor holds NaN or Inf (4-bit grids have no such codes)");
    if (bad & 2) throw std::invalid_argument("RHT overflows FP32 (a rotated value is Inf or NaN; 4-bit grids have no such codes)");
    if (bad & 4) throw std::invalid_argument("a row index is negative");
  }
}

// rows x cols: the output's shape; tr: d_x is [cols, rows] and is quantised as its transpose.
// out and deq: the quantised operand and the dequantised BF16 values (fake quantisation), either or both.
template <class T>
void quantize_impl(const T* d_x, int64_t rows, int64_t cols, const QuantConfig& cfg, DQTensor* out, uint16_t* deq,
                   QuantWorkspace& ws, cudaStream_t s, RhtPath path, bool check_finite, int* d_nonfinite_flag,
                   bool tr, const uint64_t* d_seed, const int64_t* d_row_index = nullptr,
                   const float* amax = nullptr) {
  validate(cfg, rows, cols);
  const int fmt = detail::format_index(cfg.format);
  if (rows * cols % 2 != 0) throw std::invalid_argument("odd element count");
  if (tr && cfg.rht != 0 && (path == RhtPath::unfused || cfg.rht > 32)) {
    // The rotation runs in its own pass on these paths anyway: it reads a materialised X^T.
    ws.transposed.resize(size_t(rows * cols));
    transpose_kernel<T><<<dim3(unsigned((rows + 31) / 32), unsigned((cols + 31) / 32)), dim3(32, 8), 0, s>>>(
        d_x, ws.transposed.data(), cols, rows);
    check_launch("transpose_kernel");
    return quantize_impl<float>(ws.transposed.data(), rows, cols, cfg, out, deq, ws, s, path, check_finite,
                                d_nonfinite_flag, false, d_seed, d_row_index, amax);
  }
  // RHT-64/128 keep 64/128 values per thread in registers only in the standalone pass: take the unfused path.
  if (cfg.rht != 0 && (path == RhtPath::unfused || cfg.rht > 32)) {
    ws.rotated.resize(size_t(rows * cols));
    rht_impl(d_x, ws.rotated.data(), rows, cols, cfg, s);
    return quantize_pass<float>(ws.rotated.data(), 0, fmt, rows, cols, cfg, out, deq, ws, s, check_finite,
                                d_nonfinite_flag, false, d_seed, d_row_index, amax);
  }
  quantize_pass<T>(d_x, cfg.rht, fmt, rows, cols, cfg, out, deq, ws, s, check_finite, d_nonfinite_flag, tr, d_seed,
                   d_row_index, amax);
}
}  // namespace

void quantize(const float* d_x, int64_t rows, int64_t cols, const QuantConfig& cfg, DQTensor& out,
              QuantWorkspace& ws, cudaStream_t s, RhtPath path, bool check_finite, int* d_nonfinite_flag,
              const uint64_t* d_seed) {
  quantize_impl(d_x, rows, cols, cfg, &out, nullptr, ws, s, path, check_finite, d_nonfinite_flag, false, d_seed);
}
void quantize_bf16(const uint16_t* d_x, int64_t rows, int64_t cols, const QuantConfig& cfg, DQTensor& out,
                   QuantWorkspace& ws, cudaStream_t s, RhtPath path, bool check_finite, int* d_nonfinite_flag,
              const uint64_t* d_seed) {
  quantize_impl(d_x, rows, cols, cfg, &out, nullptr, ws, s, path, check_finite, d_nonfinite_flag, false, d_seed);
}
void quantize_transposed(const float* d_x, int64_t rows, int64_t cols, const QuantConfig& cfg, DQTensor& out,
                         QuantWorkspace& ws, cudaStream_t s, RhtPath path, bool check_finite, int* d_nonfinite_flag,
                         const uint64_t* d_seed) {
  quantize_impl(d_x, cols, rows, cfg, &out, nullptr, ws, s, path, check_finite, d_nonfinite_flag, true, d_seed);
}
void quantize_transposed_bf16(const uint16_t* d_x, int64_t rows, int64_t cols, const QuantConfig& cfg,
                              DQTensor& out, QuantWorkspace& ws, cudaStream_t s, RhtPath path, bool check_finite,
                              int* d_nonfinite_flag, const uint64_t* d_seed) {
  quantize_impl(d_x, cols, rows, cfg, &out, nullptr, ws, s, path, check_finite, d_nonfinite_flag, true, d_seed);
}

void quantize_rows(const void* d_x, bool x_bf16, bool transposed, int64_t rows, int64_t cols,
                   const QuantConfig& cfg, const int64_t* d_row_index, const float* amax, DQTensor& out,
                   QuantWorkspace& ws, cudaStream_t s, RhtPath path, bool check_finite, int* d_nonfinite_flag,
                   const uint64_t* d_seed) {
  if (d_row_index && cfg.tile2d)
    throw std::invalid_argument("16x16 tiles span rows: a tensor's rows are not quantised one at a time");
  if (amax && !(std::isfinite(*amax) && *amax >= 0.0f))
    throw std::invalid_argument("amax must be a finite number >= 0, not " + std::to_string(*amax));
  const int64_t r = transposed ? cols : rows, c = transposed ? rows : cols;
  if (x_bf16)
    quantize_impl(static_cast<const uint16_t*>(d_x), r, c, cfg, &out, nullptr, ws, s, path, check_finite,
                  d_nonfinite_flag, transposed, d_seed, d_row_index, amax);
  else
    quantize_impl(static_cast<const float*>(d_x), r, c, cfg, &out, nullptr, ws, s, path, check_finite,
                  d_nonfinite_flag, transposed, d_seed, d_row_index, amax);
}

void fake_quantize(const void* d_x, bool x_bf16, bool transposed, int64_t rows, int64_t cols,
                   const QuantConfig& cfg, uint16_t* d_out, DQTensor* q, QuantWorkspace& ws, cudaStream_t s,
                   RhtPath path, bool check_finite, int* d_nonfinite_flag, const uint64_t* d_seed) {
  if (!d_out) throw std::invalid_argument("fake_quantize(): no output");
  const int64_t r = transposed ? cols : rows, c = transposed ? rows : cols;
  if (x_bf16)
    quantize_impl(static_cast<const uint16_t*>(d_x), r, c, cfg, q, d_out, ws, s, path, check_finite,
                  d_nonfinite_flag, transposed, d_seed);
  else
    quantize_impl(static_cast<const float*>(d_x), r, c, cfg, q, d_out, ws, s, path, check_finite,
                  d_nonfinite_flag, transposed, d_seed);
}

namespace {
// A 32-bit word's non-finite test: its one FP32 value, or its two BF16 values (exponent field all ones).
__device__ __forceinline__ bool word_nonfinite(uint32_t w, bool bf16) {
  return bf16 ? ((w & 0x7F80u) == 0x7F80u) || ((w & 0x7F800000u) == 0x7F800000u) : (w & 0x7F800000u) == 0x7F800000u;
}

// Grid-stride over 16-byte words (torch's allocations are 256-byte aligned; a misaligned start takes the scalar
// loop), then the elements past the last whole word.
__global__ void __launch_bounds__(kThreads) flag_nonfinite_kernel(const void* y, bool bf16, int64_t n, int* flag,
                                                                   int bit, bool vec) {
  const int esize = bf16 ? 2 : 4;
  const int64_t stride = int64_t(gridDim.x) * kThreads, tid = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  bool bad = false;
  int64_t done = 0;
  if (vec) {
    const int64_t words = n * esize / 16;
    const uint4* p = static_cast<const uint4*>(y);
    for (int64_t i = tid; i < words; i += stride) {
      const uint4 v = __ldg(p + i);
      bad |= word_nonfinite(v.x, bf16) | word_nonfinite(v.y, bf16) | word_nonfinite(v.z, bf16) |
             word_nonfinite(v.w, bf16);
    }
    done = words * 16 / esize;
  }
  for (int64_t i = done + tid; i < n; i += stride) {
    const uint32_t w = bf16 ? uint32_t(static_cast<const uint16_t*>(y)[i])
                            : __float_as_uint(static_cast<const float*>(y)[i]);
    bad |= word_nonfinite(w, bf16);
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(flag, bit);
}
}  // namespace

void flag_nonfinite(const void* d_y, bool bf16, int64_t n, int* d_flag, int bit, cudaStream_t s) {
  if (n < 0) throw std::invalid_argument("flag_nonfinite(): negative element count");
  if (!d_flag) throw std::invalid_argument("flag_nonfinite(): no flag");
  if (n == 0) return;
  const bool vec = (reinterpret_cast<uintptr_t>(d_y) & 15u) == 0;
  const int64_t units = vec ? std::max<int64_t>(n * (bf16 ? 2 : 4) / 16, 1) : n;
  // At most 1024 blocks (several per SM); the threads stride over the rest.
  const unsigned blocks = std::min(detail::blocks_for(units, kThreads), 1024u);
  flag_nonfinite_kernel<<<blocks, kThreads, 0, s>>>(d_y, bf16, n, d_flag, bit, vec);
  check_launch("flag_nonfinite_kernel");
}

uint64_t count_rtne_fast_mismatches(const ElemFormat& f, uint32_t* first_bad, uint64_t* evaluated) {
  const int fmt = detail::format_index(f);
  Buffer<unsigned long long> count(1), seen(1);
  seen.fill_bytes(0);
  Buffer<unsigned> first(1);
  count.fill_bytes(0);
  first.fill_bytes(0xFF);
  const unsigned grid = unsigned((uint64_t(1) << 32) / 64 / kThreads);
  switch (fmt) {
    case 0: rtne_selftest_kernel<0><<<grid, kThreads>>>(count.data(), first.data(), seen.data()); break;
    case 1: rtne_selftest_kernel<1><<<grid, kThreads>>>(count.data(), first.data(), seen.data()); break;
    case 2: rtne_selftest_kernel<2><<<grid, kThreads>>>(count.data(), first.data(), seen.data()); break;
    default: rtne_selftest_kernel<3><<<grid, kThreads>>>(count.data(), first.data(), seen.data()); break;
  }
  check_launch("rtne_selftest_kernel", true);
  if (first_bad) *first_bad = first.to_host()[0];
  if (evaluated) *evaluated = seen.to_host()[0];
  return count.to_host()[0];
}

uint64_t count_sr_fast_mismatches(const ElemFormat& f, uint32_t* first_bad, uint64_t* evaluated) {
  const int fmt = detail::format_index(f);
  Buffer<unsigned long long> count(1), seen(1);
  seen.fill_bytes(0);
  Buffer<unsigned> first(1);
  count.fill_bytes(0);
  first.fill_bytes(0xFF);
  const unsigned grid = unsigned((uint64_t(1) << 32) / 64 / kThreads);
  switch (fmt) {
    case 0: sr_selftest_kernel<0><<<grid, kThreads>>>(count.data(), first.data(), seen.data()); break;
    case 1: sr_selftest_kernel<1><<<grid, kThreads>>>(count.data(), first.data(), seen.data()); break;
    case 2: sr_selftest_kernel<2><<<grid, kThreads>>>(count.data(), first.data(), seen.data()); break;
    default: sr_selftest_kernel<3><<<grid, kThreads>>>(count.data(), first.data(), seen.data()); break;
  }
  check_launch("sr_selftest_kernel", true);
  if (first_bad) *first_bad = first.to_host()[0];
  if (evaluated) *evaluated = seen.to_host()[0];
  return count.to_host()[0];
}

namespace {
struct DequantArgs {
  const uint32_t* codes;  // eight packed codes per word
  const float* scales;
  const float* global_dec;
  int64_t words, cols, kb;
  int block;
  float value[16];  // decode(format, code)
};

inline __device__ void store8(float* out, const float (&v)[8]) {
  reinterpret_cast<float4*>(out)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(out)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
inline __device__ void store8(uint16_t* out, const float (&v)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) w[j] = uint32_t(f32_to_bf16(v[2 * j])) | (uint32_t(f32_to_bf16(v[2 * j + 1])) << 16);
  *reinterpret_cast<uint4*>(out) = make_uint4(w[0], w[1], w[2], w[3]);
}

// One thread: the eight elements of one packed word (all in one block, as cols is a multiple of 16).
template <class Out>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const DequantArgs a, Out* out) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= a.words) return;
  const int64_t e0 = t * 8, row = e0 / a.cols, col = e0 - row * a.cols;
  const float s = a.scales[row * a.kb + col / a.block], g = *a.global_dec;
  const uint32_t w = a.codes[t];
  float v[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = dequant_value(a.value[(w >> (4 * j)) & 15u], s, g);
  store8(out + e0, v);
}

template <class Out>
void dequantize_impl(const DQTensor& q, Out* d_out, cudaStream_t s) {
  if (q.cols % 16 != 0) throw std::invalid_argument("dequantize: cols must be a multiple of 16");
  DequantArgs a{};
  a.codes = reinterpret_cast<const uint32_t*>(q.codes.data());
  a.scales = q.scales.data();
  a.global_dec = q.global_dec.data();
  a.words = q.rows * q.cols / 8;
  a.cols = q.cols;
  a.kb = q.kblocks();
  a.block = q.block;
  decode_table(q.format, a.value);
  dequantize_kernel<Out><<<detail::blocks_for(a.words, kThreads), kThreads, 0, s>>>(a, d_out);
  check_launch("dequantize_kernel");
}
}  // namespace

void dequantize(const DQTensor& q, float* d_out, cudaStream_t s) { dequantize_impl(q, d_out, s); }
void dequantize_bf16(const DQTensor& q, uint16_t* d_out, cudaStream_t s) { dequantize_impl(q, d_out, s); }

QTensor to_host(const DQTensor& d) {
  QTensor q;
  q.meta() = d.meta();
  const std::vector<uint8_t> packed = d.codes.to_host();
  q.codes.resize(size_t(d.rows * d.cols));
  for (size_t i = 0; i < q.codes.size(); ++i) q.codes[i] = (packed[i / 2] >> (4 * (i % 2))) & 0xF;
  q.scales = d.scales.to_host();
  q.scale_codes = d.scale_codes.to_host();
  q.global_dec = d.global_dec.to_host().at(0);
  return q;
}

void upload(const QTensor& q, DQTensor& d) {
  if (q.rows * q.cols % 2 != 0) throw std::invalid_argument("odd element count");
  d.meta() = q.meta();
  std::vector<uint8_t> packed(q.codes.size() / 2);
  for (size_t i = 0; i < packed.size(); ++i)
    packed[i] = uint8_t((q.codes[2 * i] & 0xF) | ((q.codes[2 * i + 1] & 0xF) << 4));
  d.codes.upload(packed);
  d.scales.upload(q.scales);
  if (q.scale_codes.empty())
    d.scale_codes = Buffer<uint8_t>();
  else
    d.scale_codes.upload(q.scale_codes);
  d.global_dec.upload(&q.global_dec, 1);
}

}  // namespace fp4lab::cuda
