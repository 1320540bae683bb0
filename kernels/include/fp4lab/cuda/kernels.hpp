// fp4lab CUDA kernels: the fourth implementation of the datapath contract (docs/datapath.md).
//
// Every function here computes exactly what the golden model computes (fp4lab::quantize, fp4lab::gemm /
// reference::gemm_contract), bit for bit, using the golden headers' own FP4LAB_HD functions in device code.
// The one exception is the SM100 native path (gemm_native_sm100), whose tensor cores accumulate in an order
// PTX leaves unspecified; it is checked against the golden model with the bound native_tolerance() states.
//
// Host API only: callers compile as plain C++ and link fp4lab_cuda.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "fp4lab/quantize.hpp"

namespace fp4lab::cuda {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Throws Error("CUDA error in <what>: <cudaGetErrorString>") unless e is cudaSuccess.
void check(cudaError_t e, const char* what);
// The last launch error, then (when sync) the error of the work it queued.
void check_launch(const char* what, bool sync = false);

struct DeviceInfo {
  int id = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sms = 0;
  size_t l2_bytes = 0, mem_bytes = 0;
};
// False (and why) when the CUDA runtime finds no usable device; never throws.
bool device_available(std::string* why = nullptr);
DeviceInfo device_info();

// Device memory owned like a std::vector (cudaMalloc / cudaFree), move-only.
template <class T>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t n) { resize(n); }
  ~Buffer() { release(); }
  Buffer(Buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // Reallocates only to grow; contents are not kept.
  void resize(size_t n) {
    if (n <= cap_) {
      n_ = n;
      return;
    }
    release();
    void* p = nullptr;
    check(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc");
    p_ = static_cast<T*>(p);
    n_ = cap_ = n;
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  void upload(const T* h, size_t n) {
    resize(n);
    if (n) check(cudaMemcpy(p_, h, n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    // From pageable memory cudaMemcpy may return before its DMA has landed, and a non-blocking stream does not
    // wait for the legacy stream that carries it: wait here, so that any stream may read the buffer next.
    if (n) check(cudaStreamSynchronize(cudaStreamLegacy), "cudaMemcpy H2D");
  }
  void upload(const std::vector<T>& v) { upload(v.data(), v.size()); }
  std::vector<T> to_host() const {
    std::vector<T> v(n_);
    if (n_) check(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return v;
  }
  // From now on a growth leaves the old allocation in place instead of freeing it: a CUDA graph captured with
  // this buffer addresses it at every replay (and cudaFree may not run while a stream is being captured).
  void keep() { keep_ = true; }
  // Every byte set to `byte` (tests poison outputs with 0xFF before a run).
  void fill_bytes(int byte) {
    if (n_) check(cudaMemset(p_, byte, n_ * sizeof(T)), "cudaMemset");
    if (n_) check(cudaStreamSynchronize(cudaStreamLegacy), "cudaMemset");  // as upload: before any stream reads
  }

 private:
  void release() {
    if (p_ && !keep_) cudaFree(p_);
    p_ = nullptr;
    n_ = cap_ = 0;
  }
  T* p_ = nullptr;
  size_t n_ = 0, cap_ = 0;
  bool keep_ = false;
};

// A quantised operand [rows, cols] on the GPU, blocks along cols (the GEMM's K).
// codes: two 4-bit codes per byte, element 2i in the low nibble (the NVFP4 / OCP storage order).
// Its settings and shape are the host operand's (OperandMeta), so to_host and upload copy them as one value.
struct DQTensor : OperandMeta {
  Buffer<uint8_t> codes;        // rows * cols / 2
  Buffer<float> scales;         // rows * cols / block decoded block scales
  Buffer<uint8_t> scale_codes;  // same count: E4M3 / E8M0 bit patterns; empty for fp32
  Buffer<float> global_dec;     // one value: S_dec for ue4m3, else 1
};

// Scratch memory of the quantiser (amax buffers, the rotated copy of the unfused path); reused across calls.
struct QuantWorkspace {
  Buffer<float> block_amax;
  Buffer<unsigned> tensor_amax;
  Buffer<int> nonfinite;
  Buffer<float> rotated;
  Buffer<float> transposed;  // X^T as FP32, for the transposed quantiser's unfused and RHT-64/128 paths
  void keep() { block_amax.keep(), tensor_amax.keep(), nonfinite.keep(), rotated.keep(), transposed.keep(); }
};
// Each workspace's keep() names its buffers one by one. These count them (every Buffer<T> has one size): a buffer
// added to a workspace stops the build here until the count, and keep() beside it, are brought up to date.
static_assert(sizeof(QuantWorkspace) == 5 * sizeof(Buffer<float>), "QuantWorkspace::keep() lists every buffer");

// Fused: one pass rotates (RHT-16/32), scales and rounds in registers. Unfused: an RHT pass writes the rotated
// FP32 tensor, then the plain quantiser reads it back (what the paper compares against). RHT sizes 64 and 128
// always take the unfused path. Both give the same bits.
enum class RhtPath { fused, unfused };

// Quantises x (device, FP32 [rows, cols], row-major) exactly as fp4lab::quantize does. Throws
// std::invalid_argument on a configuration fp4lab::validate rejects; with check_finite, synchronises and throws
// std::invalid_argument when x holds NaN or Inf (the golden model's rule). Without it, a non-null
// d_nonfinite_flag (device int) is set to 1 when x holds NaN or Inf and never cleared, with no synchronisation:
// a training step checks it once instead of stalling the stream at every operand; with neither the caller vouches.
// A non-null d_seed (device uint64) is read on the device in place of cfg.seed, the stochastic-rounding key: a
// training step captured in a CUDA graph replays the same launches, and each replay's key is written there first.
void quantize(const float* d_x, int64_t rows, int64_t cols, const QuantConfig& cfg, DQTensor& out,
              QuantWorkspace& ws, cudaStream_t stream = nullptr, RhtPath path = RhtPath::fused,
              bool check_finite = true, int* d_nonfinite_flag = nullptr,
              const uint64_t* d_seed = nullptr);
// The same for a BF16 tensor (d_x holds the bit patterns): each value widens exactly to FP32 as it is loaded, so
// the result is that of quantize() on the FP32 copy, without making the copy.
void quantize_bf16(const uint16_t* d_x, int64_t rows, int64_t cols, const QuantConfig& cfg, DQTensor& out,
                   QuantWorkspace& ws, cudaStream_t stream = nullptr, RhtPath path = RhtPath::fused,
                   bool check_finite = true, int* d_nonfinite_flag = nullptr, const uint64_t* d_seed = nullptr);
// The quantisation of X^T for x [rows, cols] row-major, read in place: the result ([cols, rows], blocks along x's
// columns) equals fp4lab::quantize(transpose(x), cols, rows, cfg) bit for bit (the SR counter, the RHT blocks and
// the 16x16 tiles are those of X^T). The operands bwd_dx and bwd_dw need (W^T, dY^T, X^T) without a transposed
// copy. Fused RHT-16/32 read x by columns too; RHT-64/128 and the unfused path materialise X^T in ws.transposed
// first. Arguments otherwise as quantize().
void quantize_transposed(const float* d_x, int64_t rows, int64_t cols, const QuantConfig& cfg, DQTensor& out,
                         QuantWorkspace& ws, cudaStream_t stream = nullptr, RhtPath path = RhtPath::fused,
                         bool check_finite = true, int* d_nonfinite_flag = nullptr,
                         const uint64_t* d_seed = nullptr);
void quantize_transposed_bf16(const uint16_t* d_x, int64_t rows, int64_t cols, const QuantConfig& cfg,
                              DQTensor& out, QuantWorkspace& ws, cudaStream_t stream = nullptr,
                              RhtPath path = RhtPath::fused, bool check_finite = true,
                              int* d_nonfinite_flag = nullptr, const uint64_t* d_seed = nullptr);
// Rows of a larger tensor, as fp4lab::quantize_rows quantises them within it: output row r (of x, or of x^T when
// transposed; FP32, or BF16 bits when x_bf16) is row d_row_index[r] of the whole (a device array of rows int64
// indices; null: row r), so that stochastic rounding draws the whole's random words at its element indices; `amax`
// (a host value; null: x's own, taken on the device) is the whole's tensor amax, which ue4m3's global scale takes
// (other scales ignore it). A data-parallel rank quantises its own rows of the global batch so, as one process does.
// With d_row_index, 16x16 tiles are refused (they span rows); a negative index throws with check_finite, and sets
// bit 2 (value 4) of d_nonfinite_flag without it. Arguments otherwise as quantize().
void quantize_rows(const void* d_x, bool x_bf16, bool transposed, int64_t rows, int64_t cols,
                   const QuantConfig& cfg, const int64_t* d_row_index, const float* amax, DQTensor& out,
                   QuantWorkspace& ws, cudaStream_t stream = nullptr, RhtPath path = RhtPath::fused,
                   bool check_finite = true, int* d_nonfinite_flag = nullptr, const uint64_t* d_seed = nullptr);
// Fake quantisation, the operands of the training layer's "fast" GEMMs: d_out [rows, cols] (or [cols, rows] when
// transposed) receives, as BF16 bit patterns, exactly what dequantize_bf16() gives for the operand quantize()
// (quantize_transposed()) makes of d_x (FP32, or BF16 bits when x_bf16), in the same pass: the input is read once
// and only BF16 is written. q, when not null, receives the quantised operand too. Arguments otherwise as quantize().
void fake_quantize(const void* d_x, bool x_bf16, bool transposed, int64_t rows, int64_t cols,
                   const QuantConfig& cfg, uint16_t* d_out, DQTensor* q, QuantWorkspace& ws,
                   cudaStream_t stream = nullptr, RhtPath path = RhtPath::fused, bool check_finite = true,
                   int* d_nonfinite_flag = nullptr, const uint64_t* d_seed = nullptr);
// Fake quantisation of a tensor in both orientations, the two operands a training step takes of one tensor (X for
// the forward GEMM and X^T for the weight gradient; dY and dY^T for the two backward GEMMs): d_out [rows, cols]
// receives exactly what fake_quantize(d_x, x_bf16, false, rows, cols, cfg, d_out) writes and d_out_t [cols, rows]
// what fake_quantize(d_x, x_bf16, true, rows, cols, cfg_t, d_out_t) writes. Where fake_quantize_both_fused() says
// so, one kernel reads x once for both; otherwise the two calls run. ws serves cfg's pass and ws_t cfg_t's (their
// amax passes); check_finite, d_nonfinite_flag and d_seed serve both. Arguments otherwise as fake_quantize().
// Where fake_quantize_both_mirrored() says the two outputs hold the same values (NVFP4's tiled weights), one pass
// writes d_out and a transposing copy d_out_t. d_bound and d_bound_t (both or neither;
// fake_quantize_both_bound_words(rows, cols) FP32 words each) receive bounds on the magnitudes of d_out's and
// d_out_t's values, one per tile of the one-read kernel, for flag_nonfinite_product: from the one-read kernel, in
// FP32 before their BF16 rounding (which is monotone); from the mirrored pair, the largest BF16 magnitude of the
// tile itself; where the two calls run instead they are NaN (no bound).
void fake_quantize_both(const void* d_x, bool x_bf16, int64_t rows, int64_t cols, const QuantConfig& cfg,
                        uint16_t* d_out, const QuantConfig& cfg_t, uint16_t* d_out_t, QuantWorkspace& ws,
                        QuantWorkspace& ws_t, cudaStream_t stream = nullptr, RhtPath path = RhtPath::fused,
                        bool check_finite = true, int* d_nonfinite_flag = nullptr, const uint64_t* d_seed = nullptr,
                        float* d_bound = nullptr, float* d_bound_t = nullptr);
// The words of each of fake_quantize_both's bounds for x [rows, cols]: one per 64 x 128 tile of x.
int64_t fake_quantize_both_bound_words(int64_t rows, int64_t cols);
// Whether fake_quantize_both reads x [rows, cols] once: BF16 input, the fused RHT path, one format, blocks of 16
// without 16x16 tiles and RHT 0 or 16 in both configurations (NVFP4's and UFP4's activations and gradients; MXFP4's
// blocks of 32 take the two passes, NVFP4's tiled weights the mirrored pair), and at most 65535 tiles of 64 rows (the
// grid's).
bool fake_quantize_both_fused(bool x_bf16, const QuantConfig& cfg, const QuantConfig& cfg_t,
                              RhtPath path = RhtPath::fused, int64_t rows = 0);
// Whether fake_quantize_both's two outputs hold the same values, d_out_t = d_out^T, so that one pass and a transposing
// copy make them: BF16 input, 16 x 16 tiles, no RHT and RTNE in cfg, and cfg_t the same but for the SR key and draw
// (which RTNE does not read), and at most 65535 tiles of 64 rows (the copy's grid is the one-read kernel's).
bool fake_quantize_both_mirrored(bool x_bf16, const QuantConfig& cfg, const QuantConfig& cfg_t, int64_t rows = 0);
// Whether fake_quantize_both writes bounds (not NaN): fake_quantize_both_fused() or fake_quantize_both_mirrored().
bool fake_quantize_both_bounded(bool x_bf16, const QuantConfig& cfg, const QuantConfig& cfg_t,
                                RhtPath path = RhtPath::fused, int64_t rows = 0);
// Dequantised values of q, (grid value * block scale) * global scale in that FP32 order as QTensor::dequant
// computes them, into d_out [rows, cols] as FP32, or rounded to BF16 (RTNE) as bit patterns.
void dequantize(const DQTensor& q, float* d_out, cudaStream_t stream = nullptr);
void dequantize_bf16(const DQTensor& q, uint16_t* d_out, cudaStream_t stream = nullptr);
// The unfused form's first pass alone: d_y = RHT(d_x) per block of cfg.rht (BF16-rounded when cfg.rht_bf16).
void rht(const float* d_x, float* d_y, int64_t rows, int64_t cols, const QuantConfig& cfg,
         cudaStream_t stream = nullptr);
// Per-tensor maximum of |x| (the device half of the ue4m3 scale), into ws.tensor_amax as FP32 bits.
void tensor_amax(const float* d_x, int64_t rows, int64_t cols, const QuantConfig& cfg, QuantWorkspace& ws,
                 cudaStream_t stream = nullptr);

// Sets `bit` in *d_flag when any of the n values at d_y (FP32, or BF16 bit patterns when bf16) is NaN or Inf: the
// deferred overflow check of a training GEMM's output, without a synchronisation (the torch layer reads the flag
// once a step). One atomic per thread block that saw a non-finite value.
void flag_nonfinite(const void* d_y, bool bf16, int64_t n, int* d_flag, int bit, cudaStream_t stream = nullptr);
// flag_nonfinite of a product C = A·Bᵀ over k (d_y, its n values) whose operands' magnitudes are bounded by the na
// words at d_bound_a and the nb at d_bound_b (fake_quantize_both's): where k·max(bound_a)·max(bound_b) ≤ 2^125 every
// |c| (FP32 accumulation, BF16 or FP32 output) is below 2^127 and finite, and the scan is left out; otherwise (a NaN
// bound among them, k > 2^24) it runs.
void flag_nonfinite_product(const void* d_y, bool bf16, int64_t n, int* d_flag, int bit, const float* d_bound_a,
                            int64_t na, const float* d_bound_b, int64_t nb, int64_t k, cudaStream_t stream = nullptr);

// The numerics monitor's statistics of one quantised operand, in one pass and a fixed summation order (the same
// bits on every run): d_out[0..4] = Σ ref², Σ (ref − dq)² (each term in FP64 from the FP32 values, as the host's
// statistics form it), max |x| (NaN if any x is), the count of elements with dq == 0 and ref != 0 (flushed), and
// the count of the (n + 1) / 2 packed code bytes' nibbles whose bit is set in saturated_codes (a 16-bit mask).
// x is the input, ref the input as the quantiser saw it (rotated where the recipe rotates; may be x), dq the
// dequantised operand, all FP32 with n elements.
struct OperandStatsWorkspace {
  Buffer<uint8_t> partials;
  void keep() { partials.keep(); }
};
static_assert(sizeof(OperandStatsWorkspace) == sizeof(Buffer<uint8_t>),
              "OperandStatsWorkspace::keep() lists every buffer");
void operand_stats(const float* d_x, const float* d_ref, const float* d_dq, const uint8_t* d_codes, int64_t n,
                   unsigned saturated_codes, double* d_out, OperandStatsWorkspace& ws, cudaStream_t stream = nullptr);

// The quantiser's RTNE hot path finds the level with one FP32 addition instead of the golden model's search over
// midpoints (kernels/src/round_fast.cuh); the fake quantiser computes the level's value itself (rtne_level_fast).
// Runs them and the golden rounding over all 2^32 FP32 bit patterns on the GPU and returns how many disagree in the
// code or in the level (against decode of the golden code, bit for bit), the smallest such pattern, and how many
// patterns were run; the cuda tests require 0 for every format.
uint64_t count_rtne_fast_mismatches(const ElemFormat& f, uint32_t* first_bad = nullptr, uint64_t* evaluated = nullptr);

// The same for stochastic rounding: round_sr_fast (no walk over the levels, no division) and sr_level_fast against
// fp4lab::round_sr for all 2^32 FP32 inputs, each at the four random words that decide it (kernels/src/round_fast.cuh).
uint64_t count_sr_fast_mismatches(const ElemFormat& f, uint32_t* first_bad = nullptr, uint64_t* evaluated = nullptr);

// The quantiser's fp32-scale step without a division per element (fp4lab::scale_fp32_by_reciprocal) against
// scale_element's division x / dec, for all 2^32 FP32 x at one scale dec, both on the GPU: the count of results
// whose bits differ (and the smallest such x, and how many were run); the cuda tests require 0.
uint64_t count_fp32_step_mismatches(float dec, uint32_t* first_bad = nullptr, uint64_t* evaluated = nullptr);

// The fake quantiser's and the dequantiser's BF16 conversion (one cvt.rn.bf16x2.f32 per two values) against
// fp4lab::f32_to_bf16, for all 2^32 FP32 inputs but NaNs (the golden function is defined for the others), each
// in both halves of the pair: the count of values whose bits differ; the cuda tests require 0.
uint64_t count_bf16_pack_mismatches(uint32_t* first_bad = nullptr, uint64_t* evaluated = nullptr);

// Golden layout (one code per byte) <-> device layout.
QTensor to_host(const DQTensor& d);
void upload(const QTensor& q, DQTensor& d);

// ---- block-scaled GEMM C[M, N] = A[M, K] . B[N, K]^T under the contract; d_c is FP32 [M, N] -----------------
// Simple reference kernel: one thread per output, the golden contract_step / contract_finish, decoded codes.
void gemm_reference(const DQTensor& a, const DQTensor& b, float* d_c, cudaStream_t stream = nullptr);

// Integer views and transposed scales the fast kernels read; reused across calls.
struct GemmWorkspace {
  Buffer<int8_t> a8, b8;    // [Mp, Kp], [Np, Kp] signed integer views, zero-padded (the mma.sync variants)
  Buffer<uint16_t> a16, b16;  // the same integers as F16 bit patterns (the wgmma variant: K-16 blocks in F16)
  Buffer<float> sa, sb;     // [KBp, Mp], [KBp, Np] block scales, k-major, zero-padded
  Buffer<uint8_t> na, nb;   // native path: element bytes in the tcgen05 layout
  Buffer<uint8_t> nsa, nsb; // native path: scale bytes
  Buffer<int> fused_ok;     // set on the device by gemm_fast_prepare: every scale passes fma_exact_scale
  bool fused_epilogue = true;  // false: the contract's separate multiply and add always (same bits; for timing)
  void keep() {
    a8.keep(), b8.keep(), a16.keep(), b16.keep(), sa.keep(), sb.keep(), na.keep(), nb.keep(), nsa.keep(), nsb.keep();
    fused_ok.keep();
  }
};
// 11 buffers and the flag, which takes one alignment unit.
static_assert(sizeof(GemmWorkspace) == 11 * sizeof(Buffer<int>) + alignof(Buffer<int>),
              "GemmWorkspace::keep() lists every buffer");
// Fast kernel on the int8 tensor cores (mma.sync m16n8k16 for block 16, m16n8k32 for block 32): each mma
// gives one block's exact int32 dot product; the block scaling and the FP32 accumulation in ascending block
// order run on the CUDA cores with the golden contract_scale_add, or with contract_scale_add_magic (the same bits)
// where every block scale of both operands passes fma_exact_scale: UE4M3 scales always, UE8M0 within 2^+-50. The
// check runs on the device in the prepare pass (no synchronisation). Includes the unpack pass. On SM90 one more
// variant runs wgmma.m64n128k16 on F16 views of the same integers (exact: every product and partial sum of a
// block is an integer below 2^13), whose FP32 result needs no conversion, then contract_scale_add_fma where the
// scales pass fma_exact_scale, else contract_scale_add.
// `variant` picks one of the tile shapes (all bit-identical); -1 is the default: the fastest measured on the H200
// for that block size and problem size (gemm_fast_default_variant).
void gemm_fast(const DQTensor& a, const DQTensor& b, float* d_c, GemmWorkspace& ws, cudaStream_t stream = nullptr,
               int variant = -1);
// Where the fast kernel writes C, in its epilogue (no second pass over C): the FP32 contract values (c32), or those
// values rounded to nearest-even BF16 (c16: what a BF16 layer keeps of them; bit patterns, [M, N]); exactly one of
// the two. With `nonfinite`, an FP32 value that is NaN or Inf sets `bit` there (atomicOr; other bits are kept), as
// flag_nonfinite over the FP32 C would.
struct GemmOut {
  float* c32 = nullptr;
  uint16_t* c16 = nullptr;
  int* nonfinite = nullptr;
  int bit = 0;
};
void gemm_fast(const DQTensor& a, const DQTensor& b, const GemmOut& out, GemmWorkspace& ws,
               cudaStream_t stream = nullptr, int variant = -1);
// The two halves of gemm_fast, for timing. The prepare pass writes the views `variant` reads (int8 or F16; -1:
// the default variant's), and gemm_fast_run refuses a variant whose views it did not write. gemm_fast_fused
// (synchronises `stream`, where the prepare ran; for tools and tests) tells whether the last prepare found every
// scale fit for the fused epilogue. A captured CUDA graph keeps the fused_epilogue setting of its capture.
void gemm_fast_prepare(const DQTensor& a, const DQTensor& b, GemmWorkspace& ws, cudaStream_t stream = nullptr,
                       int variant = -1);
void gemm_fast_run(const DQTensor& a, const DQTensor& b, float* d_c, GemmWorkspace& ws,
                   cudaStream_t stream = nullptr, int variant = -1);
void gemm_fast_run(const DQTensor& a, const DQTensor& b, const GemmOut& out, GemmWorkspace& ws,
                   cudaStream_t stream = nullptr, int variant = -1);
bool gemm_fast_fused(const GemmWorkspace& ws, cudaStream_t stream = nullptr);
int gemm_fast_variants();  // the mma.sync tile shapes, and on an SM90 device the wgmma one after them
const char* gemm_fast_variant_name(int variant);
int gemm_fast_default_variant(int block, int64_t M, int64_t N);

// ---- SM100 native block-scaled path (tcgen05.mma; built for sm_100a, never run here) ----------------------
// kind::mxf4nvf4 for e2m1 with ue4m3 per 16 or ue8m0 per 32; kind::mxf8f6f4 for e1m2 / int4 embedded exactly
// in E2M3 with ue8m0 per 32. False (and why) for any other combination.
bool native_supported(const DQTensor& a, const DQTensor& b, std::string* why = nullptr);
// False (and why) unless the current device is compute capability 10.0 (the sm_100a cubin's target).
bool native_device_ok(std::string* why = nullptr);
void gemm_native_sm100(const DQTensor& a, const DQTensor& b, float* d_c, GemmWorkspace& ws,
                       cudaStream_t stream = nullptr);
// Per-output bound on |C_native - C_golden|, from the golden operands (see kernels/README.md):
//   (K + K/B + 2) * 2^-23 * sum_j |a_j b_j| sa sb |ga gb|  (+ the smallest subnormal, for outputs near zero).
std::vector<double> native_tolerance(const QTensor& a, const QTensor& b);
// E2M3 byte of the integer view v in [-7, 7] (exact; E2M3 holds every integer up to 7.5). Host and device.
uint8_t e2m3_of_int(int v);

// ---- cuBLAS BF16 baseline, loaded at run time (libcublas.so) so nothing else depends on it -----------------
class CublasBf16 {
 public:
  CublasBf16();  // throws Error naming the library when it cannot be loaded
  ~CublasBf16();
  CublasBf16(const CublasBf16&) = delete;
  CublasBf16& operator=(const CublasBf16&) = delete;
  // C[M, N] (FP32, row-major) = A[M, K] . B[N, K]^T with A, B BF16 row-major, FP32 compute.
  void gemm(const uint16_t* d_a, const uint16_t* d_b, float* d_c, int64_t M, int64_t N, int64_t K,
            cudaStream_t stream);

 private:
  struct Impl;
  Impl* impl_ = nullptr;
};

}  // namespace fp4lab::cuda
