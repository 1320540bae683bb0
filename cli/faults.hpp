// How the command line reads a fault: its exit code (fp4lab/io/exit_codes.hpp) and its one-line message, for main
// and for the ranks of a distributed job (fp4lab/dist/dist.hpp), which agree on one fault and report it once.
#pragma once

#include <exception>
#include <string>

#include "fp4lab/dist/dist.hpp"

namespace fp4lab::cli {

// main's mapping of an exception to its exit code and one-line message ("fp4lab <cmd>: error: " not included;
// empty for dist::Quiet, whose rank prints nothing).
int describe(std::exception_ptr e, const std::string& cmd, std::string& msg);
// describe() for subcommand `cmd`, as dist::agree takes it.
inline dist::Describe describer(const std::string& cmd) {
  return [cmd](std::exception_ptr e, std::string& msg) { return describe(e, cmd, msg); };
}

}  // namespace fp4lab::cli
