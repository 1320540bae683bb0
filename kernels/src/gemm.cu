// Block-scaled GEMM under the datapath contract (docs/datapath.md section 3), C[M, N] = A[M, K] . B[N, K]^T:
// a simple reference kernel and a fast one on the int8 tensor cores. Both call the golden contract functions
// (contract_step / contract_scale_add / contract_finish / tensor_factor), which use __fmul_rn / __fadd_rn in
// device code, so nothing is contracted into an FMA or reordered; the fma of the fused epilogue is the golden
// contract_scale_add_magic, taken only where it is proven to give the same bits.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "common.cuh"
#include "fp4lab/cuda/kernels.hpp"
#include "fp4lab/gemm.hpp"
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#include "wgmma.cuh"  // device code of the sm_90a pass only
#endif

namespace fp4lab::cuda {
namespace {

void check_operands(const DQTensor& a, const DQTensor& b) {
  check_gemm_operands(a, b);
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
int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// codes [rows, K] packed -> signed integer views [Rp, Kp] (zero padding), 16 outputs per thread. The integer
// view of each code (golden decode_int) sits in byte tables, four codes looked up per byte permute: magnitude
// index -> value and -> negated value, then the sign bit picks one of the two.
__device__ __forceinline__ uint4 unpack16(ElemFormat f, const uint8_t* codes, int64_t rows, int64_t K, int64_t r,
                                          int64_t c) {
  uint32_t w[4] = {0, 0, 0, 0};
  if (r < rows && c * 16 < K) {
    uint32_t pos[2] = {0, 0}, neg[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      pos[i / 4] |= uint32_t(uint8_t(int8_t(decode_int(f, uint8_t(i))))) << (8 * (i % 4));
      neg[i / 4] |= uint32_t(uint8_t(int8_t(decode_int(f, uint8_t(8 | i))))) << (8 * (i % 4));
    }
    const uint2 in = *reinterpret_cast<const uint2*>(codes + (r * K + c * 16) / 2);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint32_t sel = ((q < 2 ? in.x : in.y) >> (16 * (q % 2))) & 0xFFFF;  // codes 4q .. 4q+3, one per nibble
      const uint32_t idx = sel & 0x7777;                                      // magnitude indices
      const uint32_t pv = __byte_perm(pos[0], pos[1], idx), nv = __byte_perm(neg[0], neg[1], idx);
      w[q] = __byte_perm(pv, nv, 0x3210 | ((sel >> 1) & 0x4444));  // sign bit set: byte i of nv
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// A view's 16 integers at [r, 16c .. 16c + 15]: int8 bytes (the mma.sync variants) or F16 bit patterns (the wgmma
// variant; |v| <= 12, exact).
template <bool F16>
__device__ __forceinline__ void store_view16(void* view, int64_t Kp, int64_t r, int64_t c, uint4 v) {
  if constexpr (!F16) {
    *reinterpret_cast<uint4*>(static_cast<int8_t*>(view) + r * Kp + c * 16) = v;
  } else {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    uint32_t h[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int lo = int8_t((w[i / 2] >> (16 * (i % 2))) & 0xFF), hi = int8_t((w[i / 2] >> (16 * (i % 2) + 8)) & 0xFF);
      h[i] = uint32_t(__half_as_ushort(__int2half_rn(lo))) | (uint32_t(__half_as_ushort(__int2half_rn(hi))) << 16);
    }
    uint4* o = reinterpret_cast<uint4*>(static_cast<uint16_t*>(view) + r * Kp + c * 16);
    o[0] = make_uint4(h[0], h[1], h[2], h[3]);
    o[1] = make_uint4(h[4], h[5], h[6], h[7]);
  }
}

// Everything the fast kernels read of a GEMM's two operands, in one launch: blocks [0, unpack[0]) write A's view,
// the next unpack[1] B's, then tiles[0] blocks transpose A's scales and tiles[1] B's. Four launches became one
// (70% of a device copy's bandwidth at 8192^2, kernels/README.md): 32-bit index arithmetic where it fits (a 64-bit
// division per thread was most of the unpack's instructions), and the scales transposed through shared memory
// (read along K, written along rows, both coalesced; a thread per scale had read them with a stride of KB).
struct PrepArgs {
  ElemFormat f[2];
  const uint8_t* codes[2];
  const float* scales[2];  // [rows, KB]
  int64_t rows[2], Rp[2];
  void* view[2];     // [Rp, Kp]
  float* scales_t[2];  // [KBp, Rp] (k-major, zero padding)
  int64_t K, Kp, KB, KBp;
  unsigned unpack[2], tiles[2], tiles_r[2];  // blocks per part; scale tiles along rows
  int* fused_ok;  // cleared when a scale (padding included) does not pass fma_exact_scale; null: nothing checked
};
constexpr int kPrepThreads = 256, kScaleTile = 32;

template <bool F16>
__global__ void __launch_bounds__(kPrepThreads) prepare_kernel(const PrepArgs p) {
  unsigned bid = blockIdx.x;
  const int o = bid < p.unpack[0] ? 0 : bid < p.unpack[0] + p.unpack[1] ? 1 : -1;
  if (o >= 0) {  // unpack: 16 codes a thread
    const int64_t t = int64_t(bid - (o ? p.unpack[0] : 0u)) * kPrepThreads + threadIdx.x;
    const int64_t chunks = p.Kp / 16, n = p.Rp[o] * chunks;
    if (t >= n) return;
    int64_t r, c;
    if (n < (int64_t(1) << 32)) {
      r = uint32_t(t) / uint32_t(chunks);
      c = uint32_t(t) - uint32_t(r) * uint32_t(chunks);
    } else {
      r = t / chunks;
      c = t - r * chunks;
    }
    store_view16<F16>(p.view[o], p.Kp, r, c, unpack16(p.f[o], p.codes[o], p.rows[o], p.K, r, c));
    return;
  }
  bid -= p.unpack[0] + p.unpack[1];
  const int q = bid < p.tiles[0] ? 0 : 1;  // the scales' transpose: a 32 x 32 tile a block
  if (q) bid -= p.tiles[0];
  if (bid >= p.tiles[q]) return;
  __shared__ float tile[kScaleTile][kScaleTile + 1];
  const int64_t r0 = int64_t(bid % p.tiles_r[q]) * kScaleTile, k0 = int64_t(bid / p.tiles_r[q]) * kScaleTile;
  const int tx = threadIdx.x % kScaleTile, ty = threadIdx.x / kScaleTile;
  constexpr int kRowsPerPass = kPrepThreads / kScaleTile;
#pragma unroll
  for (int i = 0; i < kScaleTile; i += kRowsPerPass) {
    const int64_t r = r0 + ty + i, k = k0 + tx;
    tile[ty + i][tx] = (r < p.rows[q] && k < p.KB) ? p.scales[q][r * p.KB + k] : 0.0f;
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kScaleTile; i += kRowsPerPass) {
    const int64_t k = k0 + ty + i, r = r0 + tx;
    if (k < p.KBp && r < p.Rp[q]) {
      const float v = tile[tx][ty + i];
      p.scales_t[q][k * p.Rp[q] + r] = v;
      if (p.fused_ok && !fma_exact_scale(v)) *p.fused_ok = 0;  // every writer stores the same 0
    }
  }
}

struct FastArgs {
  const int8_t *a, *b;   // the views' bytes: int8 (mma.sync) or F16 (wgmma), [Mp, Kp] and [Np, Kp] elements
  const float *sa, *sb;  // [KBp, Mp], [KBp, Np]
  int64_t Mp, Np, Kp;
  int64_t M, N;
  ElemFormat fa, fb;
  const float *gda, *gdb;
  const int* fused_ok;  // nonzero: steps 2-5 as contract_scale_add_magic (proven the same bits); null = never
  float* c;             // FP32 C, or null and
  uint16_t* c16;        // BF16 C (round to nearest even of the FP32 value)
  int* nonfinite;       // null, or the flag whose `bit` a NaN or Inf FP32 value of C sets
  int bit;
};

// Step 6 done: C[m][n], C[m][n + 1] stored as FP32 or BF16, out-of-range ones skipped; `bad` collects NaN/Inf.
__device__ __forceinline__ void store_c_pair(const FastArgs& p, int64_t m, int64_t n, float c0, float c1, bool& bad) {
  if (m >= p.M) return;
  bad |= (n < p.N && !isfinite(c0)) || (n + 1 < p.N && !isfinite(c1));
  const bool pair = n + 1 < p.N && (p.N % 2) == 0;  // both in range, and the pair aligned
  if (p.c16) {
    // The golden f32_to_bf16 (round to nearest even), as torch's FP32 -> BF16 conversion on finite values.
    const uint16_t b0 = f32_to_bf16(c0), b1 = f32_to_bf16(c1);
    uint16_t* out = p.c16 + m * p.N + n;
    if (pair) {
      *reinterpret_cast<uint32_t*>(out) = uint32_t(b0) | (uint32_t(b1) << 16);
    } else {
      if (n < p.N) out[0] = b0;
      if (n + 1 < p.N) out[1] = b1;
    }
    return;
  }
  float* out = p.c + m * p.N + n;
  if (pair) {
    *reinterpret_cast<float2*>(out) = make_float2(c0, c1);
  } else {
    if (n < p.N) out[0] = c0;
    if (n + 1 < p.N) out[1] = c1;
  }
}

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

// Every mma starts its accumulator at kMagicBits (models/include/fp4lab/gemm.hpp): read back as FP32 the result is
// exactly kMagic + p, so step 2 needs no int-to-float conversion instruction (a quarter-rate pipe on SM90).

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

// Tile shapes of the fast kernel: warps WM x WN, each warp MT x NT mma tiles (16 x 8 outputs each), K in stages
// of 128 bytes (8 blocks of 16 or 4 of 32 per barrier) through a STAGES-deep cp.async pipeline, MINB CTAs per SM.
template <int WM_, int WN_, int MT_, int NT_, int STAGES_, int MINB_>
struct Tile {
  static constexpr int WM = WM_, WN = WN_, MT = MT_, NT = NT_, STAGES = STAGES_, MINB = MINB_;
  static constexpr int THREADS = 32 * WM * WN, BM = WM * MT * 16, BN = WN * NT * 8;
  static constexpr int BKB = 128;  // K bytes per stage (and per shared row)
};

// Shared-memory byte offset of 16-byte chunk c (0..7) of row r (128-byte rows): the XOR puts the 8 rows one
// ldmatrix phase reads into 8 different 16-byte bank groups.
__device__ __forceinline__ int swz(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

// The cp.async copies of one pipeline stage, the same in both fast kernels: BM rows of A and BN of B, CH 16-byte
// chunks a row into the swizzled layout (thread tid moves chunk tid % CH of rows tid / CH + i * RS), then the
// stage's k-major scales of A and B (copy id = tid + i * THREADS: ids below QA are A's, row kk = id / (BM / 4),
// the rest B's). Every address is computed once per thread: a fixed offset plus the stage's K offset.
template <int BM, int BN, int BKB, int THREADS, int KPS>
struct StageCopies {
  static constexpr int CH = BKB / 16, RS = THREADS / CH;  // chunks a row; rows between a thread's copies
  static constexpr int A_BYTES = BM * BKB, B_BYTES = BN * BKB, SA_FLOATS = KPS * BM;
  static constexpr int QA = KPS * BM / 4, QB = KPS * BN / 4;
  static constexpr int NS = (QA + QB + THREADS - 1) / THREADS;  // scale copies a thread (the last may be idle)
  static_assert(THREADS % CH == 0 && BM % RS == 0 && BN % RS == 0 && RS % 8 == 0, "uniform copy pattern");

  const int8_t *a_src, *b_src;
  uint32_t ab_dst;
  const float* s_src[NS];
  uint32_t s_dst[NS];
  int64_t row_bytes, sa_step, sb_step;
  int tid;

  __device__ __forceinline__ StageCopies(const FastArgs& p, int tid_, int64_t m0, int64_t n0, int64_t row_bytes_)
      : row_bytes(row_bytes_), sa_step(int64_t(KPS) * p.Mp), sb_step(int64_t(KPS) * p.Np), tid(tid_) {
    const int cr = tid / CH, cc = tid % CH;
    a_src = p.a + (m0 + cr) * row_bytes + cc * 16;
    b_src = p.b + (n0 + cr) * row_bytes + cc * 16;
    ab_dst = uint32_t(swz(cr, cc));  // + i * RS * BKB for copy i
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      const int id = tid + i * THREADS;
      s_src[i] = nullptr;
      s_dst[i] = 0;
      if (id >= QA + QB) continue;
      if (id < QA) {
        const int kk = id / (BM / 4), q = id % (BM / 4);
        s_src[i] = p.sa + int64_t(kk) * p.Mp + m0 + q * 4;
        s_dst[i] = uint32_t(A_BYTES + B_BYTES + 4 * (kk * BM + q * 4));
      } else {
        const int kk = (id - QA) / (BN / 4), q = (id - QA) % (BN / 4);
        s_src[i] = p.sb + int64_t(kk) * p.Np + n0 + q * 4;
        s_dst[i] = uint32_t(A_BYTES + B_BYTES + 4 * (SA_FLOATS + kk * BN + q * 4));
      }
    }
  }
  // Stage kt of K into the stage at shared address `base`.
  __device__ __forceinline__ void load(uint32_t base, int64_t kt) const {
    const int64_t k0 = kt * BKB;
#pragma unroll
    for (int i = 0; i < BM / RS; ++i)
      cp_async16(base + ab_dst + i * RS * BKB, a_src + int64_t(i) * RS * row_bytes + k0);
#pragma unroll
    for (int i = 0; i < BN / RS; ++i)
      cp_async16(base + A_BYTES + ab_dst + i * RS * BKB, b_src + int64_t(i) * RS * row_bytes + k0);
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      const int id = tid + i * THREADS;
      if (id < QA + QB) cp_async16(base + s_dst[i], s_src[i] + kt * (id < QA ? sa_step : sb_step));
    }
  }
};

// Per block of the stage and output of the thread: one exact subtraction (step 2) and the golden
// contract_scale_add (steps 3-5: two multiplies, one add), blocks in ascending order; where every scale of the
// GEMM passes fma_exact_scale (the device flag), contract_scale_add_magic instead: two fmas on the mma's kMagic + p,
// no subtraction, plus one multiply per row scale; the same bits (models/include/fp4lab/gemm.hpp has the proof;
// the accumulators start at +0 and so are never -0). The flag is uniform, so the loop is chosen once.
// Every copy and ldmatrix address is computed once per thread (a fixed offset from the stage base plus the
// stage's K offset).
template <int B, class T>
__global__ void __launch_bounds__(T::THREADS, T::MINB) gemm_mma_kernel(const FastArgs p) {
  constexpr int BM = T::BM, BN = T::BN, MT = T::MT, NT = T::NT, STAGES = T::STAGES, THREADS = T::THREADS;
  constexpr int BKB = T::BKB;
  constexpr int KPS = BKB / B;  // blocks per stage
  constexpr int A_BYTES = BM * BKB, B_BYTES = BN * BKB, SA_FLOATS = KPS * BM, SB_FLOATS = KPS * BN;
  constexpr int STAGE_BYTES = A_BYTES + B_BYTES + 4 * (SA_FLOATS + SB_FLOATS);
  static_assert(MT % 2 == 0 && NT % 4 == 0, "ldmatrix.x4 loads two m-tiles or four n-tiles at a time");
  extern __shared__ __align__(128) uint8_t smem[];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp % T::WM, wn = warp / T::WM;
  const int g = lane >> 2, t4 = lane & 3;
  const int64_t m0 = int64_t(blockIdx.y) * BM, n0 = int64_t(blockIdx.x) * BN;
  const int64_t ktiles = p.Kp / BKB;
  const int wrow = wm * MT * 16, wcol = wn * NT * 8;
  const uint32_t smem0 = smem_u32(smem);

  const StageCopies<BM, BN, BKB, THREADS, KPS> copies(p, tid, m0, n0, p.Kp);
  auto load_stage = [&](int s, int64_t kt) { copies.load(smem0 + uint32_t(s * STAGE_BYTES), kt); };

  // ldmatrix rows of this lane: A (k16: two m-tiles per x4; k32: one m-tile per x4), B likewise.
  const int mi = lane >> 3, r8 = lane & 7;
  const uint32_t x7 = uint32_t(r8) << 4;  // every ldmatrix row of this lane has row & 7 == r8
  int a_row, b_row;
  if constexpr (B == 16) {
    a_row = wrow + (mi >> 1) * 16 + (mi & 1) * 8 + r8;  // + pr * 32
    b_row = wcol + mi * 8 + r8;                          // + q * 32
  } else {
    a_row = wrow + (mi & 1) * 8 + r8;                    // + mt * 16; chunk + (mi >> 1)
    b_row = wcol + (mi >> 1) * 8 + r8;                   // + pr * 16; chunk + (mi & 1)
  }
  auto ld_addr = [&](uint32_t stage_base, int row, int chunk) -> uint32_t {  // swz(row, chunk) + stage_base
    return stage_base + uint32_t(row * 128) + ((uint32_t(chunk) << 4) ^ x7);
  };

  float acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ktiles) load_stage(s, s);
    cp_async_commit();
  }

  auto main_loop = [&](auto fused_tag) {
    constexpr bool FUSED = decltype(fused_tag)::value;
    for (int64_t kt = 0; kt < ktiles; ++kt) {
      cp_async_wait<STAGES - 2>();
      __syncthreads();
      {
        const int64_t next = kt + STAGES - 1;
        if (next < ktiles) load_stage(int(next % STAGES), next);
        cp_async_commit();
      }
      const int s = int(kt % STAGES);
      const uint32_t As = smem0 + uint32_t(s * STAGE_BYTES), Bs = As + A_BYTES;
      const float* SAs = reinterpret_cast<const float*>(smem + s * STAGE_BYTES + A_BYTES + B_BYTES);
      const float* SBs = SAs + SA_FLOATS;

#pragma unroll
      for (int kk = 0; kk < KPS; ++kk) {
        int32_t d[MT][NT][4];
        if constexpr (B == 16) {
          uint32_t af[MT][2], bf[NT];
#pragma unroll
          for (int pr = 0; pr < MT / 2; ++pr)
            ldmatrix_x4(ld_addr(As, a_row + pr * 32, kk), af[pr * 2][0], af[pr * 2][1], af[pr * 2 + 1][0],
                        af[pr * 2 + 1][1]);
#pragma unroll
          for (int q = 0; q < NT / 4; ++q)
            ldmatrix_x4(ld_addr(Bs, b_row + q * 32, kk), bf[q * 4], bf[q * 4 + 1], bf[q * 4 + 2], bf[q * 4 + 3]);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) mma_k16(d[mt][nt], af[mt], bf[nt]);
        } else {
          uint32_t af[MT][4], bf[NT][2];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
            ldmatrix_x4(ld_addr(As, a_row + mt * 16, 2 * kk + (mi >> 1)), af[mt][0], af[mt][1], af[mt][2], af[mt][3]);
#pragma unroll
          for (int pr = 0; pr < NT / 2; ++pr)
            ldmatrix_x4(ld_addr(Bs, b_row + pr * 16, 2 * kk + (mi & 1)), bf[pr * 2][0], bf[pr * 2][1],
                        bf[pr * 2 + 1][0], bf[pr * 2 + 1][1]);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) mma_k32(d[mt][nt], af[mt], bf[nt]);
        }
        float sa[MT][2], sb[NT][2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          sa[mt][0] = SAs[kk * BM + wrow + mt * 16 + g];
          sa[mt][1] = SAs[kk * BM + wrow + mt * 16 + g + 8];
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const float2 v = *reinterpret_cast<const float2*>(SBs + kk * BN + wcol + nt * 8 + t4 * 2);
          sb[nt][0] = v.x;
          sb[nt][1] = v.y;
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          float msa[2] = {0.0f, 0.0f};
          if constexpr (FUSED) {
            msa[0] = magic_scale(sa[mt][0]);
            msa[1] = magic_scale(sa[mt][1]);
          }
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float f = __int_as_float(d[mt][nt][e]);  // kMagic + p, exactly
              acc[mt][nt][e] = FUSED ? contract_scale_add_magic(acc[mt][nt][e], f, sa[mt][e >> 1], msa[e >> 1],
                                                                sb[nt][e & 1])
                                     : contract_scale_add(acc[mt][nt][e], __fsub_rn(f, kMagic),  // FP32(p), exact
                                                          sa[mt][e >> 1], sb[nt][e & 1]);
            }
        }
      }
    }
  };
  if (p.fused_ok && __ldg(p.fused_ok) != 0)
    main_loop(std::true_type{});
  else
    main_loop(std::false_type{});
  cp_async_wait<0>();

  const float ga = tensor_factor(p.fa, *p.gda), gb = tensor_factor(p.fb, *p.gdb);
  bool bad = false;  // a stored value of this thread is NaN or Inf
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        store_c_pair(p, m0 + wrow + mt * 16 + g + h * 8, n0 + wcol + nt * 8 + t4 * 2,
                     contract_finish(acc[mt][nt][2 * h], ga, gb), contract_finish(acc[mt][nt][2 * h + 1], ga, gb), bad);
  // The output check of the whole tile in one flag write (p.nonfinite is uniform, so every thread reaches it).
  if (p.nonfinite && __syncthreads_or(bad) && threadIdx.x == 0) atomicOr(p.nonfinite, p.bit);
}

