// The CUDA kernels' bindings (fp4lab.torch.ops launches them on torch tensors), where they are built; without
// them, only cuda_available, which says why.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "fp4lab/gemm.hpp"
#include "fp4lab/settings.hpp"
#include "fp4lab/quantize.hpp"
#if FP4LAB_PY_CUDA
#include "fp4lab/cuda/epilogue_bound.hpp"
#include "fp4lab/cuda/kernels.hpp"
#endif

using namespace nb::literals;

namespace fp4lab::py {
#if FP4LAB_PY_CUDA
namespace {

namespace fc = fp4lab::cuda;
// FP32 or BF16 (torch.bfloat16), checked at run time.
using CudaAny2 = nb::ndarray<nb::ndim<2>, nb::c_contig, nb::device::cuda>;
const nb::dlpack::dtype kBf16{uint8_t(nb::dlpack::dtype_code::Bfloat), 16, 1};
using CudaOut = nb::ndarray<float, nb::ndim<2>, nb::c_contig, nb::device::cuda>;

// Scratch memory of the kernels: one set per (device, stream), reused across calls, so that kernels on two streams
// or two devices at once never share scratch (kernels on one stream run in its order). Sets are never destroyed:
// freeing device memory at exit races the driver, and torch keeps a bounded pool of streams per device.
struct Workspaces {
  fc::QuantWorkspace quant;
  fc::QuantWorkspace quant_t;  // the transposed pass of cuda_fake_quantize_both (its own amax)
  fc::GemmWorkspace gemm;
  fc::OperandStatsWorkspace stats;
};
// Settings for every later call, on every device (the same bits under each).
int g_gemm_variant = -1;      // the fast GEMM's tile variant (-1: its default per shape)
bool g_fused_epilogue = true; // the fast GEMM's fused epilogue

// The calling thread may allocate while its stream is being captured into a CUDA graph (a stream's first call
// under capture makes its scratch then; cudaMalloc enqueues nothing), and the scratch a graph addresses is kept
// for its replays: a later growth leaves the old allocation in place (Buffer::keep).
class CaptureSafe {
 public:
  explicit CaptureSafe(cudaStream_t s) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    fc::check(cudaStreamIsCapturing(s, &st), "cudaStreamIsCapturing");
    capturing_ = st == cudaStreamCaptureStatusActive;
    if (capturing_) {
      mode_ = cudaStreamCaptureModeRelaxed;
      fc::check(cudaThreadExchangeStreamCaptureMode(&mode_), "cudaThreadExchangeStreamCaptureMode");
    }
  }
  ~CaptureSafe() {
    if (capturing_) cudaThreadExchangeStreamCaptureMode(&mode_);
  }
  bool capturing() const { return capturing_; }
  CaptureSafe(const CaptureSafe&) = delete;
  CaptureSafe& operator=(const CaptureSafe&) = delete;

