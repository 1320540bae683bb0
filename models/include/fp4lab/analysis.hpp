// Pinned analysis definitions (docs/spec.md §6). All sums in float64.
#pragma once

#include <cstdint>
#include <vector>

#include "fp4lab/format.hpp"
#include "fp4lab/quantize.hpp"

namespace fp4lab {

// Analytic shrinkage bias of one magnitude level under locally uniform density. The RTNE bin of level
// g_i is [g_i - l_i, g_i + r_i] with half-gaps l_i = (g_i - g_{i-1})/2, r_i = (g_{i+1} - g_i)/2. The mean
// input in the bin is g_i + (r_i - l_i)/2, so the conditional mean error E[q - x] = (l_i - r_i)/2, a quarter
// of the difference of the full gaps. Level 0's bin starts at 0 (l_0 = 0); the top level's bin is
// one-sided (r = 0) when values never exceed gmax, as block scaling by amax/gmax guarantees.
struct LevelBias {
  int index;
  double level, left_halfgap, right_halfgap, bias;
};
std::vector<LevelBias> analytic_bias(const ElemFormat& f);

// Empirical per-level bias of a quantised tensor: for elements quantised to level i, the mean of
// (level_i - |x| / scale) in grid units, with x the values the quantiser saw (rotated when RHT is on).
struct EmpiricalLevel {
  int index;
  double level;
  int64_t count;
  double mean_error;  // 0 when count == 0
};
std::vector<EmpiricalLevel> empirical_bias(const QTensor& q, const float* seen);

// The sums every comparison of a quantised tensor (or product) q with its reference needs, in double:
// sum ref^2, sum (q - ref)^2 and sum q * ref. One pass, accumulated in 8 interleaved partial sums that are
// added in a fixed order at the end: every caller gets the same bits, and the lanes vectorise.
struct Moments {
  double ref2 = 0, err2 = 0, dot = 0;
  double sqnr_db() const;  // 10 log10(ref2 / err2); +inf when the error is zero
  double alpha() const;    // dot / ref2 (the shrinkage factor); 1 for an all-zero reference
};
Moments moments(const float* ref, const float* q, int64_t n);
Moments moments(const double* ref, const float* q, int64_t n);
// The same against the dequantised values of q, computed on the fly (no dequantised copy).
Moments moments(const float* ref, const QTensor& q);

// The same sums built up over consecutive rows of one tensor (or product), in order: the same lanes and the same
// order of additions, so the same bits as one call over the whole, without the whole in memory at once.
class MomentsSum {
 public:
  // Rows [row0, row0 + rows) of q against `ref`, which holds those rows only.
  void add(const float* ref, const QTensor& q, int64_t row0, int64_t rows);
  // The next n elements (n a multiple of 8, but for the last call).
  void add(const double* ref, const float* q, int64_t n);
  Moments sum() const;

 private:
  friend class BiasSum;  // BiasSum::add can take these sums in its own pass over the rows
  double r2_[8] = {}, e2_[8] = {}, d_[8] = {};
};

// empirical_bias built up over consecutive rows of q; `seen` holds those rows only.
class BiasSum {
 public:
  explicit BiasSum(const ElemFormat& f);
  void add(const QTensor& q, const float* seen, int64_t row0, int64_t rows);
  // The same, and m.add(seen, q, row0, rows) in the same pass (the same sums in the same order, so the same bits):
  // the moments' vector work runs beside the chains of additions per level.
  void add(const QTensor& q, const float* seen, int64_t row0, int64_t rows, MomentsSum& m);
  std::vector<EmpiricalLevel> levels() const;
  // beff(q) of the rows added (all of q's rows), from the counts taken here: the codes are read once.
  double beff() const;

 private:
  void add(const QTensor& q, const float* seen, int64_t row0, int64_t rows, MomentsSum* m);
  int n_;
  double sum_[16] = {}, level_[16] = {};
  int64_t cnt_[16] = {};
  int64_t zero_cnt_[16] = {};  // codes of all-zero blocks, which beff counts and the bias does not
};

// 10 log10(sum ref^2 / sum (q - ref)^2); +inf when the error is zero.
double sqnr_db(const float* ref, const float* q, int64_t n);
double sqnr_db(const double* ref, const float* q, int64_t n);

// Effective bucket ratio: exp(-sum p log p) / K over the K magnitude bins of the grid.
double beff(const QTensor& q);

// Shrinkage factor alpha = <Q(A), A> / |A|^2.
double shrinkage_alpha(const float* ref, const float* q, int64_t n);

}  // namespace fp4lab
