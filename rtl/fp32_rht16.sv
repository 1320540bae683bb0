// fp32_rht16: the random Hadamard transform of one block of 16 FP32 values (rht.hpp rht_block, d = 16),
// in the contract's operation order:
//   1. y_j = s_j * x_j                      (a sign flip: exact)
//   2. stages h = 1, 2, 4, 8: for every j with (j & h) == 0,
//        (y_j, y_j+h) <- (y_j + y_j+h, y_j - y_j+h)        one FP32 rounding each
//   3. y_j = y_j * 0.25                     (FP32(1/sqrt(16)); rounds only in the subnormal range)
// and, for the nvfp4 preset (Transformer Engine's BF16 Hadamard GEMM), 4. round each y_j to BF16, RTNE.
module fp32_rht16 (
  input  logic [511:0] x_i,      // element j in bits [32j+31:32j]
  input  logic [15:0]  neg_i,    // bit j set: s_j = -1
  input  logic         bf16_i,   // round the results to BF16
  output logic [511:0] y_o
);
  // Stage k in bits [512k +: 512]; stage 0 is the sign-flipped input, stage 4 the last butterflies.
  logic [5*512-1:0] st /* verilator split_var */;

  for (genvar j = 0; j < 16; j++) begin : gen_sign
    assign st[32*j +: 32] = x_i[32*j +: 32] ^ {neg_i[j], 31'd0};
  end

  for (genvar k = 0; k < 4; k++) begin : gen_stage
    for (genvar j = 0; j < 16; j++) begin : gen_bfly
      if ((j & (1 << k)) == 0) begin : gen_pair
        localparam int unsigned H = 1 << k;
        fp32_add u_sum (
          .a_i(st[512*k + 32*j +: 32]), .b_i(st[512*k + 32*(j+H) +: 32]),
          .y_o(st[512*(k+1) + 32*j +: 32]));
        // a - b is a + (-b) in IEEE arithmetic, zero signs included
        fp32_add u_diff (
          .a_i(st[512*k + 32*j +: 32]), .b_i(st[512*k + 32*(j+H) +: 32] ^ {1'b1, 31'd0}),
          .y_o(st[512*(k+1) + 32*(j+H) +: 32]));
      end
    end
  end

  for (genvar j = 0; j < 16; j++) begin : gen_scale
    logic [31:0] y;
    logic [15:0] b;
    fp32_mul u_quarter (.a_i(st[512*4 + 32*j +: 32]), .b_i(fp4lab_pkg::F32_QUARTER), .y_o(y));
    // scale.hpp f32_to_bf16: (u + 0x7FFF + lsb) >> 16, in 32-bit arithmetic
    assign b = 16'((y + 32'h0000_7FFF + {31'd0, y[16]}) >> 16);
    assign y_o[32*j +: 32] = bf16_i ? {b, 16'd0} : y;
  end
endmodule
