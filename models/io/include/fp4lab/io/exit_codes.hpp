// The exit codes of fp4lab, every subcommand and every front-end (the command line, the Python module's console
// scripts) included: defined here once. `fp4lab --help` prints this table and
// docs/spec.md §11.1 carries a copy that tests/cli/cli_test.cpp compares with it row by row.
#pragma once

namespace fp4lab::io {

inline constexpr int kExitOk = 0;
inline constexpr int kExitData = 1;      // a bad input file or tensor, or a check that found mismatches
inline constexpr int kExitUsage = 2;     // a bad option, option value or config file
inline constexpr int kExitNoDevice = 3;  // fp4lab cuda: built with CUDA, but no usable CUDA device here
inline constexpr int kExitNoCuda = 4;    // fp4lab cuda: this fp4lab was built without CUDA
inline constexpr int kExitNoSim = 5;     // fp4lab sim: this fp4lab was built without the simulator (SystemC)

struct ExitCode {
  int code;
  const char* meaning;  // one line, as printed by `fp4lab --help` and written in docs/spec.md §11.1
};

inline constexpr ExitCode kExitCodes[] = {
    {kExitOk, "success"},
    {kExitData, "bad data: an input file or tensor, a failed write, or a check that found mismatches"},
    {kExitUsage, "bad usage: an option, option value or config file"},
    {kExitNoDevice, "fp4lab cuda: no usable CUDA device"},
    {kExitNoCuda, "fp4lab cuda: this fp4lab was built without CUDA"},
    {kExitNoSim, "fp4lab sim: this fp4lab was built without the simulator (no SystemC)"},
};

}  // namespace fp4lab::io