// ---- SM90 path: wgmma.m64n128k16 on F16 views ---------------------------------------------------------------
// The same contract on warpgroup MMAs: a block of 16 is one K-16 wgmma (block 32: two, the second accumulating),
// whose FP32 result is the block's dot product p exactly: the F16 inputs are integers |v| <= 12, so every product
// and partial sum is an integer of magnitude at most 32 * 144 < 2^13, exact wherever the tensor core keeps 14
// significant bits of a sum (FP32 keeps 24); measured too, by the kernel tests and tools/mma_probe.cu. Steps
// 3-5 are then the golden contract_scale_add (3 instructions) or, where every scale passes fma_exact_scale,
// contract_scale_add_fma (2), on the CUDA cores, blocks in ascending order. 128 x 128 tile, two warpgroups of 64
// rows; stages of 64 K elements through cp.async into the 128-byte-swizzled K-major layout wgmma's descriptors
// read (the swz above: 16-byte chunk XOR row % 8, on 1024-byte-aligned 8-row atoms). Within a stage, the wgmma of
// the next block runs while the epilogue of this one does (two accumulator sets).
constexpr int kWgStages = 4, kWgThreads = 256, kWgBM = 128, kWgBN = 128, kWgRowBytes = 128;
template <int B>
__host__ __device__ constexpr int wg_stage_bytes() {
  return kWgBM * kWgRowBytes + kWgBN * kWgRowBytes + 4 * (kWgRowBytes / 2 / B) * (kWgBM + kWgBN);
}


