// fp4lab._core: the Python binding of the golden model (and of the CUDA kernels where they are built). This file
// makes the module; each other file of python/src binds one concern (common.hpp lists them).
//
// No arithmetic lives here: every call goes to the same C++ functions the command line calls
// (fp4lab::operand_config for the knobs, fp4lab::quantize, fp4lab::gemm, fp4lab::cuda::*), so results are
// bit-identical to the CLI by construction. Errors keep the C++ one-line messages: std::invalid_argument
// (and fp4lab::SettingsError) and the file reader's and writer's fp4lab::io::Error arrive in Python as ValueError.
// analyze() calls the trace analysis library (fp4lab/trace_analysis.hpp) that `fp4lab analyze` calls, and
// returns the dict its JSON reads as; the safetensors and trace v1 functions are the reader and writer of
// fp4lab/io/safetensors.hpp, which the command line uses.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "common.hpp"
#include "fp4lab/io/safetensors.hpp"  // io::Error
#include "fp4lab/version.hpp"
#include "fp4lab/io/exit_codes.hpp"  // the exit codes every front-end uses (Python's console scripts included)
#include "fp4lab/io/outputs.hpp"     // the rules every output path is held to
#include "fp4lab/text.hpp"           // the command line's escaping and quoting, so messages and records match it
#include "fp4lab/io/threads.hpp"     // the OpenMP thread counts a run may ask for

using namespace nb::literals;

namespace fp4lab::py {

// A fault as the package's DataError or UsageError (python/fp4lab/_files.py: ValueErrors that carry the command
// line's exit codes), or as a plain ValueError where that module cannot be imported.
[[noreturn]] void raise_fault(bool usage, const std::string& msg) {
  nb::object cls;
  try {
    cls = nb::module_::import_("fp4lab._files").attr(usage ? "UsageError" : "DataError");
  } catch (const nb::python_error&) {
    cls = nb::borrow(PyExc_ValueError);
  }
  const nb::object e = cls(nb::str(printable(msg).c_str()));
  PyErr_SetObject(cls.ptr(), e.ptr());
  throw nb::python_error();
}

// OMP_NUM_THREADS as this module found it when imported, which is when libgomp read it too (fp4lab/io/threads.hpp): a
// count OpenMP cannot honour is refused (UsageError) by every call that would start threads, before it starts any.
std::optional<std::string>& threads_fault() {
  static std::optional<std::string> fault;
  return fault;
}
void require_threads() {
  if (const auto& f = threads_fault())
    raise_fault(true, *f + "; fp4lab's calls that run threads refuse it (set it before Python starts)");
}

}  // namespace fp4lab::py

NB_MODULE(_core, m) {
  using namespace fp4lab;
  using namespace fp4lab::py;
  m.doc() = "fp4lab golden model (C++) bindings; use the fp4lab package, not this module";
  m.attr("__version__") = kVersion;
  m.attr("git_commit") = kGitCommit;
  m.attr("cuda_built") = bool(FP4LAB_PY_CUDA);
  threads_fault() = io::threads_env_fault();
  io::one_level_of_threads();
  m.def("threads_fault", [] { return threads_fault(); },
        "The fault of OMP_NUM_THREADS as the module found it (docs/spec.md §11.1), or None.");
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const std::invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const io::Error& e) {
      // Paths come from the caller and are not escaped by the reader: keep the message on one printable line.
      PyErr_SetString(PyExc_ValueError, printable(e.what()).c_str());
    }
  });

  // Objects of this module can outlive the interpreter's last collection (a QuantConfig cached in a recipe that a
  // torch module holds in a reference cycle); that is no leak while the process ends, so nanobind's report is off.
  nb::set_leak_warnings(false);

  // The command line's output rules and exit codes, so that the Python front-ends hold their outputs to the same
  // rules and end with the same codes (python/fp4lab/_files.py).
  m.def("output_fault", [](const std::vector<std::string>& outputs, const std::vector<std::string>& inputs)
            -> std::optional<std::tuple<bool, std::string>> {
        if (auto f = io::output_fault(outputs, inputs)) return std::make_tuple(f->usage, f->message);
        return std::nullopt;
      }, "outputs"_a, "inputs"_a,
        "The first fault of the outputs against the command line's rules, as (usage, message), or None.");
  m.def("exit_codes", [] {
    std::vector<std::tuple<int, std::string>> rows;
    for (const auto& e : io::kExitCodes) rows.emplace_back(e.code, e.meaning);
    return rows;
  }, "The command line's exit codes and their meanings (fp4lab/io/exit_codes.hpp).");

  // In this order: a signature names only classes bound before it (the type stubs read them so).
  bind_config(m);
  bind_quant(m);
  bind_analyze(m);
  bind_io(m);
  bind_cuda(m);
}
