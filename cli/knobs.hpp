// The command line's recipe options as text: "--format e1m2 --rht 16 ..." (and the same keys in --config files)
// read into the typed settings of fp4lab/settings.hpp, with one message per fault. Only the command line reads
// option text; the library and the Python package take typed settings.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "fp4lab/settings.hpp"

namespace fp4lab {

using KnobError = SettingsError;

// A knob's value: its text as typed (command line, config file), or a value Boost.Program_options already typed
// (--block, --tile2d, --rht-bf16) or the command line set itself (fp4lab sim's stream of each GEMM, --seed).
using KnobValue = std::variant<std::string, bool, int64_t>;
// Option name without the leading dashes ("rht-signs") -> its value; absent keys are not given.
using Knobs = std::map<std::string, KnobValue>;

// The recipe-knob names, in the order the CLI's help lists them.
const std::vector<std::string>& knob_names(bool with_role);

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

Pass selected_pass(const Knobs& k);                      // "pass", default from "role", else fwd_y
Operand selected_operand(const Knobs& k, Pass pass);     // from "role", default operand A

// The knobs read into typed settings for one operand of the pass (unknown names and values that do not read are
// KnobErrors; a combination fault is reported before the text of the values it combines is read).
OperandSettings settings_of(const Knobs& k, Pass pass, Operand operand);
// operand_config(settings_of(k, pass, operand), pass, operand).
QuantConfig operand_config(const Knobs& k, Pass pass, Operand operand);

}  // namespace fp4lab
