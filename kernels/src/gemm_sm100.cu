// SM100 native block-scaled GEMM on tcgen05.mma (kind::mxf4nvf4 for E2M1, kind::mxf8f6f4 for the E1M2 / INT4
// grids embedded exactly in E2M3). Built for sm_100a; no Blackwell card was available, so it has been
// compiled and never run (kernels/README.md). The scale factors are applied inside the tensor core and PTX
// leaves the order and precision of its FP32 accumulation unspecified, so this path is not bit-exact: its check
// uses native_tolerance(). The bit-exact path on SM100 is gemm_fast / gemm_reference, which build for sm_100a.
//
// Deliberately simple: one CTA (4 warps) per 128 x 128 output tile, one MMA per K step, synchronous.
//   A, B tiles in shared memory, K-major, no swizzle: core matrices of 8 rows x 16 bytes, adjacent in K 128 bytes
//   apart (leading byte offset), adjacent 8-row groups 256 bytes apart (stride byte offset).
//   Tensor memory: D in columns [0, 128) (lane = row), scale factors of A in [128, 132), of B in [132, 136):
//   lane l of every 32-lane quadrant, column j, holds the scale word of row / column 32 j + l (the layout a
//   tcgen05.cp.32x128b.warpx4 copy produces; written here with tcgen05.st by each warp into its quadrant).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>

#include "common.cuh"
#include "fp4lab/cuda/kernels.hpp"
#include "fp4lab/gemm.hpp"

namespace fp4lab::cuda {
namespace {

enum NativeKind : int { kMxf4Nvf4Ue4m3 = 0, kMxf4Nvf4Ue8m0 = 1, kMxf8f6f4E2m3 = 2 };

struct NativeArgs {
  const uint8_t *a, *b;    // element bytes [Mp, RB], [Np, RB]
  const uint8_t *sa, *sb;  // scale codes [Mp, KBp], [Np, KBp]
  int64_t Mp, Np, RB, KBp, steps;
  int64_t M, N;
  float post;              // E2M1 values are integer views / 2: D * 4 is the contract's acc scale
  ElemFormat fa, fb;
  const float *gda, *gdb;
  float* c;
};

constexpr int kTile = 128;

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM100_ALL)
constexpr int kStepBytes = 32, kTmemCols = 256, kSfaCol = 128, kSfbCol = 132;

// 32-bit instruction descriptors (PTX ISA, tcgen05 "Instruction descriptor", block-scaled kinds):
// bits 7-9 A type, 10-12 B type, 17-22 N >> 3, 23 scale type (0 UE4M3, 1 UE8M0), 27-28 M >> 7, K-major A and B
// (transpose bits 15/16 clear), scale-factor IDs 0, dense.
__device__ constexpr uint32_t idesc(int kind) {
  const uint32_t n = uint32_t(kTile >> 3) << 17, m = uint32_t(kTile >> 7) << 27;
  if (kind == kMxf8f6f4E2m3) return (3u << 7) | (3u << 10) | n | (1u << 23) | m;  // E2M3 x E2M3, UE8M0
  const uint32_t scale = kind == kMxf4Nvf4Ue8m0 ? (1u << 23) : 0u;
  return (1u << 7) | (1u << 10) | n | scale | m;                                  // E2M1 x E2M1
}

// Shared-memory matrix descriptor: start, leading and stride byte offsets (>> 4), the fixed 0b001 at bits
// 46-48, base offset 0, no swizzle.
__device__ __forceinline__ uint64_t smem_desc(const void* p, uint32_t lbo, uint32_t sbo) {
  const uint64_t addr = uint32_t(__cvta_generic_to_shared(p));
  return ((addr & 0x3FFFF) >> 4) | (uint64_t((lbo & 0x3FFFF) >> 4) << 16) | (uint64_t((sbo & 0x3FFFF) >> 4) << 32) |
         (1ull << 46);
}

template <int KIND>
__device__ __forceinline__ void mma(uint32_t d, uint64_t ad, uint64_t bd, uint32_t sfa, uint32_t sfb, bool accum) {
  constexpr uint32_t id = idesc(KIND);
  const uint32_t acc = accum ? 1u : 0u;
  if constexpr (KIND == kMxf4Nvf4Ue4m3) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %6, 0;\n"
        " tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.scale_vec::4X [%0], %1, %2, %3, [%4], [%5], p;\n}\n" ::
            "r"(d), "l"(ad), "l"(bd), "r"(id), "r"(sfa), "r"(sfb), "r"(acc)
        : "memory");
  } else if constexpr (KIND == kMxf4Nvf4Ue8m0) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %6, 0;\n"
        " tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.scale_vec::2X [%0], %1, %2, %3, [%4], [%5], p;\n}\n" ::
            "r"(d), "l"(ad), "l"(bd), "r"(id), "r"(sfa), "r"(sfb), "r"(acc)
        : "memory");
  } else {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %6, 0;\n"
        " tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.scale_vec::1X [%0], %1, %2, %3, [%4], [%5], p;\n}\n" ::
            "r"(d), "l"(ad), "l"(bd), "r"(id), "r"(sfa), "r"(sfb), "r"(acc)
        : "memory");
  }
}

