// fp4lab: the command-line front end of the golden model. `fp4lab <subcommand> [options]`; each subcommand
// lives in cli/cmd_<name>.cpp and is listed in kCommands. Every fault ends as one line on stderr,
// "fp4lab <cmd>: error: <file>: <fault>", with exit code 2 (usage) or 1 (data); nothing escapes main.
#include <malloc.h>

#include <cstring>
#include <exception>
#include <iostream>
#include <new>
#include <string>

#include "commands.hpp"
#include "files.hpp"
#include "fp4lab/io/files.hpp"
#include "fp4lab/io/safetensors.hpp"
#include "mpi_dist.hpp"
#include "options.hpp"

namespace fp4lab::cli {
namespace {

const Command kCommands[] = {
#ifdef FP4LAB_CLI_HAS_ANALYZE
    {"analyze", "SQNR, B_eff, bias and shrinkage of a trace under a recipe", cmd_analyze},
#endif
    {"formats", "every element grid (levels, integer view, gmax, emax) and scale format", cmd_formats},
    {"bias", "analytic per-level shrinkage bias of a grid (the paper's Figure 1a)", cmd_bias},
    {"recipes", "what each operand of each training GEMM gets under every named recipe", cmd_recipes},
    {"quantize", "block-quantise a 2-D tensor of a safetensors file", cmd_quantize},
    {"cast", "round every element onto a grid with no scaling (the codec alone)", cmd_cast},
    {"gemm", "block-scaled GEMM C = A . B^T under the datapath contract, beside a float64 reference", cmd_gemm},
#ifdef FP4LAB_CLI_HAS_SIM
    {"sim", "cycle-approximate tensor-core model (SystemC)", cmd_sim},
#endif
};

void usage(std::ostream& os) {
  os << "usage: fp4lab <subcommand> [options]    (fp4lab <subcommand> --help for its options)\n\nsubcommands:\n";
  for (const Command& c : kCommands) os << "  " << c.name << std::string(10 - std::strlen(c.name), ' ') << c.summary << "\n";
}

std::string shell_quote(const std::string& s) {
  const bool plain = !s.empty() && s.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                       "0123456789_./:=,+-@%") == std::string::npos;
  if (plain) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// One line, whatever the message holds: control bytes (a name from a file or the command line may carry
// escape sequences) are shown as \xNN, never sent to the terminal raw.
void report(const std::string& cmd, const std::string& msg) {
  std::cerr << "fp4lab" << (cmd.empty() ? "" : " ") << printable(cmd) << ": error: " << printable(msg) << std::endl;
}

// The table or JSON went to stdout through a buffer: a full disk or closed pipe shows only at the flush,
// and must not end in exit 0.
int flushed(const std::string& cmd, int code) {
  std::cout.flush();
  if (!std::cout) {
    report(cmd, "stdout: write failed");
    return code == kExitOk ? kExitData : code;
  }
  return code;
}

}  // namespace
}  // namespace fp4lab::cli

int main(int argc, char** argv) {
  using namespace fp4lab::cli;
  // Keep freed tensors in the heap: glibc otherwise maps every large buffer afresh and unmaps it on free, and
  // the page faults of re-zeroing them were 12% of `analyze` (17% of its wall time on the bundled trace).
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // A run ended by SIGINT, SIGTERM, SIGHUP or SIGPIPE leaves no temporary output behind (docs/spec.md §11.1).
  fp4lab::io::remove_temporaries_on_signals();
  Invocation inv;
  for (int i = 0; i < argc; ++i) {
    if (i) inv.command_line += ' ';
    inv.command_line += shell_quote(argv[i]);
  }

  std::string cmd = argc > 1 ? argv[1] : "";
  int first_arg = 2;
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    usage(std::cout);
    return flushed("", kExitOk);
  }
  if (cmd == "--version") {
    std::cout << version_line() << "\n";
    return flushed("", kExitOk);
  }
#ifdef FP4LAB_CLI_HAS_ANALYZE
  // No subcommand (or options only): analyze, which defaults to the bundled trace.
  if (cmd.empty() || cmd[0] == '-') {
    cmd = "analyze";
    first_arg = 1;
  }
#endif
  const Command* entry = nullptr;
  for (const Command& c : kCommands)
    if (cmd == c.name) entry = &c;
  if (cmd.empty()) {
    usage(std::cerr);
    return kExitUsage;
  }
  if (!entry) {
    std::string known;
    for (const Command& c : kCommands) known.append(known.empty() ? "" : ", ").append(c.name);
    report("", "unknown subcommand '" + cmd + "' (known: " + known + "; fp4lab --help)");
    return kExitUsage;
  }

  inv.command = cmd;
  for (int i = first_arg; i < argc; ++i) inv.args.emplace_back(argv[i]);
  // Under mpirun every rank runs the subcommand; a fault anywhere is agreed on and named once, by rank 0
  // (cli/mpi_dist.hpp). MPI ends before main returns, on every path.
  dist::init(&argc, &argv);
  struct Finalize {
    ~Finalize() { dist::finalize(); }
  } finalize;
  int rc = kExitOk;
  try {
    dist::agree(cmd, [&] { rc = entry->run(inv); });
    return flushed(cmd, rc);
  } catch (const dist::Quiet& q) {
    return q.code;
  } catch (...) {
    std::string msg;
    const int code = dist::describe(std::current_exception(), cmd, msg);
    report(cmd, msg);
    return code;
  }
}
