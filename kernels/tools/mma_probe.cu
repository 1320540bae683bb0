// fp4lab_mma_probe: what the block-scaled GEMM's two resources cost on this GPU (sm_90a), measured with no
// memory traffic: the tensor instruction that forms a block's integer dot product p, and the FP32 instructions of
// the contract's per-block epilogue (docs/datapath.md section 3) that follow it.
//
//   1. mma.sync (the shipped kernel's IMMA.16816 / IMMA.16832, and HMMA.16816 with F32 output): cycles per MMA
//      per scheduler, each followed by the epilogue's FP32 instructions of its outputs (2 per output: the two-fma
//      form; 4: the separate form after the magic-constant subtraction), at 2 and 4 warps per scheduler.
//   2. wgmma.m64n128k16 with F16 operands holding the contract's integer code values (decode_int, |v| <= 12):
//      (a) whether every block dot product comes out exact (FP32 equal to the integer sum; the integers are
//      exact in F16 and every partial sum is an integer below 2^12), checked against a host sum on random,
//      extreme (|p| = 16 * 144) and cancelling operands; (b) cycles per 128 x 128 output tile and block of 16,
//      the epilogue (2 or 3 FP32 instructions per output) of one block running while the next block's wgmma does.
//
// Every figure is normalised to one 128 x 128 output tile and one block of 16 on one SM, so the two paths read
// side by side; the floor of an epilogue of E instructions is 128 * 128 * E / 128 lanes = 128 E cycles.
// Exit status: 0, or 1 when a wgmma block dot product is not exact or a CUDA call fails.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "../src/wgmma.cuh"
#include "fp4lab/gemm.hpp"

namespace {
namespace wg = fp4lab::cuda::wg;
using fp4lab::kMagic;
using fp4lab::kMagicBits;

#define CHECK(x)                                                                              \
  do {                                                                                        \
    const cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "fp4lab_mma_probe: %s: %s\n", #x, cudaGetErrorString(e_));         \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

// ---- 1. mma.sync ------------------------------------------------------------------------------------------------
enum Kind { IMMA16, IMMA32, HMMA16 };

template <Kind K>
__device__ __forceinline__ void mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) {
  if constexpr (K == HMMA16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a0), "r"(a1), "r"(a0 ^ 1u), "r"(a1 ^ 1u), "r"(b), "r"(b ^ 1u), "f"(0.0f));
  } else {
    int t[4];
    if constexpr (K == IMMA16)
      asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
                   : "=r"(t[0]), "=r"(t[1]), "=r"(t[2]), "=r"(t[3])
                   : "r"(a0), "r"(a1), "r"(b), "r"(kMagicBits));
    else
      asm volatile(
          "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%10,%10,%10,%10};\n"
          : "=r"(t[0]), "=r"(t[1]), "=r"(t[2]), "=r"(t[3])
          : "r"(a0), "r"(a1), "r"(a0 ^ 3u), "r"(a1 ^ 3u), "r"(b), "r"(b ^ 3u), "r"(kMagicBits));
#pragma unroll
    for (int i = 0; i < 4; ++i) d[i] = __int_as_float(t[i]);
  }
}

// E FP32 instructions per output, the golden forms the shipped kernel calls: 2 = contract_scale_add_magic (two
// fmas on f = kMagic + p); 4 = the exact subtraction f - kMagic, then contract_scale_add (sa * sb per output, a
// multiply, an add); 3 = contract_scale_add on an F32 MMA output x = p, which needs no subtraction.
template <int E>
__device__ __forceinline__ float epilogue(float acc, float f, float sa, float msa, float sb) {
  if constexpr (E == 2) return fp4lab::contract_scale_add_magic(acc, f, sa, msa, sb);
  if constexpr (E == 3) return fp4lab::contract_scale_add(acc, f, sa, sb);
  return fp4lab::contract_scale_add(acc, __fsub_rn(f, kMagic), sa, sb);
}

