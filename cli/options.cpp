#include "options.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "bundled_configs.hpp"
#include "files.hpp"
#include "fp4lab/io/files.hpp"
#include "fp4lab/io/safetensors.hpp"
#include "knobs.hpp"
#include "fp4lab/rht.hpp"
#include "fp4lab/version.hpp"
#include "option_file.hpp"

namespace fp4lab::cli {

void usage_error(const std::string& msg) { throw Error(kExitUsage, msg); }
void data_error(const std::string& file, const std::string& msg) {
  throw Error(kExitData, file.empty() ? msg : file + ": " + msg);
}

std::string sqnr_text(double db, int width, int prec) {
  if (std::isfinite(db)) return fmt("%*.*f dB", std::max(width - 3, 0), prec, db);
  return fmt("%*s", width, db > 0 ? "exact" : "n/a");
}

std::string delta_text(double d, int width, int prec) {
  return std::isfinite(d) ? fmt("%+*.*f", width, prec, d) : fmt("%*s", width, "n/a");
}

std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  const int n = std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  if (n < 0) return {};
  if (size_t(n) < sizeof buf) return std::string(buf, size_t(n));
  std::string s(size_t(n) + 1, '\0');
  va_start(ap, f);
  std::vsnprintf(s.data(), s.size(), f, ap);
  va_end(ap);
  s.resize(size_t(n));
  return s;
}

std::string shape_string(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ", ";
    r += std::to_string(s[i]);
  }
  return r + "]";
}

// ---- parsing ---------------------------------------------------------------------------------------
void add_common_options(po::options_description& desc) {
  desc.add_options()
      ("help,h", "print this help and exit")
      ("version", "print the fp4lab version and git commit and exit")
      ("config", po::value<std::string>()->value_name("FILE"),
       "read further options from FILE (lines `option = value`; the command line wins)")
      ("json", po::value<std::string>()->value_name("FILE|-"),
       "write machine-readable JSON to FILE, or to stdout instead of the table with -");
}

std::string version_line() { return std::string("fp4lab ") + kVersion + " (git " + kGitCommit + ")"; }

void refuse_placeholders(const std::string& text, const std::string& where) {
  try {
    refuse_option_placeholders(text, where);
  } catch (const io::Error& e) {
    usage_error(printable(e.what()));
  }
}

std::vector<int64_t> parse_dims(const std::string& text, const std::string& form, const std::string& opt) {
  const size_t n = size_t(std::count(form.begin(), form.end(), 'x')) + 1;
  const std::string fault = "--" + opt + " '" + printable(text) + "' is not " + form + " (positive integers joined by 'x')";
  std::vector<int64_t> d;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, 'x')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (part.empty() || used != part.size() || v <= 0 || v > (1LL << 31)) usage_error(fault);
    d.push_back(v);
  }
  if (d.size() != n || text.empty() || text.back() == 'x') usage_error(fault);
  return d;
}

