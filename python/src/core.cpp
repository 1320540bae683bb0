// fp4lab._core: the Python binding of the golden model (and of the CUDA kernels where they are built).
//
// No arithmetic lives here: every call goes to the same C++ functions the command line calls
// (fp4lab::operand_config for the knobs, fp4lab::quantize, fp4lab::gemm, fp4lab::cuda::*), so results are
// bit-identical to the CLI by construction. Errors keep the C++ one-line messages: std::invalid_argument
// (and fp4lab::KnobError) and the file reader's and writer's fp4lab::io::Error arrive in Python as ValueError.
// analyze() calls the trace analysis library (fp4lab/trace_analysis.hpp) that `fp4lab analyze` calls, and
// returns the dict its JSON reads as; the safetensors and trace v1 functions are the reader and writer of
// fp4lab/io/safetensors.hpp, which the command line uses.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>  // Knobs: text, or a typed value
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "fp4lab/gemm.hpp"
#include "fp4lab/io/files.hpp"
#include "fp4lab/io/safetensors.hpp"
#include "fp4lab/knobs.hpp"
#include "fp4lab/quantize.hpp"
#include "fp4lab/recipe.hpp"
#include "fp4lab/rht.hpp"
#include "fp4lab/sim/model_shapes.hpp"
#include "fp4lab/trace_analysis.hpp"
#include "fp4lab/version.hpp"
#include "exit_codes.hpp"  // cli/: the exit codes every front-end uses (Python's console scripts included)
#include "outputs.hpp"  // cli/: the rules every output path is held to
#include "text.hpp"  // cli/: the command line's escaping and quoting, so messages and records match it
#include "threads.hpp"  // cli/: the OpenMP thread counts a run may ask for
#if FP4LAB_PY_CUDA
#include "fp4lab/cuda/kernels.hpp"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace fp4lab::py {
namespace {

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
[[noreturn]] void raise_fault(bool usage, const std::string& msg) {
  nb::object cls;
  try {
    cls = nb::module_::import_("fp4lab._files").attr(usage ? "UsageError" : "DataError");
  } catch (const nb::python_error&) {
    cls = nb::borrow(PyExc_ValueError);
  }
  const nb::object e = cls(nb::str(cli::printable(msg).c_str()));
  PyErr_SetObject(cls.ptr(), e.ptr());
  throw nb::python_error();
}

// OMP_NUM_THREADS as this module found it when imported, which is when libgomp read it too (cli/threads.hpp): a
// count OpenMP cannot honour is refused (UsageError) by every call that would start threads, before it starts any.
std::optional<std::string>& threads_fault() {
  static std::optional<std::string> fault;
  return fault;
}
void require_threads() {
  if (const auto& f = threads_fault())
    raise_fault(true, *f + "; fp4lab's calls that run threads refuse it (set it before Python starts)");
}

nb::dict config_dict(const QuantConfig& c) {
  nb::dict d;
  d["label"] = c.label();
  d["format"] = c.format.name;
  d["block"] = c.block;
  d["tile2d"] = c.tile2d;
  d["scale"] = scale_name(c.scale);
  d["rht"] = c.rht;
  d["rht_signs"] = signs_string(c.rht_signs);
  d["rht_bf16"] = c.rht_bf16;
  d["rounding"] = rounding_name(c.rounding);
  d["seed"] = c.seed;
  d["stream"] = c.stream;
  return d;
}

nb::dict format_dict(const ElemFormat& f) {
  nb::dict d;
  std::vector<float> levels;
  std::vector<int> ints;
  for (int i = 0; i < f.num_levels(); ++i) {
    levels.push_back(f.level(i));
    ints.push_back(f.int_level(i));
  }
  d["name"] = f.name;
  d["ebits"] = f.ebits;
  d["mbits"] = f.mbits;
  d["bias"] = f.bias;
  d["max_index"] = f.max_index;
  d["levels"] = levels;
  d["int_levels"] = ints;
  d["int_shift"] = f.int_shift();
  d["gmax"] = f.gmax();
  d["emax"] = f.emax();
  return d;
}

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

// The rotation a rebuilt operand says it was quantised under: none (no signs), or a valid size with its d signs.
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

// A QTensor from its parts (codes one per byte, decoded scales, the rotation it was quantised under), checked like
// the CLI checks a file.
QTensor make_qtensor(const std::string& format, const std::string& scale, int block, bool tile2d,
                     nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> codes,
                     nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu> scales, float global_dec,
                     int rht, const std::vector<float>& rht_signs) {
  QTensor q;
  q.format = parse_format(format);
  q.scale_kind = parse_scale(scale);
  q.block = block;
  q.tile2d = tile2d;
  // S_dec = 1 / S_enc with 0 < S_enc <= FLT_MAX (docs/spec.md §2): a NaN, infinite, zero or negative global
  // scale is no quantised operand.
  if (!(std::isfinite(global_dec) && global_dec > 0.0f))
    throw std::invalid_argument("global_scale must be a positive finite number, not " + std::to_string(global_dec));
  check_rotation(rht, rht_signs);
  q.rht = rht;
  q.rht_signs = rht_signs;
  q.rows = int64_t(codes.shape(0));
  q.cols = int64_t(codes.shape(1));
  if (block != 16 && block != 32) throw std::invalid_argument("block size must be 16 or 32, not " + std::to_string(block));
  if (q.cols % block != 0)
    throw std::invalid_argument("codes have " + std::to_string(q.cols) + " columns, not a multiple of the block size " +
                                std::to_string(block));
  if (int64_t(scales.shape(0)) != q.rows || int64_t(scales.shape(1)) != q.cols / block)
    throw std::invalid_argument("scales must have shape [" + std::to_string(q.rows) + ", " +
                                std::to_string(q.cols / block) + "]");
  q.codes.assign(codes.data(), codes.data() + codes.size());
  for (uint8_t c : q.codes)
    if (!code_valid(q.format, c))
      throw std::invalid_argument("code " + std::to_string(int(c)) + " is not a " + std::string(q.format.name) + " code");
  q.scales.assign(scales.data(), scales.data() + scales.size());
  check_finite(q.scales.data(), int64_t(q.scales.size()), "scales");
  q.global_dec = global_dec;
  return q;
}

// ---- analyze -------------------------------------------------------------------------------------------------
// A JSON value as json.loads reads the text `fp4lab analyze --json` writes: ordered keys, doubles as they are (the
// JSON text is their shortest round-trip form), non-finite numbers as None (the writer spells them null), and
// strings decoded with invalid UTF-8 replaced (the writer's error handler replaces them too).
nb::object to_python(const nlohmann::ordered_json& j) {
  using V = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case V::null: return nb::none();
    case V::boolean: return nb::bool_(j.get<bool>());
    case V::number_integer: return nb::int_(j.get<int64_t>());
    case V::number_unsigned: return nb::steal(PyLong_FromUnsignedLongLong(j.get<uint64_t>()));
    case V::number_float: {
      const double v = j.get<double>();
      return std::isfinite(v) ? nb::object(nb::float_(v)) : nb::none();
    }
    case V::string: {
      const std::string& t = j.get_ref<const std::string&>();
      PyObject* o = PyUnicode_DecodeUTF8(t.data(), Py_ssize_t(t.size()), "replace");
      if (!o) throw nb::python_error();
      return nb::steal(o);
    }
    case V::array: {
      nb::list l;
      for (const auto& v : j) l.append(to_python(v));
      return l;
    }
    case V::object: {
      nb::dict d;
      for (const auto& [k, v] : j.items()) d[nb::str(k.c_str(), k.size())] = to_python(v);
      return d;
    }
    default: throw std::logic_error("to_python: a JSON value of a type analyze never writes");
  }
}

