// The OpenMP threads a run may ask for (docs/spec.md §11.1): one rule for the command line (main.cpp) and the
// Python module (python/src/core.cpp). OMP_NUM_THREADS, when set, must be a whole number from 1 to kMaxThreads, or a
// comma-separated list of them (OpenMP's list, one per nesting level). libgomp itself ends a run that asks for
// 100,000 threads in SIGSEGV and one of 40,000 with its own message, and ignores a malformed value ("abc", "0", "-3")
// after a warning of its own; fp4lab refuses both with one line naming the variable and its value.
// Parallel regions run one level deep (one_level_of_threads): fp4lab's inner regions run serially inside outer ones,
// and nested teams (OMP_NESTED, OMP_MAX_ACTIVE_LEVELS, a list in OMP_NUM_THREADS) would multiply the threads.
#pragma once

#include <omp.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "text.hpp"

namespace fp4lab::cli {

inline constexpr const char* kThreadsVar = "OMP_NUM_THREADS";
inline constexpr unsigned long kMaxThreads = 1024;

// Whether an OMP_NUM_THREADS value follows the rule (blanks around each number allowed, as OpenMP allows them).
// No allocation and no exception: the command line checks the variable before any library initialiser has run.
inline bool threads_value_ok(const char* v) noexcept {
  for (;;) {
    while (*v == ' ' || *v == '\t') ++v;
    unsigned long n = 0;
    const char* digits = v;
    for (; *v >= '0' && *v <= '9'; ++v)
      if ((n = n * 10 + unsigned(*v - '0')) > kMaxThreads) return false;
    if (v == digits || n == 0) return false;
    while (*v == ' ' || *v == '\t') ++v;
    if (*v == '\0') return true;
    if (*v++ != ',') return false;
  }
}

// The one-line fault of OMP_NUM_THREADS=value (its first 80 bytes shown, quoted as a shell would read them back).
inline std::string threads_fault(const std::string& value) {
  const std::string shown = value.size() <= 80 ? value : value.substr(0, 80) + "...";
  return std::string(kThreadsVar) + "=" + shell_quote(shown) + ": not a thread count from 1 to " +
         std::to_string(kMaxThreads) + " (a whole number, or a comma-separated list of them, one per nesting level)";
}

// The fault of the process's OMP_NUM_THREADS, or nothing when it is unset or follows the rule.
inline std::optional<std::string> threads_env_fault() {
  const char* v = std::getenv(kThreadsVar);
  if (v == nullptr || threads_value_ok(v)) return std::nullopt;
  return threads_fault(v);
}

inline void one_level_of_threads() { omp_set_max_active_levels(1); }

}  // namespace fp4lab::cli
