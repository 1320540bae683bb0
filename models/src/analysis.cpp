#include "fp4lab/analysis.hpp"

#include "fp4lab/crmath.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 warns inside its own AVX-512 intrinsics (their _mm512_undefined passthrough, GCC PR 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

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

BiasSum::BiasSum(const ElemFormat& f) : n_(f.num_levels()) {
  for (int i = 0; i < n_; ++i) level_[i] = f.level(i);
}

std::vector<EmpiricalLevel> BiasSum::levels() const {
  std::vector<EmpiricalLevel> out;
  out.reserve(size_t(n_));
  for (int i = 0; i < n_; ++i) out.push_back({i, level_[i], cnt_[i], cnt_[i] ? sum_[i] / double(cnt_[i]) : 0.0});
  return out;
}

namespace {
// exp(-sum p log p) / L over the counts of the L levels, n codes in all.
double beff_of_counts(const int64_t* cnt, int L, int64_t codes) {
  const double n = double(codes);
  double h = 0;
  for (int i = 0; i < L; ++i)
    if (cnt[i]) {
      const double p = double(cnt[i]) / n;
      h -= p * cr::log(p);
    }
  return cr::exp(h) / L;
}
}  // namespace

double BiasSum::beff() const {
  int64_t cnt[16], n = 0;
  for (int i = 0; i < 16; ++i) {
    cnt[i] = cnt_[i] + zero_cnt_[i];
    n += cnt[i];
  }
  return beff_of_counts(cnt, n_, n);
}

std::vector<EmpiricalLevel> empirical_bias(const QTensor& q, const float* seen) {
  BiasSum b(q.format);
  b.add(q, seen, 0, q.rows);
  return b.levels();
}

double Moments::sqnr_db() const {
  return err2 == 0.0 ? std::numeric_limits<double>::infinity() : 10.0 * cr::log10(ref2 / err2);
}
double Moments::alpha() const { return ref2 == 0.0 ? 1.0 : dot / ref2; }

namespace {
constexpr int kLanes = 8;
struct Lanes {
  double r2[kLanes] = {}, e2[kLanes] = {}, d[kLanes] = {};
  void add(int l, double r, double q) {
    const double e = q - r;
    r2[l] += r * r;
    e2[l] += e * e;
    d[l] += q * r;
  }
  Moments sum() const {
    Moments m;
    for (int l = 0; l < kLanes; ++l) {
      m.ref2 += r2[l];
      m.err2 += e2[l];
      m.dot += d[l];
    }
    return m;
  }
};
// The eight lanes as one vector each (GCC's vector extensions: elementwise IEEE operations, so each lane adds
// exactly as Lanes::add does; the compiler does not vectorise the lane loop by itself).
using V8d = double __attribute__((vector_size(8 * sizeof(double))));
using V8f = float __attribute__((vector_size(8 * sizeof(float))));
struct VLanes {
  V8d r2, e2, d;
  explicit VLanes(const Lanes& l) {
    std::memcpy(&r2, l.r2, sizeof r2);
    std::memcpy(&e2, l.e2, sizeof e2);
    std::memcpy(&d, l.d, sizeof d);
  }
  void store(Lanes& l) const {
    std::memcpy(l.r2, &r2, sizeof r2);
    std::memcpy(l.e2, &e2, sizeof e2);
    std::memcpy(l.d, &d, sizeof d);
  }
  void add(const V8d& r, const V8d& q) {
    const V8d e = q - r;
    r2 += r * r;
    e2 += e * e;
    d += q * r;
  }
};
// Loads by reference parameter, not by value: a 64-byte vector passed or returned by value draws GCC's ABI note
// (-Wpsabi) where AVX-512 is off.
inline void load8(const double* p, V8d& v) { std::memcpy(&v, p, sizeof v); }
inline void load8(const float* p, V8d& v) {
  V8f f;
  std::memcpy(&f, p, sizeof f);
  v = __builtin_convertvector(f, V8d);
}

template <class R>
void moments_into(Lanes& out, const R* ref, const float* q, int64_t n) {
  VLanes acc(out);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    V8d r, v;
    load8(ref + i, r);
    load8(q + i, v);
    acc.add(r, v);
  }
  acc.store(out);
  for (int l = 0; i < n; ++i, ++l) out.add(l, double(ref[i]), double(q[i]));
}
template <class R>
Moments moments_impl(const R* ref, const float* q, int64_t n) {
  Lanes acc;
  moments_into(acc, ref, q, n);
  return acc.sum();
}