// The members every fp4lab JSON output ends with: the build that wrote it (the command line's JsonOut too).
nlohmann::ordered_json stamps() { return {{"fp4lab_version", kVersion}, {"git_commit", kGitCommit}}; }

// Ctrl-C during a long call: `work` runs on a thread of its own while the calling thread waits with the GIL released
// and, every 50 ms, runs Python's signal handlers (only the main thread can). When one raises (KeyboardInterrupt),
// `stop` is set, the work ends at its next check (the analysis checks at each record), and the handler's exception is
// raised here once it has: within about a record's time, not after the whole analysis, and with nothing half written.
struct Interrupted {};  // thrown by a check once `stop` is set; not a std::exception, so no handler turns it into one
void run_interruptible(const std::function<void()>& work, std::atomic<bool>& stop) {
  std::exception_ptr fault;
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::thread t([&] {
    try {
      work();
    } catch (...) {
      fault = std::current_exception();
    }
    const std::lock_guard<std::mutex> g(m);
    done = true;
    cv.notify_one();
  });
  bool raised = false;
  for (;;) {
    {
      nb::gil_scoped_release release;
      std::unique_lock<std::mutex> lk(m);
      if (cv.wait_for(lk, std::chrono::milliseconds(50), [&] { return done; })) break;
    }
    if (!raised && PyErr_CheckSignals() != 0) {
      raised = true;  // the exception stays set until the work has stopped
      stop = true;
    }
  }
  t.join();
  if (raised) throw nb::python_error();
  if (fault) std::rethrow_exception(fault);
}

