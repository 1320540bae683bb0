// Block-scaled GEMM under the datapath contract (docs/datapath.md section 3), C[M, N] = A[M, K] . B[N, K]^T:
// a simple reference kernel and a fast one on the int8 tensor cores. Both call the golden contract functions
// (contract_step / contract_scale_add / contract_finish / tensor_factor), which use __fmul_rn / __fadd_rn in
// device code, so nothing is contracted into an FMA or reordered.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "common.cuh"
#include "fp4lab/cuda/kernels.hpp"
#include "fp4lab/gemm.hpp"

namespace fp4lab::cuda {
namespace {

void check_operands(const DQTensor& a, const DQTensor& b) {
  if (a.cols != b.cols)
    throw std::invalid_argument("GEMM operands disagree on K: A has " + std::to_string(a.cols) + ", B has " +
                                std::to_string(b.cols));
  if (a.block != b.block)
    throw std::invalid_argument("GEMM operands disagree on block size: " + std::to_string(a.block) + " vs " +
                                std::to_string(b.block));
  if (a.codes.size() != size_t(a.rows * a.cols / 2) || b.codes.size() != size_t(b.rows * b.cols / 2))
    throw std::invalid_argument("GEMM operand is not quantised (no codes on the device)");
}

__device__ __forceinline__ uint8_t nibble(const uint8_t* packed, int64_t i) {
  return (packed[i >> 1] >> ((i & 1) * 4)) & 0xF;
}

// ---- reference: one thread per output, the contract read straight from docs/datapath.md -------------------
struct RefArgs {
  ElemFormat fa, fb;
  const uint8_t *ca, *cb;
  const float *sa, *sb;
  const float *gda, *gdb;
  int64_t M, N, K;
  int B;
  float* c;
};

__global__ void gemm_reference_kernel(const RefArgs a) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t m = int64_t(blockIdx.y) * blockDim.y + threadIdx.y;
  if (m >= a.M || n >= a.N) return;
  const int64_t KB = a.K / a.B;
  float acc = 0.0f;
  for (int64_t k = 0; k < KB; ++k) {
    int32_t p = 0;  // step 1: exact integer block dot product
    for (int64_t j = k * a.B; j < (k + 1) * a.B; ++j)
      p += decode_int(a.fa, nibble(a.ca, m * a.K + j)) * decode_int(a.fb, nibble(a.cb, n * a.K + j));
    acc = contract_step(acc, p, a.sa[m * KB + k], a.sb[n * KB + k]);  // steps 2-5
  }
  a.c[m * a.N + n] = contract_finish(acc, tensor_factor(a.fa, *a.gda), tensor_factor(a.fb, *a.gdb));  // step 6
}

// ---- fast path: int8 views + mma.sync ------------------------------------------------------------------------
constexpr int BM = 128, BN = 128, BK = 64, STAGES = 4, THREADS = 256;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// codes [rows, K] packed -> signed integer views [Rp, Kp] (zero padding), 16 outputs per thread.
__global__ void unpack_kernel(ElemFormat f, const uint8_t* codes, int64_t rows, int64_t K, int8_t* out, int64_t Rp,
                              int64_t Kp) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t chunks = Kp / 16;
  if (t >= Rp * chunks) return;
  const int64_t r = t / chunks, c = t - r * chunks;
  uint32_t w[4] = {0, 0, 0, 0};
  if (r < rows && c * 16 < K) {
    const uint2 in = *reinterpret_cast<const uint2*>(codes + (r * K + c * 16) / 2);
    const uint32_t src[2] = {in.x, in.y};
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      const uint8_t code = (src[e / 8] >> (4 * (e % 8))) & 0xF;
      w[e / 4] |= uint32_t(uint8_t(int8_t(decode_int(f, code)))) << (8 * (e % 4));
    }
  }
  *reinterpret_cast<uint4*>(out + r * Kp + c * 16) = make_uint4(w[0], w[1], w[2], w[3]);
}

// scales [rows, KB] -> [KBp, Rp] (k-major, zero padding): a CTA tile's scales for one block are contiguous.
__global__ void transpose_scales_kernel(const float* s, int64_t rows, int64_t KB, float* out, int64_t Rp,
                                        int64_t KBp) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= KBp * Rp) return;
  const int64_t k = t / Rp, r = t - k * Rp;
  out[t] = (r < rows && k < KB) ? s[r * KB + k] : 0.0f;
}

