#include "fp4lab/io/outputs.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <system_error>

#include "fp4lab/text.hpp"

namespace fp4lab::io {

namespace {
namespace fs = std::filesystem;

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec, ec2;
  const bool eq = fs::equivalent(a, b, ec);  // false (with ec set) when either does not exist
  if (!ec && eq) return true;
  // Not there yet: the same name spelt differently ("./x" and "x") is still one file.
  // Absolute first: weakly_canonical leaves a relative name whose first part does not exist relative ("x" vs "./x").
  const fs::path ca = fs::weakly_canonical(fs::absolute(a, ec), ec);
  const fs::path cb = fs::weakly_canonical(fs::absolute(b, ec2), ec2);
  return !ec && !ec2 && ca == cb;
}

std::optional<OutputFault> path_fault(const std::string& out) {
  if (out.empty()) return OutputFault{true, "an output file name is empty"};
  const auto data = [&](const std::string& why) { return OutputFault{false, printable(out) + ": " + why}; };
  const fs::path p(out);
  if (!p.has_filename() || p.filename() == "." || p.filename() == "..")
    return data("output names a folder, not a file");
  struct stat st;
  if (::stat(out.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    return data("output exists and is not a regular file (outputs are written to a temporary file and renamed "
                "into place; use --json - for stdout)");
  const std::string dir = p.has_parent_path() ? p.parent_path().string() : ".";
  struct stat ds;
  if (::stat(dir.c_str(), &ds) != 0 || !S_ISDIR(ds.st_mode)) return data("no such folder " + printable(dir));
  if (::access(dir.c_str(), W_OK | X_OK) != 0) return data("folder " + printable(dir) + " is not writable");
  return std::nullopt;
}
}  // namespace

std::optional<OutputFault> output_fault(const std::vector<std::string>& outputs,
                                        const std::vector<std::string>& inputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::string& o = outputs[i];
    if (auto f = path_fault(o)) return f;
    for (const std::string& in : inputs)
      if (o == in || same_file(o, in))
        return OutputFault{true, printable(o) + ": output is also an input (" + printable(in) +
                                     "); it would be overwritten"};
    for (size_t j = 0; j < i; ++j)
      if (o == outputs[j] || same_file(o, outputs[j]))
        return OutputFault{true, printable(o) + ": given as two outputs (" + printable(outputs[j]) + ")"};
  }
  return std::nullopt;
}

}  // namespace fp4lab::io