template <int B>
__global__ void __launch_bounds__(kWgThreads, 1) gemm_wgmma_kernel(const FastArgs p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BM = kWgBM, BN = kWgBN, BKB = kWgRowBytes, STAGES = kWgStages, THREADS = kWgThreads;
  constexpr int KPS = BKB / 2 / B, SUB = B / 16;  // blocks a stage, wgmmas a block
  constexpr int A_BYTES = BM * BKB, B_BYTES = BN * BKB, SA_FLOATS = KPS * BM;
  constexpr int STAGE_BYTES = wg_stage_bytes<B>();
  static_assert(STAGE_BYTES % 1024 == 0 && KPS % 2 == 0, "1024-byte stages; blocks in pairs (two accumulators)");
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // The 128-byte swizzle's atoms must start on 1024 bytes; the launch asks for 1024 bytes more than the stages.
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const uint32_t smem0 = smem_u32(smem);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, w = warp & 3;
  const int g = lane >> 2, t4 = lane & 3;
  const int64_t m0 = int64_t(blockIdx.y) * BM, n0 = int64_t(blockIdx.x) * BN;
  const int64_t row_bytes = 2 * p.Kp, ktiles = row_bytes / BKB;

  const StageCopies<BM, BN, BKB, THREADS, KPS> copies(p, tid, m0, n0, row_bytes);
  auto load_stage = [&](int s, int64_t kt) { copies.load(smem0 + uint32_t(s * STAGE_BYTES), kt); };

  float acc[64], d0[64], d1[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = d0[i] = d1[i] = 0.0f;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ktiles) load_stage(s, s);
    cp_async_commit();
  }
  // Accumulator element i = 4 j + e: row w * 16 + g + 8 (e >> 1) of the warpgroup's 64, column 8 j + 2 t4 + (e & 1).
  const int arow = wg * 64 + w * 16 + g;
  auto main_loop = [&](auto fused_tag) {
    constexpr bool FUSED = decltype(fused_tag)::value;
    for (int64_t kt = 0; kt < ktiles; ++kt) {
      cp_async_wait<STAGES - 2>();
      wg::fence_async_shared();  // the cp.async data, read by wgmma
      __syncthreads();
      {
        const int64_t next = kt + STAGES - 1;
        if (next < ktiles) load_stage(int(next % STAGES), next);
        cp_async_commit();
      }
      const int s = int(kt % STAGES);
      const uint32_t As = smem0 + uint32_t(s * STAGE_BYTES) + uint32_t(wg * 64 * BKB);  // this warpgroup's 64 rows
      const uint32_t Bs = smem0 + uint32_t(s * STAGE_BYTES + A_BYTES);
      const float* SAs = reinterpret_cast<const float*>(smem + s * STAGE_BYTES + A_BYTES + B_BYTES);
      const float* SBs = SAs + SA_FLOATS;
      auto issue = [&](float(&d)[64], int kk) {
        wg::fence();
#pragma unroll
        for (int u = 0; u < SUB; ++u)
          wg::mma_m64n128k16(d, wg::desc(As + uint32_t((kk * SUB + u) * 32)),
                             wg::desc(Bs + uint32_t((kk * SUB + u) * 32)), u);  // + 32 bytes per K slice of 16
        wg::commit();
      };
      auto epilogue = [&](float(&d)[64], int kk) {
        const float sa0 = SAs[kk * BM + arow], sa1 = SAs[kk * BM + arow + 8];
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const float2 sb = *reinterpret_cast<const float2*>(SBs + kk * BN + j * 8 + t4 * 2);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float sa = (e >> 1) ? sa1 : sa0, sbe = (e & 1) ? sb.y : sb.x;
            acc[4 * j + e] = FUSED ? contract_scale_add_fma(acc[4 * j + e], d[4 * j + e], sa, sbe)
                                   : contract_scale_add(acc[4 * j + e], d[4 * j + e], sa, sbe);
          }
        }
      };