struct FastArgs {
  const int8_t *a, *b;
  const float *sa, *sb;  // [KBp, Mp], [KBp, Np]
  int64_t Mp, Np, Kp;
  int64_t M, N;
  ElemFormat fa, fb;
  const float *gda, *gdb;
  float* c;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// 0x4B400000 is 1.5 * 2^23. The mma adds the block's integer dot product p (|p| <= 32 * 144 < 2^22) to this bit
// pattern; read back as FP32 it is exactly 12582912 + p, and one exact subtraction gives FP32(p), the
// contract's step 2, without an int-to-float conversion instruction (a quarter-rate pipe on SM90).
constexpr int32_t kMagicBits = 0x4B400000;
constexpr float kMagic = 12582912.0f;

__device__ __forceinline__ void mma_k16(int32_t (&d)[4], const uint32_t (&a)[2], uint32_t b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(b), "r"(kMagicBits));
}
__device__ __forceinline__ void mma_k32(int32_t (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(kMagicBits));
}

// Shared-memory byte offset of 16-byte chunk c (0..3) of row r (64 bytes per row). The XOR puts the 8 rows one
// ldmatrix phase reads into 8 different 16-byte bank groups.
__device__ __forceinline__ int swz(int r, int c) { return r * BK + ((c ^ ((r >> 1) & 3)) << 4); }