// Element i's lane is i % 8 as in moments_impl (rows are multiples of the block, so of 8), and every value is
// QTensor::dequant's: (grid value * block scale) * global_dec. One block: its codes, its scale s, and `ref` its
// values seen.
inline void moments_block(VLanes& acc, const float* grid, const uint8_t* codes, float s, float g, const float* ref,
                          int block) {
#if defined(__AVX512F__)
  if (block % 16 == 0) {  // 16 grid values at once from a register table, in the same element order
    const __m512 table = _mm512_loadu_ps(grid);
    for (int j = 0; j < block; j += 16) {
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + j));
      const __m512i idx = _mm512_and_si512(_mm512_cvtepu8_epi32(c), _mm512_set1_epi32(15));
      const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_permutexvar_ps(idx, table), _mm512_set1_ps(s)),
                                     _mm512_set1_ps(g));
      V8d lo, hi;
      const __m512d vlo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
      const __m512d vhi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
      std::memcpy(&lo, &vlo, sizeof lo);
      std::memcpy(&hi, &vhi, sizeof hi);
      V8d r;
      load8(ref + j, r);
      acc.add(r, lo);
      load8(ref + j + 8, r);
      acc.add(r, hi);
    }
    return;
  }
#endif
  for (int j = 0; j < block; j += kLanes) {
    V8f v;
    for (int l = 0; l < kLanes; ++l) v[l] = grid[codes[j + l] & 15];
    v = v * s * g;
    V8d r;
    load8(ref + j, r);
    acc.add(r, __builtin_convertvector(v, V8d));
  }
}

inline void grid_table(const QTensor& q, float* grid) {
  for (int c = 0; c < 16; ++c) grid[c] = decode(q.format, uint8_t(c));
}

// `ref` holds rows [row0, row0 + rows) of q.
void moments_into(Lanes& out, const float* ref, const QTensor& q, int64_t row0, int64_t rows) {
  VLanes acc(out);  // a local copy: the code bytes may alias anything, a caller's lanes would be reloaded per byte
  float grid[16];
  grid_table(q, grid);
  const int64_t kb = q.kblocks();
  for (int64_t r = row0; r < row0 + rows; ++r)
    for (int64_t b = 0; b < kb; ++b) {
      const int64_t base = r * q.cols + b * q.block, rbase = (r - row0) * q.cols + b * q.block;
      moments_block(acc, grid, q.codes.data() + base, q.scales[r * kb + b], q.global_dec, ref + rbase, q.block);
    }
  acc.store(out);
}
}  // namespace

Moments moments(const float* ref, const float* q, int64_t n) { return moments_impl(ref, q, n); }
Moments moments(const double* ref, const float* q, int64_t n) { return moments_impl(ref, q, n); }

Moments moments(const float* ref, const QTensor& q) {
  Lanes acc;
  moments_into(acc, ref, q, 0, q.rows);
  return acc.sum();
}

// MomentsSum keeps the lanes between calls (Lanes, whose loops vectorise, stays private to this file).
namespace {
Lanes load(const double* r2, const double* e2, const double* d) {
  Lanes acc;
  std::copy(r2, r2 + kLanes, acc.r2);
  std::copy(e2, e2 + kLanes, acc.e2);
  std::copy(d, d + kLanes, acc.d);
  return acc;
}
void store(const Lanes& acc, double* r2, double* e2, double* d) {
  std::copy(acc.r2, acc.r2 + kLanes, r2);
  std::copy(acc.e2, acc.e2 + kLanes, e2);
  std::copy(acc.d, acc.d + kLanes, d);
}
}  // namespace
void MomentsSum::add(const float* ref, const QTensor& q, int64_t row0, int64_t rows) {
  Lanes acc = load(r2_, e2_, d_);
  moments_into(acc, ref, q, row0, rows);
  store(acc, r2_, e2_, d_);
}
void MomentsSum::add(const double* ref, const float* q, int64_t n) {
  Lanes acc = load(r2_, e2_, d_);
  moments_into(acc, ref, q, n);
  store(acc, r2_, e2_, d_);
}
Moments MomentsSum::sum() const { return load(r2_, e2_, d_).sum(); }