__device__ __forceinline__ void tmem_st4(uint32_t taddr, const uint32_t (&v)[4]) {
  asm volatile("tcgen05.st.sync.aligned.32x32b.x4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(taddr), "r"(v[0]), "r"(v[1]),
               "r"(v[2]), "r"(v[3])
               : "memory");
}

__device__ __forceinline__ void tmem_ld32(uint32_t taddr, uint32_t (&v)[32]) {
  asm volatile(
      "tcgen05.ld.sync.aligned.32x32b.x32.b32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, "
      "%15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, [%32];\n"
      : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]), "=r"(v[4]), "=r"(v[5]), "=r"(v[6]), "=r"(v[7]), "=r"(v[8]),
        "=r"(v[9]), "=r"(v[10]), "=r"(v[11]), "=r"(v[12]), "=r"(v[13]), "=r"(v[14]), "=r"(v[15]), "=r"(v[16]),
        "=r"(v[17]), "=r"(v[18]), "=r"(v[19]), "=r"(v[20]), "=r"(v[21]), "=r"(v[22]), "=r"(v[23]), "=r"(v[24]),
        "=r"(v[25]), "=r"(v[26]), "=r"(v[27]), "=r"(v[28]), "=r"(v[29]), "=r"(v[30]), "=r"(v[31])
      : "r"(taddr)
      : "memory");
}
#endif