// Eight independent MMAs a round (eight n-tiles of one m16 row pair), each followed by the epilogue of its 4 outputs
// per thread. As in the shipped kernel, every round reads its scales from shared memory (2 row scales, 16 column
// scales a thread), so sa * sb is a new product per output and block.
template <Kind K, int E>
__global__ void mma_sync_rate(int rounds, const float* scales, float* out, long long* cycles) {
  __shared__ __align__(16) float ss[64 * 20];  // read as float4
  for (int i = threadIdx.x; i < 64 * 20; i += blockDim.x) ss[i] = scales[i % 64] * float(1 + i % 7);
  __syncthreads();
  uint32_t a0 = threadIdx.x * 0x01010101u, a1 = a0 + 3, b = threadIdx.x ^ 0x02020202u;
  float acc[8][4] = {};
  const long long t0 = clock64();
  for (int r = 0; r < rounds; ++r) {
    const float* sr = ss + (r % 64) * 20;
    const float sa[2] = {sr[0], sr[1]};
    float sb[16];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float4 v = reinterpret_cast<const float4*>(sr + 4)[q];
      sb[4 * q] = v.x, sb[4 * q + 1] = v.y, sb[4 * q + 2] = v.z, sb[4 * q + 3] = v.w;
    }
    const float msa[2] = {fp4lab::magic_scale(sa[0]), fp4lab::magic_scale(sa[1])};
    float d[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) mma<K>(d[j], a0 + j, a1, b);
    // Every result is consumed: ptxas removes an MMA whose outputs are dead, so there is no "MMA alone" row.
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        acc[j][e] = epilogue<E>(acc[j][e], d[j][e], sa[e >> 1], msa[e >> 1], sb[2 * j + (e & 1)]);
    a1 += 1;  // new operands each round
  }
  const long long t1 = clock64();
  float s = 0;
  for (int j = 0; j < 8; ++j)
    for (int e = 0; e < 4; ++e) s += acc[j][e];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

// ---- 2. wgmma -----------------------------------------------------------------------------------------------------
// Byte offset of K byte kb of row r in the layout wg::desc reads (16-byte chunk XOR row % 8).
__host__ __device__ inline int swz128(int r, int kb) { return r * 128 + ((((kb >> 4) ^ (r & 7))) << 4) + (kb & 15); }

constexpr int kRows = 128, kK = 64;  // A and B tiles: 128 rows x 64 K (four blocks of 16), F16
constexpr int kTileBytes = kRows * kK * 2;

// Two warpgroups (rows 0-63, 64-127), B shared: writes D of each of the four blocks, [4][128][128].
__global__ void __launch_bounds__(256, 1) wgmma_exact(const __half* a, const __half* b, float* out) {
  extern __shared__ __align__(1024) uint8_t sm[];
  for (int i = threadIdx.x; i < kRows * kK; i += blockDim.x) {
    const int r = i / kK, k = i % kK;
    *reinterpret_cast<__half*>(sm + swz128(r, 2 * k)) = a[i];
    *reinterpret_cast<__half*>(sm + kTileBytes + swz128(r, 2 * k)) = b[i];
  }
  wg::fence_async_shared();  // each thread's shared stores, before the barrier that the wgmmas follow
  __syncthreads();
  const int wg = threadIdx.x / 128, w = (threadIdx.x / 32) % 4, g = (threadIdx.x % 32) / 4, t4 = threadIdx.x % 4;
  const uint32_t sa = uint32_t(__cvta_generic_to_shared(sm + wg * 64 * 128));
  const uint32_t sb = uint32_t(__cvta_generic_to_shared(sm + kTileBytes));
  for (int kk = 0; kk < kK / 16; ++kk) {
    float d[64];
    for (int i = 0; i < 64; ++i) d[i] = 0.0f;
    wg::fence();
    wg::mma_m64n128k16(d, wg::desc(sa + kk * 32), wg::desc(sb + kk * 32), 0);
    wg::commit();
    wg::wait<0>();
    wg::pin(d);
    for (int j = 0; j < 16; ++j)  // the accumulator layout: per 8 columns, the m16n8 fragment of mma.sync
      for (int e = 0; e < 4; ++e) {
        const int row = wg * 64 + w * 16 + g + 8 * (e >> 1), col = j * 8 + 2 * t4 + (e & 1);
        out[(kk * kRows + row) * kRows + col] = d[j * 4 + e];
      }
  }
}