// One pass over the rows for the per-level bias and, when `m` is given, the moments (each sum in its own order,
// as the two passes would take them).
void BiasSum::add(const QTensor& q, const float* seen, int64_t row0, int64_t rows, MomentsSum* m) {
  // Copies on the stack: the per-element scatter then stays out of memory, and the code bytes (which may alias
  // anything) do not force the sums to be reloaded.
  double sum[16], level[16];
  int64_t cnt[16];
  std::copy(sum_, sum_ + 16, sum);
  std::copy(level_, level_ + 16, level);
  std::copy(cnt_, cnt_ + 16, cnt);
  Lanes lanes = m ? load(m->r2_, m->e2_, m->d_) : Lanes();
  VLanes acc(lanes);
  float grid[16];
  grid_table(q, grid);
  const int64_t kb = q.kblocks();
  for (int64_t r = row0; r < row0 + rows; ++r)
    for (int64_t b = 0; b < kb; ++b) {
      const float s = q.scales[r * kb + b];
      const int64_t base = r * q.cols + b * q.block, sbase = (r - row0) * q.cols + b * q.block;
      if (m) moments_block(acc, grid, q.codes.data() + base, s, q.global_dec, seen + sbase, q.block);
      const double scale = double(s) * q.global_dec;
      if (scale == 0.0) {  // an all-zero block carries no information about the grid
        for (int j = 0; j < q.block; ++j) ++zero_cnt_[code_index(q.codes[base + j])];
        continue;
      }
      const double inv = 1.0 / scale;
      for (int j = 0; j < q.block; ++j) {
        const int i = code_index(q.codes[base + j]);  // indices past max_index never come out of quantize()
        sum[i] += level[i] - std::fabs(double(seen[sbase + j])) * inv;
        ++cnt[i];
      }
    }
  std::copy(sum, sum + 16, sum_);
  std::copy(cnt, cnt + 16, cnt_);
  if (m) {
    acc.store(lanes);
    store(lanes, m->r2_, m->e2_, m->d_);
  }
}
void BiasSum::add(const QTensor& q, const float* seen, int64_t row0, int64_t rows) { add(q, seen, row0, rows, nullptr); }
void BiasSum::add(const QTensor& q, const float* seen, int64_t row0, int64_t rows, MomentsSum& m) {
  add(q, seen, row0, rows, &m);
}

double sqnr_db(const float* ref, const float* q, int64_t n) { return moments(ref, q, n).sqnr_db(); }
double sqnr_db(const double* ref, const float* q, int64_t n) { return moments(ref, q, n).sqnr_db(); }

double beff(const QTensor& q) {
  const int L = q.format.num_levels();
  int64_t cnt[4][16] = {};  // four histograms, so that consecutive equal codes do not wait on each other
  const size_t n4 = q.codes.size() / 4 * 4;
  for (size_t i = 0; i < n4; i += 4)
    for (int h = 0; h < 4; ++h) ++cnt[h][code_index(q.codes[i + h])];
  for (size_t i = n4; i < q.codes.size(); ++i) ++cnt[0][code_index(q.codes[i])];
  for (int h = 1; h < 4; ++h)
    for (int i = 0; i < 16; ++i) cnt[0][i] += cnt[h][i];
  return beff_of_counts(cnt[0], L, int64_t(q.codes.size()));
}

double shrinkage_alpha(const float* ref, const float* q, int64_t n) { return moments(ref, q, n).alpha(); }

}  // namespace fp4lab
