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
  logic        sign;
  fp4lab_pkg::f32_t a, b;
  logic [23:0] na, nb;
  logic [4:0]  lza, lzb;
  logic [26:0] q, norm;
  logic [24:0] r;
  logic signed [11:0] exp;
  logic [31:0] rounded;

  always_comb begin
    a = fp4lab_pkg::f32_unpack(a_i);
    b = fp4lab_pkg::f32_unpack(b_i);
    sign = a.sign ^ b.sign;
  end

  fp4lab_lzc #(.W(24)) u_lza (.x_i(a.m), .cnt_o(lza));
  fp4lab_lzc #(.W(24)) u_lzb (.x_i(b.m), .cnt_o(lzb));

  always_comb begin
    // 1. Normalise (subnormal inputs have leading zeros); both now lie in [2^23, 2^24).
    na = a.m << lza;
    nb = b.m << lzb;
    // 2. q = floor(na * 2^26 / nb): na / nb lies in (1/2, 2), so q has its leading bit at 26 or 25.
    r = {1'b0, na};
    for (int i = 26; i >= 0; i--) begin
      q[i] = r >= {1'b0, nb};
      if (q[i]) r = r - {1'b0, nb};
      r = r << 1;
    end
    // 3. Value = q * 2^-26 * 2^((a.e - lza) - (b.e - lzb)); q[26] has weight 2^0 of the ratio.
    norm = q[26] ? q : q << 1;
    exp = $signed(12'(a.e)) - $signed(12'(lza)) - $signed(12'(b.e)) + $signed(12'(lzb))
        + (q[26] ? 12'sd127 : 12'sd126);
  end

  fp32_round #(.W(27)) u_round (
    .sign_i(sign), .exp_i(exp), .sig_i(norm), .sticky_i(r != '0), .res_o(rounded));

  always_comb begin
    if (a.nan || b.nan || (a.zero && b.zero) || (a.inf && b.inf)) y_o = fp4lab_pkg::F32_QNAN;
    else if (a.inf || b.zero) y_o = {sign, fp4lab_pkg::F32_INF[30:0]};
    else if (a.zero || b.inf) y_o = {sign, 31'd0};
    else y_o = rounded;
  end
endmodule
