// The fused quantiser of a tensor and its transpose (fp4lab::cuda::fake_quantize_both): one read of x serves both
// GEMM operands a training step takes of it (X for the forward and X^T for the weight gradient; dY and dY^T for the
// two backward GEMMs), where the two separate kernels of quantize_kernels.cuh read it twice, the transposed one by
// 4-byte column pairs. Each group goes through the same quantize_group as in those kernels, at the same output
// coordinates, so the bits are theirs.
#include "quantize_kernels.cuh"
#include "transpose_bound.cuh"

namespace fp4lab::cuda {
namespace {

// A thread block's tile of x: 64 rows x 128 columns of BF16, 256 threads. Row-wise, each thread quantises two
// groups of 16 (rows t / 8 and t / 8 + 32); transposed, each thread quantises two adjacent columns of 16 rows
// (lane & 3: which 16 rows; warp * 8 + lane / 4: which column pair), the transposed kernel's unit.
constexpr int kBothRows = 64, kBothCols = 128, kBothThreads = 256;
// The tile in shared memory as 32-bit words (column pairs): row r starts at word r * 64 + (r / 16) * 8. The skew of
// 8 words per 16 rows puts the 32 lanes of a transposed read (4 row groups x 8 column pairs) in 32 distinct banks.
constexpr int kBothWords = kBothRows * (kBothCols / 2) + (kBothRows / 16) * 8;
constexpr int kSkewRows = 16;  // rows that share one skew: one transposed group of 16
__device__ __forceinline__ int tile_word(int r, int pair) {
  return r * (kBothCols / 2) + (r / kSkewRows) * 8 + pair;
}
// The block's tile, as an index into the QArgs::bound words (fake_quantize_both_bound_words of them).
__device__ __forceinline__ int64_t tile_index() { return int64_t(blockIdx.y) * gridDim.x + blockIdx.x; }

// The tile's magnitude bound (QArgs::bound, word tile_index(), which thread 0 zeroed before
// the block's barrier) raised to v: one atomic per warp, of the maximum over the lanes here (redux.sync). As FP32
// bits, non-negative values and NaN order as unsigned integers. A lane that arrives apart from the others raises it
// on its own: the result is the same.
__device__ __forceinline__ void raise_bound(float* bound, float v) {
  const unsigned here = __activemask(), m = __reduce_max_sync(here, __float_as_uint(v));
  if ((threadIdx.x & 31) == unsigned(__ffs(here) - 1))
    atomicMax(reinterpret_cast<unsigned*>(bound + tile_index()), m);
}

// Loads group q (0 .. 2 * kBothThreads - 1: row q / 8, columns (q & 7) * 16 ..) of the block's 64 x 128 tile of x
// into the tile in shared memory and into raw: zeros outside x, which change neither a quantised group nor a maximum
// of magnitudes (cols is a multiple of 16: a group is wholly in or out).
__device__ __forceinline__ void load_tile_group(const uint16_t* x, int64_t rows, int64_t cols, int64_t r0, int64_t c0,
                                                int q, uint32_t* tile, RawGroup<uint16_t, 16>& raw) {
  const int lr = q >> 3, lg = q & 7;
  const int64_t row = r0 + lr, col = c0 + lg * 16;
  if (row < rows && col < cols) {
    load_raw(x + row * cols + col, raw);
  } else {
    raw.v[0] = raw.v[1] = make_uint4(0, 0, 0, 0);
  }
  uint4* dst = reinterpret_cast<uint4*>(tile + tile_word(lr, lg * 8));
  dst[0] = raw.v[0];
  dst[1] = raw.v[1];
}

template <int F, int DR, int DT, int RND = -1, int DRAW = -1, int SC = -1>
__global__ void __launch_bounds__(kBothThreads, 4) quantize_both_kernel(const QArgs ar, const QArgs at) {
  constexpr int G = 16;
  __shared__ __align__(16) uint32_t tile[kBothWords];
  const int t = threadIdx.x;
  const int64_t rows = ar.rows, cols = ar.cols, r0 = int64_t(blockIdx.y) * kBothRows,
                c0 = int64_t(blockIdx.x) * kBothCols;
  const uint16_t* x = static_cast<const uint16_t*>(ar.x);
  if (t == 0 && ar.bound) {  // the tile's bounds, raised by its warps after the barrier below
    ar.bound[tile_index()] = 0.0f;
    at.bound[tile_index()] = 0.0f;
  }
  // Both groups loaded first (four 16-byte loads in flight) into the tile; each thread then quantises its row-wise
  // groups from the tile (kept in registers across the loop, they would go to local memory).
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    RawGroup<uint16_t, G> raw;
    load_tile_group(x, rows, cols, r0, c0, t + k * kBothThreads, tile, raw);
  }
  __syncthreads();  // the tile
  const float s_enc_r = tensor_encode<F>(ar);
  // Each thread's bound in shared memory rather than in a register across the quantiser (the kernel has none to
  // spare: one more spills).
  __shared__ float thread_bound[kBothThreads];
  thread_bound[t] = 0.0f;
#pragma unroll 1
  for (int k = 0; k < 2; ++k) {
    const int q = t + k * kBothThreads, lr = q >> 3, lg = q & 7;
    const int64_t row = r0 + lr, col = c0 + lg * G;
    if (row >= rows || col >= cols) continue;
    RawGroup<uint16_t, G> raw;
    const uint4* src = reinterpret_cast<const uint4*>(tile + tile_word(lr, lg * (G / 2)));
    raw.v[0] = src[0];
    raw.v[1] = src[1];
    float y[G];
    widen(raw, y);
    // Fake quantisation only (no codes): quantize_group's LEVELS path, which reads no decode table.
    const float b = quantize_group<F, 16, DR, G, true, false, true, RND, DRAW, SC>(y, row, col, ar, s_enc_r, nullptr);
    thread_bound[t] = fmax_nan(thread_bound[t], b);
  }
  if (ar.bound) raise_bound(ar.bound, thread_bound[t]);  // the caller sets both bounds or neither
  // Transposed: output row j (a column of x), its elements r0 + 16 * rg .. + 15.
  const int lane = t & 31, rg = lane & 3, pair = (t >> 5) * 8 + (lane >> 2);
  const int64_t j = c0 + 2 * pair, gr0 = r0 + rg * G;
  if (j >= cols || gr0 >= rows) return;  // rows is a multiple of 16 too
  const float s_enc_t = tensor_encode<F>(at);
  thread_bound[t] = 0.0f;
  // One column at a time, each read from the tile (holding both columns' values would take 16 more registers). The
  // group's 16 rows share one skew, so its words lie whole rows apart (immediate offsets, not 16 address registers).
  static_assert(G == kSkewRows, "a transposed group's rows share one skew");
  const uint32_t* column = tile + tile_word(rg * G, pair);
#pragma unroll 1
  for (int h = 0; h < 2; ++h) {
    float y[G];
#pragma unroll
    for (int i = 0; i < G; ++i) y[i] = bf16_to_f32(uint16_t(column[i * (kBothCols / 2)] >> (16 * h)));
    const float b = quantize_group<F, 16, DT, G, true, false, true, RND, DRAW, SC>(y, j + h, gr0, at, s_enc_t, nullptr);
    thread_bound[t] = fmax_nan(thread_bound[t], b);
  }
  if (at.bound) raise_bound(at.bound, thread_bound[t]);
}

struct AmaxBothArgs {
  const uint16_t* x;
  int64_t rows, cols;
  float signs_r[16], signs_t[16];
  bool bf16_r, bf16_t;
  unsigned *amax_r, *amax_t;
};

// The quantise kernel's tile and thread layout, rotations and maxima in place of the quantiser.
template <int DR, int DT>
__global__ void __launch_bounds__(kBothThreads) amax_both_kernel(const AmaxBothArgs a) {
  constexpr int G = 16;
  __shared__ __align__(16) uint32_t tile[kBothWords];
  const int t = threadIdx.x;
  const int64_t r0 = int64_t(blockIdx.y) * kBothRows, c0 = int64_t(blockIdx.x) * kBothCols;
  float mr = 0.0f;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    RawGroup<uint16_t, G> raw;
    load_tile_group(a.x, a.rows, a.cols, r0, c0, t + k * kBothThreads, tile, raw);
    float y[G];
    widen(raw, y);
    rotate_group<G, DR>(y, a.signs_r, a.bf16_r);
#pragma unroll
    for (int j = 0; j < G; ++j) mr = fmaxf(mr, fabsf(y[j]));
  }
  __syncthreads();
  const int lane = t & 31, rg = lane & 3, pair = (t >> 5) * 8 + (lane >> 2);
  float mt = 0.0f;
  if (c0 + 2 * pair < a.cols && r0 + rg * G < a.rows) {
    float y0[G], y1[G];
    const uint32_t* column = tile + tile_word(rg * G, pair);  // one skew for the group's 16 rows
#pragma unroll
    for (int i = 0; i < G; ++i) {
      const uint32_t w = column[i * (kBothCols / 2)];
      y0[i] = bf16_to_f32(uint16_t(w & 0xFFFFu));
      y1[i] = bf16_to_f32(uint16_t(w >> 16));
    }
    rotate_group<G, DT>(y0, a.signs_t, a.bf16_t);
    rotate_group<G, DT>(y1, a.signs_t, a.bf16_t);
#pragma unroll
    for (int i = 0; i < G; ++i) mt = fmaxf(mt, fmaxf(fabsf(y0[i]), fabsf(y1[i])));
  }
  block_max_to(a.amax_r, mr);
  __syncthreads();  // block_max_to's shared words, reused
  block_max_to(a.amax_t, mt);
}

