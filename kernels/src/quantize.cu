// Quantiser host entries over the kernels of quantize_kernels.cuh (plain, fused RHT + quantise; instantiated in the
// generated quantize_part files), the unfused RHT pass, amax passes, and the device<->golden layout helpers. All
// arithmetic is the golden model's (rht_block, round_to_bf16, nvfp4_global_encode, block_scale, scale_element,
// round_rtne, round_sr, random_bits), called from device code.
#include "quantize_kernels.cuh"
#include "transpose_bound.cuh"

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

// Every FP32 bit pattern through both roundings, and the fake quantiser's level (rtne_level_fast) against the
// decode of the golden code; counts disagreements and keeps the smallest failing pattern.
template <int F>
__global__ void rtne_selftest_kernel(unsigned long long* count, unsigned* first, unsigned long long* evaluated) {
  constexpr ElemFormat f = kAllFormats[F];
  const uint64_t t = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned long long bad = 0;
  for (uint64_t i = t * 64; i < t * 64 + 64; ++i) {
    const float v = __uint_as_float(uint32_t(i));
    const uint8_t code = round_rtne(f, v);
    // The code, and the fake quantiser's level: decode(format, code), bit for bit (sign of zero included).
    if (code != detail::round_rtne_fast<F>(v) ||
        __float_as_uint(decode(f, code)) != __float_as_uint(detail::rtne_level_fast<F>(v))) {
      ++bad;
      atomicMin(first, uint32_t(i));
    }
  }
  if (bad) atomicAdd(count, bad);
  if ((threadIdx.x & 31) == 0) atomicAdd(evaluated, 64ull * 32);  // 32 lanes x 64 patterns
}

// Every FP32 bit pattern x through the quantiser's fp32-scale step (scale_fp32_by_reciprocal, the reciprocal
// computed here on the device as the kernels compute it) and through scale_element's division, at one scale.
__global__ void fp32_step_selftest_kernel(float dec, unsigned long long* count, unsigned* first,
                                          unsigned long long* evaluated) {
  const uint64_t t = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  BlockScale b;
  b.dec = dec;
  const float recip = fp32_step_reciprocal(b);
  unsigned long long bad = 0;
  for (uint64_t i = t * 64; i < t * 64 + 64; ++i) {
    const float x = __uint_as_float(uint32_t(i));
    if (__float_as_uint(scale_fp32_by_reciprocal(x, b, recip)) !=
        __float_as_uint(scale_element(ScaleKind::fp32, x, b))) {
      ++bad;
      atomicMin(first, uint32_t(i));
    }
  }
  if (bad) atomicAdd(count, bad);
  if ((threadIdx.x & 31) == 0) atomicAdd(evaluated, 64ull * 32);
}

// Every FP32 bit pattern through bf16x2_rn (in both halves) and golden f32_to_bf16; NaN inputs, for which the
// golden function is not defined, are skipped (and counted as run).
__global__ void bf16_pack_selftest_kernel(unsigned long long* count, unsigned* first, unsigned long long* evaluated) {
  const uint64_t t = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned long long bad = 0;
  for (uint64_t i = t * 64; i < t * 64 + 64; i += 2) {
    const float lo = __uint_as_float(uint32_t(i)), hi = __uint_as_float(uint32_t(i + 1));
    const uint32_t p = detail::bf16x2_rn(lo, hi);
    const bool bad_lo = !isnan(lo) && uint16_t(p & 0xFFFFu) != f32_to_bf16(lo);
    const bool bad_hi = !isnan(hi) && uint16_t(p >> 16) != f32_to_bf16(hi);
    if (bad_lo || bad_hi) {
      bad += unsigned(bad_lo) + unsigned(bad_hi);
      atomicMin(first, uint32_t(bad_lo ? i : i + 1));
    }
  }
  if (bad) atomicAdd(count, bad);
  if ((threadIdx.x & 31) == 0) atomicAdd(evaluated, 64ull * 32);
}

