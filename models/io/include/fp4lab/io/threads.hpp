// The OpenMP threads a run may ask for (docs/spec.md §11.1): one rule for the command line (cli/main.cpp) and the
// Python module (python/src/core.cpp). OMP_NUM_THREADS, when set, must be a whole number from 1 to kMaxThreads, or
// a comma-separated list of them (OpenMP's list, one per nesting level); OMP_THREAD_LIMIT, when set, a whole number
// from 1 to 2^31 - 1. libgomp itself ends a run that asks for 100,000 threads in SIGSEGV and one of 40,000 with its
// own message, and ignores a malformed value ("abc", "0", "-3") after a warning of its own; fp4lab refuses both with
// one line naming the variable and its value.
// Parallel regions run one level deep (one_level_of_threads): fp4lab's inner regions run serially inside outer ones,
// and nested teams (OMP_NESTED, OMP_MAX_ACTIVE_LEVELS, a list in OMP_NUM_THREADS) would multiply the threads.
#pragma once

#include <omp.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "fp4lab/text.hpp"

namespace fp4lab::io {

inline constexpr const char* kThreadsVar = "OMP_NUM_THREADS";
inline constexpr unsigned long kMaxThreads = 1024;

// The variables the rule covers: name, largest value, whether a comma-separated list is allowed.
struct ThreadsVar {
  const char* name;
  unsigned long max;
  bool list;
};
inline constexpr ThreadsVar kThreadsVars[] = {
    {kThreadsVar, kMaxThreads, true},
    {"OMP_THREAD_LIMIT", 2147483647UL, false},
};

// Whether a value follows its variable's rule (blanks around each number allowed, as OpenMP allows them).
// No allocation and no exception: the command line checks the variables before any library initialiser has run.
inline bool threads_value_ok(const char* v, const ThreadsVar& var = kThreadsVars[0]) noexcept {
  for (;;) {
    while (*v == ' ' || *v == '\t') ++v;
    unsigned long n = 0;
    const char* digits = v;
    for (; *v >= '0' && *v <= '9'; ++v)
      if ((n = n * 10 + unsigned(*v - '0')) > var.max) return false;
    if (v == digits || n == 0) return false;
    while (*v == ' ' || *v == '\t') ++v;
    if (*v == '\0') return true;
    if (!var.list || *v++ != ',') return false;
  }
}

// The one-line fault of NAME=value (its first 80 bytes shown, quoted as a shell would read them back).
inline std::string threads_fault(const std::string& value, const ThreadsVar& var = kThreadsVars[0]) {
  const std::string shown = value.size() <= 80 ? value : value.substr(0, 80) + "...";
  return std::string(var.name) + "=" + shell_quote(shown) + ": not a thread count from 1 to " +
         std::to_string(var.max) +
         (var.list ? " (a whole number, or a comma-separated list of them, one per nesting level)" : " (a whole number)");
}

// The fault of the first of the process's thread variables that breaks its rule, or nothing.
inline std::optional<std::string> threads_env_fault() {
  for (const ThreadsVar& var : kThreadsVars) {
    const char* v = std::getenv(var.name);
    if (v != nullptr && !threads_value_ok(v, var)) return threads_fault(v, var);
  }
  return std::nullopt;
}

inline void one_level_of_threads() { omp_set_max_active_levels(1); }

}  // namespace fp4lab::io
