// The rules every output path is held to before any work, with no dependency beyond the standard library and
// fp4lab/text.hpp: the command line (cli/files.hpp) and fp4lab._core (fp4lab.analyze(json=...)) apply the same ones.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace fp4lab::io {

struct OutputFault {
  bool usage = false;   // a conflict between the paths given (exit 2), else a path the file system refuses (exit 1)
  std::string message;  // one line, as the command line prints it after "fp4lab <cmd>: error: "
};

// The first fault of `outputs` against the rules: each a file name (absent, or an existing regular file) in an
// existing writable folder, different from every input (same inode counts) and from every other output.
std::optional<OutputFault> output_fault(const std::vector<std::string>& outputs,
                                        const std::vector<std::string>& inputs);

}  // namespace fp4lab::io
