// Grid rounding (fp4_round) and the E4M3 scale codec: every rounding midpoint between neighbouring levels
// and one ulp either side, every level, saturation, signed zeros and subnormals, SR at the exact
// round-up boundary of its random word, then random values. Golden: round_rtne / round_sr,
// ue4m3_encode / e4m3_decode.
#include <cmath>
#include <string>
#include <vector>

#include "Ve4m3_decode.h"
#include "Vfp4_round.h"
#include "Vue4m3_encode.h"
#include "fp4lab/format.hpp"
#include "fp4lab/scale.hpp"
#include "harness.hpp"

namespace fp4lab::rtl_test {
namespace {

float up(float x) { return std::nextafter(x, INFINITY); }
float down(float x) { return std::nextafter(x, -INFINITY); }

// Values on, between and around the grid of f, in the scaled domain v (before int_view_of).
std::vector<float> grid_probes(const ElemFormat& f) {
  const float step = std::ldexp(1.0f, -f.int_shift());  // v = u * 2^-int_shift
  std::vector<float> u;
  for (int i = 0; i <= f.max_index; ++i) {
    u.push_back(float(f.int_level(i)));
    if (i < f.max_index) u.push_back(0.5f * float(f.int_level(i) + f.int_level(i + 1)));  // midpoint
  }
  std::vector<float> v;
  for (float x : u)
    for (float y : {x * step, up(x * step), down(x * step)})
      if (y >= 0) v.push_back(y);
  for (float y : {0.0f, 1e-45f, 1e-40f, 1.17549435e-38f, f.gmax() * 1.5f, 1e30f, FLT_MAX, INFINITY})
    v.push_back(y);
  std::vector<float> out;
  for (float y : v) {
    out.push_back(y);
    out.push_back(-y);
  }
  return out;
}

TEST(Round, Fp4Grid) {
  Dut<Vfp4_round> dut("fp4_round");
  Checker chk("fp4_round");
  std::mt19937_64 rng(seed());
  auto one = [&](const ElemFormat& f, float v, bool sr, uint32_t r) {
    dut->v_i = f32_bits(v);
    dut->fmt_i = uint32_t(&f - kAllFormats);
    dut->sr_i = sr;
    dut->rbits_i = r >> 8;
    dut.eval();
    const unsigned want = sr ? round_sr(f, v, r) : round_rtne(f, v), got = dut->code_o;
    return chk.check(want == got, [&] {
      return std::string(f.name) + (sr ? " SR r=" + hex32(r) : std::string(" RTNE")) + " v=" + fmt_f32(f32_bits(v)) +
             ": want code " + std::to_string(want) + " got " + std::to_string(got);
    });
  };
  for (const ElemFormat& f : kAllFormats) {
    // RTNE at every level, midpoint and one ulp either side.
    for (float v : grid_probes(f)) one(f, v, false, 0);
    // SR: r around the exact boundary ceil(frac * 2^24), computed with the golden's own int_view_of.
    for (float v : grid_probes(f)) {
      if (std::isinf(v)) continue;
      const float u = int_view_of(f, v);
      int i = 0;
      while (i < f.max_index && float(f.int_level(i + 1)) <= u) ++i;
      double F = 0;
      if (i < f.max_index) F = (double(u) - f.int_level(i)) / (f.int_level(i + 1) - f.int_level(i)) * 16777216.0;
      const int64_t c = int64_t(std::ceil(F));
      for (int64_t R : {c - 1, c, c + 1, int64_t(0), int64_t(0xFFFFFF)})
        if (R >= 0 && R < (1 << 24)) one(f, v, true, uint32_t(R) << 8 | uint32_t(rng() & 0xFF));
    }
    // Random values over the grid's range and beyond, both modes.
    for (uint64_t k = 0, n = scaled(100'000); k < n; ++k) {
      const float v = std::ldexp(float(rng() % (1u << 24)) / float(1u << 24), int(rng() % 40) - 36 + f.emax());
      const float sv = (rng() & 1) ? -v : v;
      if (!one(f, sv, false, 0) || !one(f, sv, true, uint32_t(rng()))) break;
    }
  }
  chk.finish();
}

TEST(Round, Ue4m3Encode) {
  Dut<Vue4m3_encode> dut("ue4m3_encode");
  Checker chk("ue4m3_encode");
  auto one = [&](float x) {
    dut->x_i = f32_bits(x);
    dut.eval();
    const unsigned want = ue4m3_encode(x), got = dut->code_o;
    return chk.check(want == got, [&] {
      return "x=" + fmt_f32(f32_bits(x)) + ": want " + std::to_string(want) + " got " + std::to_string(got);
    });
  };
  // Every code value, every midpoint between neighbours, one ulp either side.
  for (int c = 0; c <= 0x7E; ++c) {
    const float x = e4m3_decode(uint8_t(c));
    for (float y : {x, up(x), down(x)}) one(std::fabs(y));
    if (c < 0x7E) {
      const float mid = 0.5f * (x + e4m3_decode(uint8_t(c + 1)));
      for (float y : {mid, up(mid), down(mid)}) one(y);
    }
  }
  for (float x : {0.0f, -0.0f, 448.0f, 464.0f, 480.0f, 1e30f, FLT_MAX, 1e-45f, 1e-40f}) one(x);
  std::mt19937_64 rng(seed());
  for (uint64_t k = 0, n = scaled(200'000); k < n; ++k)
    if (!one(std::ldexp(float(rng() % (1u << 24)) / float(1u << 24), int(rng() % 160) - 150))) break;
  chk.finish();
}

TEST(Round, E4m3Decode) {
  Dut<Ve4m3_decode> dut("e4m3_decode");
  Checker chk("e4m3_decode");
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;  // NaN codes: never produced by the encoder
    dut->code_i = c;
    dut.eval();
    const uint32_t want = f32_bits(e4m3_decode(uint8_t(c))), got = dut->y_o;
    chk.check(want == got, [&] { return "code " + std::to_string(c) + ": want " + fmt_f32(want) + " got " + fmt_f32(got); });
  }
  chk.finish();
}

}  // namespace
}  // namespace fp4lab::rtl_test
