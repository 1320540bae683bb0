// Training recipes (docs/spec.md §2): which grid, block, scale, RHT and rounding each operand of the three
// training GEMMs of a linear layer gets. Presets and ablations are named (recipe_table); every knob is also
// settable alone.
//
// Linear layer with X [tokens, in], W [out, in], dY [tokens, out]; every pass is C = A . B^T with both
// operands quantised along the reduction dimension K:
//   fwd_y  = X . W^T    A = X    [tokens, in]    B = W    [out, in]      K = in
//   bwd_dx = dY . W     A = dY   [tokens, out]   B = W^T  [in, out]      K = out
//   bwd_dw = dY^T . X   A = dY^T [out, tokens]   B = X^T  [in, tokens]   K = tokens
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "fp4lab/quantize.hpp"

namespace fp4lab {

enum class Pass : uint8_t { fwd_y = 0, bwd_dx = 1, bwd_dw = 2 };
enum class Operand : uint8_t { a = 0, b = 1 };
inline constexpr Pass kPasses[] = {Pass::fwd_y, Pass::bwd_dx, Pass::bwd_dw};
const char* pass_name(Pass p);
// The trace tensor an operand comes from: "fwd_x", "fwd_w" or "bwd_dy".
const char* operand_role(Pass p, Operand o);

// Rounding of operand a and b of each pass, in pass order.
using PassRounding = std::array<std::array<Rounding, 2>, 3>;

struct Recipe {
  std::string name = "custom";
  ElemFormat format = kE1M2;
  int block = 16;
  ScaleKind scale = ScaleKind::fp32;
  bool weight_tile2d = false;                 // W operands in 16x16 tiles (NVFP4)
  int rht = 0;                                // Hadamard size used where rht_on; 0 = never
  std::array<bool, 3> rht_on{false, false, false};  // per pass: fwd_y, bwd_dx, bwd_dw
  std::vector<float> rht_signs;               // rht entries
  bool rht_bf16 = false;                      // rotated operands rounded to BF16 (TE's BF16 Hadamard)
  PassRounding rounding{{{Rounding::rtne, Rounding::rtne},
                         {Rounding::rtne, Rounding::rtne},
                         {Rounding::rtne, Rounding::rtne}}};
  uint64_t seed = 0;
  SrDraw sr_draw = kDefaultSrDraw;           // how its SR operands draw their words (docs/spec.md §4)

  // A named recipe of recipe_table(): a preset or an ablation. Throws std::invalid_argument on any other name.
  static Recipe preset(const std::string& name);
  // The presets (ufp4, e2m1-ref, nvfp4, mxfp4): what "all" means wherever a list of recipes is asked for.
  static const std::vector<std::string>& preset_names();
  // Every named recipe, presets first, in table order.
  static const std::vector<std::string>& names();

  // Quantiser settings for one operand of one pass. `stream` tells SR streams of different GEMMs apart.
  QuantConfig operand(Pass p, Operand o, uint32_t stream = 0) const;
};

// The named recipes (docs/spec.md §2), one row each: the presets, then the ablations of the paper's dense study
// (docs/spec.md §8), each a preset with RHT or rounding changed on some passes. The CLI, the analyses and the
// Python package (fp4lab.recipes(), fp4lab.ABLATIONS) all take their recipes from here.
enum class RecipeKind : uint8_t { preset, ablation };
struct RecipeRow {
  Recipe recipe;     // its name and settings
  RecipeKind kind;
  std::string base;  // the preset an ablation changes; a preset's own name
  int study;         // its place among the arms of the paper's ablation study (1, 2, ...); 0: not an arm
  std::string what;  // what it is, in one line
};
const std::vector<RecipeRow>& recipe_table();
const char* recipe_kind_name(RecipeKind k);

// The shape of a pass, C [M, N] = A [M, K] . B [N, K]^T, for a layer of `tokens` rows, `in` inputs and `out`
// outputs: the table at the top of this file, written once (the quantiser, the analyses, the simulator's jobs and
// the CLI's shape checks all take it from here).
struct PassGeometry {
  int64_t M = 0, N = 0, K = 0;
};
PassGeometry pass_geometry(Pass p, int64_t tokens, int64_t in, int64_t out);

// One pass's operands, laid out K-major (transposed copies where the pass needs them).
struct PassOperands {
  int64_t M = 0, N = 0, K = 0;
  std::vector<float> a, b;  // [M, K], [N, K]
};
PassOperands pass_operands(Pass p, const float* x, const float* w, const float* dy, int64_t tokens, int64_t in,
                           int64_t out);

std::vector<float> transpose(const float* x, int64_t rows, int64_t cols);

// Stochastic-rounding key of a training step (docs/spec.md §12). Step t of a run seeded `seed` quantises with
// the seed training_seed(seed, t): the first two Philox4x32-10 words under key `seed` and counter
// (t low, t high, kStepStream, 0). The layer's index is the GEMM id N of Recipe::operand (stream N*8 + pass*2
// + operand), so every (seed, step, layer, pass, operand) draws its own bits, on any device and thread count.
inline constexpr uint32_t kStepStream = 0x53544550u;  // "STEP"
uint64_t training_seed(uint64_t seed, uint64_t step);

}  // namespace fp4lab
