// fp4_quant_unit: the block quantiser fp4_quant behind DEPTH pipeline registers with valid/ready.
// Latency DEPTH cycles, one 1x16 block per cycle.
module fp4_quant_unit #(
  parameter fp4lab_pkg::fmt_mask_t   FORMATS = fp4lab_pkg::FMTS_ALL,
  parameter fp4lab_pkg::scale_mask_t SCALES  = fp4lab_pkg::SCALES_ALL,  // one kind: a fixed-scale build
  parameter int unsigned             DEPTH   = 1
) (
  input  logic               clk_i,
  input  logic               rst_ni,
  input  logic               in_valid_i,
  output logic               in_ready_o,
  input  logic [511:0]       y_i,
  input  fp4lab_pkg::fmt_t   fmt_i,
  input  fp4lab_pkg::scale_t scale_i,
  input  logic               sr_i,
  input  logic [383:0]       rbits_i,
  input  logic [31:0]        s_enc_i,
  input  logic               amax_ext_en_i,
  input  logic [31:0]        amax_ext_i,
  output logic               out_valid_o,
  input  logic               out_ready_i,
  output logic [63:0]        codes_o,
  output logic [31:0]        dec_o,
  output logic [7:0]         scode_o,
  output logic [31:0]        amax_o
);
  logic [63:0] codes;
  logic [31:0] dec, amax;
  logic [7:0]  scode;

  fp4_quant #(.FORMATS(FORMATS), .SCALES(SCALES)) u_quant (
    .y_i, .fmt_i, .scale_i, .sr_i, .rbits_i, .s_enc_i, .amax_ext_en_i, .amax_ext_i,
    .codes_o(codes), .dec_o(dec), .scode_o(scode), .amax_o(amax));

  fp4lab_pipe #(.WIDTH(64 + 32 + 8 + 32), .DEPTH(DEPTH)) u_pipe (
    .clk_i, .rst_ni, .in_valid_i, .in_ready_o, .in_data_i({codes, dec, scode, amax}),
    .out_valid_o, .out_ready_i, .out_data_o({codes_o, dec_o, scode_o, amax_o}));
endmodule