// The kernel with the rounding, SR draw and scale kind SC both orientations share fixed at compile time, where they
// share them (philox1 excepted): it then holds that path's code alone. False where it is not launched.
template <int F, int DR, int DT, int SC>
bool launch_fixed(const dim3& grid, const QArgs& ar, const QArgs& at, cudaStream_t s) {
  constexpr int kRtne = int(Rounding::rtne), kSr = int(Rounding::sr);
  if (ar.scale != ScaleKind(SC) || at.scale != ScaleKind(SC) || ar.rounding != at.rounding) return false;
  if (ar.rounding == Rounding::rtne) {
    quantize_both_kernel<F, DR, DT, kRtne, -1, SC><<<grid, kBothThreads, 0, s>>>(ar, at);
    return true;
  }
  if (ar.sr_draw != at.sr_draw) return false;
  if (ar.sr_draw == SrDraw::philox4) {
    quantize_both_kernel<F, DR, DT, kSr, int(SrDraw::philox4), SC><<<grid, kBothThreads, 0, s>>>(ar, at);
    return true;
  }
  if (ar.sr_draw == SrDraw::philox16) {
    quantize_both_kernel<F, DR, DT, kSr, int(SrDraw::philox16), SC><<<grid, kBothThreads, 0, s>>>(ar, at);
    return true;
  }
  return false;
}

