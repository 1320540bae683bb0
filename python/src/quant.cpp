// QTensor, the golden quantiser and the GEMM on host arrays.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4lab/gemm.hpp"
#include "fp4lab/settings.hpp"
#include "fp4lab/quantize.hpp"
#include "fp4lab/rht.hpp"
#include "fp4lab/scale.hpp"

#include "common.hpp"

using namespace nb::literals;

namespace fp4lab::py {
namespace {

QTensor quantize_f32(CpuIn x, const QuantConfig& cfg) {
  require_threads();
  const int64_t rows = int64_t(x.shape(0)), cols = int64_t(x.shape(1));
  nb::gil_scoped_release release;  // the quantiser runs on OpenMP threads; other Python threads may go on
  return quantize(x.data(), rows, cols, cfg);
}

QTensor quantize_bf16(CpuBf16In x, const QuantConfig& cfg) {
  require_threads();
  const int64_t rows = int64_t(x.shape(0)), cols = int64_t(x.shape(1));
  nb::gil_scoped_release release;
  // BF16 -> FP32 is exact (a shift), as the trace reader does it.
  std::vector<float> f(size_t(rows * cols));
  for (size_t i = 0; i < f.size(); ++i) f[i] = bf16_to_f32(x.data()[i]);
  return quantize(f.data(), rows, cols, cfg);
}

// A QTensor from its parts (codes one per byte, decoded scales, the rotation it was quantised under), checked like
// the CLI checks a file.
QTensor make_qtensor(const std::string& format, const std::string& scale, int block, bool tile2d,
                     nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> codes,
                     nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu> scales, float global_dec,
                     int rht, const std::vector<float>& rht_signs) {
  QTensor q;
  const ElemFormat f = parse_format(format);
  const ScaleKind sk = parse_scale(scale);
  // S_dec = 1 / S_enc with 0 < S_enc <= FLT_MAX (docs/spec.md §2): a NaN, infinite, zero or negative global
  // scale is no quantised operand.
  if (!(std::isfinite(global_dec) && global_dec > 0.0f))
    throw std::invalid_argument("global_scale must be a positive finite number, not " + std::to_string(global_dec));
  check_rotation(rht, rht_signs);
  const int64_t rows = int64_t(codes.shape(0)), cols = int64_t(codes.shape(1));
  check_parts(block, rows, cols, int64_t(scales.shape(0)), int64_t(scales.shape(1)));
  q.meta() = OperandMeta{.format = f, .scale_kind = sk, .block = block, .tile2d = tile2d, .rht = rht,
                         .rht_signs = rht_signs, .rows = rows, .cols = cols};
  q.codes.assign(codes.data(), codes.data() + codes.size());
  for (uint8_t c : q.codes)
    if (!code_valid(q.format, c))
      throw std::invalid_argument("code " + std::to_string(int(c)) + " is not a " + std::string(q.format.name) + " code");
  q.scales.assign(scales.data(), scales.data() + scales.size());
  check_finite(q.scales.data(), int64_t(q.scales.size()), "scales");
  q.global_dec = global_dec;
  return q;
}

}  // namespace

void check_parts(int block, int64_t rows, int64_t cols, int64_t scale_rows, int64_t scale_cols) {
  if (!block_size_ok(block)) throw std::invalid_argument(block_size_fault(block));
  if (cols % block != 0)
    throw std::invalid_argument("codes have " + std::to_string(cols) + " columns, not a multiple of the block size " +
                                std::to_string(block));
  if (scale_rows != rows || scale_cols != cols / block)
    throw std::invalid_argument("scales must have shape [" + std::to_string(rows) + ", " + std::to_string(cols / block) + "]");
}

void check_rotation(int rht, const std::vector<float>& rht_signs) {
  if (rht != 0) {
    if (!rht_size_ok(rht)) throw std::invalid_argument(rht_size_fault(rht));
    if (int(rht_signs.size()) != rht)
      throw std::invalid_argument("RHT needs " + std::to_string(rht) + " signs, got " + std::to_string(rht_signs.size()));
    for (float s : rht_signs)
      if (s != 1.0f && s != -1.0f) throw std::invalid_argument("RHT signs must be +1 or -1");
  } else if (!rht_signs.empty()) {
    throw std::invalid_argument("rht_signs given without an RHT size");
  }
}


void bind_quant(nb::module_& m) {
  nb::class_<QTensor>(m, "QTensor")
      .def_prop_ro("rows", [](const QTensor& q) { return q.rows; })
      .def_prop_ro("cols", [](const QTensor& q) { return q.cols; })
      .def_prop_ro("format", [](const QTensor& q) { return std::string(q.format.name); })
      .def_prop_ro("scale", [](const QTensor& q) { return std::string(scale_name(q.scale_kind)); })
      .def_prop_ro("block", [](const QTensor& q) { return q.block; })
      .def_prop_ro("tile2d", [](const QTensor& q) { return q.tile2d; })
      .def_prop_ro("global_scale", [](const QTensor& q) { return q.global_dec; })
      // The rotation the operand was quantised under: its size (0 = none) and signs (None without RHT).
      .def_prop_ro("rht", [](const QTensor& q) { return q.rht; })
      .def_prop_ro("rht_signs", [](const QTensor& q) -> nb::object {
        if (q.rht == 0) return nb::none();
        return nb::cast(q.rht_signs);
      })
      .def("__repr__", [](const QTensor& q) {
        return "<fp4lab.QTensor [" + std::to_string(q.rows) + ", " + std::to_string(q.cols) + "] " + q.format.name +
               " b" + std::to_string(q.block) + (q.tile2d ? "x16 " : " ") + scale_name(q.scale_kind) + " " +
               rht_name(q.rht, q.rht_signs) + ">";
      })
      .def_prop_ro("codes", [](nb::handle self) {
        const QTensor& q = nb::cast<const QTensor&>(self);
        return view(q.codes, size_t(q.rows), size_t(q.cols), self);
      })
      .def_prop_ro("scales", [](nb::handle self) {
        const QTensor& q = nb::cast<const QTensor&>(self);
        return view(q.scales, size_t(q.rows), size_t(q.kblocks()), self);
      })
      .def_prop_ro("scale_codes", [](nb::handle self) -> nb::object {
        const QTensor& q = nb::cast<const QTensor&>(self);
        if (q.scale_codes.empty()) return nb::none();
        return nb::cast(view(q.scale_codes, size_t(q.rows), size_t(q.kblocks()), self));
      })
      .def("dequantize", [](const QTensor& q) {
        require_threads();
        return owned(q.dequantize(), {size_t(q.rows), size_t(q.cols)});
      });

  m.def("quantize_f32", &quantize_f32, "x"_a.noconvert(), "config"_a);
  m.def("quantize_bf16", &quantize_bf16, "x"_a.noconvert(), "config"_a);
  m.def("rotate", [](CpuIn x, const QuantConfig& cfg) {
    require_threads();
    const int64_t rows = int64_t(x.shape(0)), cols = int64_t(x.shape(1));
    validate(cfg, rows, cols);
    return owned(rotate(x.data(), rows, cols, cfg), {size_t(rows), size_t(cols)});
  }, "x"_a.noconvert(), "config"_a);
  // A tensor-wide scale (ue4m3) from an amax of a larger tensor: data parallelism reduces each rank's tensor_amax
  // with MAX and quantises its rows with the result (fp4lab.torch.reduce_amax), as one process quantises them.
  m.def("tensor_amax", [](CpuIn x, const QuantConfig& cfg) {
    require_threads();
    const int64_t rows = int64_t(x.shape(0)), cols = int64_t(x.shape(1));
    nb::gil_scoped_release release;
    return tensor_amax(x.data(), rows, cols, cfg);
  }, "x"_a.noconvert(), "config"_a,
        "The tensor amax a ue4m3 global scale is taken from: the largest block amax, after the rotation when RHT is on.");
  m.def("quantize_f32_amax", [](CpuIn x, const QuantConfig& cfg, float amax) {
    require_threads();
    if (!(std::isfinite(amax) && amax >= 0.0f))
      throw std::invalid_argument("amax must be a finite number >= 0, not " + std::to_string(amax));
    const int64_t rows = int64_t(x.shape(0)), cols = int64_t(x.shape(1));
    nb::gil_scoped_release release;
    return quantize_rows(x.data(), 0, rows, cols, cfg, amax);
  }, "x"_a.noconvert(), "config"_a, "amax"_a,
        "quantize_f32 with the tensor amax given (ue4m3's global scale; other scales ignore it).");
  // Some rows of a larger tensor, each quantised as quantize() quantises it within the whole: row i of x is row
  // index[i] of the whole, whose stochastic rounding draws the whole's element indices and whose ue4m3 scales take
  // the whole's amax. A data-parallel rank quantises its own rows of the global batch this way
  // (fp4lab.torch.sr_shard) with the single process's random words, without the other ranks' rows.
  m.def("quantize_f32_at", [](CpuIn x, const QuantConfig& cfg,
                              nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> index,
                              float amax) {
    require_threads();
    if (!(std::isfinite(amax) && amax >= 0.0f))
      throw std::invalid_argument("amax must be a finite number >= 0, not " + std::to_string(amax));
    const int64_t rows = int64_t(x.shape(0)), cols = int64_t(x.shape(1));
    if (int64_t(index.shape(0)) != rows)
      throw std::invalid_argument("index must hold one row index per row of x (" + std::to_string(rows) + "), not " +
                                  std::to_string(index.shape(0)));
    if (cfg.tile2d)
      throw std::invalid_argument("16x16 tiles span rows: a tensor's rows are not quantised one at a time");
    const int64_t* at = index.data();
    for (int64_t i = 0; i < rows; ++i)
      if (at[i] < 0) throw std::invalid_argument("row index " + std::to_string(at[i]) + " is negative");
    validate(cfg, rows, cols);
    nb::gil_scoped_release release;
    // One call per run of consecutive rows (a contiguous slice of the whole is one panel), appended to the first.
    QTensor q;
    for (int64_t i = 0; i < rows;) {
      int64_t j = i + 1;
      while (j < rows && at[j] == at[j - 1] + 1) ++j;
      QTensor p = quantize_rows(x.data() + i * cols, at[i], j - i, cols, cfg, amax);
      if (i == 0) {
        q = std::move(p);
      } else {
        q.codes.insert(q.codes.end(), p.codes.begin(), p.codes.end());
        q.scales.insert(q.scales.end(), p.scales.begin(), p.scales.end());
        q.scale_codes.insert(q.scale_codes.end(), p.scale_codes.begin(), p.scale_codes.end());
      }
      i = j;
    }
    q.rows = rows;
    return q;
  }, "x"_a.noconvert(), "config"_a, "index"_a.noconvert(), "amax"_a,
        "Rows index[i] of a larger tensor (x's row i) quantised as quantize_f32 quantises them within it, with the "
        "larger tensor's amax (ue4m3's global scale; other scales ignore it).");
  m.def("validate", [](const QuantConfig& cfg, int64_t rows, int64_t cols) { validate(cfg, rows, cols); },
        "config"_a, "rows"_a, "cols"_a, "Raises ValueError when a [rows, cols] operand cannot be quantised so.");
  m.def("make_qtensor", &make_qtensor, "format"_a, "scale"_a, "block"_a, "tile2d"_a, "codes"_a, "scales"_a,
        "global_scale"_a, "rht"_a = 0, "rht_signs"_a = std::vector<float>());
  m.def("check_gemm_operands", [](const QTensor& a, const QTensor& b) { check_gemm_operands(a, b); }, "a"_a, "b"_a,
        "Raises ValueError, with the reason, when the contract does not define A . B^T (docs/spec.md §5).");
  m.def("gemm", [](const QTensor& a, const QTensor& b) {
    require_threads();
    std::vector<float> c;
    {
      nb::gil_scoped_release release;
      c = gemm(a, b);
    }
    return owned(std::move(c), {size_t(a.rows), size_t(b.rows)});
  }, "a"_a, "b"_a, "C = A . B^T under the datapath contract (docs/datapath.md)");
}

}  // namespace fp4lab::py
