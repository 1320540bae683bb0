// Random Hadamard transform on blocks of d consecutive elements: RHT_d(x) = H_d . diag(s) . x / sqrt(d).
//
// FP32 operation order (part of the bit-exact contract, docs/datapath.md section 2):
//   1. y_j = s_j * x_j                       (exact: a sign flip)
//   2. butterfly stages h = 1, 2, 4, ..., d/2: for every j with (j & h) == 0,
//        (y_j, y_{j+h}) <- (y_j + y_{j+h}, y_j - y_{j+h})     one FP32 rounding each
//   3. y_j = y_j * inv_sqrt(d), inv_sqrt(d) = FP32(1/sqrt(d)) (exact for d = 16 and 64)
// The stages realise the Sylvester matrix H_d = H_2 (x) H_{d/2} in natural order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4lab/format.hpp"
#include "fp4lab/philox.hpp"

namespace fp4lab {

// The Hadamard sizes the quantiser rotates by: powers of two from one block of 16 elements to 128.
inline constexpr int kMinRht = 16;
inline constexpr int kMaxRht = 128;

// Transformer Engine's fixed sign vector for d = 16 (docs/spec.md §3).
inline constexpr float kTeSigns16[16] = {+1, +1, +1, -1, +1, -1, -1, -1, -1, -1, -1, +1, -1, +1, -1, -1};

FP4LAB_HD inline float rht_inv_sqrt(int d) {
  return d == 16 ? 0.25f : d == 64 ? 0.125f : float(1.0 / std::sqrt(double(d)));
}

// In-place RHT of one block of d values (d a power of two, 2..128).
FP4LAB_HD inline void rht_block(float* y, int d, const float* signs) {
  for (int j = 0; j < d; ++j) y[j] = signs[j] < 0 ? -y[j] : y[j];
  for (int h = 1; h < d; h <<= 1) {
    for (int j = 0; j < d; ++j) {
      if (j & h) continue;
      const float a = y[j], b = y[j + h];
      y[j] = a + b;
      y[j + h] = a - b;
    }
  }
  const float r = rht_inv_sqrt(d);
  for (int j = 0; j < d; ++j) y[j] = y[j] * r;
}

inline bool rht_size_ok(int d) { return d >= kMinRht && d <= kMaxRht && (d & (d - 1)) == 0; }
// The one message for a size outside that range.
inline std::string rht_size_fault(int d) {
  return "RHT size must be a power of two from " + std::to_string(kMinRht) + " to " + std::to_string(kMaxRht) +
         ", not " + std::to_string(d);
}

// Seeded signs (documented generator): s_j = -1 iff bit 0 of random_bits(seed, kRhtStream, j) is set.
inline constexpr uint32_t kRhtStream = 0x52485400u;  // "RHT\0"
inline std::vector<float> rht_signs_from_seed(int d, uint64_t seed) {
  std::vector<float> s(d);
  for (int j = 0; j < d; ++j) s[j] = (random_bits(seed, kRhtStream, uint64_t(j)) & 1u) ? -1.0f : 1.0f;
  return s;
}

// Transformer Engine's vector; TE defines it for d = 16 only, so other sizes are refused.
inline std::vector<float> rht_signs_te(int d) {
  if (d != 16) throw std::invalid_argument("Transformer Engine's RHT sign vector is defined for d = 16 only, not " + std::to_string(d));
  return std::vector<float>(kTeSigns16, kTeSigns16 + 16);
}

// A rotation in a message: "RHT-16 (signs te)" for Transformer Engine's vector, else the signs as hex digits,
// four signs a digit, the first sign the top bit, a set bit a -1 ("RHT-32 (signs 0x1d0f35e2)"); "no RHT" for d = 0.
inline std::string rht_name(int d, const std::vector<float>& signs) {
  if (d == 0) return "no RHT";
  std::string r = "RHT-" + std::to_string(d) + " (signs ";
  if (d == 16 && signs.size() == 16 && std::equal(signs.begin(), signs.end(), kTeSigns16)) return r + "te)";
  r += "0x";
  static const char kHex[] = "0123456789abcdef";
  for (size_t i = 0; i < signs.size(); i += 4) {
    int v = 0;
    for (size_t j = i; j < i + 4; ++j) v = v * 2 + (j < signs.size() && signs[j] < 0 ? 1 : 0);
    r += kHex[v];
  }
  return r + ")";
}

}  // namespace fp4lab
