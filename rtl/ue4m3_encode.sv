// ue4m3_encode: a non-negative FP32 value to an E4M3 (OCP FP8 E4M3FN) code, round to nearest even,
// saturating at 448 (scale.hpp ue4m3_encode): e = max(ilogb(x), -6), q = rint(x * 2^(3 - e)),
// code = ((e + 6) << 3) + q, where q = 16 carries into the next binade by itself.
module ue4m3_encode (
  input  logic [31:0] x_i,   // callers clamp to [0, 448] first, as Transformer Engine does
  output logic [7:0]  code_o
);
  logic [7:0]  e_field;      // e + 6 (0 for x below 2^-6)
  int          rsh;          // q = RNE(sig >> rsh)
  logic [23:0] sig;
  logic [4:0]  q;
  logic        round_bit, sticky;
  logic [23:0] below;

  always_comb begin
    sig = {x_i[30:23] != '0, x_i[22:0]};
    if (x_i[30:23] >= 8'd121) begin           // ilogb(x) >= -6: x = sig * 2^(E - 150), e = E - 127
      e_field = x_i[30:23] - 8'd121;
      rsh = 20;
    end else begin                             // e = -6: q = x * 2^9 = sig * 2^(E_eff - 141)
      e_field = 8'd0;
      rsh = 141 - (x_i[30:23] == '0 ? 1 : 32'(x_i[30:23]));
    end
    if (rsh > 24) rsh = 25;                    // everything below the round bit: q = 0
    q = 5'(sig >> rsh);
    round_bit = rsh >= 1 && rsh <= 24 ? sig[rsh-1] : 1'b0;
    below = rsh >= 2 ? sig & ((24'd1 << (rsh - 1)) - 24'd1) : 24'd0;
    sticky = below != '0;
    q = q + {4'd0, round_bit & (sticky | q[0])};
    if (x_i[31] || x_i[30:0] == '0) code_o = 8'h00;          // !(x > 0)
    else if (x_i >= fp4lab_pkg::F32_448) code_o = 8'h7E;      // 448
    else code_o = (e_field << 3) + 8'(q);
  end
endmodule
