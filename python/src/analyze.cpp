// Trace analysis (the library `fp4lab analyze` calls) and a model's training-step shapes.
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "fp4lab/io/files.hpp"
#include "fp4lab/settings.hpp"
#include "fp4lab/sim/model_shapes.hpp"
#include "fp4lab/trace_analysis.hpp"
#include "fp4lab/version.hpp"
#include "fp4lab/io/outputs.hpp"  // the rules every output path is held to (the command line's too)
#include "fp4lab/text.hpp"        // the command line's escaping and quoting, so the recorded command matches it

#include "common.hpp"

using namespace nb::literals;

namespace fp4lab::py {
namespace {

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

// The options of an analysis as fp4lab.analyze hands them over: typed values, None where not given (the library's
// defaults then apply and the recorded command line leaves the option out).
struct PyAnalysisOptions {
  std::optional<std::vector<FormatId>> formats;
  std::optional<std::vector<int>> rht;  // 0: no rotation
  bool rht_signs_te = false;            // Transformer Engine's vector
  std::optional<std::vector<float>> rht_signs;
  std::optional<uint64_t> rht_seed;
  bool all_recipes = false;  // the presets, recorded as --recipe all
  std::optional<std::vector<std::string>> recipes;
  std::optional<int> block;
  std::optional<ScaleKind> scale;
  std::optional<uint64_t> seed;
  std::optional<SrDraw> sr_draw;
};

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + v[i];
  return s;
}

// The command line that writes the same JSON, options in the order this module always recorded them, each value in
// the spelling fp4lab analyze reads (the record of the analysis: config.command).
std::string analysis_command(const std::vector<std::string>& traces, const std::string& json,
                             const PyAnalysisOptions& p) {
  std::string c = "fp4lab analyze --trace";
  for (const auto& t : traces) c += " " + shell_quote(t);
  c += " --json " + shell_quote(json);
  const auto add = [&](const char* name, const std::string& v) {
    c += std::string(" --") + name + " " + shell_quote(v);
  };
  if (p.formats) {
    std::vector<std::string> n;
    for (FormatId f : *p.formats) n.push_back(kAllFormats[int(f)].name);
    add("formats", joined(n));
  }
  if (p.rht) {
    std::vector<std::string> n;
    for (int d : *p.rht) n.push_back(d == 0 ? "none" : std::to_string(d));
    add("rht", joined(n));
  }
  if (p.all_recipes) add("recipe", "all");
  else if (p.recipes) add("recipe", joined(*p.recipes));
  if (p.rht_signs_te) add("rht-signs", "te");
  else if (p.rht_signs) add("rht-signs", signs_string(*p.rht_signs));
  if (p.rht_seed) add("rht-seed", std::to_string(*p.rht_seed));
  if (p.block) add("block", std::to_string(*p.block));
  if (p.scale) add("scale", scale_name(*p.scale));
  if (p.seed) add("seed", std::to_string(*p.seed));
  if (p.sr_draw) add("sr-draw", sr_draw_name(*p.sr_draw));
  return c;
}

// The analysis of traces under typed options (fp4lab.analyze reads its keywords into them). Faults are the command
// line's one-line messages, as the package's UsageError or DataError (ValueErrors; MemoryError when memory runs out).
// With json_path, the document goes to that file as `fp4lab analyze --json FILE` writes it (in pieces, through a
// temporary name: memory that of the command line, not of a dict of the whole report), and None is returned. Ctrl-C
// stops it at the next record (run_interruptible), leaving no output and no temporary.
nb::object analyze(const std::vector<std::string>& traces, const PyAnalysisOptions& p,
                   const std::optional<std::string>& json_path) {
  require_threads();
  if (traces.empty()) raise_fault(true, "analyze: no trace given");
  if (json_path) {  // the path first, as the command line checks --json before the options and traces
    if (json_path->empty() || *json_path == "-")
      raise_fault(true, "analyze: json needs a file name (the command line's '-', stdout, is not one)");
    if (const auto f = io::output_fault({*json_path}, {})) raise_fault(f->usage, f->message);
  }
  const std::string command = analysis_command(traces, json_path ? *json_path : "-", p);
  // As the command line types them (cli/cmd_analyze.cpp): signs used only when a setting rotates, the seed only for
  // recipe runs.
  AnalysisOptions o;
  o.traces = traces;
  if (p.formats) {
    o.formats.clear();
    for (FormatId f : *p.formats) o.formats.push_back(kAllFormats[int(f)]);
  }
  if (p.rht) o.rht = *p.rht;
  if (p.block) o.block = *p.block;
  if (p.scale) o.scale = *p.scale;
  if (p.rht_seed) o.rht_seed = *p.rht_seed;
  const bool rotates = std::any_of(o.rht.begin(), o.rht.end(), [](int d) { return d != 0; });
  if (rotates && (p.rht_signs_te || p.rht_signs))
    o.rht_signs = AnalysisOptions::RhtSigns{p.rht_signs_te, p.rht_signs_te ? std::vector<float>() : *p.rht_signs};
  if (p.all_recipes) o.recipes = Recipe::preset_names();
  else if (p.recipes) o.recipes = *p.recipes;
  if (o.recipes && !o.recipes->empty() && p.seed) o.seed = *p.seed;
  if (o.recipes && !o.recipes->empty() && p.sr_draw) o.sr_draw = *p.sr_draw;
  nlohmann::ordered_json j;
  std::atomic<bool> stop{false};
  const AnalysisProgress progress = [&stop](size_t, size_t, const std::string&) {
    if (stop) throw Interrupted{};
  };
  try {
    // The analysis runs on OpenMP threads, the GIL released: other Python threads may go on.
    run_interruptible([&] {
      if (json_path) {
        const auto check = [&](const TraceAnalysis& ta) {  // before any record is analysed, as the command line does
          if (const auto f = io::output_fault({*json_path}, ta.inputs())) throw AnalysisError(f->usage, f->message);
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
  } catch (const std::invalid_argument& e) {  // a setting (SettingsError)
    raise_fault(true, e.what());
  } catch (const std::exception& e) {
    raise_fault(false, e.what());
  }
  if (json_path) return nb::none();  // (made here, with the GIL held again)
  const nlohmann::ordered_json tail = stamps();  // every fp4lab JSON output ends with the build that wrote it
  for (const auto& [k, v] : tail.items()) j[k] = v;
  return to_python(j);
}

}  // namespace

void bind_analyze(nb::module_& m) {
  m.def("analyze", [](const std::vector<std::string>& traces, std::optional<std::vector<FormatId>> formats,
                       std::optional<std::vector<int>> rht, bool rht_signs_te,
                       std::optional<std::vector<float>> rht_signs, std::optional<uint64_t> rht_seed,
                       bool all_recipes, std::optional<std::vector<std::string>> recipes, std::optional<int> block,
                       std::optional<ScaleKind> scale, std::optional<uint64_t> seed, std::optional<SrDraw> sr_draw,
                       const std::optional<std::string>& json_path) {
    return analyze(traces, {std::move(formats), std::move(rht), rht_signs_te, std::move(rht_signs), rht_seed,
                            all_recipes, std::move(recipes), block, scale, seed, sr_draw}, json_path);
  }, "traces"_a, nb::kw_only(), "formats"_a = nb::none(), "rht"_a = nb::none(), "rht_signs_te"_a = false,
     "rht_signs"_a = nb::none(), "rht_seed"_a = nb::none(), "all_recipes"_a = false, "recipes"_a = nb::none(),
     "block"_a = nb::none(), "scale"_a = nb::none(), "seed"_a = nb::none(), "sr_draw"_a = nb::none(),
     "json_path"_a = nb::none(),
        "The docs/spec.md §6 analyses of trace folders or files under typed options (None: the default): the dict "
        "`fp4lab analyze --json` writes, or with json_path that document written to the file (None returned).");
  // Names of table entries (a format, a scale, an SR draw): the one lookup of each, with its message, as a
  // UsageError.
  const auto named = [](auto parse) {
    return [parse](const std::string& t) {
      try {
        return parse(t);
      } catch (const std::invalid_argument& e) {
        raise_fault(true, e.what());
      }
    };
  };
  m.def("format_named", named([](const std::string& t) { return format_id(parse_format(t)); }), "name"_a);
  m.def("scale_named", named([](const std::string& t) { return parse_scale(t); }), "name"_a);
  m.def("sr_draw_named", named([](const std::string& t) { return parse_sr_draw(t); }), "name"_a);
  m.def("split_list", &split_list, "text"_a, "A comma-separated list's entries, empty ones left out.");
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
}

}  // namespace fp4lab::py
