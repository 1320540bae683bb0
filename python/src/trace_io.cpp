// The safetensors reader and writer and trace v1 (docs/spec.md §7), as the command line reads them.
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "fp4lab/io/safetensors.hpp"

#include "common.hpp"

using namespace nb::literals;

namespace fp4lab::py {
namespace {

// ---- safetensors and trace v1 (docs/spec.md §7) ----------------------------------------------------------------
// Tensors cross as (name, dtype name, shape, bytes as a flat uint8 array): numpy has no BF16 or FP8 of its own, so
// the Python side views the bytes with the dtype the name gives (ml_dtypes' for those).
using Bytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using RawTensor = std::tuple<std::string, std::string, std::vector<int64_t>, Bytes>;

// A file's metadata and its tensors in header order, each tensor's bytes in an array of its own (so the arrays
// outlive the file and can be written to).
nb::tuple read_safetensors(const std::string& path) {
  const io::SafetensorsFile f(path);
  nb::list tensors;
  for (const io::TensorInfo& t : f.tensors()) {
    std::vector<uint8_t> b = f.read_bytes(t.name);
    const size_t n = b.size();
    tensors.append(nb::make_tuple(t.name, io::dtype_name(t.dtype), t.shape, owned(std::move(b), {n})));
  }
  return nb::make_tuple(f.metadata(), tensors);
}

// Every dtype of the reader: the enum's values up to the first without a size.
std::vector<io::DType> all_dtypes() {
  std::vector<io::DType> out;
  for (int d = 0; io::dtype_size(io::DType(d)) != 0; ++d) out.push_back(io::DType(d));
  return out;
}

io::DType parse_dtype(const std::string& path, const std::string& name) {
  for (io::DType d : all_dtypes())
    if (name == io::dtype_name(d)) return d;
  throw io::Error(path + ": dtype '" + name + "' is not a safetensors dtype");
}

void write_safetensors(const std::string& path, const std::vector<RawTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<io::OutTensor> out;
  out.reserve(tensors.size());
  for (const auto& [name, dtype, shape, bytes] : tensors)
    out.push_back({name, parse_dtype(path, dtype), shape, std::vector<uint8_t>(bytes.data(), bytes.data() + bytes.size())});
  nb::gil_scoped_release release;
  io::write_safetensors(path, out, metadata);
}

nb::dict record_dict(const io::Trace& t, const io::TraceRecord& r) {
  nb::dict d;
  d["gemm"] = r.gemm;
  d["file"] = r.file;
  d["tokens"] = r.tokens;
  d["in"] = r.in;
  d["out"] = r.out;
  d["dtype"] = io::dtype_name(t.file(r.file).info(r.gemm + ".fwd_x").dtype);
  return d;
}

}  // namespace

void bind_io(nb::module_& m) {
  m.def("safetensors_dtypes", [] {
    std::map<std::string, size_t> d;
    for (io::DType t : all_dtypes()) d[io::dtype_name(t)] = io::dtype_size(t);
    return d;
  }, "Every safetensors dtype the reader knows, with its size in bytes.");
  m.def("read_safetensors", &read_safetensors, "path"_a,
        "(metadata, [(name, dtype, shape, bytes)]) of a safetensors file, the header fully validated.");
  m.def("write_safetensors", &write_safetensors, "path"_a, "tensors"_a, "metadata"_a,
        "Writes [(name, dtype, shape, bytes)] and metadata under a temporary name, renamed when complete.");
  nb::class_<io::Trace>(m, "Trace")
      .def(nb::init<const std::string&, int>(), "path"_a, "block"_a = 16,
           "Opens a trace v1 folder or file and validates every header and record (docs/spec.md §7).")
      .def_prop_ro("records", [](const io::Trace& t) {
        nb::list l;
        for (const io::TraceRecord& r : t.records()) l.append(record_dict(t, r));
        return l;
      }, "One dict per gemm (gemm, file, tokens, in, out, dtype of fwd_x), in the reader's order.")
      .def("metadata", &io::Trace::metadata, "file"_a)
      .def("load", [](const io::Trace& t, size_t i) {
        if (i >= t.records().size())
          throw std::invalid_argument("record " + std::to_string(i) + " of a trace of " +
                                      std::to_string(t.records().size()));
        const io::TraceRecord& r = t.records()[i];
        io::Trace::Layer l;
        {
          nb::gil_scoped_release release;
          l = t.load(r);
        }
        const auto tk = size_t(r.tokens), in = size_t(r.in), out = size_t(r.out);
        return nb::make_tuple(owned(std::move(l.x), {tk, in}), owned(std::move(l.w), {out, in}),
                              owned(std::move(l.dy), {tk, out}));
      }, "index"_a, "Record `index` as FP32 arrays (X, W, dY); NaN or Inf is an error naming tensor and element.");
}

}  // namespace fp4lab::py