// The analysis of a trace with the options as `fp4lab analyze` spells them (option name without dashes -> text).
// Faults are the command line's one-line messages, as the package's UsageError or DataError (ValueErrors; MemoryError
// when memory runs out). With json_path, the document goes to that file as `fp4lab analyze --json FILE` writes it (in
// pieces, through a temporary name: memory that of the command line, not of a dict of the whole report), and None is
// returned. Ctrl-C stops it at the next record (run_interruptible), leaving no output and no temporary.
nb::object analyze(const std::vector<std::string>& traces, const std::map<std::string, std::string>& options,
                   const std::optional<std::string>& json_path) {
  require_threads();
  // The options in the order of the command line recorded in config.command: the one that writes this same JSON.
  static const char* const kOrder[] = {"formats", "rht", "recipe", "rht-signs", "rht-seed", "block", "scale", "seed"};
  for (const auto& [k, v] : options)
    if (std::find_if(std::begin(kOrder), std::end(kOrder), [&](const char* n) { return k == n; }) == std::end(kOrder))
      raise_fault(true, "analyze: unknown option '" + k + "'");
  if (traces.empty()) raise_fault(true, "analyze: no trace given");
  if (json_path) {  // the path first, as the command line checks --json before the options and traces
    if (json_path->empty() || *json_path == "-")
      raise_fault(true, "analyze: json needs a file name (the command line's '-', stdout, is not one)");
    if (const auto f = cli::output_fault({*json_path}, {})) raise_fault(f->usage, f->message);
  }
  std::string command = "fp4lab analyze --trace";
  for (const auto& t : traces) command += " " + cli::shell_quote(t);
  command += " --json " + cli::shell_quote(json_path ? *json_path : "-");
  AnalysisOptions o;
  o.traces = traces;
  nlohmann::ordered_json j;
  std::atomic<bool> stop{false};
  const AnalysisProgress progress = [&stop](size_t, size_t, const std::string&) {
    if (stop) throw Interrupted{};
  };
  try {
    for (const char* name : kOrder) {
      const auto it = options.find(name);
      if (it == options.end()) continue;
      command += std::string(" --") + name + " " + cli::shell_quote(it->second);
      const std::string& v = it->second;
      const std::string n = name;
      if (n == "formats") o.formats = v;
      else if (n == "rht") o.rht = v;
      else if (n == "recipe") o.recipes = v;
      else if (n == "rht-signs") o.rht_signs = v;
      else if (n == "rht-seed") o.rht_seed = v;
      else if (n == "block") o.block = parse_int(v, "block");
      else if (n == "scale") o.scale = v;
      else o.seed = v;
    }
    // The analysis runs on OpenMP threads, the GIL released: other Python threads may go on.
    run_interruptible([&] {
      if (json_path) {
        const auto check = [&](const TraceAnalysis& ta) {  // before any record is analysed, as the command line does
          if (const auto f = cli::output_fault({*json_path}, ta.inputs())) throw AnalysisError(f->usage, f->message);
        };
        const AnalysisResult r = analyze_traces(o, progress, check);
        io::AtomicFile f(*json_path);  // io::Error names the file; nothing is left under it on failure or Ctrl-C
        write_analysis_json(r, command, stamps(), [&](const std::string& piece) {
          if (stop) throw Interrupted{};
          f.write(piece.data(), piece.size());
        });
        f.write("\n", 1);
        f.commit();
      } else {
        j = analysis_json(analyze_traces(o, progress), command);
      }
    }, stop);
  } catch (const nb::python_error&) {
    throw;  // KeyboardInterrupt, or whatever else a signal handler raised
  } catch (const std::bad_alloc&) {
    throw;  // MemoryError
  } catch (const AnalysisError& e) {
    raise_fault(e.usage, e.what());
  } catch (const io::Error& e) {
    raise_fault(false, e.what());
  } catch (const std::invalid_argument& e) {  // an option value (KnobError)
    raise_fault(true, e.what());
  } catch (const std::exception& e) {
    raise_fault(false, e.what());
  }
  if (json_path) return nb::none();  // (made here, with the GIL held again)
  const nlohmann::ordered_json tail = stamps();  // every fp4lab JSON output ends with the build that wrote it
  for (const auto& [k, v] : tail.items()) j[k] = v;
  return to_python(j);
}

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

