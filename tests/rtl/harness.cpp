#include "harness.hpp"

#include <cmath>
#include <cstdlib>
#include <cstring>

namespace fp4lab::rtl_test {

namespace {
std::vector<std::string>& plusargs() {
  static std::vector<std::string> v;
  return v;
}
// The whole "+name..." argument whose text starts with "+name", or "".
std::string plusarg(const char* name) {
  const std::string want = std::string("+") + name;
  for (const std::string& a : plusargs())
    if (a.compare(0, want.size(), want) == 0) return a;
  return {};
}
}  // namespace

void set_plusargs(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (argv[i][0] == '+') plusargs().push_back(argv[i]);
}

bool trace_requested() {
  for (const std::string& a : plusargs())
    if (a == "+trace") return true;
  return false;
}

std::string plusarg_value(const char* name) {
  const std::string v = plusarg((std::string(name) + "=").c_str());
  return v.empty() ? v : v.substr(std::strlen(name) + 2);
}

uint64_t seed() {
  const std::string v = plusarg("seed=");
  return v.empty() ? 0x0f4c1ab5ULL : std::strtoull(v.c_str() + 6, nullptr, 0);
}

uint64_t scaled(uint64_t n) {
  const std::string v = plusarg("scale=");
  const double f = v.empty() ? 1.0 : std::strtod(v.c_str() + 7, nullptr);
  const double r = double(n) * f;
  return r < 1.0 ? 1 : uint64_t(r);
}

std::string hex32(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", v);
  return b;
}

std::string fmt_f32(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  char b[64];
  std::snprintf(b, sizeof b, "0x%08x (%.9g)", bits, double(f));
  return b;
}

uint32_t F32Gen::any() {
  static constexpr uint32_t kSpecial[] = {
      0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00400000, 0x00800000, 0x00800001,
      0x3F800000, 0xBF800000, 0x3F800001, 0x3FFFFFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F000000, 0x7F800000,
      0xFF800000, 0x7FC00000, 0x7F800001, 0x3E800000, 0x40C00000, 0x3FE00000, 0x43E00000, 0x34000000};
  const uint32_t kind = uint32_t(rng_() % 16);
  const uint32_t sign = uint32_t(rng_() & 1) << 31;
  switch (kind) {
    case 0:
      return kSpecial[rng_() % (sizeof kSpecial / sizeof kSpecial[0])] ^ (uint32_t(rng_() & 1) << 31);
    case 1:  // subnormal
      return sign | uint32_t(rng_() & 0x7FFFFF);
    case 2:  // near the bottom of the normal range
      return sign | (uint32_t(1 + rng_() % 24) << 23) | uint32_t(rng_() & 0x7FFFFF);
    case 3:  // near the top (overflow)
      return sign | (uint32_t(230 + rng_() % 25) << 23) | uint32_t(rng_() & 0x7FFFFF);
    case 4:
    case 5:
    case 6: {  // short significand: few bits set, so exact results and ties are common
      const int keep = int(rng_() % 12);
      const uint32_t frac = uint32_t(rng_() & 0x7FFFFF) & ~((1u << (23 - keep)) - 1u);
      return sign | (uint32_t(64 + rng_() % 128) << 23) | frac;
    }
    case 7: {  // all-ones tails (carry out of the fraction on round-up)
      const int ones = int(rng_() % 24);
      return sign | (uint32_t(1 + rng_() % 254) << 23) | ((1u << ones) - 1u);
    }
    case 8:  // any bit pattern at all (NaN and Inf included)
      return uint32_t(rng_());
    default:  // ordinary finite values around 1
      return sign | (uint32_t(100 + rng_() % 56) << 23) | uint32_t(rng_() & 0x7FFFFF);
  }
}

uint32_t F32Gen::near(uint32_t a) {
  const uint32_t kind = uint32_t(rng_() % 8);
  const uint32_t sign = uint32_t(rng_() & 1) << 31;
  const int ea = int((a >> 23) & 0xFF);
  switch (kind) {
    case 0:
    case 1: {  // exponent within +-2 (cancellation in add)
      int e = ea + int(rng_() % 5) - 2;
      e = e < 0 ? 0 : (e > 254 ? 254 : e);
      return sign | (uint32_t(e) << 23) | uint32_t(rng_() & 0x7FFFFF);
    }
    case 2: {  // exponent 23..26 below: ties and sticky in add
      int e = ea - 23 - int(rng_() % 4);
      e = e < 0 ? 0 : e;
      const int keep = int(rng_() % 6);
      const uint32_t frac = uint32_t(rng_() & 0x7FFFFF) & ~((1u << (23 - keep)) - 1u);
      return sign | (uint32_t(e) << 23) | frac;
    }
    case 3:  // negation or the same value (exact zero sums, x - x)
      return a ^ (uint32_t(rng_() & 1) << 31);
    case 4: {  // one ulp away
      return (a & 0x7FFFFFFF) == 0x7F7FFFFF ? a : a + 1;
    }
    default:
      return any();
  }
}

}  // namespace fp4lab::rtl_test

int main(int argc, char** argv) {
  fp4lab::rtl_test::set_plusargs(argc, argv);  // +trace, +seed=, +scale= (gtest ignores them)
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