bool parse_args(const Invocation& inv, const po::options_description& desc, const std::string& synopsis,
                po::variables_map& vm) {
  const std::string hint = " (see fp4lab " + inv.command + " --help)";
  try {
    for (const std::string& a : inv.args) refuse_placeholders(a, "command line");
    // An empty positional description makes a stray bare word an error instead of being ignored.
    const po::positional_options_description no_positionals;
    po::store(po::command_line_parser(inv.args).options(desc).style(kCommandLineStyle).positional(no_positionals).run(),
              vm);
    if (vm.count("help")) {
      std::cout << "usage: fp4lab " << inv.command << " " << synopsis << "\n\n" << desc;
      return false;
    }
    if (vm.count("version")) {
      std::cout << version_line() << "\n";
      return false;
    }
    if (vm.count("config")) {
      const std::string path = vm["config"].as<std::string>();
      std::string text;
      // A bundled configuration by name (fp4lab sim --list-configs) where no file of that name exists.
      std::error_code ec;
      const BundledConfig* bundled = std::filesystem::exists(path, ec) ? nullptr : find_bundled_config(path);
      if (bundled) {
        text = bundled->text;
      } else {
        try {
          text = io::read_regular_file(path, "config file");  // a FIFO or device is refused, not waited on
        } catch (const io::Error& e) {
          usage_error(e.what());
        }
      }
      refuse_placeholders(text, printable(path));
      po::parsed_options parsed(&desc);
      try {
        parsed = parse_option_text(text, desc);  // `key = value` lines or JSON (option_file.hpp)
      } catch (const po::error& e) {
        usage_error(printable(path) + ": " + e.what());
      }
      // Config files do not nest: a `config = other.cfg` line would otherwise be stored and silently ignored.
      for (const po::option& o : parsed.options)
        if (o.string_key == "config" || o.string_key == "help" || o.string_key == "version")
          usage_error(printable(path) + ": '" + o.string_key + "' cannot be set in a config file");
      // Stored after the command line: po::store keeps values already present, so the command line wins.
      try {
        store_option_text(parsed, vm);  // a value of the wrong type is the file's fault: named with it
      } catch (const po::error& e) {
        usage_error(printable(path) + ": " + e.what());
      }
    }
    po::notify(vm);
    // Paths and names are recorded in UTF-8 (JSON reports, safetensors metadata, the command line a report
    // repeats): a value that is not UTF-8 is refused here, before any work, rather than when the output is written.
    for (const auto& [key, v] : vm) {
      const auto* one = boost::any_cast<std::string>(&v.value());
      const auto* many = boost::any_cast<std::vector<std::string>>(&v.value());
      std::vector<std::string> values = one ? std::vector<std::string>{*one} : many ? *many : std::vector<std::string>{};
      for (const std::string& s : values)
        if (!valid_utf8(s))
          usage_error("--" + key + ": '" + printable(s) + "' is not valid UTF-8 (fp4lab records paths and names in UTF-8)");
    }
  } catch (const po::error& e) {
    usage_error(e.what() + hint);
  }
  return true;
}

Progress::Progress(std::string c) : cmd(std::move(c)), tty(::isatty(STDERR_FILENO) == 1), out(&std::cerr) {}

double Progress::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Progress::step(size_t i, size_t n, const std::string& what) const {
  const double s = seconds();
  if (tty && s > kQuietSeconds) *out << fmt("%s: [%zu/%zu] %s (%.1f s)\n", cmd.c_str(), i, n, printable(what).c_str(), s);
}

Json option_value_json(const po::variable_value& v) {
  const boost::any& a = v.value();
  if (const auto* p = boost::any_cast<std::string>(&a)) return *p;
  if (const auto* p = boost::any_cast<bool>(&a)) return *p;
  if (const auto* p = boost::any_cast<int>(&a)) return *p;
  if (const auto* p = boost::any_cast<int64_t>(&a)) return *p;
  if (const auto* p = boost::any_cast<double>(&a)) return *p;
  if (const auto* p = boost::any_cast<std::vector<std::string>>(&a)) return *p;
  throw std::logic_error("option_value_json: an option of a type it does not know");
}

JsonOut::JsonOut(const po::variables_map& vm) {
  if (vm.count("json")) {
    dest = vm["json"].as<std::string>();
    if (dest.empty()) usage_error("--json needs a file name or -");
  }
  // The destination is checked now (folder, not a device, not the config file); commands that read inputs
  // check it against those too, with their --out, before any work.
  check_outputs(vm, {}, {});
}

void JsonOut::write(const Json& j) const {
  if (dest.empty()) return;
  Json out = j;
  if (out.is_object()) {  // every JSON output says which build wrote it
    out["fp4lab_version"] = kVersion;
    out["git_commit"] = kGitCommit;
  }
  // Infinite SQNR (zero error) has no JSON number; nlohmann writes null for it.
  const std::string text = out.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
  if (dest == "-") {
    std::cout << text << std::flush;
    if (!std::cout) data_error("stdout", "write failed");
    return;
  }
  io::write_file_atomic(dest, text);  // io::Error names the file; nothing is left under it on failure
}

