// The quantiser settings of one operand as a library user gives them, typed: a recipe, then each setting given
// explicitly on top (operand_config). The command line reads its option text into these (cli/knobs.hpp); the
// Python package its keywords (python/src/config.cpp). The names each setting takes come from the tables that
// define them (kAllFormats, kAllScales, kRoundings, kSrDraws, kPasses, Recipe::names()), looked up here with one message.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4lab/quantize.hpp"
#include "fp4lab/recipe.hpp"

namespace fp4lab {

// A bad setting or an inconsistent combination; what() is one line. The messages name each setting as the
// command line's option does (--rht-signs), the spelling docs/spec.md uses.
struct SettingsError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// The names a setting takes ("format", "scale", "rounding", "sr_draw", "pass", "role" or "recipe"), joined by `sep`: the one
// list that --help texts and error messages print.
std::string knob_choices(const std::string& knob, const std::string& sep);

// A table entry by its name; SettingsError "unknown format 'x' (known: ...)" otherwise.
ElemFormat parse_format(const std::string& name);
ScaleKind parse_scale(const std::string& name);
Rounding parse_rounding(const std::string& name);
SrDraw parse_sr_draw(const std::string& name);
Pass parse_pass(const std::string& name);

// The operand roles by name (fwd_x, fwd_w, bwd_dy, ...), each the A or B operand of some pass.
const std::vector<std::string>& role_names();
// The pass a role picks where no pass is given: bwd_dx for bwd_dy (its first pass), fwd_y otherwise.
Pass role_pass(const std::string& role);
// The operand that `role` is in `pass`; SettingsError for an unknown role or one that is not an operand of pass.
Operand role_operand(const std::string& role, Pass pass);

// The signs as outputs spell them and --rht-signs reads them: +1/-1 joined by commas.
std::string signs_string(const std::vector<float>& s);

// Each setting absent = the recipe's. The RHT signs come from rht_signs, rht_signs_te, rht_seed, the recipe (when
// the size matches) or, for d = 16, Transformer Engine's vector.
struct OperandSettings {
  std::optional<std::string> recipe;          // a preset's name; absent: e1m2, block 16, fp32, no RHT, RTNE
  std::optional<uint64_t> seed;               // the SR seed
  std::optional<uint32_t> stream;             // the GEMM id N in the SR counter (stream N*8 + pass*2 + operand)
  std::optional<ElemFormat> format;
  std::optional<int> block;
  std::optional<ScaleKind> scale;
  std::optional<bool> tile2d;
  std::optional<Rounding> rounding;
  std::optional<SrDraw> sr_draw;              // how SR draws its words (philox.hpp); RTNE operands ignore it
  std::optional<int> rht;                     // the RHT size; 0 turns it off
  std::optional<std::vector<float>> rht_signs;  // D entries, each +1 or -1 (their count gives the size without rht)
  bool rht_signs_te = false;                  // Transformer Engine's vector (size 16 where none is given)
  std::optional<uint64_t> rht_seed;           // signs drawn from this seed (needs a size)
  std::optional<bool> rht_bf16;
};

// The quantiser settings for one operand of the pass: the recipe's config, then every setting given on top,
// checked together (and by the model's validate() on a shape every valid setting accepts). Throws SettingsError.
QuantConfig operand_config(const OperandSettings& s, Pass pass, Operand operand);

}  // namespace fp4lab
