// wgmma (SM90 warpgroup MMA) helpers shared by the fast GEMM's wgmma variant (gemm.cu) and fp4lab_mma_probe
// (tools/mma_probe.cu). Device code for sm_90a only: include it inside #if defined(__CUDA_ARCH_FEAT_SM90_ALL) or
// from a file built only for sm_90a.
#pragma once

#include <cstdint>

namespace fp4lab::cuda::wg {

// Shared-memory matrix descriptor: K-major, 128-byte swizzle (the 16-byte chunk c of row r at r * 128 +
// ((c ^ (r % 8)) << 4)), 8-row atoms 1024 bytes apart, which must start on 1024 bytes; the leading-dimension
// offset is unused for this layout. A K slice of 16 F16 elements further along a row is the address + 32 bytes.
__device__ __forceinline__ uint64_t desc(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

#define FP4LAB_WG_R8(i) \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
// d (the warpgroup's 64 rows x 128 columns, 64 FP32 a thread: element 4 j + e is row 16 w + g + 8 (e >> 1) of warp
// w's lane 4 g + t4, column 8 j + 2 t4 + (e & 1)) = A . B^T over one K slice of 16, or += when acc.
__device__ __forceinline__ void mma_m64n128k16(float (&d)[64], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,"
      "%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,"
      "%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : FP4LAB_WG_R8(0), FP4LAB_WG_R8(8), FP4LAB_WG_R8(16), FP4LAB_WG_R8(24), FP4LAB_WG_R8(32), FP4LAB_WG_R8(40),
        FP4LAB_WG_R8(48), FP4LAB_WG_R8(56)
      : "l"(da), "l"(db), "r"(acc));
}
#undef FP4LAB_WG_R8
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void pin(float (&d)[64]) {  // no access to d moves across a fence or wait
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// Shared-memory stores of the generic proxy (st.shared, cp.async), made visible to wgmma's async-proxy reads.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

}  // namespace fp4lab::cuda::wg