// Every FP32 bit pattern through golden round_sr, round_sr_fast and the fake quantiser's sr_level_fast (against the
// decode of the golden code) at four random words: 0, all ones, and the two either side of the fast path's
// threshold ceil(t) (all three are step functions of r >> 8, so agreeing at the two words next to the step means the
// same step, and at 0 / all ones the same level below and above).
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
    for (int k = 0; k < 4; ++k) {
      const uint8_t code = round_sr(f, v, rs[k]);
      ok &= code == detail::round_sr_fast<F>(v, rs[k]) &&
            __float_as_uint(decode(f, code)) == __float_as_uint(detail::sr_level_fast<F>(v, rs[k]));
    }
    if (!ok) {
      ++bad;
      atomicMin(first, uint32_t(i));
    }
  }
  if (bad) atomicAdd(count, bad);
  if ((threadIdx.x & 31) == 0) atomicAdd(evaluated, 64ull * 32);
}

// ---- dispatch -----------------------------------------------------------------------------------------------
template <class T, bool TR>
void launch_quantize_any(int fmt, int block, int d, const QArgs& a, cudaStream_t s) {
  switch (fmt) {
    case 0: return detail::launch_quantize_fmt<T, 0, TR>(block, d, a, s);
    case 1: return detail::launch_quantize_fmt<T, 1, TR>(block, d, a, s);
    case 2: return detail::launch_quantize_fmt<T, 2, TR>(block, d, a, s);
    case 3: return detail::launch_quantize_fmt<T, 3, TR>(block, d, a, s);
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

// The flag a pass's kernels report non-finite inputs to: with check_finite the workspace's, cleared first; without
// it the caller's (null: not checked).
int* nonfinite_flag_of(QuantWorkspace& ws, cudaStream_t s, bool check_finite, int* d_nonfinite_flag) {
  if (!check_finite) return d_nonfinite_flag;
  ws.nonfinite.resize(1);
  check(cudaMemsetAsync(ws.nonfinite.data(), 0, sizeof(int), s), "cudaMemsetAsync");
  return ws.nonfinite.data();
}

// check_finite's end of a pass: waits for the stream and throws the fault the kernels flagged.
void raise_nonfinite(QuantWorkspace& ws, cudaStream_t s) {
  int bad = 0;
  check(cudaMemcpyAsync(&bad, ws.nonfinite.data(), sizeof(int), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(s), "quantize");
  if (bad & 1) throw std::invalid_argument("input tensor holds NaN or Inf (4-bit grids have no such codes)");
  if (bad & 2) throw std::invalid_argument("RHT overflows FP32 (a rotated value is Inf or NaN; 4-bit grids have no such codes)");
  if (bad & 4) throw std::invalid_argument("a row index is negative");
}

// The launch arguments of a quantise pass over x (T: float or BF16 bits), rotated in registers by RHT-d (d = 0: x
// is already rotated or the configuration has no RHT), with the amax pass the scale kind needs enqueued first.
// rows x cols is the output's shape; tr: x is [cols, rows] and the output is its transpose's quantisation;
// nonfinite: nonfinite_flag_of's.
template <class T>
QArgs pass_args(const T* x, int d, int64_t rows, int64_t cols, const QuantConfig& cfg, DQTensor* out,
                uint16_t* deq, QuantWorkspace& ws, cudaStream_t s, int* nonfinite, bool tr, const uint64_t* d_seed,
                const int64_t* d_row_index, const float* amax, bool amax_in_ws = false) {
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
  a.sr_draw = cfg.sr_draw;
  a.rht_bf16 = d > 0 && cfg.rht_bf16;
  a.seed = cfg.seed;
  a.seed_dev = d_seed;
  a.stream = cfg.stream;
  a.row_index = d_row_index;
  a.nonfinite = nonfinite;
  copy_signs(a.signs, 32, cfg);

  // A given amax stands in for the tensor's (the pass still runs for 16x16 tiles, whose blocks need it).
  const bool given = amax && cfg.scale == ScaleKind::ue4m3;
  if (amax_in_ws && cfg.scale == ScaleKind::ue4m3 && !cfg.tile2d) {
    a.tensor_amax = ws.tensor_amax.data();  // ws.tensor_amax already holds it (fake_quantize_both's one read)
  } else if ((cfg.scale == ScaleKind::ue4m3 && !given) || cfg.tile2d) {
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
  return a;
}

// The quantise pass over x: pass_args, the launch, and check_finite's fault.
template <class T>
void quantize_pass(const T* x, int d, int fmt, int64_t rows, int64_t cols, const QuantConfig& cfg, DQTensor* out,
                   uint16_t* deq, QuantWorkspace& ws, cudaStream_t s, bool check_finite, int* d_nonfinite_flag,
                   bool tr, const uint64_t* d_seed, const int64_t* d_row_index = nullptr,
                   const float* amax = nullptr) {
  int* flag = nonfinite_flag_of(ws, s, check_finite, d_nonfinite_flag);
  const QArgs a = pass_args(x, d, rows, cols, cfg, out, deq, ws, s, flag, tr, d_seed, d_row_index, amax);
  if (tr)
    launch_quantize_any<T, true>(fmt, cfg.block, d, a, s);
  else
    launch_quantize_any<T, false>(fmt, cfg.block, d, a, s);
  check_launch("quantize_kernel");
  if (check_finite) raise_nonfinite(ws, s);
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

bool fake_quantize_both_fused(bool x_bf16, const QuantConfig& cfg, const QuantConfig& cfg_t, RhtPath path,
                              int64_t rows) {
  const auto fits = [](const QuantConfig& c) { return c.block == 16 && !c.tile2d && (c.rht == 0 || c.rht == 16); };
  return x_bf16 && path == RhtPath::fused && fits(cfg) && fits(cfg_t) &&
         detail::format_index(cfg.format) == detail::format_index(cfg_t.format) && detail::both_grid_fits(rows);
}

bool fake_quantize_both_mirrored(bool x_bf16, const QuantConfig& cfg, const QuantConfig& cfg_t, int64_t rows) {
  // 16 x 16 tiles scale an element by its tile's amax and the tensor's, the same in both orientations; RTNE reads
  // neither the SR key nor its draw, and without RHT nothing else depends on the orientation.
  QuantConfig same = cfg_t;
  same.seed = cfg.seed;
  same.stream = cfg.stream;
  same.sr_draw = cfg.sr_draw;
  return x_bf16 && cfg.tile2d && cfg.rht == 0 && cfg.rounding == Rounding::rtne && same == cfg &&
         detail::both_grid_fits(rows);
}

bool fake_quantize_both_bounded(bool x_bf16, const QuantConfig& cfg, const QuantConfig& cfg_t, RhtPath path,
                                int64_t rows) {
  return fake_quantize_both_fused(x_bf16, cfg, cfg_t, path, rows) ||
         fake_quantize_both_mirrored(x_bf16, cfg, cfg_t, rows);
}

void fake_quantize_both(const void* d_x, bool x_bf16, int64_t rows, int64_t cols, const QuantConfig& cfg,
                        uint16_t* d_out, const QuantConfig& cfg_t, uint16_t* d_out_t, QuantWorkspace& ws,
                        QuantWorkspace& ws_t, cudaStream_t s, RhtPath path, bool check_finite, int* d_nonfinite_flag,
                        const uint64_t* d_seed, float* d_bound, float* d_bound_t) {
  if (!d_out || !d_out_t) throw std::invalid_argument("fake_quantize_both(): no output");
  if (!d_bound != !d_bound_t) throw std::invalid_argument("fake_quantize_both(): give both bounds or neither");
  if (fake_quantize_both_mirrored(x_bf16, cfg, cfg_t, rows)) {
    validate(cfg, rows, cols);
    validate(cfg_t, cols, rows);  // before the work, which the second pass it stands for would check
    fake_quantize(d_x, x_bf16, false, rows, cols, cfg, d_out, nullptr, ws, s, path, check_finite, d_nonfinite_flag,
                  d_seed);
    detail::launch_transpose_bound(d_out, rows, cols, d_out_t, d_bound, d_bound_t, s);
    check_launch("transpose_bound_kernel");
    return;
  }
  if (!fake_quantize_both_fused(x_bf16, cfg, cfg_t, path, rows)) {
    fake_quantize(d_x, x_bf16, false, rows, cols, cfg, d_out, nullptr, ws, s, path, check_finite, d_nonfinite_flag,
                  d_seed);
    fake_quantize(d_x, x_bf16, true, rows, cols, cfg_t, d_out_t, nullptr, ws_t, s, path, check_finite,
                  d_nonfinite_flag, d_seed);
    if (d_bound) {  // all ones: NaN, no bound (the output checks scan)
      const size_t bytes = size_t(fake_quantize_both_bound_words(rows, cols)) * sizeof(float);
      check(cudaMemsetAsync(d_bound, 0xFF, bytes, s), "cudaMemsetAsync");
      check(cudaMemsetAsync(d_bound_t, 0xFF, bytes, s), "cudaMemsetAsync");
    }
    return;
  }
  validate(cfg, rows, cols);
  validate(cfg_t, cols, rows);
  const auto* x = static_cast<const uint16_t*>(d_x);
  int* flag = nonfinite_flag_of(ws, s, check_finite, d_nonfinite_flag);
  // Both per-tensor (ue4m3) scales: both amaxes from one read as well.
  const bool both_amax = cfg.scale == ScaleKind::ue4m3 && cfg_t.scale == ScaleKind::ue4m3;
  if (both_amax) {
    ws.tensor_amax.resize(1);
    ws_t.tensor_amax.resize(1);
    check(cudaMemsetAsync(ws.tensor_amax.data(), 0, sizeof(unsigned), s), "cudaMemsetAsync");
    check(cudaMemsetAsync(ws_t.tensor_amax.data(), 0, sizeof(unsigned), s), "cudaMemsetAsync");
    float sr[16], st[16];
    copy_signs(sr, 16, cfg);
    copy_signs(st, 16, cfg_t);
    detail::launch_amax_both(x, rows, cols, cfg.rht, cfg_t.rht, sr, cfg.rht_bf16, st, cfg_t.rht_bf16,
                             ws.tensor_amax.data(), ws_t.tensor_amax.data(), s);
    check_launch("amax_both_kernel");
  }
  QArgs ar = pass_args(x, cfg.rht, rows, cols, cfg, nullptr, d_out, ws, s, flag, false, d_seed, nullptr, nullptr,
                       both_amax);
  QArgs at = pass_args(x, cfg_t.rht, cols, rows, cfg_t, nullptr, d_out_t, ws_t, s, flag, true, d_seed, nullptr,
                       nullptr, both_amax);
  ar.bound = d_bound;
  at.bound = d_bound_t;
  detail::launch_quantize_both(detail::format_index(cfg.format), cfg.rht, cfg_t.rht, ar, at, s);
  check_launch("quantize_both_kernel");
  if (check_finite) raise_nonfinite(ws, s);
}

namespace {
// A 32-bit word's non-finite test: its one FP32 value, or its two BF16 values (exponent field all ones).
__device__ __forceinline__ bool word_nonfinite(uint32_t w, bool bf16) {
  return bf16 ? ((w & 0x7F80u) == 0x7F80u) || ((w & 0x7F800000u) == 0x7F800000u) : (w & 0x7F800000u) == 0x7F800000u;
}

// Grid-stride over 16-byte words (torch's allocations are 256-byte aligned; a misaligned start takes the scalar
// loop), then the elements past the last whole word.
__device__ __forceinline__ void scan_nonfinite(const void* y, bool bf16, int64_t n, int* flag, int bit, bool vec) {
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

__global__ void __launch_bounds__(kThreads) flag_nonfinite_kernel(const void* y, bool bf16, int64_t n, int* flag,
                                                                   int bit, bool vec) {
  scan_nonfinite(y, bf16, n, flag, bit, vec);
}

// Each block first reduces both operands' bounds (a few thousand words, from L2) and leaves the scan out where
// they prove the product finite; the decision is the same in every block.
__global__ void __launch_bounds__(kThreads) flag_nonfinite_product_kernel(const void* y, bool bf16, int64_t n,
                                                                           int* flag, int bit, bool vec,
                                                                           const float* ba, int64_t na,
                                                                           const float* bb, int64_t nb, double k) {
  __shared__ float warp_max[2][kThreads / 32];
  __shared__ bool proven;
  float ma = 0.0f, mb = 0.0f;
  for (int64_t i = threadIdx.x; i < na; i += kThreads) ma = fmax_nan(ma, __ldg(ba + i));
  for (int64_t i = threadIdx.x; i < nb; i += kThreads) mb = fmax_nan(mb, __ldg(bb + i));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    ma = fmax_nan(ma, __shfl_xor_sync(0xFFFFFFFFu, ma, o));
    mb = fmax_nan(mb, __shfl_xor_sync(0xFFFFFFFFu, mb, o));
  }
  if ((threadIdx.x & 31) == 0) {
    warp_max[0][threadIdx.x >> 5] = ma;
    warp_max[1][threadIdx.x >> 5] = mb;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) {
      ma = fmax_nan(ma, warp_max[0][w]);
      mb = fmax_nan(mb, warp_max[1][w]);
    }
    // |a| <= (1 + 2^-8) max a (the bounds precede the operands' BF16 rounding), likewise b, so
    // |c| <= (1 + 2^-24)^k (1 + 2^-8)^2 k max a max b < 2.8 * 2^125 < 2^127 (FP32 products and sums, k <= 2^24):
    // finite in FP32 and in BF16. A GEMM that reduces split-K partial sums in BF16 (cuBLAS may, by torch's
    // default) rounds each up by at most 2^-8: the margin below 2^127 holds about 48 such roundings. The test's product
    // is FP64 (no overflow); a NaN bound fails it.
    proven = k <= 0x1p24 && k * double(ma) * double(mb) <= 0x1p125;
  }
  __syncthreads();
  if (proven) return;
  scan_nonfinite(y, bf16, n, flag, bit, vec);
}
}  // namespace

namespace {
// The scans' launch: 16-byte words where d_y is aligned to them, and the thread blocks for them (at most max_blocks).
struct ScanLaunch {
  bool vec;
  unsigned blocks;
};
ScanLaunch scan_launch(const void* d_y, bool bf16, int64_t n, unsigned max_blocks) {
  const bool vec = (reinterpret_cast<uintptr_t>(d_y) & 15u) == 0;
  const int64_t units = vec ? std::max<int64_t>(n * (bf16 ? 2 : 4) / 16, 1) : n;
  return {vec, std::min(detail::blocks_for(units, kThreads), max_blocks)};
}
}  // namespace

void flag_nonfinite(const void* d_y, bool bf16, int64_t n, int* d_flag, int bit, cudaStream_t s) {
  if (n < 0) throw std::invalid_argument("flag_nonfinite(): negative element count");
  if (!d_flag) throw std::invalid_argument("flag_nonfinite(): no flag");
  if (n == 0) return;
  // At most 1024 blocks (several per SM); the threads stride over the rest.
  const ScanLaunch l = scan_launch(d_y, bf16, n, 1024u);
  flag_nonfinite_kernel<<<l.blocks, kThreads, 0, s>>>(d_y, bf16, n, d_flag, bit, l.vec);
  check_launch("flag_nonfinite_kernel");
}

void flag_nonfinite_product(const void* d_y, bool bf16, int64_t n, int* d_flag, int bit, const float* d_bound_a,
                            int64_t na, const float* d_bound_b, int64_t nb, int64_t k, cudaStream_t s) {
  if (n < 0 || na < 0 || nb < 0 || k < 0) throw std::invalid_argument("flag_nonfinite_product(): negative size");
  if (!d_flag) throw std::invalid_argument("flag_nonfinite_product(): no flag");
  if ((na && !d_bound_a) || (nb && !d_bound_b)) throw std::invalid_argument("flag_nonfinite_product(): no bound");
  if (n == 0) return;
  if (na == 0 || nb == 0) return flag_nonfinite(d_y, bf16, n, d_flag, bit, s);  // nothing to prove it with
  // Fewer blocks than the plain scan: each reads the bounds first (the scan itself is the rare path).
  const ScanLaunch l = scan_launch(d_y, bf16, n, 256u);
  flag_nonfinite_product_kernel<<<l.blocks, kThreads, 0, s>>>(d_y, bf16, n, d_flag, bit, l.vec, d_bound_a, na,
                                                               d_bound_b, nb, double(k));
  check_launch("flag_nonfinite_product_kernel");
}

// The exhaustive self-tests: counters zeroed, the smallest failing input at all ones, the kernel launched over all
// 2^32 inputs (64 a thread) by launch(grid, count, first, evaluated), then the counts read back.
template <class Launch>
uint64_t run_selftest(const char* name, Launch launch, uint32_t* first_bad, uint64_t* evaluated) {
  Buffer<unsigned long long> count(1), seen(1);
  count.fill_bytes(0);
  seen.fill_bytes(0);
  Buffer<unsigned> first(1);
  first.fill_bytes(0xFF);
  launch(unsigned((uint64_t(1) << 32) / 64 / kThreads), count.data(), first.data(), seen.data());
  check_launch(name, true);
  if (first_bad) *first_bad = first.to_host()[0];
  if (evaluated) *evaluated = seen.to_host()[0];
  return count.to_host()[0];
}

uint64_t count_rtne_fast_mismatches(const ElemFormat& f, uint32_t* first_bad, uint64_t* evaluated) {
  const int fmt = detail::format_index(f);
  return run_selftest("rtne_selftest_kernel", [fmt](unsigned grid, auto* count, auto* first, auto* seen) {
    switch (fmt) {
      case 0: rtne_selftest_kernel<0><<<grid, kThreads>>>(count, first, seen); break;
      case 1: rtne_selftest_kernel<1><<<grid, kThreads>>>(count, first, seen); break;
      case 2: rtne_selftest_kernel<2><<<grid, kThreads>>>(count, first, seen); break;
      default: rtne_selftest_kernel<3><<<grid, kThreads>>>(count, first, seen); break;
    }
  }, first_bad, evaluated);
}

uint64_t count_fp32_step_mismatches(float dec, uint32_t* first_bad, uint64_t* evaluated) {
  return run_selftest("fp32_step_selftest_kernel", [dec](unsigned grid, auto* count, auto* first, auto* seen) {
    fp32_step_selftest_kernel<<<grid, kThreads>>>(dec, count, first, seen);
  }, first_bad, evaluated);
}

uint64_t count_bf16_pack_mismatches(uint32_t* first_bad, uint64_t* evaluated) {
  return run_selftest("bf16_pack_selftest_kernel", [](unsigned grid, auto* count, auto* first, auto* seen) {
    bf16_pack_selftest_kernel<<<grid, kThreads>>>(count, first, seen);
  }, first_bad, evaluated);
}

uint64_t count_sr_fast_mismatches(const ElemFormat& f, uint32_t* first_bad, uint64_t* evaluated) {
  const int fmt = detail::format_index(f);
  return run_selftest("sr_selftest_kernel", [fmt](unsigned grid, auto* count, auto* first, auto* seen) {
    switch (fmt) {
      case 0: sr_selftest_kernel<0><<<grid, kThreads>>>(count, first, seen); break;
      case 1: sr_selftest_kernel<1><<<grid, kThreads>>>(count, first, seen); break;
      case 2: sr_selftest_kernel<2><<<grid, kThreads>>>(count, first, seen); break;
      default: sr_selftest_kernel<3><<<grid, kThreads>>>(count, first, seen); break;
    }
  }, first_bad, evaluated);
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
  for (int j = 0; j < 4; ++j) w[j] = detail::bf16x2_rn(v[2 * j], v[2 * j + 1]);
  *reinterpret_cast<uint4*>(out) = make_uint4(w[0], w[1], w[2], w[3]);
}

// One thread: the eight elements of one packed word (all in one block, as cols is a multiple of 16).
template <class Out>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const DequantArgs a, Out* out) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const float* table = shared_decode_table(a.value);
  if (t >= a.words) return;
  const int64_t e0 = t * 8, row = e0 / a.cols, col = e0 - row * a.cols;
  const float s = a.scales[row * a.kb + col / a.block], g = *a.global_dec;
  const uint32_t w = a.codes[t];
  float v[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = dequant_value(table[(w >> (4 * j)) & 15u], s, g);
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
