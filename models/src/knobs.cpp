#include "fp4lab/knobs.hpp"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "fp4lab/rht.hpp"

namespace fp4lab {

namespace {
[[noreturn]] void fail(const std::string& m) { throw KnobError(m); }
const KnobValue* get(const Knobs& k, const char* name) {
  const auto it = k.find(name);
  return it == k.end() ? nullptr : &it->second;
}

// A value as an error message echoes it (shown() for text).
std::string shown_number(float x) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", double(x));
  return b;
}
std::string shown_value(const KnobValue& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return shown(*s);
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* u = std::get_if<uint64_t>(&v)) return std::to_string(*u);
  if (const auto* l = std::get_if<std::vector<float>>(&v)) {
    std::string r;
    for (size_t i = 0; i < l->size(); ++i) {
      if (i) r += ',';
      r += shown_number((*l)[i]);
    }
    return shown(r);
  }
  return std::get<bool>(v) ? "true" : "false";
}
std::string int_fault(const std::string& option, const std::string& value) {
  return "--" + option + ": '" + value + "' is not an integer";
}
std::string uint_fault(const std::string& option, const std::string& value, uint64_t max) {
  return "--" + option + ": '" + value + "' is not an integer from 0 to " + std::to_string(max);
}
std::string bool_fault(const std::string& option, const std::string& value) {
  return "--" + option + ": '" + value + "' is not true or false";
}

// A knob that is a name, a list or a setting: only its text has a meaning.
const std::string& text_of(const KnobValue& v, const std::string& option) {
  if (const auto* s = std::get_if<std::string>(&v)) return *s;
  fail("--" + option + ": '" + shown_value(v) + "' is not text");
}
const std::string* get_text(const Knobs& k, const char* name) {
  const KnobValue* v = get(k, name);
  return v ? &text_of(*v, name) : nullptr;
}
int int_of(const KnobValue& v, const std::string& option) {
  if (const auto* i = std::get_if<int64_t>(&v)) {
    if (*i < INT_MIN || *i > INT_MAX) fail(int_fault(option, shown_value(v)));
    return int(*i);
  }
  if (!std::holds_alternative<std::string>(v)) fail(int_fault(option, shown_value(v)));
  return parse_int(std::get<std::string>(v), option);
}
uint64_t uint_of(const KnobValue& v, const std::string& option, uint64_t max) {
  if (const auto* i = std::get_if<int64_t>(&v)) {
    if (*i < 0 || uint64_t(*i) > max) fail(uint_fault(option, shown_value(v), max));
    return uint64_t(*i);
  }
  if (const auto* u = std::get_if<uint64_t>(&v)) {
    if (*u > max) fail(uint_fault(option, shown_value(v), max));
    return *u;
  }
  if (!std::holds_alternative<std::string>(v)) fail(uint_fault(option, shown_value(v), max));
  return parse_uint(std::get<std::string>(v), option, max);
}
bool bool_of(const KnobValue& v, const std::string& option) {
  if (const auto* b = std::get_if<bool>(&v)) return *b;
  if (!std::holds_alternative<std::string>(v)) fail(bool_fault(option, shown_value(v)));
  return parse_bool(std::get<std::string>(v), option);
}
// An RHT setting: a size as a number (0: off), or its text (parse_rht).
int rht_of(const KnobValue& v, const std::string& option) {
  if (const auto* i = std::get_if<int64_t>(&v)) {
    if (*i != 0 && (*i < 0 || *i > INT_MAX || !rht_size_ok(int(*i))))
      fail("--" + option + ": " + rht_size_fault(*i < 0 || *i > INT_MAX ? -1 : int(*i)) + " (none or 0: RHT off)");
    return int(*i);
  }
  if (std::holds_alternative<uint64_t>(v)) fail("--" + option + ": " + rht_size_fault(-1) + " (none or 0: RHT off)");
  return parse_rht(text_of(v, option), option);
}
// rht-signs: its text (parse_rht_signs), or its entries, each +1 or -1; d signs where d is not 0.
std::vector<float> signs_of(const KnobValue& v, int d) {
  const auto* l = std::get_if<std::vector<float>>(&v);
  if (!l) return parse_rht_signs(text_of(v, "rht-signs"), d);
  for (size_t i = 0; i < l->size(); ++i)
    if ((*l)[i] != 1.0f && (*l)[i] != -1.0f)
      fail("--rht-signs: sign " + std::to_string(i + 1) + " is '" + shown_number((*l)[i]) + "', not +1 or -1");
  if (d != 0 && int(l->size()) != d)
    fail("--rht-signs gives " + std::to_string(l->size()) + " signs but the RHT size is " + std::to_string(d));
  return *l;
}

