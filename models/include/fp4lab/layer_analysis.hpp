// The SPEC section 6 analyses of one captured linear layer (X, W, dY): per tensor and per GEMM pass, for
// a grid and an RHT size. Pure numerics: the trace reader and the report formatting live in the CLI.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fp4lab/analysis.hpp"
#include "fp4lab/recipe.hpp"

namespace fp4lab {

struct AnalysisSetting {
  ElemFormat format = kE1M2;
  int rht = 0;                  // 0 = no rotation
  std::vector<float> rht_signs;  // rht entries when rht != 0
  int block = 16;
  ScaleKind scale = ScaleKind::fp32;  // the paper's setting: one FP32 scale amax/gmax per block
  std::string label() const;          // "e1m2 rht16"
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

struct LayerView {
  const float* x;   // [tokens, in]
  const float* w;   // [out, in]
  const float* dy;  // [tokens, out]
  int64_t tokens, in, out;
};

// Tensors quantised in 1 x block blocks along their last (row-contiguous) dimension, RTNE; with RHT the
// reference is the rotated tensor (the rotation itself is not an error).
std::vector<TensorResult> analyze_tensors(const LayerView& l, const AnalysisSetting& s);

// The three training GEMMs with both operands quantised along the pass's reduction dimension; reference =
// exact product of the unquantised operands (float64). With RHT both operands are rotated with the same
// signs, which cancels in exact arithmetic, so the reference is the unrotated product.
// `refs` holds the float64 reference of each pass (gemm_references), computed once per layer.
using PassRefs = std::vector<std::vector<double>>;
PassRefs gemm_references(const LayerView& l);
std::vector<GemmResult> analyze_gemms(const LayerView& l, const AnalysisSetting& s, const PassRefs& refs);

// The same three GEMMs under a training recipe's operand settings (its grid, scales, RHT per pass, SR on dY).
std::vector<GemmResult> analyze_recipe(const LayerView& l, const Recipe& r, uint32_t stream, const PassRefs& refs);

}  // namespace fp4lab