template <int KIND>
__global__ void __launch_bounds__(128, 1) gemm_native_kernel(const NativeArgs p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM100_ALL)
  // Scale bytes per row per MMA: 4 (UE4M3 per 16 of K = 64), 2 (UE8M0 per 32 of 64), 1 (UE8M0 per 32 of 32).
  constexpr int SPS = KIND == kMxf4Nvf4Ue4m3 ? 4 : KIND == kMxf4Nvf4Ue8m0 ? 2 : 1;
  __shared__ __align__(1024) uint8_t sa_tile[kTile * kStepBytes];
  __shared__ __align__(1024) uint8_t sb_tile[kTile * kStepBytes];
  __shared__ __align__(8) uint64_t mbar;
  __shared__ uint32_t tmem_base_slot;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t m0 = int64_t(blockIdx.y) * kTile, n0 = int64_t(blockIdx.x) * kTile;
  const uint32_t mbar_addr = uint32_t(__cvta_generic_to_shared(&mbar));

  if (warp == 0) {
    asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;\n" ::"r"(
                     uint32_t(__cvta_generic_to_shared(&tmem_base_slot))),
                 "r"(kTmemCols)
                 : "memory");
    asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;\n" ::: "memory");
  }
  if (tid == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(mbar_addr) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  asm volatile("tcgen05.fence::before_thread_sync;\n" ::: "memory");
  __syncthreads();
  asm volatile("tcgen05.fence::after_thread_sync;\n" ::: "memory");
  const uint32_t tmem = tmem_base_slot;
  const uint32_t quad = uint32_t(32 * warp) << 16;  // this warp's lane quadrant in a tensor-memory address

  const uint64_t adesc = smem_desc(sa_tile, 128, 256), bdesc = smem_desc(sb_tile, 128, 256);
  for (int64_t step = 0; step < p.steps; ++step) {
    // Tiles into the canonical layout: row r, 16-byte chunk c -> (r / 8) * 256 + c * 128 + (r % 8) * 16.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int id = tid + 128 * i, r = id >> 1, c = id & 1;
      const int off = (r >> 3) * 256 + c * 128 + (r & 7) * 16;
      *reinterpret_cast<uint4*>(sa_tile + off) =
          *reinterpret_cast<const uint4*>(p.a + (m0 + r) * p.RB + step * kStepBytes + c * 16);
      *reinterpret_cast<uint4*>(sb_tile + off) =
          *reinterpret_cast<const uint4*>(p.b + (n0 + r) * p.RB + step * kStepBytes + c * 16);
    }
    // Scale words, replicated into every quadrant: word j of lane l = row (or column) 32 j + l.
    uint32_t wa[4], wb[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      wa[j] = wb[j] = 0;
#pragma unroll
      for (int s = 0; s < SPS; ++s) {
        wa[j] |= uint32_t(p.sa[(m0 + 32 * j + lane) * p.KBp + step * SPS + s]) << (8 * s);
        wb[j] |= uint32_t(p.sb[(n0 + 32 * j + lane) * p.KBp + step * SPS + s]) << (8 * s);
      }
    }
    tmem_st4(tmem + quad + kSfaCol, wa);
    tmem_st4(tmem + quad + kSfbCol, wb);
    asm volatile("tcgen05.wait::st.sync.aligned;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // generic-proxy smem writes -> tensor core
    asm volatile("tcgen05.fence::before_thread_sync;\n" ::: "memory");
    __syncthreads();
    asm volatile("tcgen05.fence::after_thread_sync;\n" ::: "memory");
    if (tid == 0) {
      mma<KIND>(tmem, adesc, bdesc, tmem + kSfaCol, tmem + kSfbCol, step > 0);
      asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];\n" ::"r"(mbar_addr)
                   : "memory");
    }
    // Wait for this step's MMA before the tiles and scale columns are overwritten.
    asm volatile(
        "{\n .reg .pred done;\n wait_%=:\n"
        " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        " @!done bra wait_%=;\n}\n" ::"r"(mbar_addr),
        "r"(uint32_t(step & 1))
        : "memory");
    asm volatile("tcgen05.fence::after_thread_sync;\n" ::: "memory");
  }

  // D: row 32 * warp + lane, 128 FP32 columns, 32 at a time. Then the contract's step 6 on the CUDA cores.
  const float ga = tensor_factor(p.fa, *p.gda), gb = tensor_factor(p.fb, *p.gdb);
  const int64_t m = m0 + 32 * warp + lane;
#pragma unroll 1
  for (int c0 = 0; c0 < kTile; c0 += 32) {
    uint32_t v[32];
    tmem_ld32(tmem + quad + uint32_t(c0), v);
    asm volatile("tcgen05.wait::ld.sync.aligned;\n" ::: "memory");
    if (m < p.M) {
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int64_t n = n0 + c0 + j;
        if (n < p.N) p.c[m * p.N + n] = contract_finish(__fmul_rn(__uint_as_float(v[j]), p.post), ga, gb);
      }
    }
  }
  asm volatile("tcgen05.fence::before_thread_sync;\n" ::: "memory");
  __syncthreads();
  if (warp == 0)
    asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;\n" ::"r"(tmem), "r"(kTmemCols) : "memory");
#else
  (void)p;  // only the sm_100a image holds this kernel; the host never launches it elsewhere
#endif
}

// ---- host side -------------------------------------------------------------------------------------------
int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

bool is_e2m1_family(const ElemFormat& f) { return f.ebits == 2 && f.mbits == 1 && f.bias == 1; }
bool is_uniform_grid(const ElemFormat& f) { return f.ebits == 1 && f.mbits == 2; }  // e1m2, int4: ints 0..7

