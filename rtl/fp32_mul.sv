// fp32_mul: IEEE-754 binary32 multiply, round to nearest even, subnormals in and out (C++ float `*`).
module fp32_mul (
  input  logic [31:0] a_i,
  input  logic [31:0] b_i,
  output logic [31:0] y_o
);
  // Many instances per unit: one C++ class for all of them keeps Verilated models small.
  /* verilator no_inline_module */
  logic        sign;
  logic        a_zero, b_zero, a_inf, b_inf, a_nan, b_nan;
  logic [7:0]  ea, eb;  // effective exponents: subnormals count as exponent 1
  logic [23:0] ma, mb;
  logic [47:0] prod, norm;
  logic [5:0]  lz;
  logic signed [11:0] exp;
  logic [31:0] rounded;

  always_comb begin
    sign   = a_i[31] ^ b_i[31];
    a_zero = a_i[30:0] == '0;
    b_zero = b_i[30:0] == '0;
    a_inf  = a_i[30:23] == 8'hFF && a_i[22:0] == '0;
    b_inf  = b_i[30:23] == 8'hFF && b_i[22:0] == '0;
    a_nan  = a_i[30:23] == 8'hFF && a_i[22:0] != '0;
    b_nan  = b_i[30:23] == 8'hFF && b_i[22:0] != '0;
    // Hidden bit only for normals; subnormals use exponent 1 (see exp below).
    ea = a_i[30:23] == '0 ? 8'd1 : a_i[30:23];
    eb = b_i[30:23] == '0 ? 8'd1 : b_i[30:23];
    ma = {a_i[30:23] != '0, a_i[22:0]};
    mb = {b_i[30:23] != '0, b_i[22:0]};
    prod = 48'(ma) * 48'(mb);  // exact
  end

  fp4lab_lzc #(.W(48)) u_lz (.x_i(prod), .cnt_o(lz));

  always_comb begin
    norm = prod << lz;
    // prod's bit 46 has weight 2^(ea + eb - 254); after the shift the leading bit sits at 47: one
    // place up, lz places down.
    exp = $signed(12'(ea) + 12'(eb)) - 12'sd126 - $signed(12'(lz));
  end

  fp32_round #(.W(48)) u_round (
    .sign_i(sign), .exp_i(exp), .sig_i(norm), .sticky_i(1'b0), .res_o(rounded));

  always_comb begin
    if (a_nan || b_nan || (a_inf && b_zero) || (b_inf && a_zero)) y_o = fp4lab_pkg::F32_QNAN;
    else if (a_inf || b_inf) y_o = {sign, fp4lab_pkg::F32_INF[30:0]};
    else if (a_zero || b_zero) y_o = {sign, 31'd0};
    else y_o = rounded;
  end
endmodule
