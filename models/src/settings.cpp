#include "fp4lab/settings.hpp"

#include <algorithm>
#include <cstdio>

#include "fp4lab/rht.hpp"
#include "fp4lab/text.hpp"  // shown(): a name as an error message echoes it

namespace fp4lab {

namespace {
[[noreturn]] void fail(const std::string& m) { throw SettingsError(m); }

std::string shown_number(float x) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", double(x));
  return b;
}

// Each entry +1 or -1, and d of them where d is not 0.
const std::vector<float>& checked_signs(const std::vector<float>& s, int d) {
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] != 1.0f && s[i] != -1.0f)
      fail("--rht-signs: sign " + std::to_string(i + 1) + " is '" + shown_number(s[i]) + "', not +1 or -1");
  if (d != 0 && int(s.size()) != d)
    fail("--rht-signs gives " + std::to_string(s.size()) + " signs but the RHT size is " + std::to_string(d));
  return s;
}
std::vector<float> te_signs(int d) {
  try {
    return rht_signs_te(d);
  } catch (const std::invalid_argument& e) {
    fail(std::string("--rht-signs te: ") + e.what());
  }
}
}  // namespace

std::string knob_choices(const std::string& knob, const std::string& sep) {
  std::vector<std::string> names;
  if (knob == "format")
    for (const ElemFormat& f : kAllFormats) names.push_back(f.name);
  else if (knob == "scale")
    for (ScaleKind s : kAllScales) names.push_back(scale_name(s));
  else if (knob == "rounding")
    for (Rounding r : kRoundings) names.push_back(rounding_name(r));
  else if (knob == "sr_draw")
    for (SrDraw d : kSrDraws) names.push_back(sr_draw_name(d));
  else if (knob == "pass")
    for (Pass p : kPasses) names.push_back(pass_name(p));
  else if (knob == "role")
    names = role_names();
  else if (knob == "recipe")
    names = Recipe::names();
  else
    throw std::logic_error("knob_choices: knob '" + knob + "' has no list of names");
  std::string r;
  for (const std::string& n : names) r.append(r.empty() ? "" : sep).append(n);
  return r;
}

ElemFormat parse_format(const std::string& name) {
  for (const ElemFormat& f : kAllFormats)
    if (name == f.name) return f;
  fail("unknown format '" + shown(name) + "' (known: " + knob_choices("format", ", ") + ")");
}

ScaleKind parse_scale(const std::string& name) {
  for (ScaleKind s : kAllScales)
    if (name == scale_name(s)) return s;
  fail("unknown scale '" + shown(name) + "' (known: " + knob_choices("scale", ", ") + ")");
}

Rounding parse_rounding(const std::string& name) {
  for (Rounding r : kRoundings)
    if (name == rounding_name(r)) return r;
  fail("unknown rounding '" + shown(name) + "' (known: " + knob_choices("rounding", ", ") + ")");
}

SrDraw parse_sr_draw(const std::string& name) {
  for (SrDraw d : kSrDraws)
    if (name == sr_draw_name(d)) return d;
  fail("unknown SR draw '" + shown(name) + "' (known: " + knob_choices("sr_draw", ", ") + ")");
}

Pass parse_pass(const std::string& name) {
  for (Pass p : kPasses)
    if (name == pass_name(p)) return p;
  fail("unknown pass '" + shown(name) + "' (known: " + knob_choices("pass", ", ") + ")");
}

const std::vector<std::string>& role_names() {
  static const std::vector<std::string> roles = [] {
    std::vector<std::string> r;
    for (Pass p : kPasses)
      for (Operand o : {Operand::a, Operand::b})
        if (std::find(r.begin(), r.end(), operand_role(p, o)) == r.end()) r.push_back(operand_role(p, o));
    return r;
  }();
  return roles;
}

Pass role_pass(const std::string& role) { return role == "bwd_dy" ? Pass::bwd_dx : Pass::fwd_y; }