std::vector<std::string> role_names() {
  std::vector<std::string> roles;
  for (Pass p : kPasses)
    for (Operand o : {Operand::a, Operand::b})
      if (std::find(roles.begin(), roles.end(), operand_role(p, o)) == roles.end())
        roles.push_back(operand_role(p, o));
  return roles;
}
}  // namespace

const std::vector<std::string>& knob_names(bool with_role) {
  static const std::vector<std::string> with = {"recipe", "pass", "role", "format", "block", "scale", "tile2d",
                                                "rht", "rht-signs", "rht-seed", "rht-bf16", "rounding", "seed",
                                                "stream"};
  static const std::vector<std::string> without = [] {
    std::vector<std::string> v = with;
    v.erase(v.begin() + 2);
    return v;
  }();
  return with_role ? with : without;
}

std::string knob_choices(const std::string& knob, const std::string& sep) {
  std::vector<std::string> names;
  if (knob == "format")
    for (const ElemFormat& f : kAllFormats) names.push_back(f.name);
  else if (knob == "scale")
    for (ScaleKind s : kAllScales) names.push_back(scale_name(s));
  else if (knob == "rounding")
    for (Rounding r : kRoundings) names.push_back(rounding_name(r));
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

Pass parse_pass(const std::string& name) {
  for (Pass p : kPasses)
    if (name == pass_name(p)) return p;
  fail("unknown pass '" + shown(name) + "' (known: " + knob_choices("pass", ", ") + ")");
}

uint64_t parse_uint(const std::string& text, const std::string& option, uint64_t max) {
  // Decimal digits only: strtoull would accept "-1" (and wrap it), "+1", spaces and "0x..".
  const bool digits = !text.empty() && text.size() <= 20 && text.find_first_not_of("0123456789") == std::string::npos;
  errno = 0;
  const unsigned long long v = digits ? std::strtoull(text.c_str(), nullptr, 10) : 0;
  if (!digits || errno == ERANGE || v > max) fail(uint_fault(option, shown(text), max));
  return v;
}

int parse_int(const std::string& text, const std::string& option) {
  const bool neg = !text.empty() && text[0] == '-';
  const std::string digits = neg ? text.substr(1) : text;
  const bool ok = !digits.empty() && digits.size() <= 10 && digits.find_first_not_of("0123456789") == std::string::npos;
  const long long v = ok ? std::strtoll(digits.c_str(), nullptr, 10) : 0;
  if (!ok || v > INT_MAX) fail(int_fault(option, shown(text)));
  return int(neg ? -v : v);
}

int parse_rht(const std::string& text, const std::string& option) {
  if (text == "none") return 0;
  const bool digits = !text.empty() && text.size() <= 9 && text.find_first_not_of("0123456789") == std::string::npos;
  if (!digits) fail("--" + option + ": '" + shown(text) + "' is not none (or 0: RHT off) nor an RHT size");
  const int d = std::atoi(text.c_str());
  if (d != 0 && !rht_size_ok(d)) fail("--" + option + ": " + rht_size_fault(d) + " (none or 0: RHT off)");
  return d;
}

bool parse_bool(const std::string& text, const std::string& option) {
  if (text == "true" || text == "1" || text == "yes" || text == "on") return true;
  if (text == "false" || text == "0" || text == "no" || text == "off") return false;
  fail(bool_fault(option, shown(text)));
}

std::vector<float> parse_rht_signs(const std::string& text, int d) {
  if (text == "te") {
    try {
      return rht_signs_te(d);
    } catch (const std::invalid_argument& e) {
      fail(std::string("--rht-signs te: ") + e.what());
    }
  }
  std::vector<float> s;
  size_t pos = 0;
  while (true) {
    const size_t comma = text.find(',', pos);
    const std::string tok = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (tok == "+1" || tok == "1" || tok == "+")
      s.push_back(1.0f);
    else if (tok == "-1" || tok == "-")
      s.push_back(-1.0f);
    else
      fail("--rht-signs: sign " + std::to_string(s.size() + 1) + " is '" + shown(tok) + "', not +1 or -1");
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (d != 0 && int(s.size()) != d)
    fail("--rht-signs gives " + std::to_string(s.size()) + " signs but the RHT size is " + std::to_string(d));
  return s;
}

std::string signs_string(const std::vector<float>& s) {
  std::string r;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ',';
    r += s[i] < 0 ? "-1" : "+1";
  }
  return r;
}

Pass selected_pass(const Knobs& k) {
  if (const std::string* p = get_text(k, "pass")) return parse_pass(*p);
  if (const std::string* r = get_text(k, "role"); r && *r == "bwd_dy") return Pass::bwd_dx;
  return Pass::fwd_y;
}

Operand selected_operand(const Knobs& k, Pass pass) {
  const std::string* r = get_text(k, "role");
  if (!r) return Operand::a;
  const std::string& role = *r;
  const std::vector<std::string> roles = role_names();
  if (std::find(roles.begin(), roles.end(), role) == roles.end())
    fail("unknown role '" + shown(role) + "' (known: " + knob_choices("role", ", ") + ")");
  for (Operand o : {Operand::a, Operand::b})
    if (role == operand_role(pass, o)) return o;
  fail("role " + role + " is not an operand of pass " + pass_name(pass) + " (A = " + operand_role(pass, Operand::a) +
       ", B = " + operand_role(pass, Operand::b) + ")");
}

QuantConfig operand_config(const Knobs& k, Pass pass, Operand operand) {
  for (const auto& [name, value] : k) {
    (void)value;
    bool known = false;
    for (const auto& n : knob_names(true)) known = known || n == name;
    if (!known) fail("unknown knob '" + shown(name) + "'");
  }
  Recipe base;  // "custom": e1m2, block 16, fp32, no RHT, RTNE
  if (const std::string* r = get_text(k, "recipe")) {
    try {
      base = Recipe::preset(*r);
    } catch (const std::invalid_argument& e) {
      fail(e.what());
    }
  }
  if (const KnobValue* s = get(k, "seed")) base.seed = uint_of(*s, "seed", UINT64_MAX);
  const KnobValue* st = get(k, "stream");
  const uint32_t stream = st ? uint32_t(uint_of(*st, "stream", UINT32_MAX)) : 0u;
  QuantConfig c = base.operand(pass, operand, stream);

  if (const std::string* v = get_text(k, "format")) c.format = parse_format(*v);
  if (const KnobValue* v = get(k, "block")) c.block = int_of(*v, "block");
  if (const std::string* v = get_text(k, "scale")) c.scale = parse_scale(*v);
  if (const KnobValue* v = get(k, "tile2d")) c.tile2d = bool_of(*v, "tile2d");
  if (const std::string* v = get_text(k, "rounding")) c.rounding = parse_rounding(*v);

  // RHT: "rht" D sets the size (0 turns it off); signs come from rht-signs, rht-seed, the recipe (when the
  // size matches) or, for d = 16, Transformer Engine's vector.
  const KnobValue* rht = get(k, "rht");
  if (rht) {
    c.rht = rht_of(*rht, "rht");
    if (int(c.rht_signs.size()) != c.rht) c.rht_signs.clear();
  }
  const KnobValue* signs = get(k, "rht-signs");
  const KnobValue* rseed = get(k, "rht-seed");
  if (signs && rseed) fail("give --rht-signs or --rht-seed, not both");
  if (signs) {
    if (c.rht == 0 && rht) fail("--rht-signs given with --rht 0");
    const auto* text = std::get_if<std::string>(signs);
    if (c.rht == 0 && !(text && *text == "te")) {
      c.rht_signs = signs_of(*signs, 0);  // the count gives the size
      c.rht = int(c.rht_signs.size());
    } else {
      if (c.rht == 0) c.rht = 16;
      c.rht_signs = signs_of(*signs, c.rht);
    }
  } else if (rseed) {
    if (c.rht == 0) fail("--rht-seed needs an RHT size (--rht D)");
    if (!rht_size_ok(c.rht)) fail(rht_size_fault(c.rht));
    c.rht_signs = rht_signs_from_seed(c.rht, uint_of(*rseed, "rht-seed", UINT64_MAX));
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
  if (const KnobValue* v = get(k, "rht-bf16")) {
    c.rht_bf16 = bool_of(*v, "rht-bf16");
    if (c.rht_bf16 && c.rht == 0) fail("--rht-bf16 needs an RHT (--rht D)");
  }

  if (c.tile2d && c.block != 16) fail("--tile2d (16x16 scale tiles) needs block 16, not " + std::to_string(c.block));
  // The knob checks of the model's own validate(), on a shape every valid knob accepts (16 rows for 2-D
  // tiles, 128 columns for every block and RHT size): what fails here is the knobs, not the data.
  try {
    validate(c, 16, 128);
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
  return c;
}

}  // namespace fp4lab
