// Shared by the files of fp4lab._core (python/src/): nanobind, the array helpers, the fault and thread rules, and
// the registration function of each file. Each file binds one concern; core.cpp makes the module and calls them.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace nb = nanobind;

namespace fp4lab {
struct ElemFormat;
}

namespace fp4lab::py {

// The element formats as a Python enum (fp4lab.Format, bound in config.cpp): its values index kAllFormats, the one
// table of formats.
enum class FormatId : int {};
FormatId format_id(const ElemFormat& f);

using CpuIn = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using CpuBf16In = nb::ndarray<const uint16_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// A numpy array that owns a moved-in std::vector (no copy of the data).
template <class T>
nb::ndarray<nb::numpy, T> owned(std::vector<T>&& v, std::initializer_list<size_t> shape) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(heap->data(), shape, owner);
}

// A read-only numpy view of a member of `self` (kept alive by the view).
template <class T>
nb::ndarray<nb::numpy, const T> view(const std::vector<T>& v, size_t rows, size_t cols, nb::handle self) {
  return nb::ndarray<nb::numpy, const T>(v.data(), {rows, cols}, self);
}

// A fault as the package's DataError or UsageError (python/fp4lab/_files.py: ValueErrors that carry the command
// line's exit codes), or as a plain ValueError where that module cannot be imported.
[[noreturn]] void raise_fault(bool usage, const std::string& msg);
// OMP_NUM_THREADS as this module found it when imported (core.cpp); require_threads refuses a count OpenMP cannot
// honour (UsageError) in every call that would start threads, before it starts any.
std::optional<std::string>& threads_fault();
void require_threads();
// The rotation a rebuilt operand says it was quantised under: none (no signs), or a valid size with its d signs.
void check_rotation(int rht, const std::vector<float>& rht_signs);
// The shape of a rebuilt operand ([rows, cols] codes, [scale_rows, scale_cols] block scales) against its block size:
// the one check of make_qtensor and cuda_make_qtensor.
void check_parts(int block, int64_t rows, int64_t cols, int64_t scale_rows, int64_t scale_cols);

void bind_config(nb::module_& m);   // config.cpp: QuantConfig, formats, recipes, knobs, scale codecs
void bind_quant(nb::module_& m);    // quant.cpp: QTensor, the quantiser, the GEMM
void bind_analyze(nb::module_& m);  // analyze.cpp: trace analysis, model shapes
void bind_io(nb::module_& m);       // trace_io.cpp: safetensors and trace v1
void bind_cuda(nb::module_& m);     // cuda.cpp: the CUDA kernels (cuda_available only, without them)

}  // namespace fp4lab::py
