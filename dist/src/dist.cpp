// MPI work distribution for fp4lab subcommands (see dist.hpp). Built with and without MPI; without it
// (FP4LAB_HAVE_MPI undefined) every call is the one-process case.
#include "fp4lab/dist/dist.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <new>
#include <utility>

#include "fp4lab/io/exit_codes.hpp"

#ifdef FP4LAB_HAVE_MPI
#include <mpi.h>
#endif

namespace fp4lab::dist {

namespace {
int g_rank = 0, g_size = 1;
// Unused in the one-process build (fp4lab_dist), which compiles this same file without MPI.
[[maybe_unused]] bool g_mpi = false;        // MPI_Init was called
[[maybe_unused]] bool g_finalized = false;
[[maybe_unused]] bool g_failed = false;     // the job has agreed on a fault: no more communication

// Environment variables an MPI launcher sets in every process it starts (Open MPI, MPICH/Hydra, PMIx/Slurm).
const char* launcher_size() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
    if (const char* s = std::getenv(v)) return s;
  return std::getenv("PMIX_RANK") ? "?" : nullptr;
}

#ifdef FP4LAB_HAVE_MPI
struct Verdict {
  int rank = -1;  // the failing rank whose fault wins; -1: none failed
  int code = 0;
};

// Every rank contributes (code, key), code 0 meaning no fault; the winner is the failing rank with the
// lowest (key, rank). agree() and gather() share this one exchange (same datatype and count), so ranks that
// reach different call sites after an asymmetric fault still match each other's collective.
Verdict exchange(int code, uint64_t key) {
  const uint64_t mine[2] = {uint64_t(code), key};
  std::vector<uint64_t> all(2 * size_t(g_size));
  MPI_Allgather(mine, 2, MPI_UINT64_T, all.data(), 2, MPI_UINT64_T, MPI_COMM_WORLD);
  Verdict v;
  uint64_t best = 0;
  for (int r = 0; r < g_size; ++r) {
    const uint64_t c = all[2 * size_t(r)], k = all[2 * size_t(r) + 1];
    if (c != 0 && (v.rank < 0 || k < best)) {
      v = {r, int(c)};
      best = k;
    }
  }
  return v;
}

// The winning rank's message, on rank 0 (others get "").
std::string fetch_message(const Verdict& v, const std::string& mine) {
  constexpr int kTag = 4201;
  if (v.rank == 0) return g_rank == 0 ? mine : std::string();
  if (g_rank == v.rank) {
    MPI_Send(mine.data(), int(mine.size()), MPI_CHAR, 0, kTag, MPI_COMM_WORLD);
    return {};
  }
  if (g_rank != 0) return {};
  MPI_Status st;
  MPI_Probe(v.rank, kTag, MPI_COMM_WORLD, &st);
  int n = 0;
  MPI_Get_count(&st, MPI_CHAR, &n);
  std::string msg(size_t(n), '\0');
  MPI_Recv(msg.data(), n, MPI_CHAR, v.rank, kTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  return msg;
}
#endif
}  // namespace

bool built_with_mpi() {
#ifdef FP4LAB_HAVE_MPI
  return true;
#else
  return false;
#endif
}

void init(int* argc, char*** argv) {
  const char* launched = launcher_size();
#ifdef FP4LAB_HAVE_MPI
  if (!launched) return;  // a plain run: no MPI runtime needed
  int provided = 0;
  // Only the main thread calls MPI; OpenMP threads inside a rank never do.
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  g_mpi = true;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
#else
  (void)argc;
  (void)argv;
  // Every rank would run the whole job and write the same outputs: say so once per rank, then go on.
  if (launched && std::strcmp(launched, "1") != 0)
    std::cerr << "fp4lab: warning: started by an MPI launcher, but this build has no MPI (FP4LAB_MPI=OFF): "
                 "each process runs the whole job\n";
#endif
}

void finalize() {
#ifdef FP4LAB_HAVE_MPI
  if (g_mpi && !g_finalized) {
    g_finalized = true;
    MPI_Finalize();
  }
#endif
}

int rank() { return g_rank; }
int size() { return g_size; }

void agree(const Describe& describe, const std::function<void()>& f) {
  std::exception_ptr e;
  try {
    f();
  } catch (...) {
    e = std::current_exception();
  }
#ifdef FP4LAB_HAVE_MPI
  if (g_mpi && g_size > 1 && !g_failed) {
    std::string msg;
    const int code = e ? describe(e, msg) : 0;
    const Verdict v = exchange(code, 0);
    if (v.rank < 0) return;
    g_failed = true;
    const std::string m = fetch_message(v, msg);
    if (g_rank != 0) throw Quiet{v.code};
    if (v.rank == 0) std::rethrow_exception(e);
    throw JobFault(v.code, m);
  }
#else
  (void)describe;
#endif
  if (e) std::rethrow_exception(e);
}

std::vector<std::string> gather(std::vector<Item> mine, const Fault& fault) {
  const bool faulted = fault.index != SIZE_MAX;
  std::vector<std::pair<size_t, std::string>> all;
#ifdef FP4LAB_HAVE_MPI
  if (g_mpi && g_size > 1) {
    if (g_failed) throw Quiet{io::kExitData};  // not reached: a failed job does not gather
    const Verdict v = exchange(faulted ? fault.code : 0, fault.index);
    if (v.rank >= 0) {
      g_failed = true;
      const std::string m = fetch_message(v, fault.msg);
      if (g_rank != 0) throw Quiet{v.code};
      throw JobFault(v.code, m);
    }
    // One buffer per rank: [u64 index][u64 length][bytes] per item.
    std::string buf;
    for (const Item& it : mine) {
      const uint64_t head[2] = {it.index, it.bytes.size()};
      buf.append(reinterpret_cast<const char*>(head), sizeof head);
      buf.append(it.bytes);
    }
    mine.clear();
    const uint64_t len = buf.size();
    std::vector<uint64_t> lens(static_cast<size_t>(g_size));
    MPI_Gather(&len, 1, MPI_UINT64_T, lens.data(), 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    std::vector<int> counts(static_cast<size_t>(g_size)), displs(static_cast<size_t>(g_size));
    std::string recv;
    if (g_rank == 0) {
      uint64_t total = 0;
      for (int r = 0; r < g_size; ++r) {
        displs[size_t(r)] = int(total);
        counts[size_t(r)] = int(lens[size_t(r)]);
        total += lens[size_t(r)];
      }
      // Results are a few kB per item; MPI counts are int.
      if (total > uint64_t(INT32_MAX)) throw JobFault(io::kExitData, "results of all ranks exceed 2 GiB");
      recv.resize(total);
    }
    MPI_Gatherv(buf.data(), int(len), MPI_CHAR, recv.data(), counts.data(), displs.data(), MPI_CHAR, 0,
                MPI_COMM_WORLD);
    if (g_rank != 0) return {};
    for (size_t p = 0; p < recv.size();) {
      uint64_t head[2];
      std::memcpy(head, recv.data() + p, sizeof head);
      p += sizeof head;
      all.emplace_back(size_t(head[0]), recv.substr(p, head[1]));
      p += head[1];
    }
  } else
#endif
  {
    if (faulted) throw JobFault(fault.code, fault.msg);
    for (Item& it : mine) all.emplace_back(it.index, std::move(it.bytes));
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  out.reserve(all.size());
  for (auto& [i, b] : all) out.push_back(std::move(b));
  return out;
}

int from_root(int value) {
#ifdef FP4LAB_HAVE_MPI
  if (g_mpi && g_size > 1 && !g_failed) MPI_Bcast(&value, 1, MPI_INT, 0, MPI_COMM_WORLD);
#endif
  return value;
}

}  // namespace fp4lab::dist
