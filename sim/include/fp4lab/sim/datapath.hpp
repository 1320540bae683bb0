// The functional seam of the TCU model: what the MAC array and the scale-and-accumulate stage compute for
// one k-step of one output tile. The timing model never looks at values; when a run checks results
// (--check) each unit hands its tile step to a Datapath. GoldenDatapath is the golden model's arithmetic
// (models/include/fp4lab: decode_int, contract_step, contract_finish); an RTL co-simulation supplies another
// implementation of the same interface, and --check compares whatever comes out with fp4lab::gemm.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fp4lab/format.hpp"
#include "fp4lab/quantize.hpp"

namespace fp4lab::sim {

// One k-step of one output tile, rows [m0, m0+tm) of A and [n0, n0+tn) of B over nblk blocks of `block`
// elements. Codes are the 4-bit encodings (bit 3 sign), row-major with leading dimensions lda / ldb, already
// offset to the step's first element; scales are the decoded FP32 block scales, offset to the step's first
// block, with leading dimensions lsa / lsb (blocks per row).
struct TileStep {
  ElemFormat fa, fb;
  const uint8_t* a;
  int64_t lda;
  const uint8_t* b;
  int64_t ldb;
  const float* sa;
  int64_t lsa;
  const float* sb;
  int64_t lsb;
  int tm, tn, nblk, block;
};

// A Datapath works at one of two granularities:
//  - k_step: the MAC array module calls block_dots and the accumulator module scale_accumulate / finish as
//    each k-step tile passes through them during the timed run (the golden model);
//  - output_tile: a cycle-level model with its own accumulator and clock (the Verilated RTL MAC, which must
//    not advance the timing model's clock) computes whole output tiles, over all of K, in output_tiles(),
//    which the Simulator calls after the timed run, in the schedule's tile order.
// One output tile: rows [m0, m0+tm) of C, columns [n0, n0+tn).
struct OutputTile {
  int64_t m0, n0;
  int tm, tn;
};

class Datapath {
 public:
  enum class Granularity { k_step, output_tile };
  virtual ~Datapath() = default;
  virtual std::string name() const = 0;
  virtual Granularity granularity() const { return Granularity::k_step; }

  // k_step. MAC array: the exact int32 dot product of every block, p[(i * nblk + k) * tn + j] for output (i, j)
  // and block k (datapath contract step 1).
  virtual void block_dots(const TileStep& s, int32_t* p) = 0;
  // Scale-and-accumulate: for k = 0 .. nblk-1 in ascending order, acc[i*tn + j] = step(acc, p, sa[i][k],
  // sb[j][k]) (contract steps 2-5).
  virtual void scale_accumulate(const TileStep& s, const int32_t* p, float* acc) = 0;
  // After the last k-step: out = acc * (ga * gb) (contract step 6), n values.
  virtual void finish(const float* acc, int64_t n, float ga, float gb, float* out) = 0;

  // output_tile. Called once while the Simulator elaborates its SystemC modules (a cycle-level datapath creates
  // its own there); only one Simulator exists at a time.
  virtual void elaborate() {}
  // Called before that Simulator's kernel context is destroyed: drop the modules elaborate() made.
  virtual void unelaborate() {}
  // Every output tile of C = A . B^T (C row-major, N columns), contract steps 1-6, tiles in the given order.
  virtual void output_tiles(const QTensor& a, const QTensor& b, const std::vector<OutputTile>& tiles, float* c);
};

// The golden model's arithmetic.
class GoldenDatapath final : public Datapath {
 public:
  std::string name() const override { return "golden"; }
  void block_dots(const TileStep& s, int32_t* p) override;
  void scale_accumulate(const TileStep& s, const int32_t* p, float* acc) override;
  void finish(const float* acc, int64_t n, float ga, float gb, float* out) override;
};

}  // namespace fp4lab::sim

namespace fp4lab::sim {
// Datapaths this build offers: "golden" always; "rtl" when the Verilated RTL datapath was built in.
std::vector<std::string> datapath_names();
// Throws std::invalid_argument naming the known datapaths when `name` is not one of them.
std::shared_ptr<Datapath> make_datapath(const std::string& name);
}  // namespace fp4lab::sim
