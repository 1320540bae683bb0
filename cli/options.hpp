// Option helpers shared by every fp4lab subcommand: errors and exit codes, command-line + config-file
// parsing (one options_description serves both, so every option can live in a --config file), --json
// output, the recipe knobs that build a fp4lab::QuantConfig, and loading tensors from safetensors files.
#pragma once

#include <boost/program_options.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.hpp"
#include "fp4lab/format.hpp"
#include "fp4lab/io/exit_codes.hpp"
#include "knobs.hpp"
#include "fp4lab/quantize.hpp"
#include "fp4lab/recipe.hpp"
#include "fp4lab/scale.hpp"

namespace fp4lab::cli {

namespace po = boost::program_options;
// The exit codes every front-end shares (fp4lab/io/exit_codes.hpp), by their short names here.
using io::ExitCode, io::kExitCodes, io::kExitOk, io::kExitData, io::kExitUsage, io::kExitNoDevice, io::kExitNoCuda,
    io::kExitNoSim;
// Keys in insertion order, so the JSON reads like the table.
using Json = nlohmann::ordered_json;

// ---- errors (exit codes: fp4lab/io/exit_codes.hpp) -------------------------------------------------------
// what() is the fault without the "fp4lab <cmd>: error: " prefix main adds; always one line.
struct Error : std::runtime_error {
  int exit_code;
  Error(int code, const std::string& msg) : std::runtime_error(msg), exit_code(code) {}
};
[[noreturn]] void usage_error(const std::string& msg);
// "<file>: <msg>" with exit code 1.
[[noreturn]] void data_error(const std::string& file, const std::string& msg);

// Boost's default style lets any unambiguous prefix stand for an option (--rec for --recipe, --mac.unit for
// --mac.units), so a typo silently sets another knob; every option must be spelt out.
inline constexpr int kCommandLineStyle =
    po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
// A usage error when option text holds a placeholder Boost.Program_options loops on (option_file.hpp).
void refuse_placeholders(const std::string& text, const std::string& where);
// A shape in the form `form` ("RxK", "MxNxK"): as many positive integers (each at most 2^31) joined by 'x', in
// order; anything else is a usage error naming option `opt`.
std::vector<int64_t> parse_dims(const std::string& text, const std::string& form, const std::string& opt);

// ---- parsing ---------------------------------------------------------------------------------------
// Adds --help, --version, --config FILE and --json FILE|- to `desc`.
void add_common_options(po::options_description& desc);
std::string version_line();  // "fp4lab <version> (git <commit>)"

// Parses inv.args against `desc` (command line first, then --config FILE, so the command line wins), and
// checks required options. Returns false after printing help or the version (exit 0). Throws Error on bad
// usage. Options must be spelt out in full (no prefix guessing); a config file must be a regular file and
// cannot name another config file.
bool parse_args(const Invocation& inv, const po::options_description& desc, const std::string& synopsis,
                po::variables_map& vm);

// The value of an option as JSON, as a JSON config file gives it back (option_file.hpp).
Json option_value_json(const po::variable_value& v);

// ---- progress ---------------------------------------------------------------------------------------
// Progress of a long run on stderr: "<cmd>: [i/n] <what> (<seconds> s)" per step, only once the run has taken
// more than two seconds and only when stderr is a terminal, so that captured stderr holds nothing but the
// one-line error when a run fails. `tty` and `out` are fields so that a test can set them.
struct Progress {
  explicit Progress(std::string cmd);
  std::string cmd;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  bool tty;               // stderr is a terminal
  std::ostream* out;      // std::cerr
  static constexpr double kQuietSeconds = 2.0;
  double seconds() const;
  void step(size_t i, size_t n, const std::string& what) const;
};

// ---- --json FILE|- -----------------------------------------------------------------------------------
// "-" sends the JSON to stdout instead of the human table; a file receives it beside the table.
struct JsonOut {
  std::string dest;  // empty: no JSON
  explicit JsonOut(const po::variables_map& vm);
  bool table() const { return dest != "-"; }  // print the human table?
  void write(const Json& j) const;
  // The same for a document too large to hold: `make(stamps, sink)` hands its text (dump(2), no final newline,
  // ending with the members of `stamps`) to `sink` piece by piece; it reaches the file through the same temporary.
  using Sink = std::function<void(const std::string&)>;
  void write_pieces(const std::function<void(const Json& stamps, const Sink& sink)>& make) const;
};
// Writes `text` to a temporary file beside `path` and renames it into place (data error naming `path`).
void write_text_atomic(const std::string& path, const std::string& text);

// ---- recipe knobs -----------------------------------------------------------------------------------
// --recipe --pass [--role] --format --block --scale --tile2d --rht --rht-signs --rht-seed --rht-bf16
// --rounding --seed --stream. With `with_role` (quantize) --role picks the operand.
void add_recipe_options(po::options_description& desc, bool with_role);

// The recipe knobs given in vm, for fp4lab::operand_config (knobs.hpp).
Knobs recipe_knobs(const po::variables_map& vm);
// The quantiser settings for one operand: the recipe's config (or the defaults e1m2, block 16, fp32, no
// RHT, RTNE without --recipe) for that operand of the pass, then every knob given explicitly on top.
// --stream N is the GEMM id in the SR counter: the operand's stream is N*8 + pass*2 + operand, as in
// Recipe::operand. Throws Error (usage) on a bad value or an inconsistent combination.
QuantConfig operand_config(const po::variables_map& vm, Pass pass, Operand operand);

Pass selected_pass(const po::variables_map& vm);  // --pass, default from --role, else fwd_y
Operand selected_operand(const po::variables_map& vm, Pass pass);  // from --role, default operand a

ElemFormat parse_format(const std::string& name);
ScaleKind parse_scale(const std::string& name);
Rounding parse_rounding(const std::string& name);
SrDraw parse_sr_draw(const std::string& name);
Pass parse_pass(const std::string& name);
// An unsigned decimal integer <= max; `option` (without dashes) names it in the usage error.
uint64_t parse_uint(const std::string& text, const std::string& option, uint64_t max);
int parse_rht(const std::string& text, const std::string& option);  // fp4lab::parse_rht (knobs.hpp)
uint64_t uint_option(const po::variables_map& vm, const std::string& option, uint64_t max);
// "s1,s2,...,sD" with each s one of +1, 1, -1, +, -; or "te" for Transformer Engine's vector (needs d = 16).
std::vector<float> parse_rht_signs(const std::string& text, int d);
std::string signs_string(const std::vector<float>& s);

// Every knob of a config, for JSON output and safetensors metadata.
Json config_json(const QuantConfig& c);
// Flattens a JSON object into string metadata entries "<prefix><key>" (strings as is, others as JSON text).
void put_metadata(std::map<std::string, std::string>& m, const std::string& prefix, const Json& obj);

// ---- tensors -----------------------------------------------------------------------------------------
struct Tensor {
  std::string file, name;
  std::vector<int64_t> shape;
  std::vector<float> v;  // FP32 copy (F32, BF16 and F16 inputs), checked finite
};
// Any rank. Missing file, missing tensor, non-float dtype and NaN/Inf give a data error naming the file.
Tensor load_tensor(const std::string& file, const std::string& name);
// A 2-D tensor [rows, cols]; any other rank is a data error.
Tensor load_matrix(const std::string& file, const std::string& name);
// "FILE:NAME" split at the last ':'; `option` names the option in the usage error.
std::pair<std::string, std::string> split_file_tensor(const std::string& spec, const char* option);

std::string shape_string(const std::vector<int64_t>& s);  // "[2, 3]"
std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));

// An SQNR as a table prints it, right-aligned in `width` characters with `prec` decimals and " dB": +inf (no error
// at all, docs/spec.md §6.1; null in the JSON) is "exact"; NaN cannot arise from the definition but would read "n/a".
std::string sqnr_text(double db, int width, int prec);
// A difference of two SQNRs, signed: "n/a" when a side is exact (inf - x or inf - inf; null in the JSON).
std::string delta_text(double d, int width, int prec);

}  // namespace fp4lab::cli
