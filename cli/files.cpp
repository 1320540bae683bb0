#include "files.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <system_error>

#include "options.hpp"

namespace fp4lab::cli {

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
