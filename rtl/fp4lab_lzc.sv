// Leading-zero count of a W-bit vector; W when the vector is zero.
module fp4lab_lzc #(
  parameter int unsigned W = 32,
  localparam int unsigned CW = $clog2(W + 1)
) (
  input  logic [W-1:0]  x_i,
  output logic [CW-1:0] cnt_o
);
  always_comb begin
    cnt_o = CW'(W);
    // The last set bit seen from the bottom is the highest one.
    for (int unsigned b = 0; b < W; b++)
      if (x_i[b]) cnt_o = CW'(W - 1 - b);
  end
endmodule
