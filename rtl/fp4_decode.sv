// fp4_decode: a 4-bit element code to the internal super format {sign, sig, sh} (magnitude = sig << sh)
// and to its exact signed integer view (format.hpp decode_int). Every grid lands on the same super format,
// so a multi-format datapath is one datapath; in a build whose formats share one (E, M) layout the
// format input is ignored and the decode is constant logic.
module fp4_decode #(
  parameter fp4lab_pkg::fmt_mask_t FORMATS = fp4lab_pkg::FMTS_ALL
) (
  input  logic [3:0]            code_i,
  input  fp4lab_pkg::fmt_t      fmt_i,   // ignored when FORMATS share one layout
  output fp4lab_pkg::raw4_t     raw_o,
  output logic signed [4:0]     int_o
);
  localparam bit FIXED = fp4lab_pkg::mask_one_layout(FORMATS);
  localparam fp4lab_pkg::fmt_t FIRST = 2'(fp4lab_pkg::mask_first(FORMATS));

  fp4lab_pkg::fmt_t fmt;
  logic [4:0] mag;

  assign fmt = FIXED ? FIRST : fmt_i;  // a constant in a fixed build: synthesis drops the select

  always_comb begin
    // decode_raw(fmt, code_i), looked up in the table the package evaluated at elaboration
    raw_o = {code_i[3], fp4lab_pkg::RAW_TABLE[5*{fmt, code_i[2:0]} +: 5]};
    mag = 5'(raw_o.sig) << raw_o.sh;
    int_o = raw_o.sign ? -$signed(mag) : $signed(mag);
  end
endmodule
