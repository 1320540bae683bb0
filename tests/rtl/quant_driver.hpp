// Drives the RTL quantiser (rtl/fp4_quant_unit.sv) and RHT-16 unit (rtl/fp32_rht16_unit.sv) over whole
// tensors the way a controller would, for the quantiser, RHT and bundled-trace regressions.
#pragma once

#include <string>
#include <vector>

#include "Vfp32_rht16_unit.h"
#include "Vfp4_quant_unit.h"
#include "fp4lab/quantize.hpp"
#include "harness.hpp"

namespace fp4lab::rtl_test {

struct RtlQuant {
  std::vector<uint8_t> codes;   // rows x cols
  std::vector<uint32_t> dec;    // rows x cols/block, FP32 bits
  std::vector<uint8_t> scode;   // rows x cols/block
};

// y [rows, cols] holds the values the scales see (rotated already when cfg.rht is on). Blocks of 32 and
// 16x16 tiles take two passes: the first reads each 16-wide block's amax_o, the second feeds the
// block's or tile's maximum back through amax_ext_i. For ue4m3 the tensor's S_enc comes from the
// golden nvfp4_global_encode of max |y|, a per-tensor value the unit takes as an input.
RtlQuant rtl_quantize(Dut<Vfp4_quant_unit>& dut, const float* y, int64_t rows, int64_t cols, const QuantConfig& cfg,
                      double p_idle = 0.0, double p_stall = 0.0);

// Compares codes, decoded scales and scale codes with the golden QTensor; returns false to stop.
bool compare_quant(Checker& chk, const RtlQuant& rtl, const QTensor& golden, const float* y, const std::string& what);

// RHT-16 of every block of every row through the RTL (cfg.rht must be 16), BF16-rounded if cfg.rht_bf16.
std::vector<float> rtl_rotate(Dut<Vfp32_rht16_unit>& dut, const float* x, int64_t rows, int64_t cols,
                              const QuantConfig& cfg, double p_idle = 0.0, double p_stall = 0.0);

}  // namespace fp4lab::rtl_test