#pragma unroll
      for (int kk = 0; kk < KPS; kk += 2) {
        issue(d0, kk);
        if (kk > 0) {
          wg::wait<1>();  // block kk - 1 (into d1) is done; block kk runs on
          wg::pin(d1);
          epilogue(d1, kk - 1);
        }
        issue(d1, kk + 1);
        wg::wait<1>();
        wg::pin(d0);
        epilogue(d0, kk);
      }
      wg::wait<0>();  // the stage's last block: no wgmma reads this stage after this (its scales are read below,
                      // before the next barrier, after which the stage may be overwritten)
      wg::pin(d1);
      epilogue(d1, KPS - 1);
    }
  };
  if (p.fused_ok && __ldg(p.fused_ok) != 0)
    main_loop(std::true_type{});
  else
    main_loop(std::false_type{});
  cp_async_wait<0>();

  const float ga = tensor_factor(p.fa, *p.gda), gb = tensor_factor(p.fb, *p.gdb);
  bool bad = false;
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      store_c_pair(p, m0 + arow + 8 * h, n0 + j * 8 + t4 * 2, contract_finish(acc[4 * j + 2 * h], ga, gb),
                   contract_finish(acc[4 * j + 2 * h + 1], ga, gb), bad);
  if (p.nonfinite && __syncthreads_or(bad) && threadIdx.x == 0) atomicOr(p.nonfinite, p.bit);
