// fp4_round: an FP32 value already divided by its block scale onto a 4-bit grid, RTNE or stochastic
// rounding, line by line after format.hpp (int_view_of, round_rtne, round_sr):
//   1. |v| saturates at gmax;
//   2. u = |v| * 2^int_shift (exact), held here in fixed point U = u * 2^24 plus a sticky bit;
//   3. RTNE: walk the midpoints between neighbouring levels, ties to the even index;
//      SR: lo <= u < hi, round up iff r < frac * 2^24 with frac = (u - lo) / (hi - lo), compared exactly;
//   4. the sign bit is the sign of v (-0 included).
module fp4_round #(
  parameter fp4lab_pkg::fmt_mask_t FORMATS = fp4lab_pkg::FMTS_ALL
) (
  input  logic [31:0]      v_i,      // not NaN; +-Inf saturates like any value above gmax
  input  fp4lab_pkg::fmt_t fmt_i,    // ignored in a single-format build
  input  logic             sr_i,     // 0: round to nearest even, 1: stochastic
  input  logic [23:0]      rbits_i,  // r >> 8 of the element's Philox word (SR only)
  output logic [3:0]       code_o
);
  // Many instances per unit: one C++ class for all of them keeps Verilated models small.
  /* verilator no_inline_module */
  localparam bit SINGLE = fp4lab_pkg::mask_single(FORMATS);
  localparam fp4lab_pkg::fmt_t FIRST = 2'(fp4lab_pkg::mask_first(FORMATS));

  fp4lab_pkg::fmt_t fmt;
  assign fmt = SINGLE ? FIRST : fmt_i;  // a constant in a fixed build: synthesis drops the select

  logic [31:0] levels;            // int_level(i) in bits [4i+3:4i]
  logic [30:0] gmax;              // gmax's bits without the (zero) sign
  logic [2:0]  max_i;
  logic [30:0] a;                 // |v| after saturation (non-negative floats order like their bits)
  logic [7:0]  e_eff;
  logic signed [9:0] rsh;         // u * 2^24 = (sig << 4) >> rsh
  logic [27:0] t, u_fix;          // u * 2^24 < 16 * 2^24
  logic [27:0] lost_mask;
  logic        sticky;            // u has bits below 2^-24
  logic        done;
  logic [2:0]  idx_rtne, idx_sr;
  logic [4:0]  mid2;               // level_i + level_i+1 = twice the midpoint
  logic [27:0] mid, lo_fix, diff;
  logic [3:0]  lvl_lo, lvl_hi, gap;
  logic [1:0]  gap_log2;
  logic [24:0] frac_ceil;         // ceil(frac * 2^24) <= 2^24

  always_comb begin
    levels = fp4lab_pkg::fmt_levels(fmt);
    gmax = 31'(fp4lab_pkg::fmt_gmax(fmt));
    max_i = fp4lab_pkg::fmt_max_idx(fmt);
    // 1. saturate
    a = v_i[30:0];
    if (a > gmax) a = gmax;
    // 2. fixed point: u * 2^24 = sig * 2^(e_eff - 126 + int_shift) = (sig << 4) >> (130 - e_eff - int_shift),
    //    a right shift because u <= int_max < 16
    e_eff = a[30:23] == '0 ? 8'd1 : a[30:23];
    t = {a[30:23] != '0, a[22:0], 4'b0000};
    rsh = 10'sd130 - $signed({2'b00, e_eff}) - 10'(fp4lab_pkg::fmt_int_shift(fmt));
    lost_mask = rsh >= 10'sd28 ? '1 : (28'd1 << rsh) - 28'd1;
    u_fix = rsh >= 10'sd28 ? '0 : t >> rsh;
    sticky = (t & lost_mask) != '0;

    // 3a. RTNE (round_rtne): the first midpoint above u stops the walk; a tie keeps the even index.
    idx_rtne = '0;
    done = 1'b0;
    mid = '0;
    mid2 = '0;
    for (int i = 0; i < 7; i++) begin
      if (!done && 3'(i) < max_i) begin
        // midpoint * 2^24 = (level_i + level_i+1) * 2^23, exact
        mid2 = {1'b0, levels[4*i +: 4]} + {1'b0, levels[4*(i+1) +: 4]};
        mid = {mid2, 23'd0};
        if (u_fix < mid) done = 1'b1;
        else if (u_fix == mid && !sticky) begin
          idx_rtne = (i & 1) != 0 ? 3'(i + 1) : 3'(i);
          done = 1'b1;
        end else idx_rtne = 3'(i + 1);
      end
    end

    // 3b. SR (round_sr): the highest level <= u, then up iff r < frac * 2^24. frac * 2^24 is exact in
    //     FP32, so for an integer r, r < frac * 2^24 <=> r < ceil(frac * 2^24).
    idx_sr = '0;
    for (int i = 0; i < 7; i++)
      if (3'(i) < max_i && u_fix >= {levels[4*(i+1) +: 4], 24'd0}) idx_sr = 3'(i + 1);
    lvl_lo = levels[4*idx_sr +: 4];
    lvl_hi = idx_sr == 3'd7 ? lvl_lo : levels[4*(idx_sr+3'd1) +: 4];
    gap = lvl_hi - lvl_lo;                               // 1, 2 or 4 (0 at the top level)
    case (gap)
      4'd4: gap_log2 = 2'd2;
      4'd2: gap_log2 = 2'd1;
      default: gap_log2 = 2'd0;
    endcase
    lo_fix = {lvl_lo, 24'd0};
    diff = u_fix - lo_fix;                               // < gap * 2^24
    frac_ceil = 25'(diff >> gap_log2)
              + {24'd0, (diff & ((28'd1 << gap_log2) - 28'd1)) != '0 || sticky};
    if (idx_sr < max_i && {1'b0, rbits_i} < frac_ceil) idx_sr = idx_sr + 3'd1;

    code_o = {v_i[31], sr_i ? idx_sr : idx_rtne};
  end
endmodule
