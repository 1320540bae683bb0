// Inputs and outputs of every fp4lab subcommand, held to one set of rules against hostile paths:
//  - every output is checked before any work: a file name (absent, or an existing regular file) in an existing
//    folder, different from every input (same inode counts: std::filesystem::equivalent) and from every other
//    output; --json FILE and --config FILE are taken from the variables map;
//  - outputs are written through fp4lab::io::AtomicFile (temporary name, renamed when complete), so a failed
//    or killed run never leaves a truncated or half-set of results under the final names;
//  - names and paths echoed to the terminal go through printable(), so control bytes cannot reach it raw.
// A conflict between options (--out naming an input) is a usage fault (exit 2); a path the file system
// refuses (no such folder, not a regular file) is a data fault (exit 1).
#pragma once

#include <boost/program_options.hpp>
#include <string>
#include <vector>

#include "fp4lab/text.hpp"  // printable, valid_utf8

namespace fp4lab::cli {


void check_outputs(const boost::program_options::variables_map& vm, std::vector<std::string> outputs,
                   std::vector<std::string> inputs);

}  // namespace fp4lab::cli
