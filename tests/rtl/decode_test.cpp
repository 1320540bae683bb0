// 4-bit decode, exhaustively: every code of every format each build supports, against decode_int.
#include <string>

#include "Vfp4_decode_dual.h"
#include "Vfp4_decode_e1m2.h"
#include "Vfp4_decode_e2m1.h"
#include "Vfp4_decode_int4.h"
#include "fp4lab/format.hpp"
#include "harness.hpp"

namespace fp4lab::rtl_test {
namespace {

template <class M>
void decode_build(const char* unit, std::initializer_list<int> fmts) {
  Dut<M> dut(unit);
  Checker chk(unit);
  for (int fi : fmts) {
    const ElemFormat& f = kAllFormats[fi];
    for (int code = 0; code < 16; ++code) {
      dut->code_i = code;
      dut->fmt_i = fi;
      dut.eval();
      const int want = decode_int(f, uint8_t(code));
      const int got = int(dut->int_o & 0x1F) - ((dut->int_o & 0x10) ? 32 : 0);
      // raw {sign, sig, sh}: the super format must describe the same value
      const unsigned raw = dut->raw_o;
      const int sign = (raw >> 5) & 1, sig = (raw >> 2) & 7, sh = raw & 3;
      const int raw_val = (sign ? -1 : 1) * (sig << sh);
      chk.check(want == got && raw_val == want && sign == (code >> 3), [&] {
        return std::string(f.name) + " code " + std::to_string(code) + ": want " + std::to_string(want) + ", int_o " +
               std::to_string(got) + ", raw sign " + std::to_string(sign) + " sig " + std::to_string(sig) + " sh " +
               std::to_string(sh);
      });
    }
  }
  chk.finish();
}

// Single-layout builds ignore fmt_i: e2m1 also covers e2m1_max2, e1m2 also covers int4 (same (E, M)).
TEST(Decode, E2M1Build) { decode_build<Vfp4_decode_e2m1>("fp4_decode_e2m1", {0, 3}); }
TEST(Decode, E1M2Build) { decode_build<Vfp4_decode_e1m2>("fp4_decode_e1m2", {1, 2}); }
TEST(Decode, Int4Build) { decode_build<Vfp4_decode_int4>("fp4_decode_int4", {2, 1}); }
TEST(Decode, DualBuild) { decode_build<Vfp4_decode_dual>("fp4_decode_dual", {0, 1, 2, 3}); }

}  // namespace
}  // namespace fp4lab::rtl_test
