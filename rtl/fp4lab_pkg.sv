// fp4lab_pkg: the RTL's single source of truth for the 4-bit element formats and the FP32 constants the
// datapath needs. It mirrors models/include/fp4lab/format.hpp: a format is the tuple (exponent bits,
// mantissa bits, bias, highest index in use) and every other property is derived from it by a function
// below. tests/rtl/format_table_test.cpp checks this table against fp4lab::kAllFormats.
//
// Kept inside what both Verilator 5.006 and Yosys 0.23 accept (docs/spec.md §11): the table is one
// flat packed localparam read through accessor functions (Yosys has no unpacked or multi-dimensional
// localparams), functions assign to their own name (no `return`), and constant functions use no structs.
package fp4lab_pkg;
  // A package offers constants that not every unit uses.
  /* verilator lint_off UNUSEDPARAM */

  // ---- element formats ---------------------------------------------------------------------------
  // Format ids, in the order of fp4lab::kAllFormats. Ports carry fmt_t (Yosys cannot cast to an enum).
  typedef enum logic [1:0] {
    FMT_E2M1      = 2'd0,
    FMT_E1M2      = 2'd1,
    FMT_INT4      = 2'd2,
    FMT_E2M1_MAX2 = 2'd3
  } fmt_e;
  typedef logic [1:0] fmt_t;
  localparam int unsigned NUM_FMT = 4;

  // A build's set of supported formats: bit i set = format i supported.
  typedef logic [NUM_FMT-1:0] fmt_mask_t;
  localparam fmt_mask_t FMTS_E2M1 = 4'b0001;
  localparam fmt_mask_t FMTS_E1M2 = 4'b0010;
  localparam fmt_mask_t FMTS_INT4 = 4'b0100;
  localparam fmt_mask_t FMTS_ALL  = 4'b1111;

  // One row per format: E[15:12] M[11:8] bias[7:4] (two's complement) max_index[3:0], plus
  // FP32(1/gmax), the one derived value that needs a rounded division (NVFP4's block-scale multiplier);
  // the format-table test checks it against C++ `1.0f / gmax()`.
  localparam int unsigned FMT_ROW_W = 48;
  localparam logic [NUM_FMT*FMT_ROW_W-1:0] FMT_TABLE = {
    //  E     M     bias   max    FP32(1/gmax)
    {4'd2, 4'd1, 4'h1, 4'd4, 32'h3F00_0000},  // 3 e2m1_max2: 0 .5 1 1.5 2        1/2
    {4'd1, 4'd2, 4'hF, 4'd7, 32'h3E12_4925},  // 2 int4:      0 1 2 ... 7         1/7
    {4'd1, 4'd2, 4'h1, 4'd7, 32'h3F12_4925},  // 1 e1m2:      0 .25 .5 ... 1.75   1/1.75
    {4'd2, 4'd1, 4'h1, 4'd7, 32'h3E2A_AAAB}   // 0 e2m1:      0 .5 1 1.5 2 3 4 6  1/6
  };

  function automatic int fmt_ebits(fmt_t f);
    fmt_ebits = 32'(FMT_TABLE[FMT_ROW_W*f+44 +: 4]);
  endfunction
  function automatic int fmt_mbits(fmt_t f);
    fmt_mbits = 32'(FMT_TABLE[FMT_ROW_W*f+40 +: 4]);
  endfunction
  function automatic int fmt_bias(fmt_t f);
    fmt_bias = 32'($signed(FMT_TABLE[FMT_ROW_W*f+36 +: 4]));
  endfunction
  function automatic int fmt_max_index(fmt_t f);
    fmt_max_index = 32'(FMT_TABLE[FMT_ROW_W*f+32 +: 4]);
  endfunction
  function automatic logic [31:0] fmt_inv_gmax(fmt_t f);
    fmt_inv_gmax = FMT_TABLE[FMT_ROW_W*f +: 32];
  endfunction

  // Integer view of magnitude index i (format.hpp int_level): subnormal (exponent field 0) -> the
  // mantissa itself; normal -> (1.m) shifted by exponent - 1. Exact small integers (<= 12).
  function automatic int int_level(fmt_t f, int i);
    int e, m;
    e = i >> fmt_mbits(f);
    m = i & ((1 << fmt_mbits(f)) - 1);
    if (e == 0) int_level = m;
    else int_level = ((1 << fmt_mbits(f)) + m) << (e - 1);
  endfunction
  // log2 of the integer-view factor: e2m1 1 (x2), e1m2 2 (x4), int4 0 (x1).
  function automatic int int_shift(fmt_t f);
    int_shift = fmt_bias(f) + fmt_mbits(f) - 1;
  endfunction
  function automatic int int_max(fmt_t f);
    int_max = int_level(f, fmt_max_index(f));
  endfunction
  // floor(log2(gmax)), the element emax the OCP MX shared exponent subtracts.
  function automatic int emax(fmt_t f);
    emax = (fmt_max_index(f) >> fmt_mbits(f)) - fmt_bias(f);
  endfunction
  // FP32 bits of gmax = int_max * 2^-int_shift (exact: a small integer times a power of two).
  function automatic logic [31:0] gmax_bits(fmt_t f);
    int n, msb;
    n = int_max(f);
    msb = 0;
    for (int b = 0; b < 8; b++)
      if (((n >> b) & 1) != 0) msb = b;
    gmax_bits = {1'b0, 8'(127 + msb - int_shift(f)), 23'((n << (23 - msb)) & 32'h7F_FFFF)};
  endfunction

  // ---- derived constants for run-time format selection ------------------------------------------
  // One row per format, evaluated at elaboration by the functions above, so that a unit selecting the
  // format at run time needs a small multiplexer, not arithmetic on the tuple. Row layout:
  // [31:0] int_level(i) in bits [4i+3:4i], [63:32] gmax (FP32), [67:64] int_shift, [71:68] emax
  // (both two's complement), [74:72] max_index.
  localparam int unsigned DER_ROW_W = 80;
  function automatic logic [NUM_FMT*DER_ROW_W-1:0] derived_table();
    derived_table = '0;
    for (int f = 0; f < NUM_FMT; f++) begin
      for (int i = 0; i < 8; i++)
        derived_table[DER_ROW_W*f + 4*i +: 4] = 4'(int_level(2'(f), i));
      derived_table[DER_ROW_W*f + 32 +: 32] = gmax_bits(2'(f));
      derived_table[DER_ROW_W*f + 64 +: 4] = 4'(int_shift(2'(f)));
      derived_table[DER_ROW_W*f + 68 +: 4] = 4'(emax(2'(f)));
      derived_table[DER_ROW_W*f + 72 +: 3] = 3'(fmt_max_index(2'(f)));
    end
  endfunction
  localparam logic [NUM_FMT*DER_ROW_W-1:0] FMT_DERIVED = derived_table();

  function automatic logic [31:0] fmt_levels(fmt_t f);
    fmt_levels = FMT_DERIVED[DER_ROW_W*f +: 32];
  endfunction
  function automatic logic [31:0] fmt_gmax(fmt_t f);
    fmt_gmax = FMT_DERIVED[DER_ROW_W*f + 32 +: 32];
  endfunction
  function automatic logic signed [3:0] fmt_int_shift(fmt_t f);
    fmt_int_shift = FMT_DERIVED[DER_ROW_W*f + 64 +: 4];
  endfunction
  function automatic logic signed [3:0] fmt_emax(fmt_t f);
    fmt_emax = FMT_DERIVED[DER_ROW_W*f + 68 +: 4];
  endfunction
  function automatic logic [2:0] fmt_max_idx(fmt_t f);
    fmt_max_idx = FMT_DERIVED[DER_ROW_W*f + 72 +: 3];
  endfunction

  // ---- build parameters derived from the supported set ----------------------------------------------
  // The decode only depends on (E, M): e2m1/e2m1_max2 decode alike, and so do e1m2/int4.
  function automatic int mask_first(fmt_mask_t mask);
    mask_first = 0;
    for (int f = NUM_FMT - 1; f >= 0; f--)
      if (mask[f]) mask_first = f;
  endfunction
  function automatic bit mask_one_layout(fmt_mask_t mask);
    fmt_t f0;
    f0 = 2'(mask_first(mask));
    mask_one_layout = 1'b1;
    for (int f = 0; f < NUM_FMT; f++)
      if (mask[f] && (fmt_ebits(2'(f)) != fmt_ebits(f0) || fmt_mbits(2'(f)) != fmt_mbits(f0)))
        mask_one_layout = 1'b0;
  endfunction
  function automatic bit mask_single(fmt_mask_t mask);
    mask_single = 32'($countones(mask)) == 1;
  endfunction
  // Largest |product| of two integer views over the supported formats: sizes the dot-product adders.
  function automatic int mask_max_product(fmt_mask_t mask);
    mask_max_product = 0;
    for (int f = 0; f < NUM_FMT; f++)
      for (int g = 0; g < NUM_FMT; g++)
        if (mask[f] && mask[g] && int_max(2'(f)) * int_max(2'(g)) > mask_max_product)
          mask_max_product = int_max(2'(f)) * int_max(2'(g));
  endfunction
  // Bits of a two's complement number holding -v .. v.
  function automatic int signed_bits(int v);
    signed_bits = 1;
    while ((1 << (signed_bits - 1)) <= v) signed_bits++;
  endfunction

  // ---- the decoded 4-bit element: one internal "super format" for every grid ----------------------
  // magnitude = sig << sh. e2m1: sig in 0..3, sh in 0..2 (0 .5 1 1.5 2 3 4 6 -> 0 1 2 3 2<<1 3<<1 2<<2
  // 3<<2); e1m2/int4: sig in 0..7, sh = 0. Mirrors a RawFloat-style {sign, significand, exponent}.
  typedef struct packed {
    logic       sign;
    logic [2:0] sig;
    logic [1:0] sh;
  } raw4_t;

  // Returns a raw4_t's bits (Yosys 0.23 cannot assign struct members inside a function).
  function automatic logic [5:0] decode_raw(fmt_t f, logic [3:0] code);
    int i, e, m;
    logic [2:0] sig;
    logic [1:0] sh;
    i = 32'(code[2:0]);
    e = i >> fmt_mbits(f);
    m = i & ((1 << fmt_mbits(f)) - 1);
    sig = e == 0 ? 3'(m) : 3'((1 << fmt_mbits(f)) + m);
    sh  = e == 0 ? 2'd0 : 2'(e - 1);
    decode_raw = {code[3], sig, sh};
  endfunction

  // decode_raw for every format and magnitude index, evaluated at elaboration: entry 8*f + i holds
  // {sig, sh} (5 bits). Run-time decoding is then a table lookup.
  function automatic logic [NUM_FMT*8*5-1:0] raw_table();
    raw_table = '0;
    for (int f = 0; f < NUM_FMT; f++)
      for (int i = 0; i < 8; i++)
        raw_table[5*(8*f + i) +: 5] = 5'(decode_raw(2'(f), 4'(i)));  // drop the sign bit
  endfunction
  localparam logic [NUM_FMT*8*5-1:0] RAW_TABLE = raw_table();

  // ---- scales -------------------------------------------------------------------------------------
  // Block-scale kinds, in the order of fp4lab::ScaleKind.
  typedef enum logic [1:0] {
    SCALE_FP32       = 2'd0,  // dec = amax / gmax, element = y / dec (true FP32 division)
    SCALE_UE4M3      = 2'd1,  // NVFP4: E4M3 block scale under the FP32 per-tensor S_enc
    SCALE_UE8M0      = 2'd2,  // OCP MX: X = floor(log2 amax) - emax
    SCALE_UE8M0_CEIL = 2'd3   // Transformer Engine MXFP4: X = ceil(log2(amax / gmax))
  } scale_e;
  typedef logic [1:0] scale_t;
  // Scale kinds a quantiser build supports (bit k: kind k). One kind fixes the select at build time, so
  // synthesis drops the other kinds' datapaths (scripts/area.sh prices NVFP4's ue4m3-only quantiser so);
  // mask_single / mask_first serve this mask as they serve fmt_mask_t.
  typedef logic [3:0] scale_mask_t;
  localparam scale_mask_t SCALES_ALL = 4'b1111;

  // ---- FP32 constants -----------------------------------------------------------------------------
  localparam logic [31:0] F32_ONE      = 32'h3F80_0000;
  localparam logic [31:0] F32_QUARTER  = 32'h3E80_0000;  // FP32(1/sqrt(16)), exact
  localparam logic [31:0] F32_448      = 32'h43E0_0000;  // largest E4M3 value
  localparam logic [31:0] F32_MAX      = 32'h7F7F_FFFF;  // FLT_MAX
  localparam logic [31:0] F32_INF      = 32'h7F80_0000;
  localparam logic [31:0] F32_QNAN     = 32'h7FC0_0000;  // NaN payload and sign are not part of the contract

  // ---- FP32 operand fields, read alike by the multiplier and the divider ----------------------------
  typedef struct packed {
    logic        sign, zero, inf, nan;
    logic [7:0]  e;  // effective exponent: subnormals count as exponent 1
    logic [23:0] m;  // significand, hidden bit set for normals only
  } f32_t;
  function automatic f32_t f32_unpack(logic [31:0] x);
    // One concatenation in field order: Yosys 0.23 cannot assign struct members of a function result.
    f32_unpack = {x[31], x[30:0] == '0, x[30:23] == 8'hFF && x[22:0] == '0, x[30:23] == 8'hFF && x[22:0] != '0,
                  x[30:23] == '0 ? 8'd1 : x[30:23], x[30:23] != '0, x[22:0]};
  endfunction

  /* verilator lint_on UNUSEDPARAM */
endpackage
