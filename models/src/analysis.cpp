#include "fp4lab/analysis.hpp"

#include <cmath>
#include <limits>

namespace fp4lab {

std::vector<LevelBias> analytic_bias(const ElemFormat& f) {
  std::vector<LevelBias> out;
  for (int i = 0; i <= f.max_index; ++i) {
    const double g = f.level(i);
    const double l = i == 0 ? 0.0 : (g - f.level(i - 1)) / 2;
    const double r = i == f.max_index ? 0.0 : (f.level(i + 1) - g) / 2;
    out.push_back({i, g, l, r, (l - r) / 2});
  }
  return out;
}

std::vector<EmpiricalLevel> empirical_bias(const QTensor& q, const float* seen) {
  const int L = q.format.num_levels();
  std::vector<double> sum(16, 0.0), level(16, 0.0);
  std::vector<int64_t> cnt(16, 0);
  for (int i = 0; i < L; ++i) level[i] = q.format.level(i);
  const int64_t kb = q.kblocks();
  for (int64_t r = 0; r < q.rows; ++r)
    for (int64_t b = 0; b < kb; ++b) {
      const double scale = double(q.scales[r * kb + b]) * q.global_dec;
      if (scale == 0.0) continue;  // an all-zero block carries no information about the grid
      const double inv = 1.0 / scale;
      const int64_t base = r * q.cols + b * q.block;
      for (int j = 0; j < q.block; ++j) {
        const int i = code_index(q.codes[base + j]);  // indices past max_index never come out of quantize()
        sum[i] += level[i] - std::fabs(double(seen[base + j])) * inv;
        ++cnt[i];
      }
    }
  std::vector<EmpiricalLevel> out;
  for (int i = 0; i < L; ++i) out.push_back({i, level[i], cnt[i], cnt[i] ? sum[i] / double(cnt[i]) : 0.0});
  return out;
}

template <class R>
static double sqnr_impl(const R* ref, const float* q, int64_t n) {
  double s = 0, e = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double r = double(ref[i]), d = double(q[i]) - r;
    s += r * r;
    e += d * d;
  }
  if (e == 0.0) return std::numeric_limits<double>::infinity();
  return 10.0 * std::log10(s / e);
}
double sqnr_db(const float* ref, const float* q, int64_t n) { return sqnr_impl(ref, q, n); }
double sqnr_db(const double* ref, const float* q, int64_t n) { return sqnr_impl(ref, q, n); }

double beff(const QTensor& q) {
  const int L = q.format.num_levels();
  std::vector<int64_t> cnt(16, 0);
  for (uint8_t c : q.codes) ++cnt[code_index(c)];
  const double n = double(q.codes.size());
  double h = 0;
  for (int i = 0; i < L; ++i)
    if (cnt[i]) {
      const double p = double(cnt[i]) / n;
      h -= p * std::log(p);
    }
  return std::exp(h) / L;
}

double shrinkage_alpha(const float* ref, const float* q, int64_t n) {
  double dot = 0, nn = 0;
  for (int64_t i = 0; i < n; ++i) {
    dot += double(q[i]) * double(ref[i]);
    nn += double(ref[i]) * double(ref[i]);
  }
  return nn == 0.0 ? 1.0 : dot / nn;
}

}  // namespace fp4lab
