#include "files.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <system_error>

#include "options.hpp"

namespace fp4lab::cli {

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
  std::string r;
  r.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = utf8_sequence(s, i);
    if (n == 0 || (c < 0x20 && !(keep_newlines && c == '\n')) || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      r += buf;
      ++i;
    } else {
      r.append(s, i, n);
      i += n;
    }
  }
  return r;
}

namespace {
namespace fs = std::filesystem;

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec, ec2;
  const bool eq = fs::equivalent(a, b, ec);  // false (with ec set) when either does not exist
  if (!ec && eq) return true;
  // Not there yet: the same name spelt differently ("./x" and "x") is still one file.
  const fs::path ca = fs::weakly_canonical(a, ec), cb = fs::weakly_canonical(b, ec2);
  return !ec && !ec2 && ca == cb;
}

void check_one(const std::string& out) {
  if (out.empty()) usage_error("an output file name is empty");
  const fs::path p(out);
  if (!p.has_filename() || p.filename() == "." || p.filename() == "..") data_error(printable(out), "output names a folder, not a file");
  struct stat st;
  if (::stat(out.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    data_error(printable(out), "output exists and is not a regular file (outputs are written to a temporary file and "
                               "renamed into place; use --json - for stdout)");
  const std::string dir = p.has_parent_path() ? p.parent_path().string() : ".";
  struct stat ds;
  if (::stat(dir.c_str(), &ds) != 0 || !S_ISDIR(ds.st_mode)) data_error(printable(out), "no such folder " + printable(dir));
  if (::access(dir.c_str(), W_OK | X_OK) != 0) data_error(printable(out), "folder " + printable(dir) + " is not writable");
}
}  // namespace

void check_outputs(const boost::program_options::variables_map& vm, std::vector<std::string> outputs,
                   std::vector<std::string> inputs) {
  if (vm.count("json") && vm["json"].as<std::string>() != "-") outputs.push_back(vm["json"].as<std::string>());
  if (vm.count("config")) inputs.push_back(vm["config"].as<std::string>());
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::string& o = outputs[i];
    check_one(o);
    for (const std::string& in : inputs)
      if (o == in || same_file(o, in))
        usage_error(printable(o) + ": output is also an input (" + printable(in) + "); it would be overwritten");
    for (size_t j = 0; j < i; ++j)
      if (o == outputs[j] || same_file(o, outputs[j]))
        usage_error(printable(o) + ": given as two outputs (" + printable(outputs[j]) + ")");
  }
}

}  // namespace fp4lab::cli