void JsonOut::write_pieces(const std::function<void(const Json& stamps, const Sink& sink)>& make) const {
  if (dest.empty()) return;
  const Json stamps = {{"fp4lab_version", kVersion}, {"git_commit", kGitCommit}};
  if (dest == "-") {
    make(stamps, [](const std::string& piece) { std::cout << piece; });
    std::cout << "\n" << std::flush;
    if (!std::cout) data_error("stdout", "write failed");
    return;
  }
  io::AtomicFile f(dest);  // io::Error names the file; nothing is left under it on failure
  make(stamps, [&](const std::string& piece) { f.write(piece.data(), piece.size()); });
  f.write("\n", 1);
  f.commit();
}

void write_text_atomic(const std::string& path, const std::string& text) {
  io::write_file_atomic(path, text);  // a temporary name renamed into place; io::Error names the file
}

// ---- value parsers: knobs.hpp's, with its KnobError as a usage error -------------------------
namespace {
template <class F>
auto knob(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const KnobError& e) {
    usage_error(e.what());
  }
}
}  // namespace

ElemFormat parse_format(const std::string& name) { return knob([&] { return fp4lab::parse_format(name); }); }
ScaleKind parse_scale(const std::string& name) { return knob([&] { return fp4lab::parse_scale(name); }); }
Rounding parse_rounding(const std::string& name) { return knob([&] { return fp4lab::parse_rounding(name); }); }
SrDraw parse_sr_draw(const std::string& name) { return knob([&] { return fp4lab::parse_sr_draw(name); }); }
Pass parse_pass(const std::string& name) { return knob([&] { return fp4lab::parse_pass(name); }); }
uint64_t parse_uint(const std::string& text, const std::string& option, uint64_t max) {
  return knob([&] { return fp4lab::parse_uint(text, option, max); });
}
int parse_rht(const std::string& text, const std::string& option) {
  return knob([&] { return fp4lab::parse_rht(text, option); });
}
uint64_t uint_option(const po::variables_map& vm, const std::string& option, uint64_t max) {
  return parse_uint(vm[option].as<std::string>(), option, max);
}
std::vector<float> parse_rht_signs(const std::string& text, int d) {
  return knob([&] { return fp4lab::parse_rht_signs(text, d); });
}
std::string signs_string(const std::vector<float>& s) { return fp4lab::signs_string(s); }

// ---- recipe knobs -----------------------------------------------------------------------------------
void add_recipe_options(po::options_description& desc, bool with_role) {
  // Without --recipe an operand gets the settings of Recipe{} ("custom"), as fp4lab::operand_config does.
  const QuantConfig plain = Recipe{}.operand(Pass::fwd_y, Operand::a);
  desc.add_options()
      ("recipe", po::value<std::string>()->value_name("R"),
       // ", " between names: the list is longer than a help line, and wraps at spaces.
       ("named recipe, a preset or an ablation: " + knob_choices("recipe", ", ") +
        "; explicit knobs below override it").c_str())
      ("pass", po::value<std::string>()->value_name("P"),
       ("GEMM whose recipe config applies: " + knob_choices("pass", "|") + " (default fwd_y)").c_str());
  if (with_role)
    desc.add_options()("role", po::value<std::string>()->value_name("ROLE"),
                       ("operand of the pass: " + knob_choices("role", "|") +
                        " (default operand A; without --pass, bwd_dy takes bwd_dx, the others fwd_y)").c_str());
  desc.add_options()
      ("format", po::value<std::string>()->value_name("F"),
       ("element grid " + knob_choices("format", "|") + " (default " + plain.format.name + ")").c_str())
      ("block", po::value<int>()->value_name("B"),
       ("elements per block scale, 16|32 (default " + std::to_string(plain.block) + ")").c_str())
      ("scale", po::value<std::string>()->value_name("S"),
       ("block scale " + knob_choices("scale", "|") + " (default " + scale_name(plain.scale) + ")").c_str())
      ("tile2d", po::value<bool>()->implicit_value(true)->value_name("BOOL"),
       "16x16 scale tiles (NVFP4 weights); --tile2d=false turns a recipe's off")
      ("rht", po::value<std::string>()->value_name("D"), "random Hadamard transform size 16..128; none (or 0) = off")
      ("rht-signs", po::value<std::string>()->value_name("S1,..,SD|te"),
       "RHT sign vector of +1/-1 entries, or te (Transformer Engine's, d = 16; the default for d = 16)")
      ("rht-seed", po::value<std::string>()->value_name("S"), "derive the RHT signs from seed S (rht_signs_from_seed)")
      ("rht-bf16", po::value<bool>()->implicit_value(true)->value_name("BOOL"),
       "round rotated values to BF16 before the amax (Transformer Engine)")
      ("rounding", po::value<std::string>()->value_name("R"),
       (knob_choices("rounding", "|") + " (default " + rounding_name(plain.rounding) + ")").c_str())
      ("sr-draw", po::value<std::string>()->value_name("D"),
       (knob_choices("sr_draw", "|") + ": SR's random words, one Philox block per 1, 4 or 16 elements (default " +
        sr_draw_name(plain.sr_draw) + "; docs/spec.md §4)").c_str())
      ("seed", po::value<std::string>()->value_name("S"), "stochastic-rounding seed (default 0)")
      ("stream", po::value<std::string>()->value_name("N"),
       "GEMM id in the SR counter; an operand's stream is N*8 + pass*2 + operand (default 0)");
}

