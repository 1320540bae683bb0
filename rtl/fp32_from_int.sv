// fp32_from_int: a signed 32-bit integer to binary32, round to nearest even (C++ float(int32_t)).
// The datapath contract only converts |p| < 2^24, which is exact; larger values round correctly too.
module fp32_from_int (
  input  logic signed [31:0] x_i,
  output logic [31:0]        y_o
);
  logic [31:0] mag, norm;
  logic [5:0]  lz;
  logic signed [11:0] exp;

  assign mag = x_i[31] ? 32'(-x_i) : 32'(x_i);  // -2^31 stays 2^31 as an unsigned magnitude

  fp4lab_lzc #(.W(32)) u_lz (.x_i(mag), .cnt_o(lz));

  always_comb begin
    norm = mag << lz;
    exp = 12'sd158 - $signed(12'(lz));  // bit 31 has weight 2^31: biased 127 + 31
  end

  // Zero converts to +0 (the round module returns sign_i with a zero magnitude).
  fp32_round #(.W(32)) u_round (
    .sign_i(x_i[31]), .exp_i(exp), .sig_i(norm), .sticky_i(1'b0), .res_o(y_o));
endmodule