#else
  __trap();  // built for another architecture: gemm_fast_variants() offers this variant only on SM90
#endif
}

// The tile shapes built; all are bit-identical (the tests run each). Operands are padded to multiples of 128 rows.
using T128x128w64x32 = Tile<2, 4, 4, 4, 3, 1>;  // 8 warps, 64 outputs per thread
using T64x128w32x32 = Tile<2, 4, 2, 4, 3, 2>;   // 8 warps, 2 CTAs per SM
using T128x128w32x32 = Tile<4, 4, 2, 4, 3, 1>;  // 16 warps, 32 outputs per thread
constexpr const char* kVariantNames[] = {"128x128 w64x32 8 warps", "64x128 w32x32 8 warps x2",
                                         "128x128 w32x32 16 warps", "128x128 wgmma f16 2 warpgroups"};
constexpr int kMmaVariants = 3, kWgmmaVariant = 3;
// The wgmma kernel is sm_90a code: offered where the library holds it and the current device is SM90.
bool wgmma_device() {
#if defined(FP4LAB_HAVE_SM90A)
  static const bool ok = [] {
    int dev = 0, major = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major == 9;
  }();
  return ok;
#else
  return false;
#endif
}
int variants() { return kMmaVariants + (wgmma_device() ? 1 : 0); }
// Default tile shapes, from the H200 measurements in docs/results/cuda-bench-h200.txt (where these three are
// variants 4-6, beside a first kernel with 64-byte K stages that never won and was removed): "64x128" was
// fastest at every shape for block 32 and at every trace shape for block 16; "128x128 w64x32" at 8192^3 for
// block 16 (152 vs 149 TOPS). The latter is taken once the 128x128 tiles fill the GPU twice.
int default_variant(int block, int64_t Mp, int64_t Np) {
  if (block == 32) return 1;
  return (Mp / 128) * (Np / 128) >= 264 ? 0 : 1;
}