int native_kind(const DQTensor& a, const DQTensor& b, std::string* why) {
  auto no = [&](const std::string& m) {
    if (why) *why = m;
    return -1;
  };
  if (a.cols != b.cols || a.block != b.block || a.scale_kind != b.scale_kind)
    return no("operands disagree on K, block or scale kind");
  const bool ue8m0 = a.scale_kind == ScaleKind::ue8m0 || a.scale_kind == ScaleKind::ue8m0_ceil;
  if (is_e2m1_family(a.format) && is_e2m1_family(b.format)) {
    if (a.scale_kind == ScaleKind::ue4m3 && a.block == 16) return kMxf4Nvf4Ue4m3;
    if (ue8m0 && a.block == 32) return kMxf4Nvf4Ue8m0;
    return no("kind::mxf4nvf4 takes E2M1 with UE4M3 per 16 or UE8M0 per 32, not " +
              std::string(scale_name(a.scale_kind)) + " per " + std::to_string(a.block));
  }
  if (is_uniform_grid(a.format) && is_uniform_grid(b.format)) {
    if (ue8m0 && a.block == 32) return kMxf8f6f4E2m3;
    return no("kind::mxf8f6f4 takes E2M3 (the E1M2 / INT4 embedding) with UE8M0 per 32 only, not " +
              std::string(scale_name(a.scale_kind)) + " per " + std::to_string(a.block));
  }
  return no(std::string("no SM100 MMA kind takes ") + a.format.name + " x " + b.format.name);
}

// Element bytes: E2M1 codes stay packed (our sign-magnitude code is the E2M1 bit pattern); the uniform grids
// become one E2M3 byte per element holding the integer view. Both padded with zeros to [Rp, RB].
__global__ void native_elements_kernel(ElemFormat f, bool e2m3, const uint8_t* codes, int64_t rows, int64_t K,
                                       uint8_t* out, int64_t Rp, int64_t RB) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= Rp * RB) return;
  const int64_t r = t / RB, j = t - r * RB;
  uint8_t v = 0;
  if (r < rows) {
    if (!e2m3) {
      if (2 * j < K) v = codes[(r * K) / 2 + j];
    } else if (j < K) {
      const int64_t i = r * K + j;
      v = detail::e2m3_int(decode_int(f, (codes[i >> 1] >> ((i & 1) * 4)) & 0xF));
    }
  }
  out[t] = v;
}

__global__ void native_scales_kernel(const uint8_t* s, int64_t rows, int64_t KB, uint8_t* out, int64_t Rp,
                                     int64_t KBp) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= Rp * KBp) return;
  const int64_t r = t / KBp, k = t - r * KBp;
  out[t] = (r < rows && k < KB) ? s[r * KB + k] : 0;
}

}  // namespace

uint8_t e2m3_of_int(int v) {
  if (v < -7 || v > 7) throw std::invalid_argument("E2M3 holds the integers -7..7 exactly, not " + std::to_string(v));
  return detail::e2m3_int(v);
}

bool native_supported(const DQTensor& a, const DQTensor& b, std::string* why) { return native_kind(a, b, why) >= 0; }

bool native_device_ok(std::string* why) {
  std::string reason;
  if (!device_available(&reason)) {
    if (why) *why = reason;
    return false;
  }
  const DeviceInfo d = device_info();
  if (d.cc_major != 10 || d.cc_minor != 0) {
    if (why)
      *why = "the native tcgen05 path needs an sm_100 device (compute capability 10.0); found " + d.name + " (" +
             std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor) + ")";
    return false;
  }
  return true;
}

