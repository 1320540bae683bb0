// fp32_round: rounds an exact intermediate to IEEE-754 binary32, round to nearest, ties to even, with
// gradual underflow (no flush to zero) and overflow to infinity. Every FP32 unit (multiply, add, divide,
// int-to-float) ends here, so the one rounding rule of docs/datapath.md is written once.
//
// The value is (-1)^sign_i * 0.sig_i * 2 * 2^(exp_i - 127) + (sticky_i ? a positive amount below
// sig_i's last bit : 0), i.e. sig_i[W-1] is the leading bit with weight 2^(exp_i - 127).
module fp32_round #(
  parameter int unsigned W = 48  // at least 25: 24 result bits and a round bit
) (
  input  logic               sign_i,
  input  logic signed [11:0] exp_i,     // biased exponent of sig_i[W-1]; may be <= 0 (subnormal result)
  input  logic [W-1:0]       sig_i,     // normalised: sig_i[W-1] = 1, or zero for an exact zero
  input  logic               sticky_i,  // some non-zero bits lie below sig_i[0]
  output logic [31:0]        res_o
);
  localparam int unsigned DW = $clog2(W + 1);

  logic [DW-1:0]  dshift;      // right shift into the subnormal range, clamped to W
  logic [W-1:0]   sig_den;     // significand after denormalisation
  logic           lost;        // bits shifted out by the denormalisation
  logic [7:0]     exp_field;
  logic [30:0]    packed_mag;  // {exponent field, fraction}: adding the increment carries correctly
  logic           round_bit, sticky, inc;

  always_comb begin
    // 1. Results below the normal range keep the minimum exponent and lose bits to the right.
    if (exp_i >= 12'sd1) begin
      dshift = '0;
      exp_field = exp_i >= 12'sd255 ? 8'hFF : exp_i[7:0];
    end else begin
      dshift = (12'sd1 - exp_i) >= $signed(12'(W)) ? DW'(W) : DW'(12'sd1 - exp_i);
      exp_field = 8'd0;
    end
    // (no intermediate wider than W bits: Verilated models stay in machine words)
    if (dshift >= DW'(W)) begin
      sig_den = '0;
      lost = sig_i != '0;
    end else begin
      sig_den = sig_i >> dshift;
      lost = (sig_i & ~({W{1'b1}} << dshift)) != '0;
    end
    // 2. Keep 23 fraction bits under the leading bit; next bit rounds, the rest is sticky.
    packed_mag = {exp_field, sig_den[W-2 -: 23]};
    round_bit = sig_den[W-25];
    sticky = lost | sticky_i;
    if (W > 25) sticky = sticky | (|(sig_den << 25));
    // 3. Ties to even; a carry out of the fraction bumps the exponent (to infinity at the top).
    inc = round_bit & (sticky | packed_mag[0]);
    if (sig_i == '0) res_o = {sign_i, 31'd0};
    else if (exp_i >= 12'sd255) res_o = {sign_i, 8'hFF, 23'd0};
    else res_o = {sign_i, packed_mag + 31'(inc)};
  end
endmodule
