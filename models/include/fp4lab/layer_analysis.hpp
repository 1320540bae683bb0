// The docs/spec.md §6 analyses of one captured linear layer (X, W, dY): per tensor and per GEMM pass, for
// a grid and an RHT size. Pure numerics: the trace reader (models/io) and the analysis of a whole trace with its
// reports (analysis/, fp4lab/trace_analysis.hpp) sit above it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fp4lab/analysis.hpp"
#include "fp4lab/buffer.hpp"
#include "fp4lab/recipe.hpp"

namespace fp4lab {

struct AnalysisSetting {
  ElemFormat format = kE1M2;
  int rht = 0;                  // 0 = no rotation
  std::vector<float> rht_signs;  // rht entries when rht != 0
  int block = 16;
  ScaleKind scale = ScaleKind::fp32;  // the paper's setting: one FP32 scale amax/gmax per block
  std::string label() const;          // "e1m2 rht16"
  QuantConfig config() const;         // the quantiser settings of a tensor or operand under this setting
};

struct TensorResult {
  std::string role;  // fwd_x, fwd_w, bwd_dy
  std::string format;
  int rht = 0;
  double sqnr_db = 0, beff = 0, alpha = 0;
  std::vector<EmpiricalLevel> bias_per_level;
};

struct GemmResult {
  std::string pass;    // fwd_y, bwd_dx, bwd_dw
  std::string format;  // grid name, or the recipe name for recipe runs
  std::string recipe;  // empty for a format/RHT sweep
  int rht = 0;
  double sqnr_db = 0;
  double eta = 0;           // alpha_A * alpha_B of the two quantised operands
  double eta_measured = 0;  // <C_q, C_ref> / |C_ref|^2 on the GEMM output itself
};

using PassRefs = std::vector<F64Buffer>;

struct LayerView {
  const float* x;   // [tokens, in]
  const float* w;   // [out, in]
  const float* dy;  // [tokens, out]
  int64_t tokens, in, out;
  // A tensor whose FP32 pointer is null is read as BF16 bit patterns from here (exact in FP32, so the same
  // values): a large BF16 tensor is read where it lies, a panel at a time, rather than copied to FP32 whole.
  const uint16_t *x16 = nullptr, *w16 = nullptr, *dy16 = nullptr;
};

// A layer with the transposed copies its backward passes need, made once and shared by every setting. A tensor
// of more than kHeldTranspose elements is not copied: its backward operand reads it in place, transposed a panel
// of rows at a time where it is quantised (the same values, so the same bits).
// Without `with_refs` the float64 references are left empty, for the caller to fill with compute_ref (say one
// task per pass beside the quantised work).
struct LayerOperands {
  static constexpr int64_t kHeldTranspose = int64_t(1) << 22;  // elements (16 MB of floats)
  // held_transpose: the largest tensor whose transpose is held (tests read every one in place with 0).
  explicit LayerOperands(const LayerView& l, bool with_refs = true, int64_t held_transpose = kHeldTranspose);
  // How operands are read a panel at a time (elements): an operand of more than chunk_above elements is quantised
  // and multiplied a chunk at a time (the larger of a pass's two); panels and chunks are whole 16-row groups of
  // about this many elements. Tests make them small, so that small layers take every path.
  struct Panels {
    int64_t chunk_above = int64_t(1) << 22;  // 16 MB of floats
    int64_t chunk = int64_t(1) << 20;        // about 1 MB of codes
    int64_t panel = int64_t(1) << 16;        // 256 kB of floats
    int64_t group = int64_t(1) << 24;        // B elements of the jobs that analyze_pass_in_panels runs together
  } panels;
  void compute_ref(Pass p);  // refs[p]: the float64 product of the pass's unquantised operands
  LayerView l;
  std::vector<float> wt, dyt, xt;  // W^T [in, out], dY^T [out, tokens], X^T [in, tokens]; empty when not held
  struct Operand {
    const float* p;
    int64_t rows, cols;
    bool transposed = false;  // element (r, c) is p[c * rows + r]: p is the untransposed [cols, rows] tensor
    const uint16_t* bf16 = nullptr;  // the elements as BF16 bit patterns, where p is null
    int64_t row_stride() const { return transposed ? 1 : cols; }
    int64_t col_stride() const { return transposed ? rows : 1; }
    // Rows [r0, r0 + n) as FP32 into dst (n x cols).
    void rows_into(int64_t r0, int64_t n, float* dst) const;
  };
  // A and B of a pass, both K-major (C = A . B^T).
  std::pair<Operand, Operand> pass(Pass p) const;
  PassRefs refs;  // float64 reference of each pass
};

struct LayerResults {
  std::vector<TensorResult> tensors;  // fwd_x, fwd_w, bwd_dy
  std::vector<GemmResult> gemms;      // fwd_y, bwd_dx, bwd_dw
  void append(LayerResults&& part);   // a later pass's results after this one's
};

// Tensors are quantised in 1 x block blocks along their last (row-contiguous) dimension, RTNE; with RHT
// the reference is the rotated tensor (the rotation itself is not an error). GEMMs quantise both operands
// along the pass's reduction dimension; the reference is the exact product of the unquantised operands
// (float64) — with RHT both operands are rotated with the same signs, which cancels in exact arithmetic.
// A tensor's quantisation along its last dimension is also its operand quantisation in fwd_y (X, W) and
// bwd_dx (dY), so those are computed once.
LayerResults analyze_setting(const LayerOperands& l, const AnalysisSetting& s);
// One pass of it: that pass's GEMM, and the tensors quantised along their last dimension in it (fwd_x and
// fwd_w in fwd_y, bwd_dy in bwd_dx). Independent of the other passes, so callers can run them side by side.
LayerResults analyze_setting_pass(const LayerOperands& l, const AnalysisSetting& s, Pass p);
// Every analysis of a pass but the GEMM output's comparison with the float64 reference: its quantised output C
// goes to `c`, and compare_gemm(result, c, ref) fills the GEMM's sqnr_db and eta_measured once the reference
// is there. Split so that the reference can be computed while the quantised work runs.
LayerResults analyze_setting_pass(const LayerOperands& l, const AnalysisSetting& s, Pass p, F32Buffer& c);
void compare_gemm(GemmResult& g, const F32Buffer& c, const F64Buffer& ref);

// Every setting's and recipe's results of pass p (one LayerResults per setting, then per recipe, each as
// analyze_setting_pass or analyze_recipe_pass and compare_gemm give it), for a pass whose float64 reference is
// too large to hold: the reference is made a panel of rows at a time, once for all of them, and each GEMM output
// is compared with it panel by panel, so neither the reference nor any output is ever whole in memory. A job's
// quantised B is held meanwhile, its A quantised a panel of rows at a time; jobs go in groups of at most
// panels.group B elements (a job alone may exceed it), each group making the reference again. It needs no refs
// (LayerOperands with_refs = false). `panel_rows`: output rows per panel (0: about 4 MB of reference and output).
std::vector<LayerResults> analyze_pass_in_panels(const LayerOperands& l, Pass p,
                                                 const std::vector<AnalysisSetting>& settings,
                                                 const std::vector<Recipe>& recipes, uint32_t stream,
                                                 int64_t panel_rows = 0);

// The three GEMMs under a training recipe's operand settings (its grid, scales, RHT per pass, SR on dY).
std::vector<GemmResult> analyze_recipe(const LayerOperands& l, const Recipe& r, uint32_t stream);
GemmResult analyze_recipe_pass(const LayerOperands& l, const Recipe& r, uint32_t stream, Pass p);
GemmResult analyze_recipe_pass(const LayerOperands& l, const Recipe& r, uint32_t stream, Pass p,
                               F32Buffer& c);  // compare_gemm finishes it

}  // namespace fp4lab