 private:
  bool capturing_ = false;
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

Workspaces& workspaces(int device, cudaStream_t stream, const CaptureSafe& capture) {
  static std::mutex mu;
  static auto* sets = new std::map<std::pair<int, uintptr_t>, std::unique_ptr<Workspaces>>;
  Workspaces* w;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto& slot = (*sets)[{device, reinterpret_cast<uintptr_t>(stream)}];
    if (!slot) slot = std::make_unique<Workspaces>();
    w = slot.get();
  }
  if (capture.capturing()) w->quant.keep(), w->quant_t.keep(), w->gemm.keep(), w->stats.keep();
  w->gemm.fused_epilogue = g_fused_epilogue;
  return *w;
}
cudaStream_t as_stream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

// The launch bindings of the torch layer (fp4lab.torch.ops) take device addresses (Tensor.data_ptr()) and shapes
// that the layer has checked, not ndarrays: a torch tensor's DLPack export is a Python call of several µs, three per
// quantiser call, on a path that runs hundreds of times a training step. The device is made current for the call.
template <class T>
T* device_ptr(uintptr_t p) { return reinterpret_cast<T*>(p); }
class OnDevice {
 public:
  explicit OnDevice(int device) {
    fc::check(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != device) fc::check(cudaSetDevice(device), "cudaSetDevice");
    else prev_ = -1;
  }
  ~OnDevice() { if (prev_ >= 0) cudaSetDevice(prev_); }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;
 private:
  int prev_ = -1;
};
fc::RhtPath rht_path(const std::string& path) {
  if (path != "fused" && path != "unfused") throw std::invalid_argument("rht path must be fused or unfused");
  return path == "fused" ? fc::RhtPath::fused : fc::RhtPath::unfused;
}

// A device view of a DQTensor buffer, owned by the Python object `self`.
template <class T>
nb::ndarray<nb::pytorch, T> device_view(fc::Buffer<T>& b, std::initializer_list<size_t> shape, nb::handle self) {
  int dev = 0;
  fc::check(cudaGetDevice(&dev), "cudaGetDevice");
  return nb::ndarray<nb::pytorch, T>(b.data(), shape, self, {}, nb::dtype<T>(), nb::device::cuda::value, dev);
}

// The host bindings' check of a given amax (quantize_f32_amax, quantize_f32_at), with their message.
void check_amax(float amax) {
  if (!(std::isfinite(amax) && amax >= 0.0f))
    throw std::invalid_argument("amax must be a finite number >= 0, not " + std::to_string(amax));
}

// cuda_quantize_at / cuda_quantize_amax: x (FP32 or BF16, or its transpose read in place) quantised by
// fc::quantize_rows into `out` (a new CudaQTensor when None), which is returned.
nb::object quantize_rows_into(CudaAny2 x, const QuantConfig& cfg, const int64_t* d_index, const float* amax,
                              nb::object out, uintptr_t stream, bool transposed, bool check_finite) {
  const bool bf16 = x.dtype() == kBf16;
  if (!bf16 && x.dtype() != nb::dtype<float>()) throw std::invalid_argument("x must be float32 or bfloat16");
  if (out.is_none()) out = nb::type<fc::DQTensor>()();
  fc::DQTensor& q = nb::cast<fc::DQTensor&>(out);
  const int device = int(x.device_id());
  OnDevice on(device);
  const cudaStream_t st = as_stream(stream);
  CaptureSafe capture(st);
  fc::quantize_rows(x.data(), bf16, transposed, int64_t(x.shape(0)), int64_t(x.shape(1)), cfg, d_index, amax, q,
                    workspaces(device, st, capture).quant, st, fc::RhtPath::fused, check_finite);
  return out;
}

}  // namespace
#endif

