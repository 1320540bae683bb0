// The sweep file of `fp4lab sim --sweep` (TOML; docs/mpi.md): its text -> the runs it describes. Kept apart from
// the sweep itself (sim_sweep.cpp) so that the readers' fuzz target (tests/sim/fuzz_readers.cpp) runs it alone.
//
//   [meta]        free-form values, copied into the results JSON
//   [defaults]    options of every run: `fp4lab sim --KEY VALUE` (e.g. config, recipe, "mac.kind")
//   [[grid]]      one group of runs: its keys on top of [defaults]; every key given a list varies, and the
//                 group runs the cartesian product (keys in alphabetical order, the last varying fastest).
//                 `name` is the run name, with {KEY} replaced by the run's value of KEY.
// Values are strings, integers, floats or booleans (true: the switch --KEY; false: left out). Dotted keys
// (prep.mode = "fused") and quoted ones ("prep.mode" = "fused") mean the same option.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace fp4lab::cli {

// docs/mpi.md and docs/spec.md §11.1: a sweep of more runs is refused before any is built; a longer run name too.
inline constexpr uint64_t kMaxSweepRuns = 100000;
inline constexpr size_t kMaxSweepName = 1024;

struct SweepRun {
  std::string name;
  std::map<std::string, std::string> opts;  // option -> value text ("" with a switch)
  std::set<std::string> switches;
  std::vector<std::string> args() const {
    std::vector<std::string> a;
    for (const auto& [k, v] : opts) {
      a.push_back("--" + k);
      if (!switches.count(k)) a.push_back(v);
    }
    return a;
  }
};

// A fault of the sweep file, a usage fault (exit 2): what() is one line that starts with the file's name.
struct SweepError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The runs of a sweep file's text, `file` naming it in messages; `meta` receives its [meta] table. Throws SweepError.
std::vector<SweepRun> parse_sweep(const std::string& text, const std::string& file, nlohmann::ordered_json& meta);

}  // namespace fp4lab::cli
