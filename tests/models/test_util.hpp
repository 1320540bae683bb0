// Shared helpers for the golden-model tests: hand-written golden tables (docs/spec.md §1), a small
// deterministic input generator, and gtest name sanitising. Nothing here re-derives a format.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "fp4lab/format.hpp"
#include "fp4lab/scale.hpp"

namespace fp4lab::test {

// ---- golden tables, written by hand from docs/spec.md §1 (not from format.hpp) ----------------------
struct Golden {
  ElemFormat f;            // the model's format under test
  const char* name;        // expected name
  int num_levels;          // magnitudes in use
  double levels[8];        // magnitudes, docs/spec.md §1
  int ints[8];             // integer view
  int int_shift;           // log2 of the integer-view factor
  double gmax;
  int emax;                // floor(log2 gmax), the OCP MX "emax of the element"
};

inline const Golden kGolden[] = {
    {kE2M1, "e2m1", 8, {0, 0.5, 1, 1.5, 2, 3, 4, 6}, {0, 1, 2, 3, 4, 6, 8, 12}, 1, 6.0, 2},
    {kE1M2, "e1m2", 8, {0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75}, {0, 1, 2, 3, 4, 5, 6, 7}, 2, 1.75, 0},
    {kInt4, "int4", 8, {0, 1, 2, 3, 4, 5, 6, 7}, {0, 1, 2, 3, 4, 5, 6, 7}, 0, 7.0, 2},
    {kE2M1Max2, "e2m1_max2", 5, {0, 0.5, 1, 1.5, 2}, {0, 1, 2, 3, 4}, 1, 2.0, 1},
};

// gtest prints a parameter with PrintTo: the format's name, not the struct's bytes.
inline void PrintTo(const Golden& g, std::ostream* os) { *os << g.name; }

// gtest parameter names allow [A-Za-z0-9_] only ("ue8m0-ceil" has a dash).
inline std::string gtest_name(std::string s) {
  for (char& c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) c = '_';
  return s;
}

inline std::string hex32(uint32_t u) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", u);
  return b;
}
inline std::string fbits(float x) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g (%s)", double(x), hex32(f32_bits(x)).c_str());
  return b;
}

// splitmix64: tiny, platform-independent input generator (std:: distributions differ by library).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 24 random bits: exact in FP32.
  float uniform() { return float(next() >> 40) * 0x1p-24f; }
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  int64_t range(int64_t lo, int64_t hi) { return lo + int64_t(next() % uint64_t(hi - lo + 1)); }
  // Roughly normal (sum of 4 uniforms, centred): enough for "typical" activations.
  float normal() { return (uniform() + uniform() + uniform() + uniform() - 2.0f) * 1.7320508f; }
  std::vector<float> normals(size_t n, float scale = 1.0f) {
    std::vector<float> v(n);
    for (auto& x : v) x = normal() * scale;
    return v;
  }
};

}  // namespace fp4lab::test