template <int F, int DR, int DT>
void launch_both(const QArgs& ar, const QArgs& at, cudaStream_t s) {
  const dim3 grid = detail::both_grid(ar.rows, ar.cols);
  // The presets' one-read operands have kernels of their own: ufp4's (E1M2, fp32 scales, RHT-16 both ways) and
  // nvfp4's (E2M1, ue4m3 scales, RHT-16 on the transposed operand or on neither).
  if constexpr (F == format_index(kE1M2) && DR == 16 && DT == 16) {
    if (launch_fixed<F, DR, DT, int(ScaleKind::fp32)>(grid, ar, at, s)) return;
  } else if constexpr (F == format_index(kE2M1) && DR == 0) {
    if (launch_fixed<F, DR, DT, int(ScaleKind::ue4m3)>(grid, ar, at, s)) return;
  }
  quantize_both_kernel<F, DR, DT><<<grid, kBothThreads, 0, s>>>(ar, at);
}
template <int F>
void launch_both_d(int dr, int dt, const QArgs& ar, const QArgs& at, cudaStream_t s) {
  if (dr == 0 && dt == 0) return launch_both<F, 0, 0>(ar, at, s);
  if (dr == 0 && dt == 16) return launch_both<F, 0, 16>(ar, at, s);
  if (dr == 16 && dt == 0) return launch_both<F, 16, 0>(ar, at, s);
  if (dr == 16 && dt == 16) return launch_both<F, 16, 16>(ar, at, s);
  throw std::logic_error("quantize_both: fused RHT must be 0 or 16");
}

