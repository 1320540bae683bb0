// fp32_add: IEEE-754 binary32 add, round to nearest even, subnormals in and out (C++ float `+`).
// Subtraction is a + (-b), which IEEE defines to be identical, zero signs included.
//
// Classic single-path adder: the smaller magnitude is aligned with guard, round and sticky bits; the
// sticky bit is "jammed" into the last place. A left shift by two or more after a subtraction only
// happens when the exponents differ by at most one, when nothing was shifted out, so jamming never
// changes a rounding decision.
module fp32_add (
  input  logic [31:0] a_i,
  input  logic [31:0] b_i,
  output logic [31:0] y_o
);
  // Many instances per unit: one C++ class for all of them keeps Verilated models small.
  /* verilator no_inline_module */
  logic        a_inf, b_inf, a_nan, b_nan, swap, sub;
  logic [31:0] op_big;
  logic [30:0] op_small;  // magnitude only: the sign of the sum is the larger operand's
  logic [7:0]  e_big, e_small, d;
  logic [26:0] m_big, m_small, m_shift;   // 24 significand bits + guard, round, sticky
  logic [53:0] ext;
  logic        sticky;
  logic [27:0] sum, norm;
  logic [4:0]  lz;
  logic signed [11:0] exp;
  logic [31:0] rounded;

  always_comb begin
    a_inf = a_i[30:23] == 8'hFF && a_i[22:0] == '0;
    b_inf = b_i[30:23] == 8'hFF && b_i[22:0] == '0;
    a_nan = a_i[30:23] == 8'hFF && a_i[22:0] != '0;
    b_nan = b_i[30:23] == 8'hFF && b_i[22:0] != '0;
    // 1. Order by magnitude (the bit patterns of non-negative floats order like integers).
    swap  = b_i[30:0] > a_i[30:0];
    op_big   = swap ? b_i : a_i;
    op_small = swap ? a_i[30:0] : b_i[30:0];
    sub   = a_i[31] ^ b_i[31];
    e_big   = op_big[30:23] == '0 ? 8'd1 : op_big[30:23];      // subnormals count as exponent 1
    e_small = op_small[30:23] == '0 ? 8'd1 : op_small[30:23];
    m_big   = {op_big[30:23] != '0, op_big[22:0], 3'b000};
    m_small = {op_small[30:23] != '0, op_small[22:0], 3'b000};
    // 2. Align the smaller operand; everything shifted past the sticky place is ORed into it.
    d = e_big - e_small;
    ext = {m_small, 27'd0} >> (d > 8'd27 ? 8'd27 : d);
    sticky = |ext[26:0];
    m_shift = {ext[53:28], ext[27] | sticky};
    // 3. Add or subtract magnitudes; op_big >= op_small so the difference is non-negative.
    sum = sub ? {1'b0, m_big} - {1'b0, m_shift} : {1'b0, m_big} + {1'b0, m_shift};
  end

  fp4lab_lzc #(.W(28)) u_lz (.x_i(sum), .cnt_o(lz));

  always_comb begin
    norm = sum << lz;
    // m_big's hidden bit (bit 26) has weight 2^(e_big - 127); the leading bit moves to 27.
    exp = $signed(12'(e_big)) + 12'sd1 - $signed(12'(lz));
  end

  fp32_round #(.W(28)) u_round (
    .sign_i(op_big[31]), .exp_i(exp), .sig_i(norm), .sticky_i(1'b0), .res_o(rounded));

  always_comb begin
    if (a_nan || b_nan || (a_inf && b_inf && sub)) y_o = fp4lab_pkg::F32_QNAN;
    else if (a_inf) y_o = a_i;
    else if (b_inf) y_o = b_i;
    // An exact zero sum is +0 under round to nearest, except (-0) + (-0).
    else if (sum == '0) y_o = {a_i[31] & b_i[31], 31'd0};
    else y_o = rounded;
  end
endmodule
