// fp32_mul: IEEE-754 binary32 multiply, round to nearest even, subnormals in and out (C++ float `*`).
module fp32_mul (
  input  logic [31:0] a_i,
  input  logic [31:0] b_i,
  output logic [31:0] y_o
);
  // Many instances per unit: one C++ class for all of them keeps Verilated models small.
  /* verilator no_inline_module */
  logic        sign;
  fp4lab_pkg::f32_t a, b;
  logic [47:0] prod, norm;
  logic [5:0]  lz;
  logic signed [11:0] exp;
  logic [31:0] rounded;

  always_comb begin
    a = fp4lab_pkg::f32_unpack(a_i);
    b = fp4lab_pkg::f32_unpack(b_i);
    sign = a.sign ^ b.sign;
    prod = 48'(a.m) * 48'(b.m);  // exact
  end

  fp4lab_lzc #(.W(48)) u_lz (.x_i(prod), .cnt_o(lz));

  always_comb begin
    norm = prod << lz;
    // prod's bit 46 has weight 2^(a.e + b.e - 254); after the shift the leading bit sits at 47: one
    // place up, lz places down.
    exp = $signed(12'(a.e) + 12'(b.e)) - 12'sd126 - $signed(12'(lz));
  end

  fp32_round #(.W(48)) u_round (
    .sign_i(sign), .exp_i(exp), .sig_i(norm), .sticky_i(1'b0), .res_o(rounded));

  always_comb begin
    if (a.nan || b.nan || (a.inf && b.zero) || (b.inf && a.zero)) y_o = fp4lab_pkg::F32_QNAN;
    else if (a.inf || b.inf) y_o = {sign, fp4lab_pkg::F32_INF[30:0]};
    else if (a.zero || b.zero) y_o = {sign, 31'd0};
    else y_o = rounded;
  end
endmodule