template <int B, class T>
void launch_mma(const FastArgs& p, cudaStream_t s) {
  constexpr int KPS = T::BKB / B;
  constexpr int smem = T::STAGES * (T::BM * T::BKB + T::BN * T::BKB + 4 * KPS * (T::BM + T::BN));
  static bool configured = false;  // the attribute is per kernel; set once per process
  if (!configured) {
    check(cudaFuncSetAttribute(gemm_mma_kernel<B, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
          "cudaFuncSetAttribute");
    configured = true;
  }
  const dim3 grid(unsigned(p.Np / T::BN), unsigned(p.Mp / T::BM));
  gemm_mma_kernel<B, T><<<grid, T::THREADS, smem, s>>>(p);
}

template <int B>
void launch_wgmma(const FastArgs& p, cudaStream_t s) {
  constexpr int smem = kWgStages * wg_stage_bytes<B>() + 1024;  // + the alignment of the first stage to 1024
  static bool configured = false;
  if (!configured) {
    check(cudaFuncSetAttribute(gemm_wgmma_kernel<B>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
          "cudaFuncSetAttribute");
    configured = true;
  }
  const dim3 grid(unsigned(p.Np / kWgBN), unsigned(p.Mp / kWgBM));
  gemm_wgmma_kernel<B><<<grid, kWgThreads, smem, s>>>(p);
}

template <int B>
void launch_variant(int v, const FastArgs& p, cudaStream_t s) {
  switch (v) {
    case kWgmmaVariant:
      if (!wgmma_device()) break;
      return launch_wgmma<B>(p, s);
    case 0: return launch_mma<B, T128x128w64x32>(p, s);
    case 1: return launch_mma<B, T64x128w32x32>(p, s);
    case 2: return launch_mma<B, T128x128w32x32>(p, s);
  }
  throw std::invalid_argument("no fast GEMM variant " + std::to_string(v));
}

constexpr int kPad = 128;   // rows of A and B are padded to this (a multiple of every variant's BM and BN)
static_assert(kPad % kScaleTile == 0, "the scales' transpose covers padded rows in whole tiles");
constexpr int kKPad = 128;  // and K to this (a multiple of every variant's stage)

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

void gemm_fast_prepare(const DQTensor& a, const DQTensor& b, GemmWorkspace& ws, cudaStream_t s, int variant) {
  check_operands(a, b);
  const int64_t K = a.cols, Kp = round_up(K, kKPad), KB = K / a.block, KBp = Kp / a.block;
  const int64_t Mp = round_up(a.rows, kPad), Np = round_up(b.rows, kPad);
  const int v = variant >= 0 ? variant : default_variant(a.block, Mp, Np);
  if (v < 0 || v >= variants()) throw std::invalid_argument("no fast GEMM variant " + std::to_string(v));
  ws.sa.resize(size_t(KBp * Mp));
  ws.sb.resize(size_t(KBp * Np));
  const bool f16 = v == kWgmmaVariant;  // F16 views; the other kind is marked empty, so another variant is refused
  ws.a8.resize(f16 ? 0 : size_t(Mp * Kp));
  ws.b8.resize(f16 ? 0 : size_t(Np * Kp));
  ws.a16.resize(f16 ? size_t(Mp * Kp) : 0);
  ws.b16.resize(f16 ? size_t(Np * Kp) : 0);
  // The fused epilogue's bound on |p| (kFmaExactMaxDot) holds for every grid fp4lab has; checked, not assumed,
  // with the largest integer any code of the grid decodes to (unpack16 decodes all eight magnitudes).
  const bool dot_ok = int64_t(a.block) * a.format.int_level(7) * b.format.int_level(7) < kFmaExactMaxDot;
  // FP32 scales take the separate form without a check: as a rule some scale fails it, and where none does the
  // two forms give the same bits. (Unchecked, every failing scale storing to one address would serialise a warp's
  // store per 32 scales at one L2 line.)
  const bool check_scales = dot_ok && fused_form_kinds(a.scale_kind, b.scale_kind);
  ws.fused_ok.resize(1);
  check(cudaMemsetAsync(ws.fused_ok.data(), check_scales ? 1 : 0, sizeof(int), s), "cudaMemsetAsync");
  PrepArgs p{};
  const DQTensor* op[2] = {&a, &b};
  const int64_t Rp[2] = {Mp, Np};
  p.K = K;
  p.Kp = Kp;
  p.KB = KB;
  p.KBp = KBp;
  p.fused_ok = check_scales ? ws.fused_ok.data() : nullptr;
  for (int o = 0; o < 2; ++o) {
    p.f[o] = op[o]->format;
    p.codes[o] = op[o]->codes.data();
    p.scales[o] = op[o]->scales.data();
    p.rows[o] = op[o]->rows;
    p.Rp[o] = Rp[o];
    p.view[o] = f16 ? static_cast<void*>((o ? ws.b16 : ws.a16).data()) : static_cast<void*>((o ? ws.b8 : ws.a8).data());
    p.scales_t[o] = (o ? ws.sb : ws.sa).data();
    p.unpack[o] = detail::blocks_for(Rp[o] * Kp / 16, kPrepThreads);
    p.tiles_r[o] = unsigned(Rp[o] / kScaleTile);  // Rp is a multiple of kPad
    p.tiles[o] = p.tiles_r[o] * detail::blocks_for(KBp, kScaleTile);
  }
  const unsigned blocks = p.unpack[0] + p.unpack[1] + p.tiles[0] + p.tiles[1];
  if (f16)
    prepare_kernel<true><<<blocks, kPrepThreads, 0, s>>>(p);
  else
    prepare_kernel<false><<<blocks, kPrepThreads, 0, s>>>(p);
  check_launch("gemm_fast_prepare");
}

bool gemm_fast_fused(const GemmWorkspace& ws, cudaStream_t s) {
  if (!ws.fused_epilogue || ws.fused_ok.size() != 1) return false;
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");  // the prepare pass wrote the flag on this stream
  return ws.fused_ok.to_host()[0] != 0;
}
int gemm_fast_variants() { return variants(); }
const char* gemm_fast_variant_name(int v) { return v >= 0 && v < variants() ? kVariantNames[v] : "?"; }
int gemm_fast_default_variant(int block, int64_t M, int64_t N) {
  return default_variant(block, round_up(M, kPad), round_up(N, kPad));
}

void gemm_fast_run(const DQTensor& a, const DQTensor& b, float* d_c, GemmWorkspace& ws, cudaStream_t s,
                   int variant) {
  GemmOut out;
  out.c32 = d_c;
  gemm_fast_run(a, b, out, ws, s, variant);
}

void gemm_fast_run(const DQTensor& a, const DQTensor& b, const GemmOut& out, GemmWorkspace& ws, cudaStream_t s,
                   int variant) {
  check_operands(a, b);
  if ((out.c32 == nullptr) == (out.c16 == nullptr))
    throw std::invalid_argument("gemm_fast_run: give exactly one output, FP32 or BF16");
  if (out.nonfinite && out.bit == 0) throw std::invalid_argument("gemm_fast_run: a flag needs a nonzero bit");
  FastArgs p{};
  p.Kp = round_up(a.cols, kKPad);
  p.Mp = round_up(a.rows, kPad);
  p.Np = round_up(b.rows, kPad);
  const int v = variant >= 0 ? variant : default_variant(a.block, p.Mp, p.Np);
  const bool f16 = v == kWgmmaVariant;
  if ((f16 ? ws.a16.size() : ws.a8.size()) != size_t(p.Mp * p.Kp) ||
      (f16 ? ws.b16.size() : ws.b8.size()) != size_t(p.Np * p.Kp))
    throw std::logic_error("gemm_fast_run: workspace not prepared for these operands and this variant");
  p.a = f16 ? reinterpret_cast<const int8_t*>(ws.a16.data()) : ws.a8.data();
  p.b = f16 ? reinterpret_cast<const int8_t*>(ws.b16.data()) : ws.b8.data();
  p.sa = ws.sa.data();
  p.sb = ws.sb.data();
  p.M = a.rows;
  p.N = b.rows;
  p.fa = a.format;
  p.fb = b.format;
  p.gda = a.global_dec.data();
  p.gdb = b.global_dec.data();
  p.fused_ok = ws.fused_epilogue ? ws.fused_ok.data() : nullptr;
  p.c = out.c32;
  p.c16 = out.c16;
  p.nonfinite = out.nonfinite;
  p.bit = out.bit;
  if (a.block == 16)
    launch_variant<16>(v, p, s);
  else if (a.block == 32)
    launch_variant<32>(v, p, s);
  else
    throw std::invalid_argument(block_size_fault(a.block));
  check_launch("gemm_mma_kernel");
}

void gemm_fast(const DQTensor& a, const DQTensor& b, float* d_c, GemmWorkspace& ws, cudaStream_t s, int variant) {
  gemm_fast_prepare(a, b, ws, s, variant);
  gemm_fast_run(a, b, d_c, ws, s, variant);
}
void gemm_fast(const DQTensor& a, const DQTensor& b, const GemmOut& out, GemmWorkspace& ws, cudaStream_t s,
               int variant) {
  gemm_fast_prepare(a, b, ws, s, variant);
  gemm_fast_run(a, b, out, ws, s, variant);
}

}  // namespace fp4lab::cuda
