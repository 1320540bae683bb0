// fp32_rht16_unit: the RHT-16 butterfly fp32_rht16 behind DEPTH pipeline registers with valid/ready.
// Latency DEPTH cycles, one block of 16 values per cycle.
module fp32_rht16_unit #(
  parameter int unsigned DEPTH = 1
) (
  input  logic         clk_i,
  input  logic         rst_ni,
  input  logic         in_valid_i,
  output logic         in_ready_o,
  input  logic [511:0] x_i,
  input  logic [15:0]  neg_i,
  input  logic         bf16_i,
  output logic         out_valid_o,
  input  logic         out_ready_i,
  output logic [511:0] y_o
);
  logic [511:0] y;

  fp32_rht16 u_rht (.x_i, .neg_i, .bf16_i, .y_o(y));

  fp4lab_pipe #(.WIDTH(512), .DEPTH(DEPTH)) u_pipe (
    .clk_i, .rst_ni, .in_valid_i, .in_ready_o, .in_data_i(y),
    .out_valid_o, .out_ready_i, .out_data_o(y_o));
endmodule
