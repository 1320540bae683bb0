// Stochastic rounding: statistics of round_sr over Philox words, and reproducibility of the quantiser
// (same seed -> same codes, whatever the OpenMP thread count).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <cstdint>
#include <vector>

#include "fp4lab/philox.hpp"
#include "fp4lab/quantize.hpp"
#include "fp4lab/rht.hpp"
#include "test_util.hpp"

namespace fp4lab::test {
namespace {

// Restores the OpenMP thread count a test changed.
struct ThreadGuard {
  int saved = omp_get_max_threads();
  ~ThreadGuard() { omp_set_num_threads(saved); }
};

class SrStats : public ::testing::TestWithParam<Golden> {};

// P(up) of a draw at the exact fraction frac of an input (docs/spec.md §4): philox1 and philox4 compare 24 random
// bits, P = ceil(frac 2^24) / 2^24 (frac <= P < frac + 2^-24); philox16 compares 8 bits and a midpoint,
// P = ceil(256 frac - 1/2) / 256 (|P - frac| <= 2^-9). Both are exact in double for an FP32 fraction.
double p_up(SrDraw d, double frac) {
  if (d == SrDraw::philox16) return std::max(0.0, std::ceil(256.0 * frac - 0.5)) / 256.0;
  return std::ceil(frac * 0x1p24) / 0x1p24;
}
// The documented bound on |P - frac| of a draw.
double p_up_bound(SrDraw d) { return d == SrDraw::philox16 ? 0x1p-9 : 0x1p-24; }

TEST(SrPUp, OfEachDrawIsWithinItsBound) {
  for (SrDraw d : kSrDraws)
    for (int i = 0; i <= 4096; ++i) {
      const double f = i / 4096.0;
      EXPECT_LE(std::fabs(p_up(d, f) - f), p_up_bound(d)) << sr_draw_name(d) << " frac " << f;
    }
  EXPECT_EQ(p_up(SrDraw::philox16, 0.3), 77 / 256.0);  // 76.8 - 0.5 rounds up to 77 of the 256 bytes
  EXPECT_EQ(p_up(SrDraw::philox16, 1 / 512.0), 0.0);   // at the midpoint of the first byte: never up
  EXPECT_EQ(p_up(SrDraw::philox16, 1 / 512.0 + 0x1p-20), 1 / 256.0);
}

// N = 2^20 (> 10^6) draws of round_sr at a fixed x, words sr_word(d, seed, stream, 0..N-1), under every draw
// (philox4 takes the four words of each block in turn, philox16 the sixteen bytes).
// Each draw rounds up with probability P = p_up(d, frac), so the number of ups is Binomial(N, P) and the mean
// error (q - x) = gap * (ups/N - frac) has standard deviation sigma = gap * sqrt(P (1 - P) / N). Bounds, 5 sigma
// (two-sided p ~ 6e-7 per check):
//   |ups/N - P|                     <= 5 sqrt(P (1 - P) / N)
//   |mean(q - x) - gap (P - frac)|  <= gap * 5 sqrt(P (1 - P) / N)
// Positions: the first, a middle and the last interval of the grid, at frac 1/8, 0.3, 0.45, 1/2 and 7/8 (at 0.45,
// 256 frac = 115.2: philox16's midpoint term makes P 115/256, where a draw without it would give 116/256, 8 sigma off).
TEST_P(SrStats, UnbiasedAndPUpEqualsFrac) {
  const Golden& g = GetParam();
  const int64_t N = int64_t(1) << 20;
  const int intervals[] = {0, (g.num_levels - 1) / 2, g.num_levels - 2};
  constexpr int kDraws = int(std::size(kSrDraws));
  int positions = 0;
  uint32_t stream = 100;
  for (int k = 0; k < 3 * kDraws; ++k)  // every draw at each of the three intervals
    for (double frac_target : {0.125, 0.3, 0.45, 0.5, 0.875}) {
      const SrDraw d = kSrDraws[k / 3];
      const int i = intervals[k % 3];
      const double lo = g.levels[i], hi = g.levels[i + 1], gap = hi - lo;
      const float x = float(lo + frac_target * gap);
      const double frac = (double(x) - lo) / gap;  // the exact fraction of the FP32 input
      const double P = p_up(d, frac);
      int64_t ups = 0;
      double err = 0.0;
      ++stream;  // an independent stream for every position
      for (int64_t n = 0; n < N; ++n) {
        const uint8_t c = round_sr(g.f, x, sr_word(d, 0x5EED, stream, uint64_t(n)));
        const int idx = code_index(c);
        ASSERT_TRUE(idx == i || idx == i + 1) << "SR left the two neighbours of " << x;
        ASSERT_FALSE(code_negative(c));
        ups += idx == i + 1;
        err += double(decode(g.f, c)) - double(x);
      }
      const double sd = std::sqrt(P * (1 - P) / double(N));
      const double p_hat = double(ups) / double(N);
      EXPECT_LE(std::fabs(p_hat - P), 5 * sd) << sr_draw_name(d) << " x " << x << " frac " << frac << " P(up) " << p_hat
                                              << " expected " << P;
      EXPECT_LE(std::fabs(err / double(N) - gap * (P - frac)), gap * 5 * sd)
          << sr_draw_name(d) << " x " << x << " frac " << frac << " mean error " << err / double(N);
      ++positions;
    }
  EXPECT_EQ(positions, 15 * kDraws);
}

INSTANTIATE_TEST_SUITE_P(AllFormats, SrStats, ::testing::ValuesIn(kGolden),
                         [](const ::testing::TestParamInfo<Golden>& i) { return gtest_name(i.param.name); });

QuantConfig sr_config(const ElemFormat& f, ScaleKind s, int rht) {
  QuantConfig c;
  c.format = f;
  c.block = 16;
  c.scale = s;
  c.rounding = Rounding::sr;
  c.seed = 0x0123456789ABCDEFull;
  c.stream = 5;
  if (rht) {
    c.rht = rht;
    c.rht_signs = rht_signs_te(16);
  }
  return c;
}

// Same seed -> same codes; one thread vs two -> same codes; another seed or stream -> other codes.
TEST(SrQuantize, ReproducibleAndIndependentOfThreadCount) {
  ThreadGuard guard;
  Rng rng(11);
  const int64_t rows = 64, cols = 256;
  const auto x = rng.normals(size_t(rows * cols));
  int configs = 0;
  for (const ElemFormat& f : kAllFormats)
    for (ScaleKind s : {ScaleKind::fp32, ScaleKind::ue4m3, ScaleKind::ue8m0})
      for (int rht : {0, 16}) {
        const QuantConfig cfg = sr_config(f, s, rht);
        SCOPED_TRACE(cfg.label());
        omp_set_num_threads(1);
        const QTensor q1 = quantize(x.data(), rows, cols, cfg);
        const QTensor q1b = quantize(x.data(), rows, cols, cfg);
        omp_set_num_threads(2);
        const QTensor q2 = quantize(x.data(), rows, cols, cfg);
        EXPECT_EQ(q1.codes, q1b.codes);
        EXPECT_EQ(q1.codes, q2.codes);
        EXPECT_EQ(q1.scales, q2.scales);
        QuantConfig other = cfg;
        other.seed ^= 1;
        const QTensor q3 = quantize(x.data(), rows, cols, other);
        other = cfg;
        other.stream += 1;
        const QTensor q4 = quantize(x.data(), rows, cols, other);
        int64_t d3 = 0, d4 = 0;
        for (size_t i = 0; i < q1.codes.size(); ++i) {
          d3 += q1.codes[i] != q3.codes[i];
          d4 += q1.codes[i] != q4.codes[i];
        }
        // Most elements are not on a level, so about half of them should change; 10% is a loose floor.
        EXPECT_GT(d3, rows * cols / 10) << "seed does not reach the rounding";
        EXPECT_GT(d4, rows * cols / 10) << "stream does not reach the rounding";
        ++configs;
      }
  EXPECT_EQ(configs, 24);
}

// The word docs/spec.md §4 gives element `index` of a stream, spelled out from the generator (whose outputs
// philox_test pins to the published known answers): philox1, the first word of the block at counter (index,
// stream); philox4, word index mod 4 of the block at counter (index / 4, stream); philox16, byte index mod 4 of
// word (index / 4) mod 4 of the block at counter (index / 16, stream), as the word (byte << 24) | 2^23.
uint32_t spec_word(SrDraw d, uint64_t seed, uint32_t stream, uint64_t index) {
  const uint64_t ctr = d == SrDraw::philox1 ? index : d == SrDraw::philox4 ? index / 4 : index / 16;
  const uint32_t k[2] = {uint32_t(seed), uint32_t(seed >> 32)};
  const uint32_t c[4] = {uint32_t(ctr), uint32_t(ctr >> 32), stream, 0u};
  uint32_t o[4];
  Philox4x32::generate(c, k, o);
  if (d == SrDraw::philox1) return o[0];
  if (d == SrDraw::philox4) return o[index % 4];
  const uint32_t byte = (o[(index / 4) % 4] >> (8 * (index % 4))) & 0xFFu;
  return byte << 24 | 0x00800000u;
}

// The quantiser draws element (r, c)'s word at index r*K + c of its stream (docs/datapath.md section 2), under
// every draw; the draws give different codes.
TEST(SrQuantize, DrawsTheContractsWordPerElement) {
  Rng rng(12);
  const int64_t rows = 8, cols = 64;
  const auto x = rng.normals(size_t(rows * cols));
  std::vector<uint8_t> codes[std::size(kSrDraws)];
  for (SrDraw d : kSrDraws) {
    SCOPED_TRACE(sr_draw_name(d));
    QuantConfig cfg = sr_config(kE1M2, ScaleKind::fp32, 0);
    cfg.sr_draw = d;
    const QTensor q = quantize(x.data(), rows, cols, cfg);
    int64_t checked = 0, differs_from_rtne = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const uint64_t i = uint64_t(r * cols + c);
        const float dec = q.scales[r * q.kblocks() + c / 16];
        const float v = x[r * cols + c] / dec;  // fp32 scale: v = y / dec
        EXPECT_EQ(sr_word(d, cfg.seed, cfg.stream, i), spec_word(d, cfg.seed, cfg.stream, i));
        const uint8_t want = round_sr(kE1M2, v, spec_word(d, cfg.seed, cfg.stream, i));
        EXPECT_EQ(q.codes[r * cols + c], want) << "element (" << r << ", " << c << ")";
        differs_from_rtne += want != round_rtne(kE1M2, v);
        ++checked;
      }
    EXPECT_EQ(checked, rows * cols);
    EXPECT_GT(differs_from_rtne, 0);
    codes[int(d)] = q.codes;
  }
  EXPECT_NE(codes[0], codes[1]);
  EXPECT_NE(codes[1], codes[2]);
  EXPECT_NE(codes[0], codes[2]);
}

// philox4's four words of a block feed four neighbouring elements, philox16's sixteen bytes sixteen, so beyond each
// element's P(up) (SrStats) the rounding decisions of two elements of a group must be independent. N = 2^20 groups
// at a fixed fraction f with P = p_up(d, f): for each pair of positions (j, k) of a group, the count of both-up has
// mean N P^2 and, under independence, standard deviation sqrt(N P^2 (1 - P^2)); we require it within 5 sigma
// (p ~ 6e-7 per check).
TEST(SrQuantize, WordsOfAGroupAreIndependent) {
  const int64_t N = int64_t(1) << 20;
  const float x = 0.3f;  // e1m2 levels 0.25 and 0.5: frac = 0.20000005 (0.3 in FP32)
  const double f = (double(x) - 0.25) / 0.25;
  for (SrDraw d : {SrDraw::philox4, SrDraw::philox16}) {
    SCOPED_TRACE(sr_draw_name(d));
    const int G = sr_draw_group(d);
    const double P = p_up(d, f);
    std::vector<int64_t> both(static_cast<size_t>(G * G)), ups(static_cast<size_t>(G));
    std::vector<char> up(static_cast<size_t>(G));
    for (int64_t g = 0; g < N; ++g) {
      for (int j = 0; j < G; ++j) {
        up[j] = code_index(round_sr(kE1M2, x, sr_word(d, 0xC0FFEE, 9, uint64_t(G * g + j)))) == 2;
        ups[j] += up[j];
      }
      for (int j = 0; j < G; ++j)
        for (int k = j + 1; k < G; ++k) both[j * G + k] += up[j] && up[k];
    }
    for (int j = 0; j < G; ++j) {
      EXPECT_LE(std::fabs(double(ups[j]) / double(N) - P), 5 * std::sqrt(P * (1 - P) / double(N))) << "position " << j;
      for (int k = j + 1; k < G; ++k) {
        const double mean = double(N) * P * P, sd = std::sqrt(double(N) * P * P * (1 - P * P));
        EXPECT_LE(std::fabs(double(both[j * G + k]) - mean), 5 * sd)
            << "positions " << j << " and " << k << ": " << both[j * G + k] << " both up, expected " << mean;
      }
    }
  }
}

// A whole SR-quantised tensor is unbiased to its draw's P(up): with v_i the scaled input, gap_i its interval, f_i
// its fraction and P_i = p_up(d, f_i), sum_i (q_i - v_i) has mean sum_i gap_i (P_i - f_i) and variance
// sum_i gap_i^2 P_i (1 - P_i); we require the sum within 5 sqrt(variance) of its mean, under every draw.
TEST(SrQuantize, TensorErrorSumIsUnbiased) {
  Rng rng(13);
  const int64_t rows = 1024, cols = 1024;
  const auto x = rng.normals(size_t(rows * cols));
  for (const Golden& g : kGolden)
    for (SrDraw d : kSrDraws) {
      SCOPED_TRACE(std::string(g.name) + " " + sr_draw_name(d));
      QuantConfig cfg = sr_config(g.f, ScaleKind::fp32, 0);
      cfg.sr_draw = d;
      const QTensor q = quantize(x.data(), rows, cols, cfg);
      double sum = 0, mean = 0, var = 0;
      int64_t n = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const float dec = q.scales[r * q.kblocks() + c / 16];
          const double v = std::fabs(double(x[r * cols + c] / dec));
          int i = 0;
          while (i + 1 < g.num_levels && g.levels[i + 1] <= v) ++i;
          if (i + 1 == g.num_levels) continue;  // at gmax (the block max): no randomness
          const double gap = g.levels[i + 1] - g.levels[i], f = (v - g.levels[i]) / gap, P = p_up(d, f);
          sum += std::fabs(double(decode(g.f, q.codes[r * cols + c]))) - v;
          mean += gap * (P - f);
          var += gap * gap * P * (1 - P);
          ++n;
        }
      ASSERT_GT(n, rows * cols / 2);
      EXPECT_LE(std::fabs(sum - mean), 5 * std::sqrt(var)) << "n " << n << " var " << var << " mean " << mean;
    }
}

}  // namespace
}  // namespace fp4lab::test
