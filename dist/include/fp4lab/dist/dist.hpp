// Spreading a subcommand's independent work items (trace records, sweep runs) over MPI ranks, with results
// and faults identical to one process. Without MPI (built without it, or not started by an MPI launcher)
// every function here acts as the one-process case: rank 0 of 1, no communication.
//
// Protocol: every rank opens the same inputs, computes the items assign() gives it, and gather() brings each
// item's bytes to rank 0 in item order, where the subcommand merges them exactly as a single process would.
// Faults are agreed on collectively, so a fault on any rank ends every rank with one message, printed by rank 0.
// A library below the front-ends: a fault is read through the front-end's own Describe (its exit code and message),
// and one that the ranks agreed on comes back as JobFault (or Quiet).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace fp4lab::dist {

// From main: MPI_Init only when an MPI launcher (mpirun, srun) started this process, so a plain run needs no
// MPI runtime and behaves as before. finalize() is safe to call more than once.
void init(int* argc, char*** argv);
void finalize();
bool built_with_mpi();
int rank();
int size();
inline bool root() { return rank() == 0; }

// Thrown on ranks other than 0 once the job has agreed on a fault, which rank 0 reports: main exits with
// `code` and prints nothing, so the fault is named once.
struct Quiet {
  int code;
};

// Thrown on rank 0 for a fault the job agreed on that rank 0 did not throw itself (another rank's, or a fault
// gather() was handed): the exit code and one-line message that the failing rank's Describe gave it.
struct JobFault : std::runtime_error {
  int code;
  JobFault(int c, const std::string& msg) : std::runtime_error(msg), code(c) {}
};

// The front-end's reading of a fault: returns its exit code (never 0) and sets msg to its one-line message (empty
// for Quiet).
using Describe = std::function<int(std::exception_ptr e, std::string& msg)>;

// Owner rank of each item: largest first (ties: lower index first), each to the least-loaded rank so far
// (ties: lower rank). Deterministic, so every rank computes the same table without communicating.
inline std::vector<int> assign(const std::vector<uint64_t>& sizes, int ranks) {
  std::vector<size_t> order(sizes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  std::vector<uint64_t> load(size_t(std::max(ranks, 1)), 0);
  std::vector<int> owner(sizes.size(), 0);
  for (size_t i : order) {
    const size_t r = size_t(std::min_element(load.begin(), load.end()) - load.begin());  // first minimum
    owner[i] = int(r);
    load[r] += sizes[i];
  }
  return owner;
}

// Runs f on every rank, then agrees: if f threw on any rank, every rank throws -- on rank 0 the fault of the
// lowest failing rank (its own exception as is, another rank's as JobFault with the code and message that
// rank's `describe` gave it), Quiet elsewhere. Once a job has agreed on a fault no further communication
// happens, so ranks that fail at different points cannot wait on each other.
void agree(const Describe& describe, const std::function<void()>& f);

struct Item {
  size_t index;        // position in the single-process order
  std::string bytes;   // the item's result, serialised exactly (e.g. CBOR: doubles as raw IEEE bits)
};
// A rank's first fault, at the item with this index (SIZE_MAX: none).
struct Fault {
  size_t index = SIZE_MAX;
  int code = 0;
  std::string msg;
};

// Brings every rank's items to rank 0, ordered by index (other ranks get an empty vector). If any rank
// faulted, every rank throws instead: rank 0 JobFault with the fault of the lowest item index -- the one a
// single process, which stops at its first fault, would have met -- and Quiet elsewhere.
std::vector<std::string> gather(std::vector<Item> mine, const Fault& fault);

// Rank 0's value on every rank (an exit code rank 0 decides from what gather() brought it).
int from_root(int value);

}  // namespace fp4lab::dist