void bind_cuda(nb::module_& m) {
#if FP4LAB_PY_CUDA
  namespace fc = fp4lab::cuda;
  m.def("cuda_available", [] {
    std::string why;
    return nb::make_tuple(fc::device_available(&why), why);
  });
  nb::class_<fc::DQTensor>(m, "CudaQTensor")
      .def(nb::init<>())
      .def_prop_ro("rows", [](const fc::DQTensor& q) { return q.rows; })
      .def_prop_ro("cols", [](const fc::DQTensor& q) { return q.cols; })
      .def_prop_ro("block", [](const fc::DQTensor& q) { return q.block; })
      .def_prop_ro("format", [](const fc::DQTensor& q) { return std::string(q.format.name); })
      .def_prop_ro("scale", [](const fc::DQTensor& q) { return std::string(scale_name(q.scale_kind)); })
      .def_prop_ro("tile2d", [](const fc::DQTensor& q) { return q.tile2d; })
      // The rotation the operand was quantised under, as QTensor's: size (0 = none) and signs (None without RHT).
      .def_prop_ro("rht", [](const fc::DQTensor& q) { return q.rht; })
      .def_prop_ro("rht_signs", [](const fc::DQTensor& q) -> nb::object {
        if (q.rht == 0) return nb::none();
        return nb::cast(q.rht_signs);
      })
      // Two 4-bit codes per byte, element 2i in the low nibble (the device layout).
      .def_prop_ro("packed_codes", [](nb::handle self) {
        auto& q = nb::cast<fc::DQTensor&>(self);
        return device_view(q.codes, {size_t(q.rows), size_t(q.cols / 2)}, self);
      })
      .def_prop_ro("scales", [](nb::handle self) {
        auto& q = nb::cast<fc::DQTensor&>(self);
        return device_view(q.scales, {size_t(q.rows), size_t(q.kblocks())}, self);
      })
      .def_prop_ro("global_scale", [](nb::handle self) {
        auto& q = nb::cast<fc::DQTensor&>(self);
        return device_view(q.global_dec, {size_t(1)}, self);
      })
      .def("to_host", [](const fc::DQTensor& q) { return fc::to_host(q); });
  m.def("cuda_check_gemm_operands", [](const fc::DQTensor& a, const fc::DQTensor& b) { check_gemm_operands(a, b); },
        "a"_a, "b"_a);
  // A device operand from device tensors (packed codes [rows, cols/2], block scales [rows, cols/block], the
  // global scale [1]), copied on the stream into out's buffers (which grow only): how the torch.library GEMM
  // operator hands its tensors to the kernels without a host round trip.
  m.def("cuda_make_qtensor", [](const std::string& format, const std::string& scale, int block, bool tile2d,
                                nb::ndarray<uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cuda> packed,
                                nb::ndarray<float, nb::ndim<2>, nb::c_contig, nb::device::cuda> scales,
                                nb::ndarray<float, nb::ndim<1>, nb::c_contig, nb::device::cuda> global_scale,
                                fc::DQTensor& out, uintptr_t stream, int rht, const std::vector<float>& rht_signs) {
    const int64_t rows = int64_t(packed.shape(0)), cols = 2 * int64_t(packed.shape(1));
    check_parts(block, rows, cols, int64_t(scales.shape(0)), int64_t(scales.shape(1)));
    if (global_scale.shape(0) != 1) throw std::invalid_argument("the global scale is one value");
    const ElemFormat f = parse_format(format);
    const ScaleKind sk = parse_scale(scale);
    check_rotation(rht, rht_signs);
    out.meta() = OperandMeta{.format = f, .scale_kind = sk, .block = block, .tile2d = tile2d, .rht = rht,
                             .rht_signs = rht_signs, .rows = rows, .cols = cols};
    out.codes.resize(size_t(rows * cols / 2));
    out.scales.resize(size_t(rows * (cols / block)));
    out.scale_codes = fc::Buffer<uint8_t>();
    out.global_dec.resize(1);
    const cudaStream_t s = as_stream(stream);
    fc::check(cudaMemcpyAsync(out.codes.data(), packed.data(), out.codes.size(), cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
    fc::check(cudaMemcpyAsync(out.scales.data(), scales.data(), out.scales.size() * sizeof(float),
                              cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
    fc::check(cudaMemcpyAsync(out.global_dec.data(), global_scale.data(), sizeof(float), cudaMemcpyDeviceToDevice, s),
              "cudaMemcpyAsync");
  }, "format"_a, "scale"_a, "block"_a, "tile2d"_a, "packed_codes"_a, "scales"_a, "global_scale"_a, "out"_a, "stream"_a,
     "rht"_a = 0, "rht_signs"_a = std::vector<float>());
  // transposed: quantise x^T (blocks along x's first dimension) reading x in place, bit-identical to quantising
  // a transposed copy; out is then [cols, rows].
  // x: the address of a C-contiguous [rows, cols] FP32 (bf16 false) or BF16 tensor on `device`, quantised along
  // its rows, or (transposed) as its transpose [cols, rows] along x's first dimension, read in place. flag: the
  // address of the int the deferred check ORs its bits into (0: none). seed: the address of a uint64 read on the
  // device in place of the config's SR seed (0: the config's), for a step captured in a CUDA graph.
  m.def("cuda_quantize", [](int device, uintptr_t stream, uintptr_t x, int64_t rows, int64_t cols, bool bf16,
                            bool transposed, const QuantConfig& cfg, fc::DQTensor& out, const std::string& path,
                            bool check_finite, uintptr_t flag, uintptr_t seed) {
    const auto p = rht_path(path);
    OnDevice on(device);
    const cudaStream_t st = as_stream(stream);
    CaptureSafe capture(st);
    auto& ws = workspaces(device, st, capture).quant;
    int* d_flag = device_ptr<int>(flag);
    const auto* d_seed = device_ptr<const uint64_t>(seed);
    if (!bf16) {
      const auto* px = device_ptr<const float>(x);
      if (transposed)
        fc::quantize_transposed(px, rows, cols, cfg, out, ws, st, p, check_finite, d_flag, d_seed);
      else
        fc::quantize(px, rows, cols, cfg, out, ws, st, p, check_finite, d_flag, d_seed);
    } else {
      const auto* px = device_ptr<const uint16_t>(x);
      if (transposed)
        fc::quantize_transposed_bf16(px, rows, cols, cfg, out, ws, st, p, check_finite, d_flag, d_seed);
      else
        fc::quantize_bf16(px, rows, cols, cfg, out, ws, st, p, check_finite, d_flag, d_seed);
    }
  }, "device"_a, "stream"_a, "x"_a, "rows"_a, "cols"_a, "bf16"_a, "transposed"_a, "config"_a, "out"_a,
     "path"_a = "fused", "check_finite"_a = true, "nonfinite_flag"_a = 0, "seed"_a = 0);
  // The host's quantize_f32_at and quantize_f32_amax on the GPU, with their checks and messages: rows index[i] (an
  // int64 tensor on x's device) of a larger tensor, with that tensor's amax (ue4m3's global scale; None: x's own,
  // taken on the device; other scales ignore it). fp4lab.torch.sr_shard and reduce_amax quantise a rank's rows so,
  // as one process quantises them, without a host round trip. transposed: x is [K, rows], quantised as its
  // transpose, read in place. A negative index is found on the device: with check_finite (a synchronisation) it
  // raises, without it bit 2 (value 4) of the deferred flag is set.
  m.def("cuda_quantize_at", [](CudaAny2 x, const QuantConfig& cfg,
                               nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cuda> index,
                               std::optional<float> amax, nb::object out, uintptr_t stream, bool transposed,
                               bool check_finite) {
    if (amax) check_amax(*amax);
    const int64_t rows = int64_t(x.shape(transposed ? 1 : 0));
    if (int64_t(index.shape(0)) != rows)
      throw std::invalid_argument("index must hold one row index per row of x (" + std::to_string(rows) + "), not " +
                                  std::to_string(index.shape(0)));
    if (index.device_id() != x.device_id()) throw std::invalid_argument("index must be on x's device");
    if (cfg.tile2d)
      throw std::invalid_argument("16x16 tiles span rows: a tensor's rows are not quantised one at a time");
    const float a = amax ? *amax : 0.0f;
    return quantize_rows_into(x, cfg, index.data(), amax ? &a : nullptr, std::move(out), stream, transposed,
                              check_finite);
  }, "x"_a, "config"_a, "index"_a, "amax"_a.none(), "out"_a = nb::none(), "stream"_a = 0, "transposed"_a = false,
     "check_finite"_a = true,
     "Rows index[i] of a larger tensor (x's row i) quantised on the GPU as quantize_f32_at quantises them, with the "
     "larger tensor's amax (None: x's own); returns out, or a new CudaQTensor.");
  m.def("cuda_quantize_amax", [](CudaAny2 x, const QuantConfig& cfg, float amax, nb::object out, uintptr_t stream,
                                 bool transposed, bool check_finite) {
    check_amax(amax);
    return quantize_rows_into(x, cfg, nullptr, &amax, std::move(out), stream, transposed, check_finite);
  }, "x"_a, "config"_a, "amax"_a, "out"_a = nb::none(), "stream"_a = 0, "transposed"_a = false,
     "check_finite"_a = true,
     "quantize_f32_amax on the GPU: x quantised with the tensor amax given (ue4m3's global scale; other scales "
     "ignore it); returns out, or a new CudaQTensor.");
  // The host's tensor_amax on the GPU (x FP32 [rows, K]): one synchronisation, to return the value, and the same
  // faults (NaN or Inf in x, a rotation that overflows FP32) raised.
  m.def("cuda_tensor_amax", [](nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cuda> x,
                               const QuantConfig& cfg, uintptr_t stream) {
    const int64_t rows = int64_t(x.shape(0)), cols = int64_t(x.shape(1));
    validate(cfg, rows, cols);
    const int device = int(x.device_id());
    OnDevice on(device);
    const cudaStream_t st = as_stream(stream);
    CaptureSafe capture(st);
    auto& ws = workspaces(device, st, capture).quant;
    ws.nonfinite.resize(1);
    fc::check(cudaMemsetAsync(ws.nonfinite.data(), 0, sizeof(int), st), "cudaMemsetAsync");
    fc::flag_nonfinite(x.data(), false, rows * cols, ws.nonfinite.data(), 1, st);
    if (cfg.rht == 16 || cfg.rht == 32 || cfg.rht == 0) {
      fc::tensor_amax(x.data(), rows, cols, cfg, ws, st);
    } else {  // RHT-64/128 rotate in a pass of their own first
      ws.rotated.resize(size_t(rows * cols));
      fc::rht(x.data(), ws.rotated.data(), rows, cols, cfg, st);
      QuantConfig plain = cfg;
      plain.rht = 0;
      plain.rht_signs.clear();
      plain.rht_bf16 = false;
      fc::tensor_amax(ws.rotated.data(), rows, cols, plain, ws, st);
    }
    int bad = 0;
    unsigned bits = 0;
    fc::check(cudaMemcpyAsync(&bad, ws.nonfinite.data(), sizeof(int), cudaMemcpyDeviceToHost, st), "cudaMemcpyAsync");
    fc::check(cudaMemcpyAsync(&bits, ws.tensor_amax.data(), sizeof bits, cudaMemcpyDeviceToHost, st), "cudaMemcpyAsync");
    fc::check(cudaStreamSynchronize(st), "tensor_amax");
    if (bad) throw std::invalid_argument("input tensor holds NaN or Inf (4-bit grids have no such codes)");
    float amax;
    std::memcpy(&amax, &bits, sizeof amax);
    if (!std::isfinite(amax))
      throw std::invalid_argument("RHT overflows FP32 (a rotated value is Inf or NaN; 4-bit grids have no such codes)");
    return amax;
  }, "x"_a, "config"_a, "stream"_a = 0,
     "The tensor amax a ue4m3 global scale is taken from (as tensor_amax), computed on the GPU.");
  // Fake quantisation in one pass: out (BF16, the quantised operand's shape) receives what cuda_dequantize would
  // write in BF16 for the operand cuda_quantize makes of x (transposed: of x^T); q, when given, receives it too.
  m.def("cuda_fake_quantize", [](int device, uintptr_t stream, uintptr_t x, int64_t rows, int64_t cols, bool bf16,
                                 bool transposed, const QuantConfig& cfg, uintptr_t out, const std::string& path,
                                 bool check_finite, uintptr_t flag, fc::DQTensor* q, uintptr_t seed) {
    const auto p = rht_path(path);
    OnDevice on(device);
    const cudaStream_t st = as_stream(stream);
    CaptureSafe capture(st);
    fc::fake_quantize(device_ptr<const void>(x), bf16, transposed, rows, cols, cfg, device_ptr<uint16_t>(out), q,
                      workspaces(device, st, capture).quant, st, p, check_finite, device_ptr<int>(flag),
                      device_ptr<const uint64_t>(seed));
  }, "device"_a, "stream"_a, "x"_a, "rows"_a, "cols"_a, "bf16"_a, "transposed"_a, "config"_a, "out"_a,
     "path"_a = "fused", "check_finite"_a = true, "nonfinite_flag"_a = 0, "q"_a = nb::none(), "seed"_a = 0,
     "Fake quantisation in one pass: out (BF16, [rows, cols], or [cols, rows] when transposed) receives what "
     "cuda_dequantize would write in BF16 for the operand cuda_quantize makes of x; q, when given, receives it too.");
  // Both operands a training step takes of one tensor, from one read where the kernels can (fake_quantize_both):
  // out [rows, cols] as cuda_fake_quantize(x, config) writes it, out_t [cols, rows] as cuda_fake_quantize(x^T,
  // config_t) does.
  m.def("cuda_fake_quantize_both", [](int device, uintptr_t stream, uintptr_t x, int64_t rows, int64_t cols,
                                      bool bf16, const QuantConfig& cfg, uintptr_t out, const QuantConfig& cfg_t,
                                      uintptr_t out_t, bool check_finite, uintptr_t flag, uintptr_t seed,
                                      uintptr_t bound, uintptr_t bound_t) {
    OnDevice on(device);
    const cudaStream_t st = as_stream(stream);
    CaptureSafe capture(st);
    Workspaces& w = workspaces(device, st, capture);
    fc::fake_quantize_both(device_ptr<const void>(x), bf16, rows, cols, cfg, device_ptr<uint16_t>(out), cfg_t,
                           device_ptr<uint16_t>(out_t), w.quant, w.quant_t, st, fc::RhtPath::fused, check_finite,
                           device_ptr<int>(flag), device_ptr<const uint64_t>(seed), device_ptr<float>(bound),
                           device_ptr<float>(bound_t));
  }, "device"_a, "stream"_a, "x"_a, "rows"_a, "cols"_a, "bf16"_a, "config"_a, "out"_a, "config_t"_a, "out_t"_a,
     "check_finite"_a = true, "nonfinite_flag"_a = 0, "seed"_a = 0, "bound"_a = 0, "bound_t"_a = 0,
     "Fake quantisation of x [rows, cols] and of its transpose from one read where the kernels can: out receives "
     "what cuda_fake_quantize gives for x under config, out_t ([cols, rows]) what it gives for x^T under config_t; "
     "bound and bound_t (both or neither, cuda_fake_quantize_both_bound_words FP32 words each) the magnitude bounds "
     "cuda_flag_nonfinite_product reads (NaN where the two passes ran: cuda_fake_quantize_both_bounded says where).");
  m.def("cuda_fake_quantize_both_bound_words", [](int64_t rows, int64_t cols) {
    return fc::fake_quantize_both_bound_words(rows, cols);
  }, "rows"_a, "cols"_a, "The FP32 words of each of cuda_fake_quantize_both's bounds for x [rows, cols].");
  m.def("cuda_fake_quantize_both_fused", [](bool bf16, const QuantConfig& cfg, const QuantConfig& cfg_t,
                                            int64_t rows) {
    return fc::fake_quantize_both_fused(bf16, cfg, cfg_t, fc::RhtPath::fused, rows);
  }, "bf16"_a, "config"_a, "config_t"_a, "rows"_a = 0,
     "Whether cuda_fake_quantize_both reads x [rows, cols] once for these configurations (else it runs the two "
     "passes).");
  m.def("cuda_fake_quantize_both_bounded", [](bool bf16, const QuantConfig& cfg, const QuantConfig& cfg_t,
                                              int64_t rows) {
    return fc::fake_quantize_both_bounded(bf16, cfg, cfg_t, fc::RhtPath::fused, rows);
  }, "bf16"_a, "config"_a, "config_t"_a, "rows"_a = 0,
     "Whether cuda_fake_quantize_both gives bounds for x [rows, cols] under these configurations: where it reads x "
     "once for both (cuda_fake_quantize_both_fused), and where the two outputs hold the same values, one pass and "
     "a transposing copy (NVFP4's tiled weights).");
  m.def("cuda_flag_nonfinite", [](int device, uintptr_t stream, uintptr_t y, int64_t n, bool bf16, uintptr_t flag,
                                  int bit) {
    OnDevice on(device);
    fc::flag_nonfinite(device_ptr<const void>(y), bf16, n, device_ptr<int>(flag), bit, as_stream(stream));
  }, "device"_a, "stream"_a, "y"_a, "n"_a, "bf16"_a, "flag"_a, "bit"_a,
     "ORs bit into the int at flag when any of the n FP32 (or BF16) values at y is NaN or Inf.");
  m.def("cuda_flag_nonfinite_product", [](int device, uintptr_t stream, uintptr_t y, int64_t n, bool bf16,
                                          uintptr_t flag, int bit, uintptr_t bound_a, int64_t na, uintptr_t bound_b,
                                          int64_t nb, int64_t k) {
    OnDevice on(device);
    fc::flag_nonfinite_product(device_ptr<const void>(y), bf16, n, device_ptr<int>(flag), bit,
                               device_ptr<const float>(bound_a), na, device_ptr<const float>(bound_b), nb, k,
                               as_stream(stream));
  }, "device"_a, "stream"_a, "y"_a, "n"_a, "bf16"_a, "flag"_a, "bit"_a, "bound_a"_a, "na"_a, "bound_b"_a, "nb"_a,
     "k"_a,
     "cuda_flag_nonfinite of a product C = A·B^T over k whose operands' magnitudes the bounds at bound_a (na words) "
     "and bound_b (nb) hold (cuda_fake_quantize_both's): the scan is left out where they prove C finite.");
  // The quantiser's rotation alone (its first step), FP32 in and out: the numerics monitor's reference on the GPU.
  m.def("cuda_rotate", [](nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cuda> x, CudaOut out,
                          const QuantConfig& cfg, uintptr_t stream) {
    if (out.shape(0) != x.shape(0) || out.shape(1) != x.shape(1)) throw std::invalid_argument("output must have x's shape");
    fc::rht(x.data(), out.data(), int64_t(x.shape(0)), int64_t(x.shape(1)), cfg, as_stream(stream));
  }, "x"_a, "out"_a, "config"_a, "stream"_a);
  m.def("cuda_operand_stats", [](nb::ndarray<const float, nb::c_contig, nb::device::cuda> x,
                                 nb::ndarray<const float, nb::c_contig, nb::device::cuda> ref,
                                 nb::ndarray<const float, nb::c_contig, nb::device::cuda> dq,
                                 nb::ndarray<const uint8_t, nb::c_contig, nb::device::cuda> codes,
                                 unsigned saturated_codes,
                                 nb::ndarray<double, nb::ndim<1>, nb::c_contig, nb::device::cuda> out,
                                 uintptr_t stream) {
    const size_t n = x.size();
    if (ref.size() != n || dq.size() != n) throw std::invalid_argument("x, ref and dq must have as many elements");
    if (codes.size() != (n + 1) / 2) throw std::invalid_argument("codes must hold (n + 1) / 2 packed bytes");
    if (out.shape(0) < 5) throw std::invalid_argument("out must hold 5 values");
    const int device = int(x.device_id());
    OnDevice on(device);
    const cudaStream_t st = as_stream(stream);
    CaptureSafe capture(st);
    fc::operand_stats(x.data(), ref.data(), dq.data(), codes.data(), int64_t(n), saturated_codes, out.data(),
                      workspaces(device, st, capture).stats, st);
  }, "x"_a, "ref"_a, "dq"_a, "codes"_a, "saturated_codes"_a, "out"_a, "stream"_a,
     "The numerics monitor's figures of one operand in one pass: out[:5] = sum ref^2, sum (ref - dq)^2 (FP64), "
     "max |x|, flushed count, saturated count (codes set in the 16-bit mask).");
  m.def("cuda_dequantize", [](const fc::DQTensor& q, CudaAny2 out, uintptr_t stream) {
    if (int64_t(out.shape(0)) != q.rows || int64_t(out.shape(1)) != q.cols)
      throw std::invalid_argument("output must have shape [" + std::to_string(q.rows) + ", " + std::to_string(q.cols) + "]");
    if (out.dtype() == nb::dtype<float>())
      fc::dequantize(q, static_cast<float*>(out.data()), as_stream(stream));
    else if (out.dtype() == kBf16)
      fc::dequantize_bf16(q, static_cast<uint16_t*>(out.data()), as_stream(stream));
    else
      throw std::invalid_argument("dequantize writes float32 or bfloat16");
  }, "q"_a, "out"_a, "stream"_a);
  // out: the address of an FP32 [a.rows, b.rows] C-contiguous tensor on `device` (BF16 with bf16=True: the fast
  // kernel rounds its FP32 values in its epilogue). flag (with a nonzero bit): the fast kernel's own output check,
  // as cuda_flag_nonfinite on the FP32 values would do.
  m.def("cuda_gemm", [](int device, uintptr_t stream, const fc::DQTensor& a, const fc::DQTensor& b, uintptr_t out,
                        const std::string& kernel, bool bf16, uintptr_t flag, int bit) {
    check_gemm_operands(a, b);
    if (kernel != "fast" && kernel != "reference")
      throw std::invalid_argument("kernel must be fast or reference, not '" + kernel + "'");
    if (kernel == "reference" && (bf16 || flag))
      throw std::invalid_argument("the reference kernel writes FP32 and checks nothing");
    OnDevice on(device);
    if (kernel == "fast") {
      fc::GemmOut o;
      if (bf16)
        o.c16 = device_ptr<uint16_t>(out);
      else
        o.c32 = device_ptr<float>(out);
      o.nonfinite = flag ? device_ptr<int>(flag) : nullptr;
      o.bit = bit;
      const cudaStream_t st = as_stream(stream);
      CaptureSafe capture(st);
      fc::gemm_fast(a, b, o, workspaces(device, st, capture).gemm, st, g_gemm_variant);
    } else {
      fc::gemm_reference(a, b, device_ptr<float>(out), as_stream(stream));
    }
  }, "device"_a, "stream"_a, "a"_a, "b"_a, "out"_a, "kernel"_a = "fast", "bf16"_a = false, "flag"_a = 0, "bit"_a = 0);
  // The fast GEMM's fused epilogue (on by default; the same bits either way, docs/datapath.md §3): off times the
  // separate multiply and add beside it. Returns the previous setting.
  m.def("cuda_gemm_fused_epilogue", [](bool on) {
    return std::exchange(g_fused_epilogue, on);
  }, "on"_a);
  // The contract GEMM's epilogue bound (epilogue_bound.hpp) for operands under configs a and b on a device.
  m.def("cuda_gemm_epilogue_bound", [](int device, const QuantConfig& a, const QuantConfig& b) {
    int sms = 0, clock_khz = 0;
    fc::check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
    fc::check(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device), "cudaDeviceGetAttribute");
    const bool fused = g_fused_epilogue && fused_form_kinds(a.scale, b.scale);
    return std::make_tuple(fc::epilogue_bound_ops_per_s(sms, clock_khz, a.block, fused),
                           fc::epilogue_fp32_instructions(fused), sms, clock_khz);
  }, "device"_a, "a"_a, "b"_a,
     "(operations per second, FP32 instructions per output and block, SMs, SM clock in kHz): the rate the contract "
     "GEMM's epilogue allows for operands under configs a and b on the device (2 operations per product), in the "
     "fused form where their scale kinds allow it and cuda_gemm_fused_epilogue is on.");
  // How many tile variants the fast GEMM has on this device (fp4lab cuda bench lists them).
  m.def("cuda_gemm_variants", [] { return fc::gemm_fast_variants(); });
  // The fast GEMM's tile variant for every later call (-1: the default per shape; the same bits from each): for
  // timing one beside another. Returns the previous setting.
  m.def("cuda_gemm_variant", [](int v) {
    if (v < -1 || v >= fc::gemm_fast_variants())
      throw std::invalid_argument("no fast GEMM variant " + std::to_string(v) + " on this device (there are " +
                                  std::to_string(fc::gemm_fast_variants()) + ")");
    return std::exchange(g_gemm_variant, v);
  }, "variant"_a);
#else
  m.def("cuda_available", [] { return nb::make_tuple(false, std::string("this fp4lab was built without CUDA (no nvcc found)")); });
#endif
}

}  // namespace fp4lab::py