// The mirrored pair's second operand (launch_transpose_bound): one block per tile of the one-read kernel's grid, so
// that its bound words cover the same elements. The tile is staged as BF16 with a row pitch of 130 halves (65 words):
// the transposed reads of a warp, 32 consecutive rows of one column, fall in 32 distinct banks.
constexpr int kPitch = kBothCols + 2;
__global__ void __launch_bounds__(kBothThreads) transpose_bound_kernel(const uint16_t* y, int64_t rows, int64_t cols,
                                                                      uint16_t* yt, float* bound, float* bound_t) {
  __shared__ uint16_t tile[kBothRows * kPitch];
  __shared__ float warp_max[kBothThreads / 32];
  const int t = threadIdx.x;
  const int64_t r0 = int64_t(blockIdx.y) * kBothRows, c0 = int64_t(blockIdx.x) * kBothCols;
  float m = 0.0f;
  for (int i = t; i < kBothRows * kBothCols; i += kBothThreads) {
    const int r = i / kBothCols, c = i % kBothCols;
    uint16_t v = 0;
    if (r0 + r < rows && c0 + c < cols) {
      v = y[(r0 + r) * cols + c0 + c];
      m = fmax_nan(m, fabsf(bf16_to_f32(v)));
    }
    tile[r * kPitch + c] = v;
  }
  __syncthreads();
  for (int i = t; i < kBothRows * kBothCols; i += kBothThreads) {
    const int c = i / kBothRows, r = i % kBothRows;
    if (r0 + r < rows && c0 + c < cols) yt[(c0 + c) * rows + r0 + r] = tile[r * kPitch + c];
  }
  if (!bound) return;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmax_nan(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  if ((t & 31) == 0) warp_max[t >> 5] = m;
  __syncthreads();
  if (t == 0) {
    for (int w = 1; w < kBothThreads / 32; ++w) m = fmax_nan(m, warp_max[w]);
    bound[tile_index()] = m;
    bound_t[tile_index()] = m;
  }
}

template <int DR, int DT>
void launch_amax_both_d(const AmaxBothArgs& a, cudaStream_t s) {
  const dim3 grid = detail::both_grid(a.rows, a.cols);
  amax_both_kernel<DR, DT><<<grid, kBothThreads, 0, s>>>(a);
}

}  // namespace

dim3 detail::both_grid(int64_t rows, int64_t cols) {
  return dim3(unsigned((cols + kBothCols - 1) / kBothCols), unsigned((rows + kBothRows - 1) / kBothRows));
}

bool detail::both_grid_fits(int64_t rows) { return (rows + kBothRows - 1) / kBothRows <= 65535; }

// One bound word per tile of the grid.
int64_t fake_quantize_both_bound_words(int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) throw std::invalid_argument("fake_quantize_both_bound_words(): negative shape");
  return ((cols + kBothCols - 1) / kBothCols) * ((rows + kBothRows - 1) / kBothRows);
}

void detail::launch_transpose_bound(const uint16_t* d_y, int64_t rows, int64_t cols, uint16_t* d_yt, float* d_bound,
                                    float* d_bound_t, cudaStream_t s) {
  if (rows == 0 || cols == 0) return;
  transpose_bound_kernel<<<both_grid(rows, cols), kBothThreads, 0, s>>>(d_y, rows, cols, d_yt, d_bound, d_bound_t);
}

void detail::launch_amax_both(const uint16_t* x, int64_t rows, int64_t cols, int dr, int dt, const float* signs_r,
                              bool bf16_r, const float* signs_t, bool bf16_t, unsigned* amax_r, unsigned* amax_t,
                              cudaStream_t s) {
  AmaxBothArgs a{};
  a.x = x;
  a.rows = rows;
  a.cols = cols;
  for (int j = 0; j < 16; ++j) {
    a.signs_r[j] = signs_r[j];
    a.signs_t[j] = signs_t[j];
  }
  a.bf16_r = dr > 0 && bf16_r;
  a.bf16_t = dt > 0 && bf16_t;
  a.amax_r = amax_r;
  a.amax_t = amax_t;
  if (dr == 0 && dt == 0) return launch_amax_both_d<0, 0>(a, s);
  if (dr == 0 && dt == 16) return launch_amax_both_d<0, 16>(a, s);
  if (dr == 16 && dt == 0) return launch_amax_both_d<16, 0>(a, s);
  if (dr == 16 && dt == 16) return launch_amax_both_d<16, 16>(a, s);
  throw std::logic_error("amax_both: fused RHT must be 0 or 16");
}

void detail::launch_quantize_both(int fmt, int dr, int dt, const QArgs& ar, const QArgs& at, cudaStream_t s) {
  static_assert(sizeof(kAllFormats) / sizeof(kAllFormats[0]) == 4, "one case per format");
  switch (fmt) {
    case 0: return launch_both_d<0>(dr, dt, ar, at, s);
    case 1: return launch_both_d<1>(dr, dt, ar, at, s);
    case 2: return launch_both_d<2>(dr, dt, ar, at, s);
    case 3: return launch_both_d<3>(dr, dt, ar, at, s);
  }
  throw std::logic_error("format index out of range");
}

}  // namespace fp4lab::cuda
