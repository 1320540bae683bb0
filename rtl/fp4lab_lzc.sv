// Leading-zero count of a W-bit vector; W when the vector is zero. Binary search over halves (log2
// steps of "is the top part zero? then shift it out"), a tree in hardware and a few word operations in
// a Verilated model.
module fp4lab_lzc #(
  parameter int unsigned W = 32,
  localparam int unsigned CW = $clog2(W + 1)
) (
  input  logic [W-1:0]  x_i,
  output logic [CW-1:0] cnt_o
);
  // Pad to a power of two P > W with a one right below x, so a zero x counts exactly W.
  localparam int unsigned P = 1 << $clog2(W + 1);
  logic [P-1:0] x;
  always_comb begin
    x = {x_i, 1'b1, {(P - W - 1){1'b0}}};
    cnt_o = '0;
    for (int unsigned step = P / 2; step >= 1; step = step / 2) begin
      if ((x >> (P - step)) == '0) begin  // the top step bits are zero
        cnt_o = cnt_o + CW'(step);
        x = x << step;
      end
    end
  end
endmodule
