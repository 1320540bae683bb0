// fp4lab: the command-line front end of the golden model. `fp4lab <subcommand> [options]`; each subcommand
// lives in cli/cmd_<name>.cpp and is listed in kCommands. Every fault ends as one line on stderr,
// "fp4lab <cmd>: error: <file>: <fault>", with an exit code of fp4lab/io/exit_codes.hpp; nothing escapes main.
#include <malloc.h>
#include <signal.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <iostream>
#include <new>
#include <string>

#include "commands.hpp"
#include "faults.hpp"  // and fp4lab/dist/dist.hpp
#include "files.hpp"
#include "fp4lab/io/files.hpp"
#include "fp4lab/io/safetensors.hpp"
#include "fp4lab/io/threads.hpp"
#include "options.hpp"

namespace fp4lab::cli {
namespace {

using io::ThreadsVar, io::kThreadsVars, io::threads_value_ok, io::threads_fault, io::threads_env_fault,
    io::one_level_of_threads;

// The first thread variable that breaks the rule of fp4lab/io/threads.hpp, as given (at most 255 bytes of it), taken out of
// the environment (with any other that breaks it) before libgomp's initialiser reads it: libgomp would print its own
// warning for a malformed value, and main reports the one line instead.
char g_refused_threads[256];
const ThreadsVar* g_threads_refused = nullptr;

extern "C" void take_refused_threads(int, char**, char** envp) {
  for (const ThreadsVar& var : kThreadsVars) {
    const size_t n = std::strlen(var.name);
    for (char** e = envp; e && *e; ++e)
      if (std::strncmp(*e, var.name, n) == 0 && (*e)[n] == '=') {
        if (threads_value_ok(*e + n + 1, var)) break;
        if (!g_threads_refused) {
          g_threads_refused = &var;
          std::strncpy(g_refused_threads, *e + n + 1, sizeof g_refused_threads - 1);
        }
        for (char** d = e; *d; ++d) d[0] = d[1];  // the array the process's environ points to
        break;
      }
  }
}
// .preinit_array: run before every shared library's initialiser (libgomp's reads OMP_NUM_THREADS).
__attribute__((section(".preinit_array"), used)) void (*const g_take_refused_threads)(int, char**, char**) =
    take_refused_threads;

#ifndef FP4LAB_CLI_HAS_SIM
// A build without SystemC lists `sim` all the same, and says so in one line when it is asked for (fp4lab/io/exit_codes.hpp).
int cmd_sim_not_built(const Invocation&) {
  throw Error(kExitNoSim, "this fp4lab was built without the simulator (FP4LAB_SIM=OFF or no SystemC found when "
                          "configured): install SystemC (apt-get install libsystemc-dev pkg-config) and build fp4lab again");
}
#endif

// `decide` and `plot` belong to the Python package (they join the simulator with the analyses and the training
// evidence, and draw with matplotlib): the `fp4lab` console script of an installed package runs them; this
// executable lists them and says where they run.
int cmd_python_only(const Invocation& inv) {
  throw Error(kExitUsage, "'" + inv.command + "' is run by the Python package: `fp4lab " + inv.command +
                              " ...` once it is installed (pip install .), or `PYTHONPATH=BUILD/python python3 -m "
                              "fp4lab " + inv.command + " ...` beside a build (docs/decide.md)");
}

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
#else
    {"sim", "cycle-approximate tensor-core model (SystemC): not in this build", cmd_sim_not_built},
#endif
    {"decide", "go/no-go on uniform-grid hardware for a model, in one report (Python package)", cmd_python_only},
    {"plot", "figures of analyze JSON and sim --sweep CSV (Python package)", cmd_python_only},
    {"cuda check", "every GEMM of a trace quantised and multiplied on the GPU, against the golden model bit for bit",
     cmd_cuda_check},
    {"cuda bench", "GPU quantiser (plain / fused RHT / unfused RHT) and block-scaled GEMM beside their baselines",
     cmd_cuda_bench},
    {"cuda qbench", "GPU BF16 quantiser variants (plain / RHT-16 / SR, row-wise and transposed) beside a copy",
     cmd_cuda_qbench},
    {"cuda timings", "per-kernel GPU medians over given shapes, as JSON (the simulator's validation set)",
     cmd_cuda_timings},
};

// A group is the first word of two-word subcommands ("cuda" of "cuda check").
bool is_group(const std::string& word) {
  for (const Command& c : kCommands)
    if (std::strncmp(c.name, word.c_str(), word.size()) == 0 && c.name[word.size()] == ' ') return true;
  return false;
}

void list(std::ostream& os, const std::string& group) {
  size_t width = 0;
  for (const Command& c : kCommands) width = std::max(width, std::strlen(c.name));
  for (const Command& c : kCommands)
    if (group.empty() || std::string(c.name).rfind(group + " ", 0) == 0)
      os << "  " << c.name << std::string(width + 2 - std::strlen(c.name), ' ') << c.summary << "\n";
}

void usage(std::ostream& os) {
  os << "usage: fp4lab <subcommand> [options]    (fp4lab <subcommand> --help for its options)\n\nsubcommands:\n";
  list(os, "");
  os << "\nexit codes:\n";
  for (const ExitCode& e : kExitCodes) os << "  " << e.code << "  " << e.meaning << "\n";
}

void group_usage(std::ostream& os, const std::string& group) {
  os << "usage: fp4lab " << group << " <subcommand> [options]    (fp4lab " << group
     << " <subcommand> --help for its options)\n\nsubcommands:\n";
  list(os, group);
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
  namespace dist = fp4lab::dist;
  // Keep freed tensors in the heap: glibc otherwise maps every large buffer afresh and unmaps it on free, and
  // the page faults of re-zeroing them were 12% of `analyze` (17% of its wall time on the bundled trace).
  mallopt(M_MMAP_THRESHOLD, 16 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // A run ended by SIGINT, SIGTERM, SIGHUP or SIGPIPE leaves no temporary output behind (docs/spec.md §11.1); a write
  // past a file-size limit (ulimit -f) fails with EFBIG, reported as a failed write, instead of ending it by SIGXFSZ.
  fp4lab::io::remove_temporaries_on_signals();
  one_level_of_threads();
  Invocation inv;
  for (int i = 0; i < argc; ++i) {
    if (i) inv.command_line += ' ';
    inv.command_line += fp4lab::shell_quote(argv[i]);
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
  if (is_group(cmd)) {
    const std::string next = argc > 2 ? argv[2] : "";
    if (next == "--help" || next == "-h" || next == "help") {
      group_usage(std::cout, cmd);
      return flushed(cmd, kExitOk);
    }
    if (next.empty()) {
      group_usage(std::cerr, cmd);
      return kExitUsage;
    }
    if (next[0] == '-') {
      report(cmd, "'" + next + "' comes before a subcommand (fp4lab " + cmd + " --help lists them)");
      return kExitUsage;
    }
    cmd += " " + next;
    first_arg = 3;
  }
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
  // (fp4lab/dist/dist.hpp). MPI ends before main returns, on every path.
  dist::init(&argc, &argv);
  struct Finalize {
    ~Finalize() { dist::finalize(); }
  } finalize;
  int rc = kExitOk;
  try {
    dist::agree(describer(cmd), [&] {
      // Before any work (and any thread): a thread count OpenMP cannot honour (fp4lab/io/threads.hpp).
      if (g_threads_refused) usage_error(threads_fault(g_refused_threads, *g_threads_refused));
      if (const auto fault = threads_env_fault()) usage_error(*fault);
      rc = entry->run(inv);
    });
    return flushed(cmd, rc);
  } catch (const dist::Quiet& q) {
    return q.code;
  } catch (...) {
    std::string msg;
    const int code = describe(std::current_exception(), cmd, msg);
    report(cmd, msg);
    return code;
  }
}
