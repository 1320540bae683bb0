#include "fp4lab/text.hpp"

#include <algorithm>

namespace fp4lab {

namespace {
// The length of the valid UTF-8 sequence that starts at s[i] (1 to 4), or 0 when the bytes there are not one.
size_t utf8_sequence(const std::string& s, size_t i) {
  const auto at = [&](size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0u; };
  const unsigned c = at(0);
  const auto cont = [&](size_t k, unsigned lo = 0x80, unsigned hi = 0xBF) { return at(k) >= lo && at(k) <= hi; };
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c == 0xE0) return cont(1, 0xA0) && cont(2) ? 3 : 0;
  if (c == 0xED) return cont(1, 0x80, 0x9F) && cont(2) ? 3 : 0;  // no UTF-16 surrogates
  if (c >= 0xE1 && c <= 0xEF) return cont(1) && cont(2) ? 3 : 0;
  if (c == 0xF0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
  if (c >= 0xF1 && c <= 0xF3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
  if (c == 0xF4) return cont(1, 0x80, 0x8F) && cont(2) && cont(3) ? 4 : 0;
  return 0;
}
}  // namespace

bool valid_utf8(const std::string& s) {
  for (size_t i = 0, n; i < s.size(); i += n)
    if ((n = utf8_sequence(s, i)) == 0) return false;
  return true;
}

std::string printable(const std::string& s, bool keep_newlines) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string r;
  r.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = utf8_sequence(s, i);
    if (n == 0 || (c < 0x20 && !(keep_newlines && c == '\n')) || c == 0x7F) {
      r += "\\x";
      r += kHex[c >> 4];
      r += kHex[c & 15];
      ++i;
    } else {
      r.append(s, i, n);
      i += n;
    }
  }
  return r;
}

std::string shown(const std::string& text) {
  constexpr size_t kShown = 80;
  if (text.size() <= kShown) return printable(text);
  return printable(text.substr(0, kShown)) + "... (" + std::to_string(text.size()) + " bytes)";
}

std::string shell_quote(const std::string& s) {
  const bool plain = !s.empty() && s.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                       "0123456789_./:=,+-@%") == std::string::npos;
  if (plain) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  for (size_t pos = 0; pos <= s.size();) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    if (comma > pos) out.push_back(s.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

}  // namespace fp4lab