void gemm_native_sm100(const DQTensor& a, const DQTensor& b, float* d_c, GemmWorkspace& ws, cudaStream_t s) {
  std::string why;
  const int kind = native_kind(a, b, &why);
  if (kind < 0) throw std::invalid_argument("native SM100 path: " + why);
  if (!native_device_ok(&why)) throw Error(why);
  const bool e2m3 = kind == kMxf8f6f4E2m3;
  const int64_t kstep = e2m3 ? 32 : 64;  // K elements per MMA
  const int64_t K = a.cols, Kp = round_up(K, kstep), KB = K / a.block, KBp = Kp / a.block;
  const int64_t Mp = round_up(a.rows, kTile), Np = round_up(b.rows, kTile);
  const int64_t RB = e2m3 ? Kp : Kp / 2;
  ws.na.resize(size_t(Mp * RB));
  ws.nb.resize(size_t(Np * RB));
  ws.nsa.resize(size_t(Mp * KBp));
  ws.nsb.resize(size_t(Np * KBp));
  const int T = 256;
  native_elements_kernel<<<detail::blocks_for(Mp * RB, T), T, 0, s>>>(a.format, e2m3, a.codes.data(), a.rows, K,
                                                                        ws.na.data(), Mp, RB);
  native_elements_kernel<<<detail::blocks_for(Np * RB, T), T, 0, s>>>(b.format, e2m3, b.codes.data(), b.rows, K,
                                                                        ws.nb.data(), Np, RB);
  native_scales_kernel<<<detail::blocks_for(Mp * KBp, T), T, 0, s>>>(a.scale_codes.data(), a.rows, KB,
                                                                       ws.nsa.data(), Mp, KBp);
  native_scales_kernel<<<detail::blocks_for(Np * KBp, T), T, 0, s>>>(b.scale_codes.data(), b.rows, KB,
                                                                       ws.nsb.data(), Np, KBp);
  check_launch("native operand preparation");
  NativeArgs p{};
  p.a = ws.na.data();
  p.b = ws.nb.data();
  p.sa = ws.nsa.data();
  p.sb = ws.nsb.data();
  p.Mp = Mp;
  p.Np = Np;
  p.RB = RB;
  p.KBp = KBp;
  p.steps = Kp / kstep;
  p.M = a.rows;
  p.N = b.rows;
  p.post = e2m3 ? 1.0f : 4.0f;
  p.fa = a.format;
  p.fb = b.format;
  p.gda = a.global_dec.data();
  p.gdb = b.global_dec.data();
  p.c = d_c;
  const dim3 grid(unsigned(Np / kTile), unsigned(Mp / kTile));
  switch (kind) {
    case kMxf4Nvf4Ue4m3: gemm_native_kernel<kMxf4Nvf4Ue4m3><<<grid, 128, 0, s>>>(p); break;
    case kMxf4Nvf4Ue8m0: gemm_native_kernel<kMxf4Nvf4Ue8m0><<<grid, 128, 0, s>>>(p); break;
    default: gemm_native_kernel<kMxf8f6f4E2m3><<<grid, 128, 0, s>>>(p); break;
  }
  check_launch("gemm_native_kernel");
}

std::vector<double> native_tolerance(const QTensor& a, const QTensor& b) {
  if (a.cols != b.cols || a.block != b.block) throw std::invalid_argument("operands disagree on K or block size");
  const int64_t M = a.rows, N = b.rows, K = a.cols, B = a.block, KB = K / B;
  const double gab = std::fabs(double(a.global_dec) * std::ldexp(1.0, -a.format.int_shift()) *
                               double(b.global_dec) * std::ldexp(1.0, -b.format.int_shift()));
  const double u = std::ldexp(1.0, -23);  // allows round-toward-zero adds as well as round-to-nearest
  std::vector<double> tol(size_t(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double S = 0.0;  // sum of |a_j b_j| sa sb over every element product
      for (int64_t k = 0; k < KB; ++k) {
        int64_t p = 0;
        for (int64_t j = k * B; j < (k + 1) * B; ++j)
          p += std::abs(decode_int(a.format, a.codes[m * K + j]) * decode_int(b.format, b.codes[n * K + j]));
        S += double(p) * double(a.scales[m * KB + k]) * double(b.scales[n * KB + k]);
      }
      tol[m * N + n] = double(K + KB + 2) * u * S * gab + double(std::numeric_limits<float>::denorm_min());
    }
  return tol;
}

}  // namespace fp4lab::cuda