// Per block: wgmma into one buffer while the epilogue (E instructions per output) consumes the other.
template <int E>
__global__ void __launch_bounds__(256, 1) wgmma_rate(int rounds, const float* scales, float* out, long long* cycles) {
  extern __shared__ __align__(1024) uint8_t sm[];
  for (int i = threadIdx.x; i < 2 * kTileBytes / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(sm)[i] = 0x3C003C00u ^ (i & 0x01000100u);  // F16 1.0 and nearby values
  wg::fence_async_shared();  // each thread's shared stores, before the barrier that the wgmmas follow
  __syncthreads();
  const int wg = threadIdx.x / 128;
  const uint32_t a0 = uint32_t(__cvta_generic_to_shared(sm + wg * 64 * 128));
  const uint32_t b0 = uint32_t(__cvta_generic_to_shared(sm + kTileBytes));
  float d0[64], d1[64], acc[64];
  for (int i = 0; i < 64; ++i) d0[i] = d1[i] = acc[i] = 0.0f;
  float* ss = reinterpret_cast<float*>(sm + 2 * kTileBytes);  // per block: 2 row and 32 column scales a thread
  for (int i = threadIdx.x; i < 64 * 36; i += blockDim.x) ss[i] = scales[i % 64] * float(1 + i % 7);
  __syncthreads();
  // The epilogue of block kk: the m64n128 accumulator holds rows g and g + 8 of the warp's 16 (e >> 1) and
  // columns 8j + 2 t4 + (e & 1) for j < 16: 2 row scales, 32 column scales a thread.
  auto epi = [&](float(&d)[64], int blk) {
    const float* sr = ss + (blk % 64) * 36;
    const float sa[2] = {sr[0], sr[1]}, msa[2] = {fp4lab::magic_scale(sr[0]), fp4lab::magic_scale(sr[1])};
    float sb[32];
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const float4 v = reinterpret_cast<const float4*>(sr + 4)[q];
      sb[4 * q] = v.x, sb[4 * q + 1] = v.y, sb[4 * q + 2] = v.z, sb[4 * q + 3] = v.w;
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int e = i & 3, j = i >> 2;
      acc[i] = epilogue<E>(acc[i], d[i], sa[e >> 1], msa[e >> 1], sb[2 * j + (e & 1)]);
    }
  };
  const long long t0 = clock64();
  for (int r = 0; r < rounds; ++r) {
#pragma unroll
    for (int kk = 0; kk < kK / 16; kk += 2) {
      wg::fence();
      wg::mma_m64n128k16(d0, wg::desc(a0 + kk * 32), wg::desc(b0 + kk * 32), 0);
      wg::commit();
      wg::wait<1>();  // the previous block's wgmma (into d1) is done
      wg::pin(d1);  // (the first round's first epilogue reads the zeros d1 starts with)
      epi(d1, r * 4 + kk + 3);
      wg::fence();
      wg::mma_m64n128k16(d1, wg::desc(a0 + kk * 32 + 32), wg::desc(b0 + kk * 32 + 32), 0);
      wg::commit();
      wg::wait<1>();
      wg::pin(d0);
      epi(d0, r * 4 + kk);
    }
  }
  wg::wait<0>();
  wg::pin(d1);
  const long long t1 = clock64();
  float s = 0;
  for (int i = 0; i < 64; ++i) s += acc[i] + d1[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

struct Dev {
  float *scales, *out;
  long long* cycles;
  int sms;
};

// Median over the CTAs of their cycle counts (each CTA alone on its SM: one CTA per SM, every SM busy).
double median_cycles(const Dev& dv, int ctas) {
  std::vector<long long> c(static_cast<size_t>(ctas));
  CHECK(cudaMemcpy(c.data(), dv.cycles, c.size() * sizeof(long long), cudaMemcpyDeviceToHost));
  std::sort(c.begin(), c.end());
  return double(c[c.size() / 2]);
}

template <Kind K, int E>
void row_mma_sync(const Dev& dv, int warps_per_scheduler) {
  const int threads = 32 * 4 * warps_per_scheduler, rounds = 20000;
  mma_sync_rate<K, E><<<dv.sms, threads>>>(16, dv.scales, dv.out, dv.cycles);  // warm-up
  mma_sync_rate<K, E><<<dv.sms, threads>>>(rounds, dv.scales, dv.out, dv.cycles);
  CHECK(cudaGetLastError());
  const double per_mma = median_cycles(dv, dv.sms) / (double(rounds) * 8 * warps_per_scheduler);
  // A 128 x 128 tile and block of 16 takes 128 MMAs of K 16 (32 a scheduler), or 64 of K 32 per 16 of K.
  const double per_tile = per_mma * (K == IMMA32 ? 16 : 32);
  const char* name = K == IMMA16 ? "IMMA.16816 (s8)" : K == IMMA32 ? "IMMA.16832 (s8)" : "HMMA.16816 (f16, f32 out)";
  std::printf("%-28s %-3d %-8d %10.2f %14.1f %10d\n", name, E, warps_per_scheduler, per_mma, per_tile,
              K == IMMA32 ? 64 * E : 128 * E);  // a block of 32: E instructions per output per 32 of K
}

template <int E>
void row_wgmma(const Dev& dv) {
  const int rounds = 20000, smem = 2 * kTileBytes + 64 * 36 * 4;
  CHECK(cudaFuncSetAttribute(wgmma_rate<E>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  wgmma_rate<E><<<dv.sms, 256, smem>>>(16, dv.scales, dv.out, dv.cycles);
  wgmma_rate<E><<<dv.sms, 256, smem>>>(rounds, dv.scales, dv.out, dv.cycles);
  CHECK(cudaGetLastError());
  const double per_tile = median_cycles(dv, dv.sms) / (double(rounds) * (kK / 16));
  std::printf("%-28s %-3d %-8d %10s %14.1f %10d\n", "wgmma.m64n128k16 (f16) x2", E, 2, "-", per_tile, 128 * E);
}

// Operands of the exactness check: the contract's integer code values (decode_int of E2M1 codes, |v| <= 12).
long long check_wgmma_exact(int trials) {
  const int levels[8] = {0, 1, 2, 3, 4, 6, 8, 12};
  std::mt19937 rng(1);
  std::vector<int> ia(kRows * kK), ib(kRows * kK);
  std::vector<__half> ha(ia.size()), hb(ib.size());
  std::vector<float> got(size_t(kK / 16) * kRows * kRows);
  __half *da, *db;
  float* dout;
  CHECK(cudaMalloc(&da, ha.size() * sizeof(__half)));
  CHECK(cudaMalloc(&db, hb.size() * sizeof(__half)));
  CHECK(cudaMalloc(&dout, got.size() * sizeof(float)));
  CHECK(cudaFuncSetAttribute(wgmma_exact, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * kTileBytes));
  long long checked = 0, bad = 0;
  for (int t = 0; t < trials; ++t) {
    for (size_t i = 0; i < ia.size(); ++i) {
      const int sa = (rng() & 1) ? 1 : -1, sb = (rng() & 1) ? 1 : -1;
      switch (t % 3) {
        case 0: ia[i] = sa * levels[rng() % 8]; ib[i] = sb * levels[rng() % 8]; break;  // random codes
        case 1: ia[i] = 12 * sa; ib[i] = 12 * (t % 2 ? 1 : sa); break;                  // |p| up to 16 * 144
        default: ia[i] = 12; ib[i] = (i % 2) ? 12 : -12; break;                         // exact cancellation
      }
      ha[i] = __float2half(float(ia[i]));
      hb[i] = __float2half(float(ib[i]));
    }
    CHECK(cudaMemcpy(da, ha.data(), ha.size() * sizeof(__half), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, hb.data(), hb.size() * sizeof(__half), cudaMemcpyHostToDevice));
    wgmma_exact<<<1, 256, 2 * kTileBytes>>>(da, db, dout);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(got.data(), dout, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (int kk = 0; kk < kK / 16; ++kk)
      for (int r = 0; r < kRows; ++r)
        for (int c = 0; c < kRows; ++c) {
          int p = 0;
          for (int k = kk * 16; k < kk * 16 + 16; ++k) p += ia[r * kK + k] * ib[c * kK + k];
          const float v = got[(size_t(kk) * kRows + r) * kRows + c];
          ++checked;
          if (v != float(p)) {
            if (bad < 5) std::printf("  not exact: block %d row %d col %d: %.9g, integer sum %d\n", kk, r, c, v, p);
            ++bad;
          }
        }
  }
  std::printf("wgmma f16 block dot products of integer code values: %lld checked, %lld not exact\n", checked, bad);
  CHECK(cudaFree(da));
  CHECK(cudaFree(db));
  CHECK(cudaFree(dout));
  return bad;
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9) {
    std::fprintf(stderr, "fp4lab_mma_probe: needs an sm_90 GPU (wgmma); this is %s, sm_%d%d\n", prop.name,
                 prop.major, prop.minor);
    return 1;
  }
  int khz = 0;
  CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  std::printf("%s, %d SMs, SM clock up to %d MHz\n", prop.name, prop.multiProcessorCount, khz / 1000);
  Dev dv{};
  dv.sms = prop.multiProcessorCount;
  std::vector<float> hs(64);
  for (int i = 0; i < 64; ++i) hs[size_t(i)] = 0.5f + 0.125f * float(i % 8);
  CHECK(cudaMalloc(&dv.scales, 64 * sizeof(float)));
  CHECK(cudaMemcpy(dv.scales, hs.data(), 64 * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMalloc(&dv.out, size_t(dv.sms) * 1024 * sizeof(float)));
  CHECK(cudaMalloc(&dv.cycles, size_t(dv.sms) * sizeof(long long)));

  const long long bad = check_wgmma_exact(12);
  std::printf("\ncycles on one SM (median over the SMs), normalised to one 128x128 output tile and block of 16\n");
  std::printf("%-28s %-3s %-8s %10s %14s %10s\n", "tensor instruction", "E", "warps/sc", "cyc/MMA/sc",
              "cyc/tile-blk", "E floor");
  for (int w : {2, 4}) {
    row_mma_sync<IMMA16, 2>(dv, w);
    row_mma_sync<IMMA16, 4>(dv, w);
    row_mma_sync<IMMA32, 2>(dv, w);
    row_mma_sync<HMMA16, 2>(dv, w);
  }
  row_wgmma<2>(dv);
  row_wgmma<3>(dv);
  std::printf("E: FP32 instructions per output and block; warps/sc: warps per scheduler;\n"
              "E floor: 128 x 128 x E / 128 FP32 lanes, the epilogue's cycles at one instruction per scheduler "
              "and cycle.\nIMMA.16832 rows are per 16 of K (a block of 32 is two such slices).\n");
  return bad ? 1 : 0;
}
