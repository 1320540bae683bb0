// fp4_dot: exact integer dot product of N 4-bit elements (docs/datapath.md section 3, step 1):
// p = sum_j int(a_j) * int(b_j). Each lane multiplies two super-format significands and shifts by the
// sum of their shifts; the adders are sized from the build's largest product, so an E2M1-only, an
// E1M2-only and a dual-format build differ only where the formats differ.
module fp4_dot #(
  parameter int unsigned           N       = 16,
  parameter fp4lab_pkg::fmt_mask_t FORMATS = fp4lab_pkg::FMTS_ALL
) (
  input  logic [4*N-1:0]     a_i,      // element j in bits [4j+3:4j]
  input  logic [4*N-1:0]     b_i,
  input  fp4lab_pkg::fmt_t   fmt_a_i,  // ignored when FORMATS share one layout
  input  fp4lab_pkg::fmt_t   fmt_b_i,
  output logic signed [31:0] p_o       // exact; the contract's int32
);
  // Width of one signed product and of the exact sum of N of them.
  localparam int unsigned TW = fp4lab_pkg::signed_bits(fp4lab_pkg::mask_max_product(FORMATS));
  localparam int unsigned PW = fp4lab_pkg::signed_bits(N * fp4lab_pkg::mask_max_product(FORMATS));
  localparam int unsigned MW = TW - 1;  // product magnitude

  logic [6*N-1:0] raw_a, raw_b;  // decoded lanes, fp4lab_pkg::raw4_t each

  for (genvar j = 0; j < N; j++) begin : gen_lane
    /* verilator lint_off PINCONNECTEMPTY */
    fp4_decode #(.FORMATS(FORMATS)) u_dec_a (
      .code_i(a_i[4*j +: 4]), .fmt_i(fmt_a_i), .raw_o(raw_a[6*j +: 6]), .int_o());
    fp4_decode #(.FORMATS(FORMATS)) u_dec_b (
      .code_i(b_i[4*j +: 4]), .fmt_i(fmt_b_i), .raw_o(raw_b[6*j +: 6]), .int_o());
    /* verilator lint_on PINCONNECTEMPTY */
  end

  fp4lab_pkg::raw4_t ra, rb;
  logic [5:0]  prod;   // sig * sig <= 7 * 7
  logic [MW-1:0] mag;  // prod << (sh + sh), shift <= 4
  logic signed [TW-1:0] term;
  logic signed [PW-1:0] sum;

  always_comb begin
    sum = '0;
    for (int j = 0; j < N; j++) begin
      ra = raw_a[6*j +: 6];
      rb = raw_b[6*j +: 6];
      prod = 6'(ra.sig) * 6'(rb.sig);
      // Real products never exceed the build's largest one, so MW bits hold them exactly.
      mag = MW'(prod);
      mag = mag << (3'(ra.sh) + 3'(rb.sh));
      term = (ra.sign ^ rb.sign) ? -$signed({1'b0, mag}) : $signed({1'b0, mag});
      sum = sum + PW'(term);
    end
    p_o = 32'(sum);
  end
endmodule
