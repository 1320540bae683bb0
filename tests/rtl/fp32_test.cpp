// FP32 building blocks against the C++ float operators (the build uses -ffp-contract=off, no fast-math,
// no flush-to-zero): bit patterns must match; where C++ gives NaN the RTL must give a NaN (NaN payload
// and sign differ between x86 and CUDA and are not part of the contract).
#include <cmath>
#include <cstring>
#include <string>

#include "Vfp32_add.h"
#include "Vfp32_div.h"
#include "Vfp32_from_int.h"
#include "Vfp32_mul.h"
#include "fp4lab/scale.hpp"
#include "harness.hpp"

namespace fp4lab::rtl_test {
namespace {

bool same_f32(uint32_t want, uint32_t got) {
  const float w = f32_from_bits(want);
  if (std::isnan(w)) return std::isnan(f32_from_bits(got));
  return want == got;
}

template <class M, class Op>
void binary_op_test(const char* unit, Op op, uint64_t n) {
  Dut<M> dut(unit);
  Checker chk(unit);
  F32Gen gen(seed());
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t a = gen.any();
    const uint32_t b = (i & 1) ? gen.near(a) : gen.any();
    dut->a_i = a;
    dut->b_i = b;
    dut.eval();
    const uint32_t want = f32_bits(op(f32_from_bits(a), f32_from_bits(b)));
    const uint32_t got = dut->y_o;
    if (!chk.check(same_f32(want, got), [&] {
          return "a=" + fmt_f32(a) + " b=" + fmt_f32(b) + " want " + fmt_f32(want) + " got " + fmt_f32(got);
        }))
      break;
  }
  chk.finish();
}

TEST(Fp32, Mul) {
  binary_op_test<Vfp32_mul>("fp32_mul", [](float a, float b) { return a * b; }, scaled(2'000'000));
}
TEST(Fp32, Add) {
  binary_op_test<Vfp32_add>("fp32_add", [](float a, float b) { return a + b; }, scaled(2'000'000));
}
TEST(Fp32, Sub) {  // a - b through the adder with b's sign flipped, as the RHT butterfly does
  Dut<Vfp32_add> dut("fp32_sub");
  Checker chk("fp32_sub");
  F32Gen gen(seed() + 1);
  for (uint64_t i = 0, n = scaled(500'000); i < n; ++i) {
    const uint32_t a = gen.any(), b = gen.near(a);
    dut->a_i = a;
    dut->b_i = b ^ 0x80000000u;
    dut.eval();
    const uint32_t want = f32_bits(f32_from_bits(a) - f32_from_bits(b)), got = dut->y_o;
    if (!chk.check(same_f32(want, got), [&] {
          return "a=" + fmt_f32(a) + " b=" + fmt_f32(b) + " want " + fmt_f32(want) + " got " + fmt_f32(got);
        }))
      break;
  }
  chk.finish();
}
TEST(Fp32, Div) {
  binary_op_test<Vfp32_div>("fp32_div", [](float a, float b) { return a / b; }, scaled(2'000'000));
}

// Every int32 the contract converts (|p| <= 32 * 144) exhaustively, then random int32 (rounding above 2^24).
TEST(Fp32, FromInt) {
  Dut<Vfp32_from_int> dut("fp32_from_int");
  Checker chk("fp32_from_int");
  auto one = [&](int32_t x) {
    dut->x_i = uint32_t(x);
    dut.eval();
    const uint32_t want = f32_bits(float(x)), got = dut->y_o;
    return chk.check(want == got, [&] { return "x=" + std::to_string(x) + " want " + fmt_f32(want) + " got " + fmt_f32(got); });
  };
  for (int32_t x = -32 * 144; x <= 32 * 144; ++x)
    if (!one(x)) break;
  F32Gen gen(seed() + 2);
  for (uint64_t i = 0, n = scaled(200'000); i < n; ++i) {
    const int sh = int(gen.rng()() % 32);
    if (!one(int32_t(gen.bits32() >> sh))) break;
  }
  one(INT32_MIN);
  one(INT32_MAX);
  chk.finish();
}

}  // namespace
}  // namespace fp4lab::rtl_test
