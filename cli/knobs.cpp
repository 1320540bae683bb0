#include "knobs.hpp"

#include <cerrno>
#include <climits>
#include <cstdlib>

#include "fp4lab/rht.hpp"
#include "fp4lab/text.hpp"

namespace fp4lab {

namespace {
[[noreturn]] void fail(const std::string& m) { throw KnobError(m); }
const KnobValue* get(const Knobs& k, const char* name) {
  const auto it = k.find(name);
  return it == k.end() ? nullptr : &it->second;
}

// A value as an error message echoes it (shown() for text).
std::string shown_value(const KnobValue& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return shown(*s);
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
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
  return parse_rht(text_of(v, option), option);
}
}  // namespace

const std::vector<std::string>& knob_names(bool with_role) {
  static const std::vector<std::string> with = {"recipe", "pass", "role", "format", "block", "scale", "tile2d",
                                                "rht", "rht-signs", "rht-seed", "rht-bf16", "rounding", "sr-draw",
                                                "seed", "stream"};
  static const std::vector<std::string> without = [] {
    std::vector<std::string> v = with;
    v.erase(v.begin() + 2);
    return v;
  }();
  return with_role ? with : without;
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

Pass selected_pass(const Knobs& k) {
  if (const std::string* p = get_text(k, "pass")) return parse_pass(*p);
  if (const std::string* r = get_text(k, "role")) return role_pass(*r);
  return Pass::fwd_y;
}

Operand selected_operand(const Knobs& k, Pass pass) {
  const std::string* r = get_text(k, "role");
  return r ? role_operand(*r, pass) : Operand::a;
}

OperandSettings settings_of(const Knobs& k, Pass pass, Operand operand) {
  for (const auto& [name, value] : k) {
    (void)value;
    bool known = false;
    for (const auto& n : knob_names(true)) known = known || n == name;
    if (!known) fail("unknown knob '" + shown(name) + "'");
  }
  OperandSettings s;
  if (const std::string* r = get_text(k, "recipe")) {
    try {
      (void)Recipe::preset(*r);  // its fault before the values' (the order the options are documented in)
    } catch (const std::invalid_argument& e) {
      fail(e.what());
    }
    s.recipe = *r;
  }
  if (const KnobValue* v = get(k, "seed")) s.seed = uint_of(*v, "seed", UINT64_MAX);
  if (const KnobValue* v = get(k, "stream")) s.stream = uint32_t(uint_of(*v, "stream", UINT32_MAX));
  if (const std::string* v = get_text(k, "format")) s.format = parse_format(*v);
  if (const KnobValue* v = get(k, "block")) s.block = int_of(*v, "block");
  if (const std::string* v = get_text(k, "scale")) s.scale = parse_scale(*v);
  if (const KnobValue* v = get(k, "tile2d")) s.tile2d = bool_of(*v, "tile2d");
  if (const std::string* v = get_text(k, "rounding")) s.rounding = parse_rounding(*v);
  if (const std::string* v = get_text(k, "sr-draw")) s.sr_draw = parse_sr_draw(*v);
  if (const KnobValue* v = get(k, "rht")) s.rht = rht_of(*v, "rht");
  const std::string* signs = get_text(k, "rht-signs");
  const KnobValue* rseed = get(k, "rht-seed");
  // The combination faults come before the values' text is read, as operand_config orders its rules.
  if (signs && rseed) fail("give --rht-signs or --rht-seed, not both");
  if (signs && s.rht && *s.rht == 0) fail("--rht-signs given with --rht 0");
  if (signs && *signs == "te")
    s.rht_signs_te = true;
  else if (signs)
    s.rht_signs = parse_rht_signs(*signs, 0);  // the count is checked against the size with the settings
  if (rseed) {
    const int d = s.rht ? *s.rht : (s.recipe ? Recipe::preset(*s.recipe) : Recipe()).operand(pass, operand, 0).rht;
    if (d == 0) fail("--rht-seed needs an RHT size (--rht D)");
    s.rht_seed = uint_of(*rseed, "rht-seed", UINT64_MAX);
  }
  if (const KnobValue* v = get(k, "rht-bf16")) s.rht_bf16 = bool_of(*v, "rht-bf16");
  return s;
}

QuantConfig operand_config(const Knobs& k, Pass pass, Operand operand) {
  return operand_config(settings_of(k, pass, operand), pass, operand);
}

}  // namespace fp4lab
