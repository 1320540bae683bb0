// The conformance check of the CUDA kernels: every GEMM of one or more traces (docs/spec.md §7), each pass
// (fwd_y, bwd_dx, bwd_dw), quantised and multiplied on the GPU and by the golden model, compared bit for bit:
// codes, block scales, scale codes and the tensor scale of both operands (fused, and unfused where the recipe
// rotates), and the FP32 outputs of the chosen GPU GEMM kernels (outputs poisoned first). Optionally the SM100
// native path, within native_tolerance() (fp4lab/cuda/kernels.hpp).
//
// Work can be shared: a ConformanceCheck lists the records of opened traces (no tensor data, no device), each
// process checks the records it owns into a CheckResult, and the results add up (merge) to exactly one process's
// result. The front-end (fp4lab cuda check) spreads the records over MPI ranks and prints; nothing here prints.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4lab/cuda/device.hpp"
#include "fp4lab/io/safetensors.hpp"
#include "fp4lab/quantize.hpp"
#include "fp4lab/recipe.hpp"

namespace fp4lab::cuda {

// The GPU GEMM kernels whose outputs are compared.
enum class CheckedGemm { fast, reference, both };

struct CheckOptions {
  Recipe recipe = Recipe::preset("ufp4");  // its seed included
  CheckedGemm gemm = CheckedGemm::both;
  int show = 5;         // mismatches kept (and handed to CheckEvents::mismatch) per category
  int limit = 0;        // only the first N GEMM records of the traces (0: all)
};

// A difference between the golden model and the GPU. Categories (`what`): "codes" and "scale codes" (bytes);
// "scales", "global scale", "gemm fast", "gemm reference" (FP32 values by bit pattern).
struct Mismatch {
  std::string what;
  std::string where;     // "<gemm>.<pass> A (<config label>[, unfused RHT])", "<gemm>.<pass> C", ...
  bool floats = false;   // FP32 bit patterns (else bytes)
  bool sizes = false;    // the two tensors differ in size (golden_size, gpu_size); no element compared
  size_t golden_size = 0, gpu_size = 0;
  int64_t row = 0, col = 0;      // the element, in a row-major [rows, cols] view
  uint32_t golden = 0, gpu = 0;  // its byte, or its FP32 bit pattern
};

// Per category: values compared, values that differ, and pairs where both sides are NaN (counted equal: x86 and
// CUDA produce different canonical NaNs, whose payloads are not part of the contract).
struct Tally {
  std::string what;
  uint64_t compared = 0, mismatched = 0, nan_pairs = 0;
};

// The SM100 native path: outputs compared, outputs outside the tolerance, the worst |err| / tolerance.
struct NativeTally {
  uint64_t compared = 0, out_of_bound = 0;
  double worst = 0.0;
};

// One pass of one record, once checked.
struct GemmChecked {
  size_t record = 0;
  std::string name;  // "<gemm>.<pass>", the GEMM's name escaped (fp4lab::printable)
  int64_t M = 0, N = 0, K = 0;
  QuantConfig a, b;
};

struct CheckResult {
  std::map<std::string, Tally> tallies;  // by category
  NativeTally native;
  // The first record (in record order) that could not be checked -- the golden model rejected its data, or the
  // device failed -- and why; the records after it in the same share were not checked.
  std::optional<size_t> fault_index;
  std::string fault;
  std::vector<Mismatch> mismatches;  // this process's first `show` per category, in the order found (not merged)

  uint64_t compared() const;    // over every category
  uint64_t mismatched() const;
  // The counts and the fault, exactly (doubles as their shortest round-trip text), to carry a share's result to
  // the process that merges; mismatches are not carried.
  std::string to_bytes() const;
  static CheckResult from_bytes(const std::string& bytes);
};
// The shares' results added up: counts summed, the worst ratio the largest, the fault the lowest record's.
CheckResult merge(const std::vector<CheckResult>& parts);

// A record's fault, as the front-end reports it once the shares are merged: what() is the one-line message.
struct CheckFault : std::runtime_error {
  size_t record;
  CheckFault(size_t r, const std::string& msg) : std::runtime_error(msg), record(r) {}
};

// Called as the check goes (on the calling thread); either may be empty.
struct CheckEvents {
  std::function<void(const Mismatch&)> mismatch;  // each mismatch kept, as found
  std::function<void(const GemmChecked&)> gemm;   // each pass of each record, once checked
};

class ConformanceCheck {
 public:
  // The records of `traces` (opened with options.recipe.block), in order: a record's position is its stochastic-
  // rounding stream. Reads no tensor data and touches no device.
  ConformanceCheck(std::vector<std::unique_ptr<io::Trace>> traces, CheckOptions options);
  ~ConformanceCheck();
  ConformanceCheck(const ConformanceCheck&) = delete;
  ConformanceCheck& operator=(const ConformanceCheck&) = delete;

  const CheckOptions& options() const { return opt_; }
  size_t records() const { return refs_.size(); }  // GEMM records to check (after limit)
  // Per record, its work (tokens*in + out*in + tokens*out), to share the records out.
  const std::vector<uint64_t>& sizes() const { return sizes_; }
  // Whether the current device runs the native path (false, and why, when it does not). Call after use_device.
  static bool native_ready(std::string* why);

  // Checks, on the current device, the records whose owner is `me` (owner: one entry per record), in record
  // order; with `native` (where native_ready), the SM100 path too, within its tolerance, for the operands it takes.
  // A record that cannot be checked ends the share: it is returned as the fault, never thrown.
  CheckResult run(const std::vector<int>& owner, int me, bool native, const CheckEvents& events = {}) const;

 private:
  struct Ref {
    const io::Trace* trace;
    const io::TraceRecord* rec;
  };
  CheckOptions opt_;
  std::vector<std::unique_ptr<io::Trace>> traces_;
  std::vector<Ref> refs_;  // all traces' records in order
  std::vector<uint64_t> sizes_;
};

}  // namespace fp4lab::cuda
