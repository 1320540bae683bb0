// The RTL's format table (rtl/fp4lab_pkg.sv) against the C++ definitions (models/include/fp4lab/format.hpp,
// scale.hpp): every field of every format, the derived integer levels, gmax and FP32(1/gmax), and the
// enum orders the ports rely on.
#include <cstring>
#include <string>

#include "Vfp4_format_table.h"
#include "fp4lab/format.hpp"
#include "fp4lab/rtl/mac_beats.hpp"
#include "fp4lab/scale.hpp"
#include "harness.hpp"

namespace fp4lab::rtl_test {
namespace {

int sext4(unsigned v) { return int(v & 0xF) - ((v & 0x8) ? 16 : 0); }

TEST(FormatTable, MatchesCxxFormats) {
  Dut<Vfp4_format_table> dut("fp4_format_table");
  Checker chk("format_table");
  constexpr int kNum = int(sizeof kAllFormats / sizeof kAllFormats[0]);
  ASSERT_EQ(kNum, 4) << "fp4lab_pkg::NUM_FMT is 4; add the new format to the RTL table";
  for (int i = 0; i < kNum; ++i) {
    const ElemFormat& f = kAllFormats[i];
    dut->fmt_i = i;
    dut.eval();
    auto field = [&](const char* what, long want, long got) {
      chk.check(want == got, [&] {
        return std::string(f.name) + "." + what + ": C++ " + std::to_string(want) + ", RTL " + std::to_string(got);
      });
    };
    field("ebits", f.ebits, dut->ebits_o);
    field("mbits", f.mbits, dut->mbits_o);
    field("bias", f.bias, sext4(dut->bias_o));
    field("max_index", f.max_index, dut->max_index_o);
    field("max_index (derived row)", f.max_index, dut->max_idx_o);
    field("int_shift", f.int_shift(), sext4(dut->int_shift_o));
    field("emax", f.emax(), sext4(dut->emax_o));
    for (int k = 0; k < 8; ++k)  // the datapath reads all eight; e2m1_max2's unused ones follow the tuple too
      field(("int_level(" + std::to_string(k) + ")").c_str(), f.int_level(k), (dut->levels_o >> (4 * k)) & 0xF);
    field("gmax bits", f32_bits(f.gmax()), dut->gmax_o);
    field("FP32(1/gmax) bits", f32_bits(1.0f / f.gmax()), dut->inv_gmax_o);
    // The RTL's format id i is the C++ format kAllFormats[i]; ports and the MAC feeder rely on it.
    field("fmt id", rtl::format_id(f), (dut->fmt_ids_o >> (2 * i)) & 3);
  }
  auto scale_id = [&](ScaleKind s) { return long((dut->scale_ids_o >> (2 * int(s))) & 3); };
  for (ScaleKind s : {ScaleKind::fp32, ScaleKind::ue4m3, ScaleKind::ue8m0, ScaleKind::ue8m0_ceil})
    chk.check(scale_id(s) == long(s), [&] { return std::string("scale id of ") + scale_name(s); });
  // fp4_round's sr_i is Rounding::sr.
  chk.check(int(Rounding::rtne) == 0 && int(Rounding::sr) == 1, [] { return std::string("Rounding enum order"); });
  chk.finish();
}

}  // namespace
}  // namespace fp4lab::rtl_test
