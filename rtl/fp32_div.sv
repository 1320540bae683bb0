// fp32_div: IEEE-754 binary32 divide, round to nearest even, subnormals in and out (C++ float `/`).
// Both significands are normalised first, then a restoring division produces 27 quotient bits and
// the remainder's non-zero-ness is the sticky bit.
module fp32_div (
  input  logic [31:0] a_i,
  input  logic [31:0] b_i,
  output logic [31:0] y_o
);
  // Many instances per unit: one C++ class for all of them keeps Verilated models small.
  /* verilator no_inline_module */
  logic        sign, a_zero, b_zero, a_inf, b_inf, a_nan, b_nan;
  logic [7:0]  ea, eb;  // effective exponents: subnormals count as exponent 1
  logic [23:0] ma, mb, na, nb;
  logic [4:0]  lza, lzb;
  logic [26:0] q, norm;
  logic [24:0] r;
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
    ea = a_i[30:23] == '0 ? 8'd1 : a_i[30:23];
    eb = b_i[30:23] == '0 ? 8'd1 : b_i[30:23];
    ma = {a_i[30:23] != '0, a_i[22:0]};
    mb = {b_i[30:23] != '0, b_i[22:0]};
  end

  fp4lab_lzc #(.W(24)) u_lza (.x_i(ma), .cnt_o(lza));
  fp4lab_lzc #(.W(24)) u_lzb (.x_i(mb), .cnt_o(lzb));

  always_comb begin
    // 1. Normalise (subnormal inputs have leading zeros); both now lie in [2^23, 2^24).
    na = ma << lza;
    nb = mb << lzb;
    // 2. q = floor(na * 2^26 / nb): na / nb lies in (1/2, 2), so q has its leading bit at 26 or 25.
    r = {1'b0, na};
    for (int i = 26; i >= 0; i--) begin
      q[i] = r >= {1'b0, nb};
      if (q[i]) r = r - {1'b0, nb};
      r = r << 1;
    end
    // 3. Value = q * 2^-26 * 2^((ea - lza) - (eb - lzb)); q[26] has weight 2^0 of the ratio.
    norm = q[26] ? q : q << 1;
    exp = $signed(12'(ea)) - $signed(12'(lza)) - $signed(12'(eb)) + $signed(12'(lzb))
        + (q[26] ? 12'sd127 : 12'sd126);
  end

  fp32_round #(.W(27)) u_round (
    .sign_i(sign), .exp_i(exp), .sig_i(norm), .sticky_i(r != '0), .res_o(rounded));

  always_comb begin
    if (a_nan || b_nan || (a_zero && b_zero) || (a_inf && b_inf)) y_o = fp4lab_pkg::F32_QNAN;
    else if (a_inf || b_zero) y_o = {sign, fp4lab_pkg::F32_INF[30:0]};
    else if (a_zero || b_inf) y_o = {sign, 31'd0};
    else y_o = rounded;
  end
endmodule
