// fp4_format_table: exposes fp4lab_pkg's format table and the derived per-format constants the datapath
// selects at run time (FMT_DERIVED), so a test can compare the RTL's single source of truth with the C++
// one (fp4lab::kAllFormats, ScaleKind).
module fp4_format_table (
  input  fp4lab_pkg::fmt_t  fmt_i,
  output logic [3:0]        ebits_o,
  output logic [3:0]        mbits_o,
  output logic signed [3:0] bias_o,
  output logic [3:0]        max_index_o,
  output logic signed [3:0] int_shift_o,
  output logic signed [3:0] emax_o,
  output logic [2:0]        max_idx_o,    // max_index as the datapath sees it (derived row)
  output logic [31:0]       levels_o,     // int_level(i) for i = 0..7, 4 bits each, i = 0 lowest
  output logic [31:0]       gmax_o,       // FP32 bits
  output logic [31:0]       inv_gmax_o,   // FP32 bits of the rounded 1/gmax
  output logic [7:0]        scale_ids_o,  // SCALE_FP32, _UE4M3, _UE8M0, _UE8M0_CEIL, 2 bits each
  output logic [7:0]        fmt_ids_o     // FMT_E2M1, _E1M2, _INT4, _E2M1_MAX2, 2 bits each
);
  always_comb begin
    ebits_o     = 4'(fp4lab_pkg::fmt_ebits(fmt_i));
    mbits_o     = 4'(fp4lab_pkg::fmt_mbits(fmt_i));
    bias_o      = 4'(fp4lab_pkg::fmt_bias(fmt_i));
    max_index_o = 4'(fp4lab_pkg::fmt_max_index(fmt_i));
    int_shift_o = fp4lab_pkg::fmt_int_shift(fmt_i);
    emax_o      = fp4lab_pkg::fmt_emax(fmt_i);
    levels_o    = fp4lab_pkg::fmt_levels(fmt_i);
    gmax_o      = fp4lab_pkg::fmt_gmax(fmt_i);
    max_idx_o   = fp4lab_pkg::fmt_max_idx(fmt_i);
    inv_gmax_o  = fp4lab_pkg::fmt_inv_gmax(fmt_i);
    scale_ids_o = {fp4lab_pkg::SCALE_UE8M0_CEIL, fp4lab_pkg::SCALE_UE8M0, fp4lab_pkg::SCALE_UE4M3,
                   fp4lab_pkg::SCALE_FP32};
    fmt_ids_o   = {fp4lab_pkg::FMT_E2M1_MAX2, fp4lab_pkg::FMT_INT4, fp4lab_pkg::FMT_E1M2,
                   fp4lab_pkg::FMT_E2M1};
  end
endmodule
