// Scale formats (fp32, ue4m3, ue8m0) and BF16, the input format. Pure C++, host and device.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "fp4lab/format.hpp"

namespace fp4lab {

// fp32: the block scale is amax/gmax, kept in FP32 (the paper's UFP4 setting).
// ue4m3: NVFP4's positive E4M3 block scale under an FP32 per-tensor scale (Transformer Engine).
// ue8m0: OCP MX power-of-two scale, X = floor(log2 amax) - emax (elements above gmax clip).
// ue8m0_ceil: the other definition in the wild (Transformer Engine's MXFP4 reference):
//             X = ceil(log2(amax / gmax)), which never clips.
enum class ScaleKind : uint8_t { fp32, ue4m3, ue8m0, ue8m0_ceil };
inline constexpr ScaleKind kAllScales[] = {ScaleKind::fp32, ScaleKind::ue4m3, ScaleKind::ue8m0, ScaleKind::ue8m0_ceil};

FP4LAB_HD constexpr const char* scale_name(ScaleKind s) {
  return s == ScaleKind::fp32    ? "fp32"
         : s == ScaleKind::ue4m3 ? "ue4m3"
         : s == ScaleKind::ue8m0 ? "ue8m0"
                                 : "ue8m0-ceil";
}

FP4LAB_HD inline uint32_t f32_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
FP4LAB_HD inline float f32_from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// ---- BF16 ---------------------------------------------------------------------------------------
FP4LAB_HD inline float bf16_to_f32(uint16_t b) { return f32_from_bits(uint32_t(b) << 16); }
// RTNE on the 16 dropped bits; inputs are finite (NaN/Inf are rejected before quantisation).
FP4LAB_HD inline uint16_t f32_to_bf16(float x) {
  const uint32_t u = f32_bits(x);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
FP4LAB_HD inline float round_to_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// ---- E4M3 (OCP FP8 E4M3FN: bias 7, max 448, no Inf; 0x7F is NaN and never produced) -------------
FP4LAB_HD inline float e4m3_decode(uint8_t c) {
  const int e = (c >> 3) & 0xF, m = c & 0x7;
  const float mag = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(float(8 + m), e - 10);
  return (c & 0x80) ? -mag : mag;
}
// Non-negative finite x, RTNE, saturating at 448 (callers clamp first, as Transformer Engine does).
FP4LAB_HD inline uint8_t ue4m3_encode(float x) {
  if (!(x > 0.0f)) return 0;
  if (x >= 448.0f) return 0x7E;
  int e = std::ilogb(x);            // x = 1.f * 2^e
  if (e < -6) e = -6;               // subnormal range shares the minimum exponent
  // q = x / 2^(e-3) is exact (power-of-two scaling); rint gives ties-to-even in the default mode.
  const float q = std::rint(std::ldexp(x, 3 - e));
  // q in [8,16] for normals ([0,8] for subnormals); q == 16 carries into the next binade, which the
  // code arithmetic below does by itself: ((e+7) << 3) + (q - 8) == ((e+8) << 3) + 0.
  return uint8_t(((e + 6) << 3) + int(q));
}

// ---- E8M0 (power of two, code = X + 127, X in [-127, 127]) --------------------------------------
FP4LAB_HD inline float e8m0_decode(uint8_t c) { return std::ldexp(1.0f, int(c) - 127); }
FP4LAB_HD inline uint8_t e8m0_encode_exp(int X) {
  X = X < -127 ? -127 : (X > 127 ? 127 : X);
  return uint8_t(X + 127);
}
// floor(log2 x) for finite x > 0, exact for normals and subnormals.
FP4LAB_HD inline int floor_log2(float x) { return std::ilogb(x); }
FP4LAB_HD inline int ceil_log2(float x) {
  int e;
  const float m = std::frexp(x, &e);  // x = m * 2^e, m in [0.5, 1)
  return m == 0.5f ? e - 1 : e;
}

}  // namespace fp4lab
