// The fp4lab subcommand registry. Each subcommand lives in its own cli/cmd_<name>.cpp and is listed in the
// table in main.cpp. Subcommands that belong to optional layers (analyze, sim) are compiled in when their
// file exists; cli/CMakeLists.txt then defines FP4LAB_CLI_HAS_<NAME> so the table lists them. A two-word name
// ("cuda check") is a member of a group: `fp4lab cuda` lists the group's members.
#pragma once

#include <string>
#include <vector>

namespace fp4lab::cli {

struct Invocation {
  std::string command;            // subcommand name, e.g. "quantize" or "cuda check"
  std::vector<std::string> args;  // the arguments after it
  std::string command_line;       // the whole command line, shell-quoted (recorded in output metadata)
};

// A subcommand returns the process exit code; it reports faults by throwing cli::Error (options.hpp),
// fp4lab::io::Error or std::invalid_argument, which main turns into one line on stderr.
using CommandFn = int (*)(const Invocation&);

struct Command {
  const char* name;
  const char* summary;  // one line for `fp4lab --help`
  CommandFn run;
};

int cmd_formats(const Invocation&);
int cmd_bias(const Invocation&);
int cmd_recipes(const Invocation&);
int cmd_quantize(const Invocation&);
int cmd_cast(const Invocation&);
int cmd_gemm(const Invocation&);
// fp4lab cuda ... (cmd_cuda_*.cpp): in every build, so that their arguments are checked alike; the GPU work only
// where the CUDA kernels are built (FP4LAB_CLI_HAS_CUDA), elsewhere they end with kExitNoCuda.
int cmd_cuda_check(const Invocation&);
int cmd_cuda_bench(const Invocation&);
int cmd_cuda_qbench(const Invocation&);
int cmd_cuda_timings(const Invocation&);
#ifdef FP4LAB_CLI_HAS_ANALYZE
int cmd_analyze(const Invocation&);
#endif
#ifdef FP4LAB_CLI_HAS_SIM
int cmd_sim(const Invocation&);
#endif

}  // namespace fp4lab::cli