Knobs recipe_knobs(const po::variables_map& vm) {
  Knobs k;
  for (const std::string& name : knob_names(/*with_role=*/true)) {
    if (!vm.count(name)) continue;
    const boost::any& v = vm[name].value();
    // Typed options (--block, --tile2d, --rht-bf16) arrive as their values and are passed on as such.
    if (const int* i = boost::any_cast<int>(&v)) k[name] = int64_t(*i);
    else if (const bool* b = boost::any_cast<bool>(&v)) k[name] = *b;
    else k[name] = boost::any_cast<std::string>(v);
  }
  return k;
}

Pass selected_pass(const po::variables_map& vm) { return knob([&] { return fp4lab::selected_pass(recipe_knobs(vm)); }); }

Operand selected_operand(const po::variables_map& vm, Pass pass) {
  return knob([&] { return fp4lab::selected_operand(recipe_knobs(vm), pass); });
}

QuantConfig operand_config(const po::variables_map& vm, Pass pass, Operand operand) {
  return knob([&] { return fp4lab::operand_config(recipe_knobs(vm), pass, operand); });
}

Json config_json(const QuantConfig& c) {
  return {{"label", c.label()},
          {"format", c.format.name},
          {"block", c.block},
          {"tile2d", c.tile2d},
          {"scale", scale_name(c.scale)},
          {"rht", c.rht},
          {"rht_signs", signs_string(c.rht_signs)},
          {"rht_bf16", c.rht_bf16},
          {"rounding", rounding_name(c.rounding)},
          {"sr_draw", sr_draw_name(c.sr_draw)},
          {"seed", c.seed},
          {"stream", c.stream}};
}

void put_metadata(std::map<std::string, std::string>& m, const std::string& prefix, const Json& obj) {
  for (const auto& [k, v] : obj.items()) m[prefix + k] = v.is_string() ? v.get<std::string>() : v.dump();
}

// ---- tensors -----------------------------------------------------------------------------------------
namespace {
Tensor load(const std::string& file, const std::string& name, int rank) {
  const io::SafetensorsFile f(file);  // io::Error names the file and the fault
  Tensor t;
  t.file = file;
  t.name = name;
  t.shape = f.info(name).shape;
  // The shape is checked before the data is read, so a wrong-rank tensor is reported as such.
  if (rank >= 0 && int(t.shape.size()) != rank)
    data_error(file, "tensor '" + name + "': expected a " + std::to_string(rank) + "-D tensor, got shape " +
                         shape_string(t.shape) + " (rank " + std::to_string(t.shape.size()) + ")");
  t.v = f.read_f32(name, /*check_finite=*/true);
  return t;
}
}  // namespace

Tensor load_tensor(const std::string& file, const std::string& name) { return load(file, name, -1); }
Tensor load_matrix(const std::string& file, const std::string& name) { return load(file, name, 2); }

std::pair<std::string, std::string> split_file_tensor(const std::string& spec, const char* option) {
  const size_t colon = spec.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == spec.size())
    usage_error(std::string(option) + " wants FILE:NAME, got '" + spec + "'");
  return {spec.substr(0, colon), spec.substr(colon + 1)};
}

}  // namespace fp4lab::cli
