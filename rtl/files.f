// The fp4lab RTL, package first: the one list CMake (rtl/CMakeLists.txt), the lint test and
// scripts/area.sh read.
fp4lab_pkg.sv
fp4lab_lzc.sv
fp4lab_pipe.sv
fp32_round.sv
fp32_mul.sv
fp32_add.sv
fp32_div.sv
fp32_from_int.sv
fp4_decode.sv
fp4_dot.sv
fp4_dot_unit.sv
fp4_mac_unit.sv
fp4_round.sv
ue4m3_encode.sv
e4m3_decode.sv
fp4_quant.sv
fp4_quant_unit.sv
fp32_rht16.sv
fp32_rht16_unit.sv
fp4_format_table.sv