// CTA tile 128 x 128, 8 warps as 2 (M) x 4 (N), warp tile 64 x 32 = 4 x 4 mma tiles; K in stages of 64
// (4 blocks of 16 or 2 of 32), 4-stage cp.async pipeline. Per block and output: one exact subtraction and the
// golden contract_scale_add (two multiplies, one add), in ascending block order.
template <int B>
__global__ void __launch_bounds__(THREADS, 1) gemm_mma_kernel(const FastArgs p) {
  constexpr int KPS = BK / B;  // blocks per stage
  constexpr int A_BYTES = BM * BK, B_BYTES = BN * BK, SA_FLOATS = KPS * BM, SB_FLOATS = KPS * BN;
  constexpr int STAGE_BYTES = A_BYTES + B_BYTES + 4 * (SA_FLOATS + SB_FLOATS);
  extern __shared__ __align__(128) uint8_t smem[];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp & 1, wn = warp >> 1;
  const int g = lane >> 2, t4 = lane & 3;
  const int64_t m0 = int64_t(blockIdx.y) * BM, n0 = int64_t(blockIdx.x) * BN;
  const int64_t ktiles = p.Kp / BK;

  auto stage_a = [&](int s) { return smem + s * STAGE_BYTES; };
  auto stage_b = [&](int s) { return smem + s * STAGE_BYTES + A_BYTES; };
  auto stage_sa = [&](int s) { return reinterpret_cast<float*>(smem + s * STAGE_BYTES + A_BYTES + B_BYTES); };
  auto stage_sb = [&](int s) {
    return reinterpret_cast<float*>(smem + s * STAGE_BYTES + A_BYTES + B_BYTES + 4 * SA_FLOATS);
  };

  auto load_stage = [&](int s, int64_t kt) {
    const int64_t k0 = kt * BK;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int id = tid + i * THREADS, r = id >> 2, c = id & 3;
      cp_async16(smem_u32(stage_a(s) + swz(r, c)), p.a + (m0 + r) * p.Kp + k0 + c * 16);
      cp_async16(smem_u32(stage_b(s) + swz(r, c)), p.b + (n0 + r) * p.Kp + k0 + c * 16);
    }
    // Scales: KPS rows of 128 floats for each operand, 16 bytes per thread.
    if (tid < KPS * 32) {
      const int kk = tid >> 5, q = tid & 31;
      cp_async16(smem_u32(stage_sa(s) + kk * BM + q * 4), p.sa + (kt * KPS + kk) * p.Mp + m0 + q * 4);
    } else if (tid >= 128 && tid < 128 + KPS * 32) {
      const int kk = (tid - 128) >> 5, q = (tid - 128) & 31;
      cp_async16(smem_u32(stage_sb(s) + kk * BN + q * 4), p.sb + (kt * KPS + kk) * p.Np + n0 + q * 4);
    }
  };

  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ktiles) load_stage(s, s);
    cp_async_commit();
  }

  for (int64_t kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    // Refill the stage consumed in the previous iteration (every warp is past it: barrier above).
    {
      const int64_t next = kt + STAGES - 1;
      if (next < ktiles) load_stage(int(next % STAGES), next);
      cp_async_commit();
    }
    const int s = int(kt % STAGES);
    const uint8_t* As = stage_a(s);
    const uint8_t* Bs = stage_b(s);
    const float* SAs = stage_sa(s);
    const float* SBs = stage_sb(s);

#pragma unroll
    for (int kk = 0; kk < KPS; ++kk) {
      int32_t d[4][4][4];
      if constexpr (B == 16) {
        uint32_t af[4][2], bf[4];
#pragma unroll
        for (int pr = 0; pr < 2; ++pr) {  // two m-tiles per ldmatrix.x4: matrices (mt, rows 0-7 / 8-15)
          const int mi = lane >> 3, mt = pr * 2 + (mi >> 1);
          const int row = wm * 64 + mt * 16 + (mi & 1) * 8 + (lane & 7);
          ldmatrix_x4(smem_u32(As + swz(row, kk)), af[pr * 2][0], af[pr * 2][1], af[pr * 2 + 1][0],
                      af[pr * 2 + 1][1]);
        }
        {
          const int row = wn * 32 + (lane >> 3) * 8 + (lane & 7);  // matrix q = n-tile q
          ldmatrix_x4(smem_u32(Bs + swz(row, kk)), bf[0], bf[1], bf[2], bf[3]);
        }
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) mma_k16(d[mt][nt], af[mt], bf[nt]);
      } else {
        uint32_t af[4][4], bf[4][2];
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {  // matrices: (rows 0-7, k 0-15), (8-15, 0-15), (0-7, 16-31), (8-15, 16-31)
          const int mi = lane >> 3;
          const int row = wm * 64 + mt * 16 + (mi & 1) * 8 + (lane & 7);
          ldmatrix_x4(smem_u32(As + swz(row, 2 * kk + (mi >> 1))), af[mt][0], af[mt][1], af[mt][2], af[mt][3]);
        }
#pragma unroll
        for (int pr = 0; pr < 2; ++pr) {  // two n-tiles per ldmatrix.x4: (nt, k 0-15), (nt, k 16-31)
          const int mi = lane >> 3, nt = pr * 2 + (mi >> 1);
          const int row = wn * 32 + nt * 8 + (lane & 7);
          ldmatrix_x4(smem_u32(Bs + swz(row, 2 * kk + (mi & 1))), bf[pr * 2][0], bf[pr * 2][1], bf[pr * 2 + 1][0],
                      bf[pr * 2 + 1][1]);
        }
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) mma_k32(d[mt][nt], af[mt], bf[nt]);
      }
      // Steps 2-5 for this block, every output of the thread.
      float sa[4][2], sb[4][2];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        sa[mt][0] = SAs[kk * BM + wm * 64 + mt * 16 + g];
        sa[mt][1] = SAs[kk * BM + wm * 64 + mt * 16 + g + 8];
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const float2 v = *reinterpret_cast<const float2*>(SBs + kk * BN + wn * 32 + nt * 8 + t4 * 2);
        sb[nt][0] = v.x;
        sb[nt][1] = v.y;
      }
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float x = __fsub_rn(__int_as_float(d[mt][nt][e]), kMagic);  // = FP32(p), exact
            acc[mt][nt][e] = contract_scale_add(acc[mt][nt][e], x, sa[mt][e >> 1], sb[nt][e & 1]);
          }
    }
  }
  cp_async_wait<0>();

  // Step 6 and the store (rows g / g+8, columns 2t4, 2t4+1 of each mma tile).
  const float ga = tensor_factor(p.fa, *p.gda), gb = tensor_factor(p.fb, *p.gdb);
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t m = m0 + wm * 64 + mt * 16 + g + h * 8;
        const int64_t n = n0 + wn * 32 + nt * 8 + t4 * 2;
        if (m >= p.M) continue;
        const float c0 = contract_finish(acc[mt][nt][2 * h], ga, gb);
        const float c1 = contract_finish(acc[mt][nt][2 * h + 1], ga, gb);
        float* out = p.c + m * p.N + n;
        if (n + 1 < p.N && (p.N % 2) == 0) {
          *reinterpret_cast<float2*>(out) = make_float2(c0, c1);
        } else {
          if (n < p.N) out[0] = c0;
          if (n + 1 < p.N) out[1] = c1;
        }
      }
}

