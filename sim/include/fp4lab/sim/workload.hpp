// What the TCU model runs: GEMM jobs. A training step of a linear layer (X [tokens, in], W [out, in],
// dY [tokens, out]) is three jobs, fwd_y, bwd_dx and bwd_dw, each C = A . B^T with both operands quantised
// along the reduction dimension K as the recipe says (fp4lab::Recipe::operand).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fp4lab/io/safetensors.hpp"
#include "fp4lab/quantize.hpp"
#include "fp4lab/recipe.hpp"

namespace fp4lab::sim {

// What of a job runs. `step`: everything a training GEMM needs under the configuration (its RHT / quantise passes
// per prep.mode, the unpack pass when unpack.launches > 0, the GEMM). The others are one kernel on its own, as a
// GPU benchmark times it: `quantize`, the prep passes of operand A alone; `unpack`, the unpack pass of both
// operands; `mma`, the GEMM reading operands already unpacked (or packed, without an unpack pass); `gemm`,
// unpack and GEMM (the operands already quantised).
enum class JobKind : uint8_t { step, quantize, unpack, mma, gemm };
const char* job_kind_name(JobKind k);
JobKind parse_job_kind(const std::string& s);  // throws std::invalid_argument naming the known values

struct GemmJob {
  std::string layer;         // e.g. "layer1.linear_fc2"
  Pass pass = Pass::fwd_y;
  JobKind kind = JobKind::step;
  int64_t M = 0, N = 0, K = 0;
  QuantConfig a, b;          // quantiser settings of operand A [M, K] and B [N, K]
  double count = 1;          // times this GEMM occurs in the workload (weights the totals)
  std::string name() const { return layer + "." + pass_name(pass); }
};

// One linear layer of a shape list.
struct LayerShape {
  std::string gemm;
  int64_t tokens = 0, in = 0, out = 0;
  double count = 1;
};

// The three training GEMMs of a layer. `quant(pass, operand, gemm)` gives each operand's quantiser settings;
// `gemm` is the layer's position in the workload, its GEMM id in the SR counter (Recipe::operand's stream), as
// fp4lab analyze and fp4lab cuda check number the records of a trace.
using OperandConfigFn = std::function<QuantConfig(Pass, Operand, uint32_t gemm)>;
std::vector<GemmJob> training_gemms(const LayerShape& layer, const OperandConfigFn& quant, uint32_t gemm);

// The largest dimension of a layer: products of two (M*N outputs, M*K operands) stay far inside int64.
inline constexpr long long kMaxShapeDim = 1LL << 31;
// The largest count of a shape list's layer: a job's figures (at most 4e18 cycles) times it stay finite in a double.
inline constexpr long long kMaxShapeCount = 1LL << 31;

// A shape list (workloads/shapes/*.csv): '#' comments, a header `gemm,tokens,in,out[,count]`, then one linear
// layer per line. Throws std::invalid_argument "FILE:LINE: fault" on a bad line.
std::vector<LayerShape> read_shapes(const std::string& path);
// The text of a shape list read_shapes reads back to `layers`: each of `comments` as a '#' line, the header, one
// line per layer. Throws std::invalid_argument for a gemm name no shape list can hold (empty, a ',' or a control
// byte in it, '#' first, blanks around it).
std::string shapes_csv(const std::vector<LayerShape>& layers, const std::vector<std::string>& comments);

// What a dimension must be a multiple of for the passes a run simulates: each pass reduces over one of tokens, in
// and out (pass_geometry's K), and its operands need K to be a multiple of their block size and RHT size.
struct ShapeMultiples {
  int64_t tokens = 1, in = 1, out = 1;
};
ShapeMultiples k_multiples(const OperandConfigFn& quant, const std::vector<Pass>& passes);
// Every dimension rounded up to its multiple: the zero padding a kernel gives a partial block (zeros add nothing
// to a dot product but take their MAC lanes). Throws std::invalid_argument if one would pass kMaxShapeDim.
std::vector<LayerShape> pad_shapes(const std::vector<LayerShape>& layers, const ShapeMultiples& m);

// The layers a trace's records stand for. Without `full_size`, each record's own shape (count 1). With it, the
// shape of the layer in the step it was captured from, from its file's metadata as fp4lab.capture writes it
// (docs/spec.md §13): tokens = `tokens_in_pass`; out = N of `out_features_kept` ("all N" or "K of N, ...") where
// given; count = `calls_in_step` where given. Throws std::invalid_argument "FILE: key: fault" for a missing
// tokens_in_pass or a value that is not what fp4lab.capture writes or does not fit the record.
std::vector<LayerShape> trace_shapes(const io::Trace& trace, bool full_size);

// Bytes of a quantised operand slice of rows x cols (cols along K): 4-bit codes plus its block scales.
double quantised_bytes_per_element(const QuantConfig& q);
int64_t quantised_bytes(const QuantConfig& q, int64_t rows, int64_t cols);

}  // namespace fp4lab::sim
