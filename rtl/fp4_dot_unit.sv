// fp4_dot_unit: the block dot-product unit, fp4_dot behind DEPTH pipeline registers with valid/ready.
// Latency DEPTH cycles, one block per cycle.
module fp4_dot_unit #(
  parameter int unsigned           N       = 16,
  parameter fp4lab_pkg::fmt_mask_t FORMATS = fp4lab_pkg::FMTS_ALL,
  parameter int unsigned           DEPTH   = 1
) (
  input  logic               clk_i,
  input  logic               rst_ni,
  input  logic               in_valid_i,
  output logic               in_ready_o,
  input  logic [4*N-1:0]     a_i,
  input  logic [4*N-1:0]     b_i,
  input  fp4lab_pkg::fmt_t   fmt_a_i,
  input  fp4lab_pkg::fmt_t   fmt_b_i,
  output logic               out_valid_o,
  input  logic               out_ready_i,
  output logic signed [31:0] p_o
);
  logic signed [31:0] p;

  fp4_dot #(.N(N), .FORMATS(FORMATS)) u_dot (
    .a_i, .b_i, .fmt_a_i, .fmt_b_i, .p_o(p));

  fp4lab_pipe #(.WIDTH(32), .DEPTH(DEPTH)) u_pipe (
    .clk_i, .rst_ni, .in_valid_i, .in_ready_o, .in_data_i(p),
    .out_valid_o, .out_ready_i, .out_data_o(p_o));
endmodule