template <int B>
void launch_mma(const FastArgs& p, cudaStream_t s) {
  constexpr int KPS = BK / B;
  constexpr int smem = STAGES * (BM * BK + BN * BK + 4 * KPS * (BM + BN));
  static bool configured = false;  // the attribute is per function; set once per process
  if (!configured) {
    check(cudaFuncSetAttribute(gemm_mma_kernel<B>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
          "cudaFuncSetAttribute");
    configured = true;
  }
  const dim3 grid(unsigned(p.Np / BN), unsigned(p.Mp / BM));
  gemm_mma_kernel<B><<<grid, THREADS, smem, s>>>(p);
}

}  // namespace

void gemm_reference(const DQTensor& a, const DQTensor& b, float* d_c, cudaStream_t s) {
  check_operands(a, b);
  RefArgs r{};
  r.fa = a.format;
  r.fb = b.format;
  r.ca = a.codes.data();
  r.cb = b.codes.data();
  r.sa = a.scales.data();
  r.sb = b.scales.data();
  r.gda = a.global_dec.data();
  r.gdb = b.global_dec.data();
  r.M = a.rows;
  r.N = b.rows;
  r.K = a.cols;
  r.B = a.block;
  r.c = d_c;
  const dim3 block(32, 8), grid(unsigned((r.N + 31) / 32), unsigned((r.M + 7) / 8));
  gemm_reference_kernel<<<grid, block, 0, s>>>(r);
  check_launch("gemm_reference_kernel");
}

void gemm_fast_prepare(const DQTensor& a, const DQTensor& b, GemmWorkspace& ws, cudaStream_t s) {
  check_operands(a, b);
  const int64_t K = a.cols, Kp = round_up(K, BK), KB = K / a.block, KBp = Kp / a.block;
  const int64_t Mp = round_up(a.rows, BM), Np = round_up(b.rows, BN);
  ws.a8.resize(size_t(Mp * Kp));
  ws.b8.resize(size_t(Np * Kp));
  ws.sa.resize(size_t(KBp * Mp));
  ws.sb.resize(size_t(KBp * Np));
  const int T = 256;
  unpack_kernel<<<detail::blocks_for(Mp * Kp / 16, T), T, 0, s>>>(a.format, a.codes.data(), a.rows, K, ws.a8.data(),
                                                                   Mp, Kp);
  unpack_kernel<<<detail::blocks_for(Np * Kp / 16, T), T, 0, s>>>(b.format, b.codes.data(), b.rows, K, ws.b8.data(),
                                                                   Np, Kp);
  transpose_scales_kernel<<<detail::blocks_for(KBp * Mp, T), T, 0, s>>>(a.scales.data(), a.rows, KB, ws.sa.data(),
                                                                         Mp, KBp);
  transpose_scales_kernel<<<detail::blocks_for(KBp * Np, T), T, 0, s>>>(b.scales.data(), b.rows, KB, ws.sb.data(),
                                                                         Np, KBp);
  check_launch("gemm_fast_prepare");
}

void gemm_fast_run(const DQTensor& a, const DQTensor& b, float* d_c, GemmWorkspace& ws, cudaStream_t s) {
  check_operands(a, b);
  FastArgs p{};
  p.Kp = round_up(a.cols, BK);
  p.Mp = round_up(a.rows, BM);
  p.Np = round_up(b.rows, BN);
  if (ws.a8.size() != size_t(p.Mp * p.Kp) || ws.b8.size() != size_t(p.Np * p.Kp))
    throw std::logic_error("gemm_fast_run: workspace not prepared for these operands");
  p.a = ws.a8.data();
  p.b = ws.b8.data();
  p.sa = ws.sa.data();
  p.sb = ws.sb.data();
  p.M = a.rows;
  p.N = b.rows;
  p.fa = a.format;
  p.fb = b.format;
  p.gda = a.global_dec.data();
  p.gdb = b.global_dec.data();
  p.c = d_c;
  if (a.block == 16)
    launch_mma<16>(p, s);
  else if (a.block == 32)
    launch_mma<32>(p, s);
  else
    throw std::invalid_argument("block size must be 16 or 32");
  check_launch("gemm_mma_kernel");
}

void gemm_fast(const DQTensor& a, const DQTensor& b, float* d_c, GemmWorkspace& ws, cudaStream_t s) {
  gemm_fast_prepare(a, b, ws, s);
  gemm_fast_run(a, b, d_c, ws, s);
}

}  // namespace fp4lab::cuda
