// fp4_mac_unit: the block MAC of one output element, docs/datapath.md section 3 step by step.
//
// One beat is one block of N elements of A and of B with their decoded block scales sa, sb:
//   1. p   = exact integer dot product (fp4_dot), plus the held partial sum of a join beat
//   2. x   = FP32(p)            exact
//   3. s   = sa * sb            FP32 multiply, RNE
//   4. x   = x * s              FP32 multiply, RNE
//   5. acc = acc + x            FP32 add, RNE (acc restarts at +0.0 on a first beat)
// and on a last beat 6. out = acc * (ga * gb), two RNE multiplies, handed out with valid/ready.
// A join beat (OCP MX blocks of 32 on a 16-wide unit) only adds its integer p into the next beat's.
// Steps 1-4 sit in front of DEPTH pipeline registers; step 5 is a one-cycle loop; step 6 lands in the
// output register, so a result leaves LATENCY = DEPTH + 1 cycles after its last beat is accepted.
module fp4_mac_unit #(
  parameter int unsigned           N       = 16,
  parameter fp4lab_pkg::fmt_mask_t FORMATS = fp4lab_pkg::FMTS_ALL,
  parameter int unsigned           DEPTH   = 1
) (
  input  logic             clk_i,
  input  logic             rst_ni,
  // one block per beat
  input  logic             in_valid_i,
  output logic             in_ready_o,
  input  logic [4*N-1:0]   a_i,       // element j in bits [4j+3:4j]
  input  logic [4*N-1:0]   b_i,
  input  fp4lab_pkg::fmt_t fmt_a_i,   // ignored when FORMATS share one layout
  input  fp4lab_pkg::fmt_t fmt_b_i,
  input  logic [31:0]      sa_i,      // decoded block scales (FP32 bits)
  input  logic [31:0]      sb_i,
  input  logic             first_i,   // first block of an output: acc starts at +0.0
  input  logic             last_i,    // last block: finish with ga * gb and emit
  input  logic             join_i,    // hold p and add it into the next beat (sa/sb/first/last unused)
  input  logic [31:0]      ga_i,      // per-tensor factors g = S_dec * 2^-int_shift (used on last beats)
  input  logic [31:0]      gb_i,
  // one result per output element
  output logic             out_valid_o,
  input  logic             out_ready_i,
  output logic [31:0]      out_o
);
  // ---- steps 1-4: combinational product path ----
  logic signed [31:0] p_blk, p, psum_q;
  logic        held_q;
  logic [31:0] xf, s, x, g;

  fp4_dot #(.N(N), .FORMATS(FORMATS)) u_dot (
    .a_i, .b_i, .fmt_a_i, .fmt_b_i, .p_o(p_blk));

  assign p = p_blk + (held_q ? psum_q : 32'sd0);

  fp32_from_int u_cvt (.x_i(p), .y_o(xf));
  fp32_mul u_scale (.a_i(sa_i), .b_i(sb_i), .y_o(s));
  fp32_mul u_x (.a_i(xf), .b_i(s), .y_o(x));
  fp32_mul u_g (.a_i(ga_i), .b_i(gb_i), .y_o(g));  // only meaningful on last beats

  // A join beat never enters the pipeline, but waits for it like any other beat so the order holds.
  logic pipe_in_ready;
  assign in_ready_o = pipe_in_ready;

  always_ff @(posedge clk_i or negedge rst_ni) begin
    if (!rst_ni) begin
      held_q <= 1'b0;
      psum_q <= '0;
    end else if (in_valid_i && in_ready_o) begin
      held_q <= join_i;
      if (join_i) psum_q <= p;
    end
  end

  // ---- DEPTH pipeline registers ----
  localparam int unsigned PW = 32 + 32 + 2;
  logic          acc_valid, acc_ready;
  logic [PW-1:0] acc_data;
  logic [31:0]   acc_x, acc_g;
  logic          acc_first, acc_last;

  fp4lab_pipe #(.WIDTH(PW), .DEPTH(DEPTH)) u_pipe (
    .clk_i, .rst_ni,
    .in_valid_i(in_valid_i & ~join_i), .in_ready_o(pipe_in_ready), .in_data_i({x, g, first_i, last_i}),
    .out_valid_o(acc_valid), .out_ready_i(acc_ready), .out_data_o(acc_data));
  assign {acc_x, acc_g, acc_first, acc_last} = acc_data;

  // ---- step 5: accumulate; step 6: finish into the output register ----
  logic [31:0] acc_q, acc_in, acc_d, fin, out_q;
  logic        out_valid_q;

  assign acc_in = acc_first ? 32'h0000_0000 : acc_q;  // +0.0, so a first x of -0.0 gives +0.0
  fp32_add u_acc (.a_i(acc_in), .b_i(acc_x), .y_o(acc_d));
  fp32_mul u_fin (.a_i(acc_d), .b_i(acc_g), .y_o(fin));

  // A last beat needs the output register free (or leaving this cycle).
  assign acc_ready = ~(acc_last & out_valid_q & ~out_ready_i);

  always_ff @(posedge clk_i or negedge rst_ni) begin
    if (!rst_ni) begin
      acc_q <= '0;
      out_valid_q <= 1'b0;
    end else begin
      if (acc_valid && acc_ready) acc_q <= acc_d;
      if (acc_valid && acc_ready && acc_last) out_valid_q <= 1'b1;
      else if (out_ready_i) out_valid_q <= 1'b0;
    end
  end
  always_ff @(posedge clk_i) begin
    if (acc_valid && acc_ready && acc_last) out_q <= fin;
  end

  assign out_valid_o = out_valid_q;
  assign out_o = out_q;
endmodule
