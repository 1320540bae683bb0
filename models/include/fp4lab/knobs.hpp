// Recipe knobs: the one parser from option values ("--format e1m2 --rht 16 ...") to the quantiser settings of an
// operand. The command line (cli/options.cpp) and the Python package (python/src/core.cpp) both call it, so a
// knob means the same thing, and fails with the same message, everywhere.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "fp4lab/quantize.hpp"
#include "fp4lab/recipe.hpp"
#include "fp4lab/text.hpp"  // shown(): a value as an error message echoes it

namespace fp4lab {

// A bad knob value or an inconsistent combination; what() is one line.
struct KnobError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// A knob's value: its text as typed (command line, config file), or a value already typed (the command line's
// --block, --tile2d and --rht-bf16 as Boost parsed them; fp4lab sim's stream of each GEMM; the Python package's
// keywords: names as text, numbers, flags, and rht-signs as its +-1 entries), taken as it is.
using KnobValue = std::variant<std::string, bool, int64_t, uint64_t, std::vector<float>>;  // uint64_t: seeds past 2^63
// Option name without the leading dashes ("rht-signs") -> its value; absent keys are not given.
using Knobs = std::map<std::string, KnobValue>;

// The recipe-knob names, in the order the CLI's help lists them.
const std::vector<std::string>& knob_names(bool with_role);
// The values a knob takes by name ("format", "scale", "rounding", "pass", "role" or "recipe"), from the tables
// that define them (kAllFormats, kAllScales, kRoundings, kPasses, Recipe::names()), joined by `sep`:
// the one list that --help texts and error messages print.
std::string knob_choices(const std::string& knob, const std::string& sep);

ElemFormat parse_format(const std::string& name);
ScaleKind parse_scale(const std::string& name);
Rounding parse_rounding(const std::string& name);
Pass parse_pass(const std::string& name);
// An unsigned decimal integer <= max; `option` (without dashes) names it in the error.
uint64_t parse_uint(const std::string& text, const std::string& option, uint64_t max);
// A decimal integer (sign allowed) that fits an int.
int parse_int(const std::string& text, const std::string& option);
// An RHT setting: "none" or 0 (off), or a size (a power of two in kMinRht..kMaxRht, fp4lab/rht.hpp). The one
// spelling of quantize, gemm, sim and analyze's list of settings.
int parse_rht(const std::string& text, const std::string& option);
// true/false, 1/0, yes/no, on/off (Boost.Program_options' spellings).
bool parse_bool(const std::string& text, const std::string& option);
// "s1,s2,...,sD" with each s one of +1, 1, -1, +, -; or "te" for Transformer Engine's vector (needs d = 16).
// d = 0 accepts any count.
std::vector<float> parse_rht_signs(const std::string& text, int d);
std::string signs_string(const std::vector<float>& s);

Pass selected_pass(const Knobs& k);                      // "pass", default from "role", else fwd_y
Operand selected_operand(const Knobs& k, Pass pass);     // from "role", default operand A

// The quantiser settings for one operand: the recipe's config (or the defaults e1m2, block 16, fp32, no RHT,
// RTNE without "recipe") for that operand of the pass, then every knob given explicitly on top. "stream" N
// is the GEMM id in the SR counter: the operand's stream is N*8 + pass*2 + operand, as in Recipe::operand.
// Throws KnobError.
QuantConfig operand_config(const Knobs& k, Pass pass, Operand operand);

}  // namespace fp4lab