#if FP4LAB_PY_CUDA
namespace fc = fp4lab::cuda;
// FP32 or BF16 (torch.bfloat16), checked at run time.
using CudaAny2 = nb::ndarray<nb::ndim<2>, nb::c_contig, nb::device::cuda>;
const nb::dlpack::dtype kBf16{uint8_t(nb::dlpack::dtype_code::Bfloat), 16, 1};
using CudaOut = nb::ndarray<float, nb::ndim<2>, nb::c_contig, nb::device::cuda>;

// Scratch memory of the kernels, one set per process, reused across calls (kernels run in stream order).
struct Workspaces {
  fc::QuantWorkspace quant;
  fc::GemmWorkspace gemm;
  int gemm_variant = -1;  // the fast GEMM's tile variant (-1: its default); all give the same bits
  fc::OperandStatsWorkspace stats;
};
Workspaces& workspaces() {
  static Workspaces* w = new Workspaces;  // never destroyed: freeing device memory at exit races the driver
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
#endif

}  // namespace
}  // namespace fp4lab::py

NB_MODULE(_core, m) {
  using namespace fp4lab;
  using namespace fp4lab::py;
  m.doc() = "fp4lab golden model (C++) bindings; use the fp4lab package, not this module";
  m.attr("__version__") = kVersion;
  m.attr("git_commit") = kGitCommit;
  m.attr("cuda_built") = bool(FP4LAB_PY_CUDA);
  threads_fault() = cli::threads_env_fault();
  cli::one_level_of_threads();
  m.def("threads_fault", [] { return threads_fault(); },
        "The fault of OMP_NUM_THREADS as the module found it (docs/spec.md §11.1), or None.");
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const std::invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const io::Error& e) {
      // Paths come from the caller and are not escaped by the reader: keep the message on one printable line.
      PyErr_SetString(PyExc_ValueError, cli::printable(e.what()).c_str());
    }
  });

  // Objects of this module can outlive the interpreter's last collection (a QuantConfig cached in a recipe that a
  // torch module holds in a reference cycle); that is no leak while the process ends, so nanobind's report is off.
  nb::set_leak_warnings(false);

  // Pickling state: every field, in the names the knobs parse, so copies, torch.save and multiprocessing work.
  using ConfigState = std::tuple<std::string, int, bool, std::string, int, std::vector<float>, bool, std::string,
                                 uint64_t, uint32_t>;
  nb::class_<QuantConfig>(m, "QuantConfig")
      .def_prop_ro("label", &QuantConfig::label)
      .def("to_dict", &config_dict)
      .def("__getstate__", [](const QuantConfig& c) {
        return ConfigState(c.format.name, c.block, c.tile2d, scale_name(c.scale), c.rht, c.rht_signs, c.rht_bf16,
                           rounding_name(c.rounding), c.seed, c.stream);
      })
      .def("__setstate__", [](QuantConfig& c, const ConfigState& s) {
        QuantConfig v;
        v.format = parse_format(std::get<0>(s));
        v.block = std::get<1>(s);
        v.tile2d = std::get<2>(s);
        v.scale = parse_scale(std::get<3>(s));
        v.rht = std::get<4>(s);
        v.rht_signs = std::get<5>(s);
        v.rht_bf16 = std::get<6>(s);
        v.rounding = parse_rounding(std::get<7>(s));
        v.seed = std::get<8>(s);
        v.stream = std::get<9>(s);
        new (&c) QuantConfig(std::move(v));
      })
      .def("__repr__", [](const QuantConfig& c) { return "<fp4lab.QuantConfig " + c.label() + ">"; })
      // A training step's settings from its layer's: only the SR key changes from step to step (docs/spec.md §12),
      // and a copy is cheaper than parsing the knobs again, hundreds of times a step.
      .def("with_seed", [](const QuantConfig& c, uint64_t seed) {
        QuantConfig v = c;
        v.seed = seed;
        return v;
      }, "seed"_a, "A copy of these settings with another stochastic-rounding seed.");

  // The command line's output rules and exit codes, so that the Python front-ends hold their outputs to the same
  // rules and end with the same codes (python/fp4lab/_files.py).
  m.def("output_fault", [](const std::vector<std::string>& outputs, const std::vector<std::string>& inputs)
            -> std::optional<std::tuple<bool, std::string>> {
        if (auto f = cli::output_fault(outputs, inputs)) return std::make_tuple(f->usage, f->message);
        return std::nullopt;
      }, "outputs"_a, "inputs"_a,
        "The first fault of the outputs against the command line's rules, as (usage, message), or None.");
  m.def("exit_codes", [] {
    std::vector<std::tuple<int, std::string>> rows;
    for (const auto& e : cli::kExitCodes) rows.emplace_back(e.code, e.meaning);
    return rows;
  }, "The command line's exit codes and their meanings (cli/exit_codes.hpp).");
  m.def("knob_names", &knob_names, "with_role"_a = true);
  m.def("operand_config", [](const Knobs& k, const std::string& pass, const std::string& operand) {
    const Pass p = pass.empty() ? selected_pass(k) : parse_pass(pass);
    Operand o;
    if (operand.empty()) o = selected_operand(k, p);
    else if (operand == "a") o = Operand::a;
    else if (operand == "b") o = Operand::b;
    else throw std::invalid_argument("operand must be 'a' or 'b', not '" + operand + "'");
    return operand_config(k, p, o);
  }, "knobs"_a, "pass_"_a = "", "operand"_a = "",
        "Quantiser settings of one operand: the recipe's, then the knobs on top (the CLI's rules and messages).");
  m.def("selected_pass", [](const Knobs& k) { return std::string(pass_name(selected_pass(k))); });
  m.def("training_seed", &training_seed, "seed"_a, "step"_a);
  // The scale codecs of scale.hpp, element-wise, so tests can hold them against independent implementations.
  using F1 = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
  using U1 = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
  m.def("ue4m3_encode", [](F1 x) {
    std::vector<uint8_t> out(x.shape(0));
    for (size_t i = 0; i < out.size(); ++i) out[i] = ue4m3_encode(x.data()[i]);
    return owned(std::move(out), {x.shape(0)});
  }, "x"_a.noconvert(), "E4M3 codes of non-negative finite values (RTNE, saturating at 448), as block scales use");
  m.def("e4m3_decode", [](U1 c) {
    std::vector<float> out(c.shape(0));
    for (size_t i = 0; i < out.size(); ++i) out[i] = e4m3_decode(c.data()[i]);
    return owned(std::move(out), {c.shape(0)});
  }, "codes"_a.noconvert());
  m.def("e8m0_decode", [](U1 c) {
    std::vector<float> out(c.shape(0));
    for (size_t i = 0; i < out.size(); ++i) out[i] = e8m0_decode(c.data()[i]);
    return owned(std::move(out), {c.shape(0)});
  }, "codes"_a.noconvert());
  m.def("e8m0_encode_exp", &e8m0_encode_exp, "exponent"_a, "E8M0 code of 2^exponent (clamped to [-127, 127])");
  m.def("decode_table", [](const std::string& format) {
    const ElemFormat f = parse_format(format);
    std::vector<float> t(16);
    for (int c = 0; c < 16; ++c) t[size_t(c)] = code_valid(f, uint8_t(c)) ? decode(f, uint8_t(c)) : NAN;
    return t;
  }, "format"_a, "The value of each 4-bit code (NaN for codes the format does not use).");
  m.def("recipe_names", &Recipe::preset_names, "The presets, in table order.");
  m.def("recipe_rows", [] {
    nb::list l;
    for (const RecipeRow& row : recipe_table()) {
      nb::dict d;
      d["name"] = row.recipe.name;
      d["kind"] = recipe_kind_name(row.kind);
      d["base"] = row.base;
      d["study"] = row.study;
      d["what"] = row.what;
      l.append(d);
    }
    return l;
  }, "Every named recipe (the presets, then the ablations): name, kind, base, study (its place in the paper's "
     "ablation study, 0: none) and what.");
  m.def("formats", [] {
    nb::list l;
    for (const ElemFormat& f : kAllFormats) l.append(format_dict(f));
    return l;
  });
  m.def("recipe_table", [](const std::string& name) {
    const Recipe r = Recipe::preset(name);
    nb::dict out;
    for (Pass p : kPasses) {
      nb::dict pd;
      for (Operand o : {Operand::a, Operand::b}) {
        nb::dict od = config_dict(r.operand(p, o));
        od["role"] = operand_role(p, o);
        pd[o == Operand::a ? "a" : "b"] = od;
      }
      out[pass_name(p)] = pd;
    }
    return out;
  });

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
  m.def("validate", [](const QuantConfig& cfg, int64_t rows, int64_t cols) { validate(cfg, rows, cols); },
        "config"_a, "rows"_a, "cols"_a, "Raises ValueError when a [rows, cols] operand cannot be quantised so.");
  m.def("make_qtensor", &make_qtensor, "format"_a, "scale"_a, "block"_a, "tile2d"_a, "codes"_a, "scales"_a,
        "global_scale"_a, "rht"_a = 0, "rht_signs"_a = std::vector<float>());
  m.def("check_gemm_operands", [](const QTensor& a, const QTensor& b) { check_gemm_operands(a, b); }, "a"_a, "b"_a,
        "Raises ValueError, with the reason, when the contract does not define A . B^T (docs/spec.md §5).");
  m.def("analyze", &analyze, "traces"_a, "options"_a, "json_path"_a = nb::none(),
        "The docs/spec.md §6 analyses of trace folders or files: the dict `fp4lab analyze --json` writes, or with "
        "json_path that document written to the file (None returned).");
  // A model's training-step GEMMs from its Hugging Face config.json: the rule `fp4lab sim --model` replays.
  m.attr("max_shape_dim") = int64_t(sim::kMaxShapeDim);
  m.def("model_shapes", [](const std::string& source, bool is_file, int64_t tokens, int64_t multiple) {
    sim::ModelShapes s;
    if (is_file) {
      s = sim::read_model_shapes(source, tokens);
    } else {
      try {
        s = sim::model_shapes(sim::parse_model_config(source, "config"), tokens);
      } catch (const std::invalid_argument& e) {
        const std::string m = e.what();  // "config: ..." from the parser already
        throw std::invalid_argument(m.rfind("config: ", 0) == 0 ? m : "config: " + m);
      }
    }
    if (multiple < 1 || multiple > sim::kMaxShapeDim)
      throw std::invalid_argument("multiple = " + std::to_string(multiple) + " is outside 1.." +
                                  std::to_string(sim::kMaxShapeDim));
    const std::vector<sim::LayerShape> rows = sim::pad_shapes(s.layers, {multiple, multiple, multiple});
    std::vector<std::tuple<std::string, int64_t, int64_t, int64_t, int64_t>> out;
    for (const sim::LayerShape& l : rows) out.emplace_back(l.gemm, l.tokens, l.in, l.out, int64_t(l.count));
    return std::make_tuple(s.model_type, s.summary, out);
  }, "source"_a, "is_file"_a, "tokens"_a, "multiple"_a = 1,
     "(model_type, summary, [(gemm, tokens, in, out, count)]) of one training step of the model a config.json "
     "describes (its path, or its text with is_file false); every dimension rounded up to a multiple of `multiple`.");
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
  m.def("gemm", [](const QTensor& a, const QTensor& b) {
    require_threads();
    std::vector<float> c;
    {
      nb::gil_scoped_release release;
      c = gemm(a, b);
    }
    return owned(std::move(c), {size_t(a.rows), size_t(b.rows)});
  }, "a"_a, "b"_a, "C = A . B^T under the datapath contract (docs/datapath.md)");

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
  m.def("cuda_upload", [](const QTensor& q, fc::DQTensor& out) { fc::upload(q, out); }, "q"_a, "out"_a);
  // A device operand from device tensors (packed codes [rows, cols/2], block scales [rows, cols/block], the
  // global scale [1]), copied on the stream into out's buffers (which grow only): how the torch.library GEMM
  // operator hands its tensors to the kernels without a host round trip.
  m.def("cuda_make_qtensor", [](const std::string& format, const std::string& scale, int block, bool tile2d,
                                nb::ndarray<uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cuda> packed,
                                nb::ndarray<float, nb::ndim<2>, nb::c_contig, nb::device::cuda> scales,
                                nb::ndarray<float, nb::ndim<1>, nb::c_contig, nb::device::cuda> global_scale,
                                fc::DQTensor& out, uintptr_t stream, int rht, const std::vector<float>& rht_signs) {
    if (block != 16 && block != 32) throw std::invalid_argument("block size must be 16 or 32, not " + std::to_string(block));
    const int64_t rows = int64_t(packed.shape(0)), cols = 2 * int64_t(packed.shape(1));
    if (cols % block != 0)
      throw std::invalid_argument("codes have " + std::to_string(cols) + " columns, not a multiple of the block size " +
                                  std::to_string(block));
    if (int64_t(scales.shape(0)) != rows || int64_t(scales.shape(1)) != cols / block)
      throw std::invalid_argument("scales must have shape [" + std::to_string(rows) + ", " + std::to_string(cols / block) + "]");
    if (global_scale.shape(0) != 1) throw std::invalid_argument("the global scale is one value");
    out.format = parse_format(format);
    out.scale_kind = parse_scale(scale);
    out.block = block;
    out.tile2d = tile2d;
    check_rotation(rht, rht_signs);
    out.rht = rht;
    out.rht_signs = rht_signs;
    out.rows = rows;
    out.cols = cols;
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
    auto& ws = workspaces().quant;
    int* d_flag = device_ptr<int>(flag);
    const auto* d_seed = device_ptr<const uint64_t>(seed);
    const cudaStream_t st = as_stream(stream);
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
  // Fake quantisation in one pass: out (BF16, the quantised operand's shape) receives what cuda_dequantize would
  // write in BF16 for the operand cuda_quantize makes of x (transposed: of x^T); q, when given, receives it too.
  m.def("cuda_fake_quantize", [](int device, uintptr_t stream, uintptr_t x, int64_t rows, int64_t cols, bool bf16,
                                 bool transposed, const QuantConfig& cfg, uintptr_t out, const std::string& path,
                                 bool check_finite, uintptr_t flag, fc::DQTensor* q, uintptr_t seed) {
    const auto p = rht_path(path);
    OnDevice on(device);
    fc::fake_quantize(device_ptr<const void>(x), bf16, transposed, rows, cols, cfg, device_ptr<uint16_t>(out), q,
                      workspaces().quant, as_stream(stream), p, check_finite, device_ptr<int>(flag),
                      device_ptr<const uint64_t>(seed));
  }, "device"_a, "stream"_a, "x"_a, "rows"_a, "cols"_a, "bf16"_a, "transposed"_a, "config"_a, "out"_a,
     "path"_a = "fused", "check_finite"_a = true, "nonfinite_flag"_a = 0, "q"_a = nb::none(), "seed"_a = 0,
     "Fake quantisation in one pass: out (BF16, [rows, cols], or [cols, rows] when transposed) receives what "
     "cuda_dequantize would write in BF16 for the operand cuda_quantize makes of x; q, when given, receives it too.");
  m.def("cuda_flag_nonfinite", [](int device, uintptr_t stream, uintptr_t y, int64_t n, bool bf16, uintptr_t flag,
                                  int bit) {
    OnDevice on(device);
    fc::flag_nonfinite(device_ptr<const void>(y), bf16, n, device_ptr<int>(flag), bit, as_stream(stream));
  }, "device"_a, "stream"_a, "y"_a, "n"_a, "bf16"_a, "flag"_a, "bit"_a,
     "ORs bit into the int at flag when any of the n FP32 (or BF16) values at y is NaN or Inf.");
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
    fc::operand_stats(x.data(), ref.data(), dq.data(), codes.data(), int64_t(n), saturated_codes, out.data(),
                      workspaces().stats, as_stream(stream));
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
      fc::gemm_fast(a, b, o, workspaces().gemm, as_stream(stream), workspaces().gemm_variant);
    } else {
      fc::gemm_reference(a, b, device_ptr<float>(out), as_stream(stream));
    }
  }, "device"_a, "stream"_a, "a"_a, "b"_a, "out"_a, "kernel"_a = "fast", "bf16"_a = false, "flag"_a = 0, "bit"_a = 0);
  // The fast GEMM's fused epilogue (on by default; the same bits either way, docs/datapath.md §3): off times the
  // separate multiply and add beside it. Returns the previous setting.
  m.def("cuda_gemm_fused_epilogue", [](bool on) {
    const bool was = workspaces().gemm.fused_epilogue;
    workspaces().gemm.fused_epilogue = on;
    return was;
  }, "on"_a);
  // How many tile variants the fast GEMM has on this device (fp4lab cuda bench lists them).
  m.def("cuda_gemm_variants", [] { return fc::gemm_fast_variants(); });
  // The fast GEMM's tile variant for every later call (-1: the default per shape; the same bits from each): for
  // timing one beside another. Returns the previous setting.
  m.def("cuda_gemm_variant", [](int v) {
    if (v < -1 || v >= fc::gemm_fast_variants())
      throw std::invalid_argument("no fast GEMM variant " + std::to_string(v) + " on this device (there are " +
                                  std::to_string(fc::gemm_fast_variants()) + ")");
    return std::exchange(workspaces().gemm_variant, v);
  }, "variant"_a);
#else
  m.def("cuda_available", [] { return nb::make_tuple(false, std::string("this fp4lab was built without CUDA (no nvcc found)")); });
#endif
}