Operand role_operand(const std::string& role, Pass pass) {
  const std::vector<std::string>& roles = role_names();
  if (std::find(roles.begin(), roles.end(), role) == roles.end())
    fail("unknown role '" + shown(role) + "' (known: " + knob_choices("role", ", ") + ")");
  for (Operand o : {Operand::a, Operand::b})
    if (role == operand_role(pass, o)) return o;
  fail("role " + role + " is not an operand of pass " + pass_name(pass) + " (A = " + operand_role(pass, Operand::a) +
       ", B = " + operand_role(pass, Operand::b) + ")");
}

std::string signs_string(const std::vector<float>& s) {
  std::string r;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ',';
    r += s[i] < 0 ? "-1" : "+1";
  }
  return r;
}

QuantConfig operand_config(const OperandSettings& s, Pass pass, Operand operand) {
  Recipe base;  // "custom": e1m2, block 16, fp32, no RHT, RTNE
  if (s.recipe) {
    try {
      base = Recipe::preset(*s.recipe);
    } catch (const std::invalid_argument& e) {
      fail(e.what());
    }
  }
  if (s.seed) base.seed = *s.seed;
  QuantConfig c = base.operand(pass, operand, s.stream.value_or(0u));

  if (s.format) c.format = *s.format;
  if (s.block) c.block = *s.block;
  if (s.scale) c.scale = *s.scale;
  if (s.tile2d) c.tile2d = *s.tile2d;
  if (s.rounding) c.rounding = *s.rounding;
  if (s.sr_draw) c.sr_draw = *s.sr_draw;

  // RHT: rht D sets the size (0 turns it off); the signs follow (see OperandSettings).
  if (s.rht) {
    const int d = *s.rht;
    if (d != 0 && (d < 0 || !rht_size_ok(d)))
      fail("--rht: " + rht_size_fault(d < 0 ? -1 : d) + " (none or 0: RHT off)");
    c.rht = d;
    if (int(c.rht_signs.size()) != c.rht) c.rht_signs.clear();
  }
  const bool signs = s.rht_signs || s.rht_signs_te;
  if (s.rht_signs && s.rht_signs_te) fail("give --rht-signs as te or as signs, not both");
  if (signs && s.rht_seed) fail("give --rht-signs or --rht-seed, not both");
  if (signs) {
    if (c.rht == 0 && s.rht) fail("--rht-signs given with --rht 0");
    if (c.rht == 0 && !s.rht_signs_te) {
      c.rht_signs = checked_signs(*s.rht_signs, 0);  // the count gives the size
      c.rht = int(c.rht_signs.size());
    } else {
      if (c.rht == 0) c.rht = 16;
      c.rht_signs = s.rht_signs_te ? te_signs(c.rht) : checked_signs(*s.rht_signs, c.rht);
    }
  } else if (s.rht_seed) {
    if (c.rht == 0) fail("--rht-seed needs an RHT size (--rht D)");
    if (!rht_size_ok(c.rht)) fail(rht_size_fault(c.rht));
    c.rht_signs = rht_signs_from_seed(c.rht, *s.rht_seed);
  }
  if (c.rht != 0 && int(c.rht_signs.size()) != c.rht) {
    if (c.rht != 16)
      fail("--rht " + std::to_string(c.rht) +
           " needs --rht-signs or --rht-seed (Transformer Engine's vector is defined for d = 16 only)");
    c.rht_signs = rht_signs_te(16);
  }
  if (c.rht == 0) {
    c.rht_signs.clear();
    c.rht_bf16 = false;
  }
  if (s.rht_bf16) {
    c.rht_bf16 = *s.rht_bf16;
    if (c.rht_bf16 && c.rht == 0) fail("--rht-bf16 needs an RHT (--rht D)");
  }

  if (c.tile2d && c.block != 16) fail("--tile2d (16x16 scale tiles) needs block 16, not " + std::to_string(c.block));
  // The checks of the model's own validate(), on a shape every valid setting accepts (16 rows for 2-D tiles, 128
  // columns for every block and RHT size): what fails here is the settings, not the data.
  try {
    validate(c, 16, 128);
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
  return c;
}

}  // namespace fp4lab
