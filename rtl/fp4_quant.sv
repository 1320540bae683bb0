// fp4_quant: the block quantiser for one 1x16 block (quantize.hpp block_scale, scale_element and the
// grid rounding), fully parallel: block amax, the block scale of the selected kind, and 16 elements
// scaled and rounded (RTNE, or SR with the caller's random bits) in one pass.
//
// Scale kinds, in the contract's operation order (docs/datapath.md section 2, step 3):
//   fp32        dec = amax / gmax; v = y / dec (a zero dec gives +-0)          -- true FP32 divisions
//   ue4m3       mult = S_enc * FP32(1/gmax); s = min(amax * mult, FLT_MAX, 448); code = E4M3(s) RTNE;
//               dec = E4M3 value; enc = min(1 / (dec * (1 / S_enc)), FLT_MAX); v = y * enc
//   ue8m0       X = floor(log2 amax) - emax           } clamped to [-127, 127]; an all-zero block takes
//   ue8m0-ceil  X = ceil(log2(amax / gmax))           } X = -127; dec = 2^X, v = y * 2^-X
// The per-tensor S_enc (ue4m3) and, for 16x16 weight tiles or 1x32 MX blocks, the amax of the whole
// tile come from outside: a controller runs a first pass reading amax_o and feeds the maximum back.
module fp4_quant #(
  parameter fp4lab_pkg::fmt_mask_t   FORMATS = fp4lab_pkg::FMTS_ALL,
  parameter fp4lab_pkg::scale_mask_t SCALES  = fp4lab_pkg::SCALES_ALL
) (
  input  logic [511:0]       y_i,            // 16 FP32 values (rotated already when RHT is on), finite
  input  fp4lab_pkg::fmt_t   fmt_i,          // ignored in a single-format build
  input  fp4lab_pkg::scale_t scale_i,        // ignored in a single-scale build
  input  logic               sr_i,           // stochastic rounding
  input  logic [383:0]       rbits_i,        // 16 x (r >> 8) of each element's Philox word
  input  logic [31:0]        s_enc_i,        // NVFP4 S_enc of the tensor (ue4m3 only)
  input  logic               amax_ext_en_i,  // use amax_ext_i instead of this block's own amax
  input  logic [31:0]        amax_ext_i,
  output logic [63:0]        codes_o,        // 16 4-bit codes
  output logic [31:0]        dec_o,          // decoded block scale
  output logic [7:0]         scode_o,        // E4M3 / E8M0 bits; 0 for fp32
  output logic [31:0]        amax_o          // this block's own amax
);
  localparam bit SINGLE = fp4lab_pkg::mask_single(FORMATS);
  localparam fp4lab_pkg::fmt_t FIRST = 2'(fp4lab_pkg::mask_first(FORMATS));

  fp4lab_pkg::fmt_t fmt;
  assign fmt = SINGLE ? FIRST : fmt_i;  // a constant in a fixed build: synthesis drops the select

  fp4lab_pkg::scale_t scale;
  assign scale = fp4lab_pkg::mask_single(SCALES) ? 2'(fp4lab_pkg::mask_first(SCALES)) : scale_i;

  // ---- block amax: |y| compared as bit patterns (finite, non-negative) ----
  logic [31:0] amax;
  always_comb begin
    amax_o = '0;
    for (int j = 0; j < 16; j++)
      if ({1'b0, y_i[32*j +: 31]} > amax_o) amax_o = {1'b0, y_i[32*j +: 31]};
    amax = amax_ext_en_i ? amax_ext_i : amax_o;
  end

  // ---- fp32: dec = amax / gmax (its quotient also feeds ue8m0-ceil) ----
  logic [31:0] q_fp32;
  fp32_div u_dec_fp32 (.a_i(amax), .b_i(fp4lab_pkg::fmt_gmax(fmt)), .y_o(q_fp32));

  // ---- ue4m3 (NVFP4, Transformer Engine's order) ----
  logic [31:0] mult, s_raw, s_sat, dec4, s_dec, t4, e4, enc4;
  logic [7:0]  code4;
  fp32_mul u_mult (.a_i(s_enc_i), .b_i(fp4lab_pkg::fmt_inv_gmax(fmt)), .y_o(mult));
  fp32_mul u_s (.a_i(amax), .b_i(mult), .y_o(s_raw));
  always_comb begin
    s_sat = s_raw > fp4lab_pkg::F32_MAX ? fp4lab_pkg::F32_MAX : s_raw;  // s >= 0: bits order like values
    s_sat = s_sat > fp4lab_pkg::F32_448 ? fp4lab_pkg::F32_448 : s_sat;
  end
  ue4m3_encode u_enc4 (.x_i(s_sat), .code_o(code4));
  e4m3_decode u_dec4 (.code_i(code4), .y_o(dec4));
  fp32_div u_sdec (.a_i(fp4lab_pkg::F32_ONE), .b_i(s_enc_i), .y_o(s_dec));
  fp32_mul u_t4 (.a_i(dec4), .b_i(s_dec), .y_o(t4));
  fp32_div u_e4 (.a_i(fp4lab_pkg::F32_ONE), .b_i(t4), .y_o(e4));
  assign enc4 = e4 > fp4lab_pkg::F32_MAX ? fp4lab_pkg::F32_MAX : e4;  // 1/0 = +Inf -> FLT_MAX

  // ---- ue8m0 / ue8m0-ceil (OCP MX) ----
  // floor(log2 x) of a positive finite x: E - 127, or for a subnormal -127 - (leading zeros of the fraction).
  logic [4:0] lz_amax, lz_q;
  fp4lab_lzc #(.W(23)) u_lz_amax (.x_i(amax[22:0]), .cnt_o(lz_amax));
  fp4lab_lzc #(.W(23)) u_lz_q (.x_i(q_fp32[22:0]), .cnt_o(lz_q));
  logic signed [9:0] ilogb_amax, ilogb_q, x_floor, x_ceil, x8;
  logic        q_pow2;
  logic [7:0]  code8;
  logic [31:0] dec8, enc8;
  always_comb begin
    ilogb_amax = amax[30:23] != '0 ? $signed({2'b00, amax[30:23]}) - 10'sd127 : -10'sd127 - $signed({5'd0, lz_amax});
    ilogb_q = q_fp32[30:23] != '0 ? $signed({2'b00, q_fp32[30:23]}) - 10'sd127 : -10'sd127 - $signed({5'd0, lz_q});
    q_pow2 = q_fp32[30:23] != '0 ? q_fp32[22:0] == '0 : (q_fp32[22:0] & (q_fp32[22:0] - 23'd1)) == '0;
    x_floor = ilogb_amax - 10'(fp4lab_pkg::fmt_emax(fmt));
    // amax / gmax may underflow to 0: the exact ceil(log2) is below -127, so the smallest scale (quantize.hpp)
    if (q_fp32[30:0] == '0) x_ceil = -10'sd127;
    else x_ceil = ilogb_q + (q_pow2 ? 10'sd0 : 10'sd1);
    if (amax[30:0] == '0) x8 = -10'sd127;
    else x8 = scale == fp4lab_pkg::SCALE_UE8M0 ? x_floor : x_ceil;
    x8 = x8 < -10'sd127 ? -10'sd127 : (x8 > 10'sd127 ? 10'sd127 : x8);
    code8 = 8'(x8 + 10'sd127);
    // 2^X and 2^-X (scale.hpp e8m0_decode): 2^-127 is the subnormal 0x00400000
    dec8 = x8 >= -10'sd126 ? {1'b0, 8'(x8 + 10'sd127), 23'd0} : 32'h0040_0000;
    enc8 = x8 <= 10'sd126 ? {1'b0, 8'(10'sd127 - x8), 23'd0} : 32'h0040_0000;
  end

  // ---- the selected scale ----
  logic [31:0] enc;
  logic        dec_zero;
  always_comb begin
    unique case (scale)
      fp4lab_pkg::SCALE_FP32: begin
        dec_o = q_fp32;
        scode_o = 8'd0;
        enc = '0;  // unused: fp32 divides
      end
      fp4lab_pkg::SCALE_UE4M3: begin
        dec_o = dec4;
        scode_o = code4;
        enc = enc4;
      end
      default: begin
        dec_o = dec8;
        scode_o = code8;
        enc = enc8;
      end
    endcase
    dec_zero = dec_o[30:0] == '0;
  end

  // ---- 16 elements: scale, then round onto the grid ----
  for (genvar j = 0; j < 16; j++) begin : gen_elem
    logic [31:0] y, v_div, v_mul, v;
    assign y = y_i[32*j +: 32];
    fp32_div u_div (.a_i(y), .b_i(dec_o), .y_o(v_div));
    fp32_mul u_mul (.a_i(y), .b_i(enc), .y_o(v_mul));
    // fp32 scale: y / dec, or y * 0 = +-0 when the scale underflowed to zero
    assign v = scale != fp4lab_pkg::SCALE_FP32 ? v_mul : dec_zero ? {y[31], 31'd0} : v_div;
    fp4_round #(.FORMATS(FORMATS)) u_round (
      .v_i(v), .fmt_i(fmt), .sr_i, .rbits_i(rbits_i[24*j +: 24]), .code_o(codes_o[4*j +: 4]));
  end
endmodule
