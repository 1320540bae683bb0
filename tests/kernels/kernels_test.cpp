// CUDA kernels against the golden model, bit for bit (label `cuda`). Every GPU test skips with a visible
// "SKIPPED: no CUDA device" where the runtime finds none; the host-side tests (E2M3 embedding, the native path's
// tolerance bound) run everywhere.
//
// Quantiser: every format x scale x block (1x16, 1x32, 16x16) x RHT (none, 16 fused and unfused, BF16-rounded,
// 32/64/128) x rounding (RTNE, SR), on random and adversarial inputs: codes, scale codes, decoded scales and the
// tensor scale compared as bit patterns. GEMM: the reference and the fast kernel against
// fp4lab::reference::gemm_contract (the scalar form of the contract), FP32 outputs compared as bit patterns.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fp4lab/cuda/kernels.hpp"
#include "fp4lab/gemm.hpp"
#include "fp4lab/quantize.hpp"
#include "fp4lab/recipe.hpp"
#include "fp4lab/rht.hpp"
#include "reference/contract_gemm.hpp"

namespace fc = fp4lab::cuda;
using fp4lab::ElemFormat;
using fp4lab::QTensor;
using fp4lab::QuantConfig;
using fp4lab::Rounding;
using fp4lab::ScaleKind;

namespace {

std::string no_device_reason() {
  std::string why;
  return fc::device_available(&why) ? std::string() : why;
}

#define SKIP_WITHOUT_GPU()                                                         \
  do {                                                                             \
    const std::string why_ = no_device_reason();                                   \
    if (!why_.empty()) GTEST_SKIP() << "SKIPPED: no CUDA device (" << why_ << ")"; \
  } while (0)

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
std::string show(float x) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g (0x%08x)", double(x), bits(x));
  return b;
}
std::string gtest_name(std::string s) {
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

// ---- inputs ------------------------------------------------------------------------------------------------
constexpr int64_t kRows = 64, kCols = 256;  // rows: 16x16 tiles; cols: RHT up to 128, blocks of 32

// Gaussian rows whose magnitudes span 2^-10 .. 2^9, with rare outliers: block scales of every size.
std::vector<float> random_input(uint64_t seed, int64_t rows = kRows, int64_t cols = kCols) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> N(0.0f, 1.0f);
  std::uniform_real_distribution<float> U(0.0f, 1.0f);
  std::vector<float> x(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float s = std::ldexp(1.0f, int(r % 20) - 10);
    for (int64_t c = 0; c < cols; ++c) x[r * cols + c] = s * (U(g) < 0.01f ? 30.0f * N(g) : N(g));
  }
  return x;
}

// Rows built to land on the rounding decisions: exact midpoints between levels (blocks whose amax is gmax, so
// fp32 and MX scales are 1) and one FP32 ulp either side, zeros of both signs, subnormals, values near the top
// of FP32 (kept where a 16-point Hadamard sum stays finite), one outlier per block, constant blocks, blocks at and
// past the ends of the fp32 step's reciprocal range.
std::vector<float> adversarial_input(const ElemFormat& f, uint64_t seed) {
  std::vector<float> x = random_input(seed);
  auto row = [&](int r) { return x.data() + r * kCols; };
  std::vector<float> mids;
  for (int i = 0; i < f.max_index; ++i) mids.push_back(0.5f * (f.level(i) + f.level(i + 1)));
  for (int r = 0; r < 14; ++r) {
    float* p = row(r);
    for (int64_t c = 0; c < kCols; ++c) {
      const float m = mids[size_t(c) % mids.size()];
      const float sign = (c / 3) % 2 ? -1.0f : 1.0f;
      switch (r) {
        case 0: p[c] = 0.0f; break;
        case 1: p[c] = -0.0f; break;
        case 2: p[c] = c % 16 == 0 ? f.gmax() : sign * m; break;  // ties, amax = gmax in every 1x16 block
        case 3: p[c] = c % 16 == 0 ? f.gmax() : sign * std::nextafter(m, 0.0f); break;
        case 4: p[c] = c % 16 == 0 ? f.gmax() : sign * std::nextafter(m, 8.0f); break;
        case 5: p[c] = sign * std::ldexp(float(1 + c % 7), -140); break;  // subnormal inputs
        case 6: p[c] = sign * std::ldexp(1.0f + float(c % 5) / 8.0f, 122); break;  // ~1e37: huge, sums finite
        case 7: p[c] = c % 16 == 5 ? 1000.0f : 1e-3f * sign; break;  // one outlier per block
        case 8: p[c] = 0.3f; break;  // constant blocks
        case 9: p[c] = c % 2 ? -f.gmax() : f.gmax(); break;
        case 10: p[c] = sign * std::ldexp(1.0f, int(c % 40) - 20); break;  // powers of two
        case 11: p[c] = c % 32 == 31 ? 7.0f : sign * 0.5f * m; break;  // 1x32 and 1x16 amax differ
        // Blocks that leave the fp32 step's reciprocal range (fp32_step_in_range) by one element: one value below
        // 2^-60 or a signed zero among ordinary ones; and blocks at the range's two ends.
        case 12: p[c] = c % 16 == 3 ? sign * 0x1p-70f : c % 16 == 9 ? -0.0f : sign * float(1 + c % 7) * 0.25f; break;
        case 13: p[c] = sign * (c % 2 ? 0x1p60f : 0x1p-60f); break;
      }
    }
  }
  return x;
}

// ---- quantiser tests ----------------------------------------------------------------------------------------
struct QCase {
  QuantConfig cfg;
  std::string name() const { return gtest_name(cfg.label() + (cfg.rht_bf16 ? "_bf16" : "")); }
};
void PrintTo(const QCase& c, std::ostream* os) { *os << c.name(); }

std::vector<QCase> quant_cases() {
  struct SB {
    ScaleKind s;
    int block;
    bool tile2d;
  };
  const SB sbs[] = {{ScaleKind::fp32, 16, false},       {ScaleKind::fp32, 32, false},
                    {ScaleKind::fp32, 16, true},        {ScaleKind::ue4m3, 16, false},
                    {ScaleKind::ue4m3, 16, true},       {ScaleKind::ue8m0, 16, false},
                    {ScaleKind::ue8m0, 32, false},      {ScaleKind::ue8m0, 16, true},
                    {ScaleKind::ue8m0_ceil, 16, false}, {ScaleKind::ue8m0_ceil, 32, false},
                    {ScaleKind::ue8m0_ceil, 16, true}};
  std::vector<QCase> v;
  for (const ElemFormat& f : fp4lab::kAllFormats)
    for (const SB& sb : sbs)
      for (int rht : {0, 16})
        for (bool bf16 : {false, true})
          for (Rounding r : {Rounding::rtne, Rounding::sr}) {
            if (bf16 && rht == 0) continue;
            QCase c;
            c.cfg.format = f;
            c.cfg.scale = sb.s;
            c.cfg.block = sb.block;
            c.cfg.tile2d = sb.tile2d;
            c.cfg.rht = rht;
            if (rht) c.cfg.rht_signs = fp4lab::rht_signs_te(16);
            c.cfg.rht_bf16 = bf16;
            c.cfg.rounding = r;
            c.cfg.seed = 0x1234'5678'9abcULL;
            c.cfg.stream = 5;
            v.push_back(c);
            if (r == Rounding::sr)  // every SR draw (docs/spec.md §4): the default above, the others here
              for (fp4lab::SrDraw d : fp4lab::kSrDraws)
                if (d != fp4lab::kDefaultSrDraw) {
                  c.cfg.sr_draw = d;
                  v.push_back(c);
                }
          }
  // Larger rotations (seeded signs): 32 runs fused, 64 and 128 through the unfused pass.
  for (int rht : {32, 64, 128})
    for (int k = 0; k < 3; ++k)
      for (Rounding r : {Rounding::rtne, Rounding::sr}) {
        QCase c;
        c.cfg.format = k == 0 ? fp4lab::kE1M2 : fp4lab::kE2M1;
        c.cfg.scale = k == 0 ? ScaleKind::fp32 : k == 1 ? ScaleKind::ue4m3 : ScaleKind::ue8m0;
        c.cfg.block = k == 2 ? 32 : 16;
        c.cfg.rht = rht;
        c.cfg.rht_signs = fp4lab::rht_signs_from_seed(rht, 99);
        c.cfg.rht_bf16 = k == 1;
        c.cfg.rounding = r;
        c.cfg.seed = 7;
        v.push_back(c);
        if (r == Rounding::sr)
          for (fp4lab::SrDraw d : fp4lab::kSrDraws)
            if (d != fp4lab::kDefaultSrDraw) {
              c.cfg.sr_draw = d;
              v.push_back(c);
            }
      }
  return v;
}

// Golden vs GPU, every field as bit patterns; returns the number of values compared.
size_t expect_same(const QTensor& gold, const QTensor& gpu, const std::vector<float>& x, const std::string& what) {
  size_t n = 0;
  EXPECT_EQ(gold.codes.size(), gpu.codes.size()) << what;
  EXPECT_EQ(gold.scales.size(), gpu.scales.size()) << what;
  EXPECT_EQ(gold.scale_codes.size(), gpu.scale_codes.size()) << what;
  if (gold.codes.size() != gpu.codes.size() || gold.scales.size() != gpu.scales.size() ||
      gold.scale_codes.size() != gpu.scale_codes.size())
    return 0;
  int bad = 0;
  for (size_t i = 0; i < gold.codes.size(); ++i, ++n)
    if (gold.codes[i] != gpu.codes[i] && bad++ < 5)
      ADD_FAILURE() << what << ": code [" << i / gold.cols << ", " << i % gold.cols << "] golden "
                    << int(gold.codes[i]) << " gpu " << int(gpu.codes[i]) << ", input " << show(x[i]) << ", scale "
                    << show(gold.scales[i / gold.block]);
  for (size_t i = 0; i < gold.scales.size(); ++i, ++n)
    if (bits(gold.scales[i]) != bits(gpu.scales[i]) && bad++ < 10)
      ADD_FAILURE() << what << ": scale " << i << " golden " << show(gold.scales[i]) << " gpu " << show(gpu.scales[i]);
  for (size_t i = 0; i < gold.scale_codes.size(); ++i, ++n)
    if (gold.scale_codes[i] != gpu.scale_codes[i] && bad++ < 15)
      ADD_FAILURE() << what << ": scale code " << i << " golden " << int(gold.scale_codes[i]) << " gpu "
                    << int(gpu.scale_codes[i]);
  ++n;
  EXPECT_EQ(bits(gold.global_dec), bits(gpu.global_dec))
      << what << ": tensor scale golden " << show(gold.global_dec) << " gpu " << show(gpu.global_dec);
  return n;
}

class Quantize : public ::testing::TestWithParam<QCase> {};

TEST_P(Quantize, MatchesGoldenBitForBit) {
  SKIP_WITHOUT_GPU();
  const QuantConfig& cfg = GetParam().cfg;
  size_t compared = 0;
  fc::QuantWorkspace ws;
  fc::Buffer<float> dx;
  for (int input = 0; input < 2; ++input) {
    const std::vector<float> x = input == 0 ? random_input(41) : adversarial_input(cfg.format, 43);
    const QTensor gold = fp4lab::quantize(x.data(), kRows, kCols, cfg);
    dx.upload(x);
    for (fc::RhtPath path : {fc::RhtPath::fused, fc::RhtPath::unfused}) {
      if (path == fc::RhtPath::unfused && cfg.rht == 0) continue;
      fc::DQTensor q;
      // Poison what the kernel must write: an unwritten byte cannot pass.
      q.codes.resize(size_t(kRows * kCols / 2));
      q.codes.fill_bytes(0xFF);
      q.scales.resize(size_t(kRows * kCols / cfg.block));
      q.scales.fill_bytes(0xFF);
      fc::quantize(dx.data(), kRows, kCols, cfg, q, ws, nullptr, path);
      compared += expect_same(gold, fc::to_host(q), x,
                              std::string(input ? "adversarial" : "random") +
                                  (path == fc::RhtPath::fused ? " fused" : " unfused"));
    }
  }
  EXPECT_GT(compared, size_t(0)) << "checked nothing";
}

INSTANTIATE_TEST_SUITE_P(AllRecipesAndKnobs, Quantize, ::testing::ValuesIn(quant_cases()),
                         [](const ::testing::TestParamInfo<QCase>& i) { return i.param.name(); });

// ---- transposed and BF16 inputs -----------------------------------------------------------------------------
std::vector<float> transposed(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = x[size_t(r * cols + c)];
  return t;
}
// x rounded to BF16 (RTNE), as bit patterns and as the FP32 values they widen to (what the golden model sees).
std::vector<uint16_t> to_bf16(std::vector<float>& x) {
  std::vector<uint16_t> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    b[i] = fp4lab::f32_to_bf16(x[i]);
    x[i] = fp4lab::bf16_to_f32(b[i]);
  }
  return b;
}

// A device operand [rows, cols] under cfg with every output byte poisoned (0xFF), so that a value the kernel
// leaves unwritten cannot pass for a result.
fc::DQTensor poisoned_output(int64_t rows, int64_t cols, const QuantConfig& cfg) {
  fc::DQTensor q;
  q.codes.resize(size_t(rows * cols / 2));
  q.codes.fill_bytes(0xFF);
  q.scales.resize(size_t(rows * cols / cfg.block));
  q.scales.fill_bytes(0xFF);
  if (cfg.scale != ScaleKind::fp32) {
    q.scale_codes.resize(size_t(rows * cols / cfg.block));
    q.scale_codes.fill_bytes(0xFF);
  }
  q.global_dec.resize(1);
  q.global_dec.fill_bytes(0xFF);
  return q;
}

// The GPU quantisation of an operand t [rows, cols] from a device copy of t (row-wise) or of t^T (transposed),
// FP32 or BF16, outputs poisoned first.
QTensor gpu_quantize(const std::vector<float>& t, int64_t rows, int64_t cols, const QuantConfig& cfg, bool tr,
                     bool bf16, fc::RhtPath path, fc::QuantWorkspace& ws) {
  std::vector<float> src = tr ? transposed(t, rows, cols) : t;
  fc::DQTensor q = poisoned_output(rows, cols, cfg);
  if (bf16) {
    std::vector<float> w = src;
    fc::Buffer<uint16_t> d;
    d.upload(to_bf16(w));
    if (tr)
      fc::quantize_transposed_bf16(d.data(), cols, rows, cfg, q, ws, nullptr, path);
    else
      fc::quantize_bf16(d.data(), rows, cols, cfg, q, ws, nullptr, path);
  } else {
    fc::Buffer<float> d;
    d.upload(src);
    if (tr)
      fc::quantize_transposed(d.data(), cols, rows, cfg, q, ws, nullptr, path);
    else
      fc::quantize(d.data(), rows, cols, cfg, q, ws, nullptr, path);
  }
  return fc::to_host(q);
}

// Every configuration of the Quantize suite, read transposed (FP32 and BF16) and row-wise from BF16: the
// operand t is the suite's [64, 256] input, so its adversarial rows are the rows being quantised; the device
// holds t^T [256, 64] and the kernel reads it by columns.
class QuantizeTransposedAndBf16 : public ::testing::TestWithParam<QCase> {};

TEST_P(QuantizeTransposedAndBf16, MatchesGoldenBitForBit) {
  SKIP_WITHOUT_GPU();
  const QuantConfig& cfg = GetParam().cfg;
  size_t compared = 0;
  fc::QuantWorkspace ws;
  for (int input = 0; input < 2; ++input) {
    const std::vector<float> t = input == 0 ? random_input(47) : adversarial_input(cfg.format, 53);
    std::vector<float> tb = t;
    to_bf16(tb);
    const QTensor gold = fp4lab::quantize(t.data(), kRows, kCols, cfg);
    const QTensor gold_b = fp4lab::quantize(tb.data(), kRows, kCols, cfg);
    for (fc::RhtPath path : {fc::RhtPath::fused, fc::RhtPath::unfused}) {
      if (path == fc::RhtPath::unfused && cfg.rht == 0) continue;
      const std::string what = std::string(input ? "adversarial" : "random") +
                               (path == fc::RhtPath::fused ? " fused" : " unfused");
      compared += expect_same(gold, gpu_quantize(t, kRows, kCols, cfg, true, false, path, ws), t,
                              what + " transposed fp32");
      compared += expect_same(gold_b, gpu_quantize(t, kRows, kCols, cfg, true, true, path, ws), tb,
                              what + " transposed bf16");
      compared += expect_same(gold_b, gpu_quantize(t, kRows, kCols, cfg, false, true, path, ws), tb,
                              what + " row-wise bf16");
    }
  }
  EXPECT_GT(compared, size_t(0)) << "checked nothing";
}

INSTANTIATE_TEST_SUITE_P(AllRecipesAndKnobs, QuantizeTransposedAndBf16, ::testing::ValuesIn(quant_cases()),
                         [](const ::testing::TestParamInfo<QCase>& i) { return i.param.name(); });

// ---- rows of a larger tensor (quantize_rows) ----------------------------------------------------------------
// Rows index[i] of a larger tensor with its amax given, against the golden fp4lab::quantize_rows one row at a
// time (each row at its own index: a run of one row is a panel), concatenated. Every configuration of the
// Quantize suite, row-wise and transposed, FP32 and BF16, fused and unfused; the indices are a permutation of
// rows of a tensor 3x as tall, with gaps, so a kernel that drew at the local element index fails under SR, and
// the amax is 3.5x the operand's own, so one that took its own amax fails under ue4m3. 16x16 tiles span rows:
// with an index they are refused, and with a given amax alone they are checked against quantize_rows over the
// whole operand.
std::vector<int64_t> gapped_permutation(int64_t rows, uint64_t seed) {
  std::vector<int64_t> idx(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) idx[size_t(i)] = 3 * i + (i % 3);  // gaps between consecutive indices
  std::mt19937_64 g(seed);
  std::shuffle(idx.begin(), idx.end(), g);
  idx[0] = 0;  // row 0 of the whole, and a run of two consecutive indices
  idx[1] = 1;
  return idx;
}

QTensor golden_rows(const std::vector<float>& x, int64_t rows, int64_t cols, const QuantConfig& cfg,
                    const std::vector<int64_t>* idx, float amax) {
  if (!idx) return fp4lab::quantize_rows(x.data(), 0, rows, cols, cfg, amax);
  QTensor q;
  for (int64_t i = 0; i < rows; ++i) {
    const QTensor p = fp4lab::quantize_rows(x.data() + i * cols, (*idx)[size_t(i)], 1, cols, cfg, amax);
    if (i == 0) {
      q = p;
      continue;
    }
    q.codes.insert(q.codes.end(), p.codes.begin(), p.codes.end());
    q.scales.insert(q.scales.end(), p.scales.begin(), p.scales.end());
    q.scale_codes.insert(q.scale_codes.end(), p.scale_codes.begin(), p.scale_codes.end());
  }
  q.rows = rows;
  return q;
}

// t [rows, cols] quantised by fc::quantize_rows from a device copy of t (or of t^T), outputs poisoned first.
QTensor gpu_quantize_rows(const std::vector<float>& t, int64_t rows, int64_t cols, const QuantConfig& cfg, bool tr,
                          bool bf16, fc::RhtPath path, const int64_t* d_idx, const float* amax,
                          fc::QuantWorkspace& ws) {
  std::vector<float> src = tr ? transposed(t, rows, cols) : t;
  fc::DQTensor q = poisoned_output(rows, cols, cfg);
  const int64_t xr = tr ? cols : rows, xc = tr ? rows : cols;  // the device tensor's shape
  if (bf16) {
    std::vector<float> w = src;
    fc::Buffer<uint16_t> d;
    d.upload(to_bf16(w));
    fc::quantize_rows(d.data(), true, tr, xr, xc, cfg, d_idx, amax, q, ws, nullptr, path);
  } else {
    fc::Buffer<float> d;
    d.upload(src);
    fc::quantize_rows(d.data(), false, tr, xr, xc, cfg, d_idx, amax, q, ws, nullptr, path);
  }
  return fc::to_host(q);
}

class QuantizeRows : public ::testing::TestWithParam<QCase> {};

TEST_P(QuantizeRows, AtGivenRowIndicesWithAGivenAmaxMatchGoldenBitForBit) {
  SKIP_WITHOUT_GPU();
  const QuantConfig& cfg = GetParam().cfg;
  size_t compared = 0;
  fc::QuantWorkspace ws;
  const std::vector<int64_t> idx = gapped_permutation(kRows, 61);
  fc::Buffer<int64_t> d_idx;
  d_idx.upload(idx);
  for (int input = 0; input < 2; ++input) {
    const std::vector<float> t = input == 0 ? random_input(67) : adversarial_input(cfg.format, 71);
    std::vector<float> tb = t;
    to_bf16(tb);
    const float amax = 3.5f * fp4lab::tensor_amax(t.data(), kRows, kCols, cfg);
    const float amax_b = 3.5f * fp4lab::tensor_amax(tb.data(), kRows, kCols, cfg);
    for (bool with_index : {true, false}) {
      if (with_index && cfg.tile2d) {
        fc::Buffer<float> d;
        d.upload(t);
        fc::DQTensor q;
        EXPECT_THROW(fc::quantize_rows(d.data(), false, false, kRows, kCols, cfg, d_idx.data(), &amax, q, ws),
                     std::invalid_argument);
        continue;
      }
      const std::vector<int64_t>* pi = with_index ? &idx : nullptr;
      const int64_t* di = with_index ? d_idx.data() : nullptr;
      const QTensor gold = golden_rows(t, kRows, kCols, cfg, pi, amax);
      const QTensor gold_b = golden_rows(tb, kRows, kCols, cfg, pi, amax_b);
      for (fc::RhtPath path : {fc::RhtPath::fused, fc::RhtPath::unfused}) {
        if (path == fc::RhtPath::unfused && cfg.rht == 0) continue;
        const std::string what = std::string(input ? "adversarial" : "random") +
                                 (with_index ? " indexed" : " whole") +
                                 (path == fc::RhtPath::fused ? " fused" : " unfused");
        compared += expect_same(gold, gpu_quantize_rows(t, kRows, kCols, cfg, false, false, path, di, &amax, ws), t,
                                what + " row-wise fp32");
        compared += expect_same(gold, gpu_quantize_rows(t, kRows, kCols, cfg, true, false, path, di, &amax, ws), t,
                                what + " transposed fp32");
        compared += expect_same(gold_b, gpu_quantize_rows(t, kRows, kCols, cfg, false, true, path, di, &amax_b, ws),
                                tb, what + " row-wise bf16");
      }
    }
    if (!cfg.tile2d) {
      // An index without an amax: the operand's own, taken on the device.
      const QTensor gold = golden_rows(t, kRows, kCols, cfg, &idx, fp4lab::tensor_amax(t.data(), kRows, kCols, cfg));
      compared += expect_same(gold, gpu_quantize_rows(t, kRows, kCols, cfg, false, false, fc::RhtPath::fused,
                                                      d_idx.data(), nullptr, ws),
                              t, "indexed, own amax");
    }
  }
  EXPECT_GT(compared, size_t(0)) << "checked nothing";
}

INSTANTIATE_TEST_SUITE_P(AllRecipesAndKnobs, QuantizeRows, ::testing::ValuesIn(quant_cases()),
                         [](const ::testing::TestParamInfo<QCase>& i) { return i.param.name(); });

// Identity indices and no amax give quantize()'s bits (rows of the whole at their own place, its own amax).
TEST(QuantizeRowsErrors, RejectsNegativeIndicesAndAmaxAndKeepsTheDefaultBits) {
  SKIP_WITHOUT_GPU();
  QuantConfig cfg;
  cfg.format = fp4lab::kE2M1;
  cfg.scale = ScaleKind::ue4m3;
  cfg.rounding = Rounding::sr;
  cfg.seed = 11;
  const std::vector<float> x = random_input(13);
  fc::QuantWorkspace ws;
  fc::Buffer<float> dx;
  dx.upload(x);
  std::vector<int64_t> idx(static_cast<size_t>(kRows));
  for (int64_t i = 0; i < kRows; ++i) idx[size_t(i)] = i;
  fc::Buffer<int64_t> d_idx;
  d_idx.upload(idx);
  fc::DQTensor q;
  fc::quantize_rows(dx.data(), false, false, kRows, kCols, cfg, d_idx.data(), nullptr, q, ws);
  expect_same(fp4lab::quantize(x.data(), kRows, kCols, cfg), fc::to_host(q), x, "identity index");
  for (float bad : {-1.0f, NAN, INFINITY})
    EXPECT_THROW(fc::quantize_rows(dx.data(), false, false, kRows, kCols, cfg, d_idx.data(), &bad, q, ws),
                 std::invalid_argument)
        << bad;
  idx[5] = -3;
  d_idx.upload(idx);
  const float amax = 1.0f;
  EXPECT_THROW(fc::quantize_rows(dx.data(), false, false, kRows, kCols, cfg, d_idx.data(), &amax, q, ws),
               std::invalid_argument);
  // Without the check, the deferred flag gets bit 2.
  fc::Buffer<int> flag(1);
  flag.fill_bytes(0);
  fc::quantize_rows(dx.data(), false, false, kRows, kCols, cfg, d_idx.data(), &amax, q, ws, nullptr,
                    fc::RhtPath::fused, false, flag.data());
  EXPECT_EQ(flag.to_host()[0], 4);
}

// Every operand of every preset recipe (SR on dY, RHT where the recipe rotates, 16x16 weight tiles), row-wise
// and transposed, FP32 and BF16, on shapes whose row counts are odd (or not a multiple of the kernels' tiles)
// and on one spanning many thread blocks in both grid dimensions.
struct RCase {
  std::string recipe;
  fp4lab::Pass pass;
  fp4lab::Operand op;
  std::string name() const {
    return gtest_name(recipe + "_" + fp4lab::pass_name(pass) + (op == fp4lab::Operand::a ? "_A" : "_B"));
  }
};
void PrintTo(const RCase& c, std::ostream* os) { *os << c.name(); }
std::vector<RCase> recipe_cases() {
  std::vector<RCase> v;
  for (const std::string& r : fp4lab::Recipe::preset_names())
    for (fp4lab::Pass p : fp4lab::kPasses)
      for (fp4lab::Operand o : {fp4lab::Operand::a, fp4lab::Operand::b}) v.push_back({r, p, o});
  return v;
}
class QuantizeRecipeOperands : public ::testing::TestWithParam<RCase> {};

TEST_P(QuantizeRecipeOperands, OddAndLargeShapesMatchGoldenBitForBit) {
  SKIP_WITHOUT_GPU();
  fp4lab::Recipe rec = fp4lab::Recipe::preset(GetParam().recipe);
  rec.seed = 0xfeed'beefULL;
  const QuantConfig cfg = rec.operand(GetParam().pass, GetParam().op, 21);
  fc::QuantWorkspace ws;
  size_t compared = 0;
  const int64_t odd = cfg.tile2d ? 48 : 37;
  const int64_t mid = cfg.tile2d ? 208 : 201;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{odd, 96}, {odd + 16, 160}, {mid, 1024}, {1040, 96}}) {
    const std::vector<float> t = random_input(61 + uint64_t(rows), rows, cols);
    std::vector<float> tb = t;
    to_bf16(tb);
    const QTensor gold = fp4lab::quantize(t.data(), rows, cols, cfg);
    const QTensor gold_b = fp4lab::quantize(tb.data(), rows, cols, cfg);
    const std::string shape = std::to_string(rows) + "x" + std::to_string(cols);
    for (bool tr : {false, true}) {
      const std::string what = shape + (tr ? " transposed" : " row-wise");
      compared += expect_same(gold, gpu_quantize(t, rows, cols, cfg, tr, false, fc::RhtPath::fused, ws), t,
                              what + " fp32");
      compared += expect_same(gold_b, gpu_quantize(t, rows, cols, cfg, tr, true, fc::RhtPath::fused, ws), tb,
                              what + " bf16");
    }
  }
  EXPECT_GT(compared, size_t(0)) << "checked nothing";
}

INSTANTIATE_TEST_SUITE_P(Presets, QuantizeRecipeOperands, ::testing::ValuesIn(recipe_cases()),
                         [](const ::testing::TestParamInfo<RCase>& i) { return i.param.name(); });

// Fake quantisation (the training layer's "fast" operands): one pass writes the BF16 values the golden model's
// dequantisation gives, rounded RTNE, row-wise and transposed, from FP32 and BF16 inputs, with and without the
// quantised operand beside them.
class FakeQuantize : public ::testing::TestWithParam<QCase> {};

TEST_P(FakeQuantize, EqualsGoldenDequantisationInBf16) {
  SKIP_WITHOUT_GPU();
  const QuantConfig& cfg = GetParam().cfg;
  size_t compared = 0;
  fc::QuantWorkspace ws;
  for (int input = 0; input < 2; ++input) {
    const std::vector<float> t0 = input == 0 ? random_input(67) : adversarial_input(cfg.format, 71);
    for (bool bf16 : {false, true}) {
      std::vector<float> t = t0;
      if (bf16) to_bf16(t);
      const QTensor gold = fp4lab::quantize(t.data(), kRows, kCols, cfg);
      const std::vector<float> deq = gold.dequantize();
      for (bool tr : {false, true})
        for (fc::RhtPath path : {fc::RhtPath::fused, fc::RhtPath::unfused})
          for (bool with_q : {false, true}) {
            if (path == fc::RhtPath::unfused && cfg.rht == 0) continue;
            const std::string what = std::string(input ? "adversarial" : "random") + (bf16 ? " bf16" : " fp32") +
                                     (tr ? " transposed" : " row-wise") +
                                     (path == fc::RhtPath::fused ? " fused" : " unfused") + (with_q ? " +q" : "");
            std::vector<float> src = tr ? transposed(t, kRows, kCols) : t;
            fc::Buffer<float> df;
            fc::Buffer<uint16_t> db;
            std::vector<float> w = src;
            if (bf16) db.upload(to_bf16(w)); else df.upload(src);
            fc::Buffer<uint16_t> out(size_t(kRows * kCols));
            out.fill_bytes(0xFF);  // poisoned: an unwritten element cannot pass
            fc::DQTensor q;
            const void* px = bf16 ? static_cast<const void*>(db.data()) : static_cast<const void*>(df.data());
            fc::fake_quantize(px, bf16, tr, tr ? kCols : kRows, tr ? kRows : kCols, cfg, out.data(),
                              with_q ? &q : nullptr, ws, nullptr, path);
            const std::vector<uint16_t> got = out.to_host();
            int bad = 0;
            for (size_t i = 0; i < deq.size(); ++i, ++compared)
              if (got[i] != fp4lab::f32_to_bf16(deq[i]) && bad++ < 8)
                ADD_FAILURE() << what << ": element " << i << " golden " << fp4lab::f32_to_bf16(deq[i]) << " gpu "
                              << got[i];
            if (with_q) compared += expect_same(gold, fc::to_host(q), t, what);
          }
    }
  }
  EXPECT_GT(compared, size_t(0)) << "checked nothing";
}

INSTANTIATE_TEST_SUITE_P(AllRecipesAndKnobs, FakeQuantize, ::testing::ValuesIn(quant_cases()),
                         [](const ::testing::TestParamInfo<QCase>& i) { return i.param.name(); });

// Both orientations from one read (fake_quantize_both): x [rows, cols] BF16 -> the golden dequantisation of
// quantize(x, cfg) and of quantize(x^T, cfg_t), in BF16, on shapes whose sides are and are not multiples of the
// fused kernel's 64 x 128 tile; x is random_input(seed), or `input` where given. Returns the number of values
// compared.
size_t expect_both_golden(const QuantConfig& cfg, const QuantConfig& cfg_t, int64_t rows, int64_t cols,
                          uint64_t seed, const std::string& what, const std::vector<float>* input = nullptr) {
  std::vector<float> t = input ? *input : random_input(seed, rows, cols);
  const std::vector<uint16_t> tb = to_bf16(t);
  fc::Buffer<uint16_t> dx;
  dx.upload(tb);
  fc::Buffer<uint16_t> out(size_t(rows * cols)), out_t(size_t(rows * cols));
  out.fill_bytes(0xFF);  // poisoned: an unwritten element cannot pass
  out_t.fill_bytes(0xFF);
  fc::QuantWorkspace ws, ws_t;
  // The magnitude bounds too, poisoned with a large finite value: an unwritten bound, or one the kernel raised
  // without zeroing it first, cannot pass.
  const int64_t words = fc::fake_quantize_both_bound_words(rows, cols);
  fc::Buffer<float> bound(static_cast<size_t>(words)), bound_t(static_cast<size_t>(words));
  bound.fill_bytes(0x7F);
  bound_t.fill_bytes(0x7F);
  fc::fake_quantize_both(dx.data(), true, rows, cols, cfg, out.data(), cfg_t, out_t.data(), ws, ws_t, nullptr,
                         fc::RhtPath::fused, true, nullptr, nullptr, bound.data(), bound_t.data());
  const bool one_read = fc::fake_quantize_both_fused(true, cfg, cfg_t);
  const bool mirrored = fc::fake_quantize_both_mirrored(true, cfg, cfg_t);
  EXPECT_EQ(fc::fake_quantize_both_bounded(true, cfg, cfg_t), one_read || mirrored) << what;
  size_t compared = 0;
  for (bool tr : {false, true}) {
    const std::vector<float> src = tr ? transposed(t, rows, cols) : t;
    const QTensor q = fp4lab::quantize(src.data(), tr ? cols : rows, tr ? rows : cols, tr ? cfg_t : cfg);
    const std::vector<float> deq = q.dequantize();
    const std::vector<uint16_t> got = (tr ? out_t : out).to_host();
    int bad = 0;
    for (size_t i = 0; i < deq.size(); ++i, ++compared)
      if (got[i] != fp4lab::f32_to_bf16(deq[i]) && bad++ < 8)
        ADD_FAILURE() << what << (tr ? " transposed" : " row-wise") << " " << rows << "x" << cols << ": element "
                      << i << " golden " << fp4lab::f32_to_bf16(deq[i]) << " gpu " << got[i];
    // Tile (ti, tj) of x, rows 64 ti.. and columns 128 tj..: its bound is the largest of its blocks' dequantised
    // largest level (golden scales), and no value written there is larger than the bound rounded to BF16. The
    // mirrored pair (one pass and a transposing copy): the largest magnitude written in the tile. Two passes: NaN,
    // no bound.
    const std::vector<float> b = (tr ? bound_t : bound).to_host();
    const int64_t tiles_c = (cols + 127) / 128, qcols = tr ? rows : cols;
    const float gmax = fp4lab::decode(q.format, uint8_t(q.format.max_index));
    for (int64_t w = 0; w < words; ++w) {
      const int64_t r0 = (w / tiles_c) * 64, c0 = (w % tiles_c) * 128;
      float expect = 0.0f, largest = 0.0f;
      for (int64_t r = r0; r < std::min(r0 + 64, rows); ++r)
        for (int64_t c = c0; c < std::min(c0 + 128, cols); ++c) {
          const int64_t qr = tr ? c : r, qc = tr ? r : c;  // the element's place in q
          expect = std::max(expect, fp4lab::dequant_value(gmax, q.scales[size_t(qr * q.kblocks() + qc / q.block)],
                                                          q.global_dec));
          largest = std::max(largest, std::fabs(fp4lab::bf16_to_f32(got[size_t(qr * qcols + qc)])));
        }
      if (mirrored) {
        EXPECT_EQ(bits(b[size_t(w)]), bits(largest)) << what << (tr ? " transposed" : " row-wise") << " tile " << w;
      } else if (!one_read) {
        EXPECT_TRUE(std::isnan(b[size_t(w)])) << what << " tile " << w << ": two passes leave no bound";
      } else {
        EXPECT_EQ(bits(b[size_t(w)]), bits(expect)) << what << (tr ? " transposed" : " row-wise") << " tile " << w;
        // The bound is the FP32 value before the BF16 rounding, which is monotone: no value exceeds its rounding.
        EXPECT_LE(largest, fp4lab::bf16_to_f32(fp4lab::f32_to_bf16(b[size_t(w)])))
            << what << (tr ? " transposed" : " row-wise") << " tile " << w;
      }
    }
  }
  return compared;
}

// Whole tiles, then sides that are not multiples of the tile's (and, last, not of 32).
const std::pair<int64_t, int64_t> kBothShapes[] = {{64, 128}, {96, 160}, {224, 352}, {1056, 416}, {48, 80}};
bool both_fit(const QuantConfig& cfg, const QuantConfig& cfg_t, int64_t rows, int64_t cols) {
  return cols % std::max(cfg.block, cfg.rht) == 0 && rows % std::max(cfg_t.block, cfg_t.rht) == 0 &&
         (!cfg.tile2d || rows % 16 == 0) && (!cfg_t.tile2d || cols % 16 == 0);
}

// Every knob of quant_cases(), the same configuration for both orientations, and the transposed one with the other
// rounding, RHT toggled and its own stream (the fused kernel takes the two passes' settings separately).
TEST_P(FakeQuantize, BothOrientationsFromOneReadEqualGolden) {
  SKIP_WITHOUT_GPU();
  const QuantConfig& cfg = GetParam().cfg;
  QuantConfig other = cfg;
  other.rounding = cfg.rounding == Rounding::sr ? Rounding::rtne : Rounding::sr;
  other.rht = cfg.rht == 0 ? 16 : 0;
  other.rht_signs = other.rht ? fp4lab::rht_signs_te(16) : std::vector<float>{};
  other.rht_bf16 = other.rht != 0 && cfg.rht_bf16;
  other.stream = cfg.stream + 1;
  size_t compared = 0;
  uint64_t seed = 301;
  // Partial tiles in both dimensions, and whole ones for RHT-64/128 (the preset pairs below take every shape).
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{96, 160}, {48, 80}, {128, 256}}) {
    if (both_fit(cfg, cfg, rows, cols)) compared += expect_both_golden(cfg, cfg, rows, cols, seed++, "same config");
    if (both_fit(cfg, other, rows, cols))
      compared += expect_both_golden(cfg, other, rows, cols, seed++, "other transposed config");
  }
  // The rounding decisions' edge rows (ties, zeros of both signs, subnormals, huge values, blocks past the fp32
  // step's range), in both orientations: the one-read kernel forms levels, not codes, so the quantiser suites' own
  // adversarial runs do not reach it.
  const std::vector<float> adv = adversarial_input(cfg.format, 307);
  const QuantConfig* const transposed_cfgs[] = {&cfg, &other};
  for (const QuantConfig* ct : transposed_cfgs)
    if (both_fit(cfg, *ct, kRows, kCols))
      compared += expect_both_golden(cfg, *ct, kRows, kCols, 0, ct == &cfg ? "adversarial" : "adversarial, other",
                                     &adv);
  EXPECT_GT(compared, size_t(0)) << "checked nothing";
}

// The pairs a training step takes of one tensor, under every preset: X for fwd_y (A) and X^T for bwd_dw (B); dY for
// bwd_dx (A) and dY^T for bwd_dw (A); W for fwd_y (B) and W^T for bwd_dx (B). UFP4's and NVFP4's activations and
// gradients read x once (fake_quantize_both_fused); the others take the two passes, with the same result.
TEST(FakeQuantizeBoth, TrainingStepPairsOfEveryPresetEqualGolden) {
  SKIP_WITHOUT_GPU();
  using fp4lab::Operand, fp4lab::Pass;
  struct Pair {
    Pass p;
    Operand o;
    Pass pt;
    Operand ot;
  };
  const Pair pairs[] = {{Pass::fwd_y, Operand::a, Pass::bwd_dw, Operand::b},
                        {Pass::bwd_dx, Operand::a, Pass::bwd_dw, Operand::a},
                        {Pass::fwd_y, Operand::b, Pass::bwd_dx, Operand::b}};
  int fused = 0;
  for (const std::string& name : fp4lab::Recipe::preset_names()) {
    fp4lab::Recipe rec = fp4lab::Recipe::preset(name);
    rec.seed = 0xfeed'beefULL;
    for (const Pair& pr : pairs) {
      const QuantConfig cfg = rec.operand(pr.p, pr.o, 40 + int(pr.p) * 2 + int(pr.o));
      const QuantConfig cfg_t = rec.operand(pr.pt, pr.ot, 40 + int(pr.pt) * 2 + int(pr.ot));
      const bool one_read = fc::fake_quantize_both_fused(true, cfg, cfg_t);
      fused += one_read;
      const bool tiled_w = name == "nvfp4" && pr.p == Pass::fwd_y && pr.o == Operand::b;
      if ((name == "ufp4" || name == "nvfp4") && !tiled_w) {
        EXPECT_TRUE(one_read) << name << " " << fp4lab::pass_name(pr.p) << ": expected the one-read kernel";
      }
      // NVFP4's W in 16x16 tiles, RTNE and no RHT both ways: the same values, one pass and a transposing copy.
      EXPECT_EQ(fc::fake_quantize_both_mirrored(true, cfg, cfg_t), tiled_w) << name << " " << fp4lab::pass_name(pr.p);
      const std::string what = name + " " + fp4lab::pass_name(pr.p) + (pr.o == Operand::a ? "A" : "B") + "+" +
                               fp4lab::pass_name(pr.pt) + (pr.ot == Operand::a ? "A" : "B");
      for (auto [rows, cols] : kBothShapes)
        if (both_fit(cfg, cfg_t, rows, cols)) expect_both_golden(cfg, cfg_t, rows, cols, 17 + uint64_t(rows), what);
    }
  }
  EXPECT_GE(fused, 5);
}

// The one-read kernel's grid holds at most 65535 tiles of 64 rows: past that fake_quantize_both_fused says no (and
// fake_quantize_both runs the two passes).
TEST(FakeQuantizeBoth, OneReadOnlyWhereItsGridFits) {
  fp4lab::Recipe rec = fp4lab::Recipe::preset("ufp4");
  const QuantConfig cfg = rec.operand(fp4lab::Pass::fwd_y, fp4lab::Operand::a, 1);
  const QuantConfig cfg_t = rec.operand(fp4lab::Pass::bwd_dw, fp4lab::Operand::b, 2);
  EXPECT_TRUE(fc::fake_quantize_both_fused(true, cfg, cfg_t, fc::RhtPath::fused, int64_t(65535) * 64));
  EXPECT_FALSE(fc::fake_quantize_both_fused(true, cfg, cfg_t, fc::RhtPath::fused, int64_t(65535) * 64 + 1));
  EXPECT_FALSE(fc::fake_quantize_both_fused(false, cfg, cfg_t, fc::RhtPath::fused, 64));
}

// The mirrored pair is taken only where the two outputs are the same values: 16x16 tiles, RTNE and no RHT in both
// configurations, which may differ only in what RTNE does not read (the SR key and draw), and BF16 input; and only
// where the copy's grid (the one-read kernel's) holds the rows.
TEST(FakeQuantizeBoth, MirroredOnlyWhereBothOutputsHoldTheSameValues) {
  fp4lab::Recipe rec = fp4lab::Recipe::preset("nvfp4");
  const QuantConfig cfg = rec.operand(fp4lab::Pass::fwd_y, fp4lab::Operand::b, 1);
  const QuantConfig cfg_t = rec.operand(fp4lab::Pass::bwd_dx, fp4lab::Operand::b, 2);
  ASSERT_TRUE(cfg.tile2d && cfg.rht == 0 && cfg.rounding == Rounding::rtne);
  EXPECT_TRUE(fc::fake_quantize_both_mirrored(true, cfg, cfg_t));
  EXPECT_TRUE(fc::fake_quantize_both_bounded(true, cfg, cfg_t));
  EXPECT_FALSE(fc::fake_quantize_both_fused(true, cfg, cfg_t));
  EXPECT_FALSE(fc::fake_quantize_both_mirrored(false, cfg, cfg_t));  // FP32 input: the two passes
  EXPECT_TRUE(fc::fake_quantize_both_mirrored(true, cfg, cfg_t, int64_t(65535) * 64));
  EXPECT_FALSE(fc::fake_quantize_both_mirrored(true, cfg, cfg_t, int64_t(65535) * 64 + 1));
  QuantConfig other = cfg_t;
  other.seed ^= 1;
  other.sr_draw = fp4lab::SrDraw::philox16;
  EXPECT_TRUE(fc::fake_quantize_both_mirrored(true, cfg, other)) << "the SR key and draw, which RTNE does not read";
  const auto differs = [&](auto change) {
    QuantConfig a = cfg, b = cfg_t;
    change(a, b);
    return !fc::fake_quantize_both_mirrored(true, a, b);
  };
  EXPECT_TRUE(differs([](QuantConfig&, QuantConfig& b) { b.rounding = Rounding::sr; }));
  EXPECT_TRUE(differs([](QuantConfig& a, QuantConfig& b) { a.rounding = b.rounding = Rounding::sr; }));
  EXPECT_TRUE(differs([](QuantConfig&, QuantConfig& b) { b.tile2d = false; }));
  EXPECT_TRUE(differs([](QuantConfig& a, QuantConfig& b) { a.tile2d = b.tile2d = false; }));
  EXPECT_TRUE(differs([](QuantConfig&, QuantConfig& b) { b.scale = fp4lab::ScaleKind::fp32; }));
  EXPECT_TRUE(differs([](QuantConfig&, QuantConfig& b) { b.format = fp4lab::kE1M2; }));
  EXPECT_TRUE(differs([](QuantConfig& a, QuantConfig& b) {
    a.rht = b.rht = 16;
    a.rht_signs = b.rht_signs = fp4lab::rht_signs_te(16);
  }));
}

// Faults: NaN in x is refused under check_finite and flagged (bit 0) without it, by the one-read kernel too.
TEST(FakeQuantizeBoth, FlagsNonFiniteInputs) {
  SKIP_WITHOUT_GPU();
  fp4lab::Recipe rec = fp4lab::Recipe::preset("ufp4");
  const QuantConfig cfg = rec.operand(fp4lab::Pass::fwd_y, fp4lab::Operand::a, 1);
  const QuantConfig cfg_t = rec.operand(fp4lab::Pass::bwd_dw, fp4lab::Operand::b, 2);
  ASSERT_TRUE(fc::fake_quantize_both_fused(true, cfg, cfg_t));
  const int64_t rows = 224, cols = 352;
  std::vector<float> t = random_input(5, rows, cols);
  t[size_t(200 * cols + 340)] = NAN;  // in the last, partial tile
  fc::Buffer<uint16_t> dx;
  dx.upload(to_bf16(t));
  fc::Buffer<uint16_t> out(size_t(rows * cols)), out_t(size_t(rows * cols));
  fc::QuantWorkspace ws, ws_t;
  EXPECT_THROW(fc::fake_quantize_both(dx.data(), true, rows, cols, cfg, out.data(), cfg_t, out_t.data(), ws, ws_t),
               std::invalid_argument);
  fc::Buffer<int> flag(1);
  flag.fill_bytes(0);
  fc::fake_quantize_both(dx.data(), true, rows, cols, cfg, out.data(), cfg_t, out_t.data(), ws, ws_t, nullptr,
                         fc::RhtPath::fused, false, flag.data());
  EXPECT_EQ(flag.to_host()[0] & 1, 1);
}

// The product's output check: where the operands' bounds prove every element of C finite the scan is left out (a
// poisoned C stays unflagged); a bound too large, a NaN bound, k past 2^24 or no bounds at all scan, and see it.
TEST(FlagNonfinite, ProductBoundsLeaveTheScanOutOnlyWhereTheyProveItFinite) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 4099;
  std::vector<uint16_t> y(size_t(n), uint16_t(0x3F80));  // 1.0
  y[size_t(n - 2)] = 0x7F80;                             // +Inf: what an overflowed product would hold
  fc::Buffer<uint16_t> dy;
  dy.upload(y);
  const auto flagged = [&](std::vector<float> ba, std::vector<float> bb, int64_t k) {
    fc::Buffer<float> da, db;
    da.upload(ba);
    db.upload(bb);
    fc::Buffer<int> flag(1);
    flag.fill_bytes(0);
    fc::flag_nonfinite_product(dy.data(), true, n, flag.data(), 4, da.data(), int64_t(ba.size()), db.data(),
                               int64_t(bb.size()), k);
    return flag.to_host()[0] == 4;
  };
  const float big = 0x1p60f;
  EXPECT_FALSE(flagged({1.0f, 3.0f, 2.0f}, {4.0f}, 4096));       // proven: 4096 * 3 * 4
  EXPECT_FALSE(flagged({big, 1.0f}, {0x1p53f}, 4096));           // 2^12 2^60 2^53 = 2^125: still proven
  EXPECT_TRUE(flagged({big, 1.0f}, {0x1p54f}, 4096));            // 2^126: scanned
  EXPECT_TRUE(flagged({1.0f, NAN, 2.0f}, {4.0f}, 4096));         // a NaN bound: scanned
  EXPECT_TRUE(flagged({1.0f}, {2.0f, NAN}, 4096));               // in b too
  EXPECT_TRUE(flagged({1.0f, INFINITY}, {4.0f}, 4096));          // an infinite bound: scanned
  EXPECT_TRUE(flagged({1.0f}, {1.0f}, (int64_t(1) << 24) + 1));  // k past 2^24: scanned
  fc::Buffer<int> flag(1);
  flag.fill_bytes(0);
  fc::flag_nonfinite_product(dy.data(), true, n, flag.data(), 4, nullptr, 0, nullptr, 0, 16);  // no bounds
  EXPECT_EQ(flag.to_host()[0], 4);
}

// The monitor's one-pass statistics: counts and amax exact, the FP64 sums within FP64 summation order of the host's
// (each term is the same FP64 value; only the order of additions differs), and the same bits on a repeat.
TEST(OperandStats, AgreeWithTheHostAndRepeatBitForBit) {
  SKIP_WITHOUT_GPU();
  QuantConfig cfg;
  cfg.format = fp4lab::kE2M1;
  cfg.scale = ScaleKind::ue4m3;
  cfg.block = 16;
  std::vector<float> x = random_input(5);
  for (size_t i = 0; i < x.size(); i += 97) x[i] = 0.0f;   // exact zeros: not counted as flushed
  for (size_t i = 3; i < x.size(); i += 89) x[i] *= 1e-6f;  // tiny values the quantiser flushes
  const QTensor q = fp4lab::quantize(x.data(), kRows, kCols, cfg);
  const std::vector<float> dq = q.dequantize();
  std::vector<uint8_t> packed(q.codes.size() / 2);
  for (size_t i = 0; i < packed.size(); ++i) packed[i] = uint8_t(q.codes[2 * i] | (q.codes[2 * i + 1] << 4));
  const unsigned mask = (1u << 7) | (1u << 15);  // E2M1's +6 and -6
  long double sig = 0, noise = 0;
  float amax = 0;
  double flushed = 0, saturated = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = double(x[i]) - double(dq[i]);
    sig += (long double)(double(x[i]) * double(x[i]));
    noise += (long double)(d * d);
    amax = std::max(amax, std::fabs(x[i]));
    flushed += dq[i] == 0.0f && x[i] != 0.0f;
    saturated += (mask >> q.codes[i]) & 1u;
  }
  ASSERT_GT(flushed, 0.0);
  ASSERT_GT(saturated, 0.0);
  fc::Buffer<float> dx, ddq;
  fc::Buffer<uint8_t> dc;
  dx.upload(x);
  ddq.upload(dq);
  dc.upload(packed);
  fc::Buffer<double> out(5);
  fc::OperandStatsWorkspace ws;
  fc::operand_stats(dx.data(), dx.data(), ddq.data(), dc.data(), int64_t(x.size()), mask, out.data(), ws);
  const std::vector<double> got = out.to_host();
  EXPECT_NEAR(got[0], double(sig), 1e-12 * double(sig));
  EXPECT_NEAR(got[1], double(noise), 1e-12 * double(noise));
  EXPECT_EQ(got[2], double(amax));
  EXPECT_EQ(got[3], flushed);
  EXPECT_EQ(got[4], saturated);
  fc::operand_stats(dx.data(), dx.data(), ddq.data(), dc.data(), int64_t(x.size()), mask, out.data(), ws);
  const std::vector<double> again = out.to_host();
  for (int k = 0; k < 5; ++k) EXPECT_EQ(std::memcmp(&got[k], &again[k], 8), 0) << "figure " << k;
}

// A training step captured in a CUDA graph reads its SR seed on the device: the bits of that seed given in the
// config, row-wise and transposed (whose SR counters are X^T's), and not the bits of the config's own seed.
TEST(QuantizeDeviceSeed, ReadsTheStochasticRoundingSeedOnTheDevice) {
  SKIP_WITHOUT_GPU();
  QuantConfig cfg;
  cfg.format = fp4lab::kE1M2;
  cfg.rounding = Rounding::sr;
  cfg.rht = 16;
  cfg.rht_signs = fp4lab::rht_signs_te(16);
  cfg.seed = 0x1234;
  cfg.stream = 9;
  QuantConfig keyed = cfg;
  keyed.seed = 0xFEEDBEEFCAFEF00Dull;
  const std::vector<float> x = random_input(21);  // [kRows, kCols]
  const std::vector<float> xt = fp4lab::transpose(x.data(), kRows, kCols);
  fc::Buffer<float> dx, dxt;
  dx.upload(x);
  dxt.upload(xt);
  fc::Buffer<uint64_t> seed;
  seed.upload(std::vector<uint64_t>{keyed.seed});
  fc::QuantWorkspace ws;
  fc::DQTensor q;
  const QTensor want = fp4lab::quantize(x.data(), kRows, kCols, keyed);
  fc::quantize(dx.data(), kRows, kCols, cfg, q, ws, nullptr, fc::RhtPath::fused, true, nullptr, seed.data());
  EXPECT_EQ(fc::to_host(q).codes, want.codes);
  EXPECT_NE(fp4lab::quantize(x.data(), kRows, kCols, cfg).codes, want.codes);
  // X^T [kCols, kRows] quantised in place gives x's quantisation.
  fc::quantize_transposed(dxt.data(), kCols, kRows, cfg, q, ws, nullptr, fc::RhtPath::fused, true, nullptr,
                          seed.data());
  EXPECT_EQ(fc::to_host(q).codes, want.codes);
}

// The deferred output check: the bit is set exactly when some value is NaN or Inf, wherever it sits (the 16-byte
// body, the scalar tail, a misaligned start), for FP32 and BF16, and other bits of the flag are kept.
TEST(FlagNonfinite, SetsItsBitExactlyWhenAValueIsNotFinite) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 100003;  // not a multiple of 8: a tail past the last 16-byte word
  for (bool bf16 : {false, true}) {
    const float big = bf16 ? 3.3895314e38f : FLT_MAX;  // the largest finite value of each type
    for (int64_t at : {int64_t(-1), int64_t(0), int64_t(12345), n - 3, n - 1}) {
      for (float bad : {NAN, INFINITY, -INFINITY}) {
        if (at < 0 && !std::isnan(bad)) continue;  // the all-finite case once per type
        std::vector<float> y(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) y[size_t(i)] = (i % 3 ? -big : big) * (i % 7 ? 1.0f : 1e-38f);
        if (at >= 0) y[size_t(at)] = bad;
        for (int offset : {0, 1}) {  // offset 1: the data starts off a 16-byte boundary
          fc::Buffer<int> flag(1);
          const int other = 64;
          flag.upload(std::vector<int>{other});
          if (bf16) {
            std::vector<uint16_t> h(size_t(n) + 1);
            for (int64_t i = 0; i < n; ++i) h[size_t(i + offset)] = uint16_t(bits(y[size_t(i)]) >> 16);
            fc::Buffer<uint16_t> d;
            d.upload(h);
            fc::flag_nonfinite(d.data() + offset, true, n - offset, flag.data(), 4);
          } else {
            std::vector<float> h(size_t(n) + 1);
            for (int64_t i = 0; i < n; ++i) h[size_t(i + offset)] = y[size_t(i)];
            fc::Buffer<float> d;
            d.upload(h);
            fc::flag_nonfinite(d.data() + offset, false, n - offset, flag.data(), 4);
          }
          // With offset 1 the last element falls outside the n - 1 values checked.
          const bool seen = at >= 0 && at + offset < n;
          EXPECT_EQ(flag.to_host()[0], other | (seen ? 4 : 0))
              << (bf16 ? "bf16" : "fp32") << " at " << at << " value " << bad << " offset " << offset;
        }
      }
    }
  }
}

TEST(QuantizeErrors, TransposedRejectsNonFiniteInputAndBadShapes) {
  SKIP_WITHOUT_GPU();
  QuantConfig cfg;
  cfg.format = fp4lab::kE1M2;
  std::vector<float> x = random_input(5, kCols, kRows);  // X [256, 64]: X^T is [64, 256]
  fc::QuantWorkspace ws;
  fc::Buffer<float> dx;
  fc::DQTensor q;
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    x[777] = bad;
    dx.upload(x);
    EXPECT_THROW(fc::quantize_transposed(dx.data(), kCols, kRows, cfg, q, ws), std::invalid_argument) << bad;
  }
  x[777] = 0.0f;
  dx.upload(x);
  EXPECT_NO_THROW(fc::quantize_transposed(dx.data(), kCols, kRows, cfg, q, ws));
  EXPECT_EQ(q.rows, kRows);
  EXPECT_EQ(q.cols, kCols);
  // X^T's rows (X's columns) must hold whole blocks: X [248, 64] gives X^T [64, 248].
  EXPECT_THROW(fc::quantize_transposed(dx.data(), kCols - 8, kRows, cfg, q, ws), std::invalid_argument);
}

// Which fault the flag names (bit 0: the input holds NaN or Inf; bit 1: its RHT does), in the row-wise, the
// transposed and the one-read kernels alike: a NaN input sets both under RHT and bit 0 alone without it; finite
// values whose 16-point Hadamard sum passes FLT_MAX set bit 1 alone. The synchronous check raises the matching
// message.
TEST(QuantizeErrors, TheFlagNamesInputAndRotationFaults) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 64, cols = 128;
  QuantConfig rot;
  rot.format = fp4lab::kE1M2;
  rot.rht = 16;
  rot.rht_signs = std::vector<float>(16, 1.0f);  // all +1: a block of equal values sums to 4x each
  QuantConfig plain = rot;
  plain.rht = 0;
  plain.rht_signs.clear();
  QuantConfig rot_bf16 = rot;  // NVFP4's wgrad operands: the rotated values rounded to BF16, where NaN becomes -0
  rot_bf16.format = fp4lab::kE2M1;
  rot_bf16.scale = ScaleKind::ue4m3;
  rot_bf16.rht_bf16 = true;
  struct Case {
    float v;
    int64_t at;
    const QuantConfig* cfg;
    int want;
  };
  std::vector<float> base = random_input(9, rows, cols);
  const Case cases[] = {{NAN, 130, &rot, 3},      {INFINITY, 2000, &plain, 1}, {NAN, 7000, &plain, 1},
                        {3e38f, -1, &rot, 2},     {3e38f, -1, &plain, 0},      {NAN, 130, &rot_bf16, 1},
                        {INFINITY, 130, &rot_bf16, 3}};
  for (const Case& c : cases) {
    std::vector<float> x = base;
    if (c.at >= 0) {
      x[size_t(c.at)] = c.v;
    } else {
      for (int64_t r = 0; r < 16; ++r)  // a 16x16 square: one row-wise and one transposed block of 3e38s
        for (int64_t k = 0; k < 16; ++k) x[size_t((32 + r) * cols + 48 + k)] = c.v;
    }
    fc::Buffer<uint16_t> dx;
    dx.upload(to_bf16(x));
    fc::Buffer<uint16_t> out(size_t(rows * cols)), out_t(size_t(rows * cols));
    fc::QuantWorkspace ws, ws_t;
    fc::Buffer<int> flag(1);
    const QuantConfig& cfg = *c.cfg;
    const std::string what = std::to_string(c.v) + (cfg.rht ? " rht16" : " plain");
    for (int kernel = 0; kernel < 3; ++kernel) {
      flag.fill_bytes(0);
      if (kernel < 2)
        fc::fake_quantize(dx.data(), true, kernel == 1, kernel == 1 ? cols : rows, kernel == 1 ? rows : cols, cfg,
                          out.data(), nullptr, ws, nullptr, fc::RhtPath::fused, false, flag.data());
      else
        fc::fake_quantize_both(dx.data(), true, rows, cols, cfg, out.data(), cfg, out_t.data(), ws, ws_t, nullptr,
                               fc::RhtPath::fused, false, flag.data());
      EXPECT_EQ(flag.to_host()[0], c.want) << what << " kernel " << kernel;
    }
    if (c.want == 0) continue;
    try {
      fc::fake_quantize(dx.data(), true, false, rows, cols, cfg, out.data(), nullptr, ws);
      ADD_FAILURE() << what << ": no fault raised";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(c.want & 1 ? "input tensor holds NaN or Inf" : "RHT overflows FP32"),
                std::string::npos)
          << what << ": " << e.what();
    }
  }
}

TEST(QuantizeErrors, RejectsNonFiniteInputAndBadConfigurations) {
  SKIP_WITHOUT_GPU();
  QuantConfig cfg;
  cfg.format = fp4lab::kE1M2;
  std::vector<float> x = random_input(3);
  fc::QuantWorkspace ws;
  fc::Buffer<float> dx;
  fc::DQTensor q;
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    x[1000] = bad;
    dx.upload(x);
    EXPECT_THROW(fc::quantize(dx.data(), kRows, kCols, cfg, q, ws), std::invalid_argument) << bad;
  }
  x[1000] = 0.0f;
  dx.upload(x);
  cfg.block = 24;
  EXPECT_THROW(fc::quantize(dx.data(), kRows, kCols, cfg, q, ws), std::invalid_argument);
  cfg.block = 16;
  EXPECT_THROW(fc::quantize(dx.data(), kRows, kCols - 8, cfg, q, ws), std::invalid_argument);
  ElemFormat odd = fp4lab::kE2M1;
  odd.max_index = 6;  // not a format the kernels were built for
  cfg.format = odd;
  EXPECT_THROW(fc::quantize(dx.data(), kRows, kCols, cfg, q, ws), std::invalid_argument);
}

// The quantiser's fast RTNE search against the golden fp4lab::round_rtne, every FP32 bit pattern.
// The quantiser's fast stochastic rounding against the golden fp4lab::round_sr: every FP32 bit pattern, at the
// random words that decide it.
TEST(QuantizeFastRounding, EqualsGoldenRoundSrForAll2To32Inputs) {
  SKIP_WITHOUT_GPU();
  for (const ElemFormat& f : fp4lab::kAllFormats) {
    uint32_t first = 0;
    uint64_t seen = 0;
    const uint64_t bad = fc::count_sr_fast_mismatches(f, &first, &seen);
    EXPECT_EQ(seen, uint64_t(1) << 32) << f.name << ": not every input was run";
    EXPECT_EQ(bad, 0u) << f.name << ": first disagreement at input bits " << first;
  }
}

TEST(QuantizeFastRounding, EqualsGoldenRoundRtneForAll2To32Inputs) {
  SKIP_WITHOUT_GPU();
  for (const ElemFormat& f : fp4lab::kAllFormats) {
    uint32_t first = 0;
    uint64_t seen = 0;
    const uint64_t bad = fc::count_rtne_fast_mismatches(f, &first, &seen);
    EXPECT_EQ(seen, uint64_t(1) << 32) << f.name << ": not every input was run";
    EXPECT_EQ(bad, 0u) << f.name << ": first disagreement at input bits " << first;
  }
}

// The quantiser's fp32-scale step (one division per block, then a multiply and two FMAs per element) against the
// golden division, every FP32 x, at scales inside its range (edge significands, the range's ends, typical activation
// and gradient scales) and outside it (the division itself then: zero, subnormal, huge, infinite scales).
TEST(QuantizeFastRounding, Fp32StepEqualsTheDivisionForAll2To32Inputs) {
  SKIP_WITHOUT_GPU();
  const float decs[] = {1.0f,      1.99999988f, 1.00000012f, 1.5f,   1.0f / 6.0f, 0x1p-60f, 0x1p60f, 1.1e-10f,
                        3.7e4f,    0x1.fffffep-61f, 0x1p61f,  0.0f,   1e-45f,      1.2e-38f, 3.4e38f, INFINITY};
  for (float dec : decs) {
    uint32_t first = 0;
    uint64_t seen = 0;
    const uint64_t bad = fc::count_fp32_step_mismatches(dec, &first, &seen);
    EXPECT_EQ(seen, uint64_t(1) << 32) << "dec " << dec << ": not every input was run";
    EXPECT_EQ(bad, 0u) << "dec " << dec << ": first disagreement at x bits " << first;
  }
}

// The fake quantiser's and the dequantiser's packed BF16 conversion against golden f32_to_bf16: every FP32 input
// but NaN (including infinities, subnormals and the values that round up to infinity), in both halves.
TEST(QuantizeFastRounding, Bf16PackEqualsGoldenForAll2To32Inputs) {
  SKIP_WITHOUT_GPU();
  uint32_t first = 0;
  uint64_t seen = 0;
  const uint64_t bad = fc::count_bf16_pack_mismatches(&first, &seen);
  EXPECT_EQ(seen, uint64_t(1) << 32) << "not every input was run";
  EXPECT_EQ(bad, 0u) << "first disagreement at input bits " << first;
}

// ---- GEMM tests -----------------------------------------------------------------------------------------------
struct GCase {
  ElemFormat fa, fb;
  ScaleKind scale;
  int block;
  int64_t M, N, K;
  std::string name() const {
    return gtest_name(std::string(fa.name) + (fa.name == fb.name ? "" : std::string("x") + fb.name) + "_b" +
                      std::to_string(block) + "_" + fp4lab::scale_name(scale) + "scale_" + std::to_string(M) + "x" +
                      std::to_string(N) + "x" + std::to_string(K));
  }
};
void PrintTo(const GCase& c, std::ostream* os) { *os << c.name(); }

std::vector<GCase> gemm_cases() {
  std::vector<GCase> v;
  struct SB {
    ScaleKind s;
    int block;
  };
  const SB sbs[] = {{ScaleKind::fp32, 16}, {ScaleKind::fp32, 32}, {ScaleKind::ue4m3, 16}, {ScaleKind::ue8m0, 32}};
  for (const ElemFormat& f : fp4lab::kAllFormats)
    for (const SB& sb : sbs) {
      // K not a multiple of the 64-wide stage (tail blocks), M and N not multiples of the 128 tile.
      v.push_back({f, f, sb.s, sb.block, 48, 40, sb.block == 16 ? 80 : 96});
      v.push_back({f, f, sb.s, sb.block, 130, 136, 320});
    }
  // Many K stages (> the 4-deep pipeline), several CTA tiles, a single row, and mixed grids.
  v.push_back({fp4lab::kE1M2, fp4lab::kE1M2, ScaleKind::fp32, 16, 300, 260, 1024});
  v.push_back({fp4lab::kE2M1, fp4lab::kE2M1, ScaleKind::ue8m0, 32, 257, 129, 1088});
  v.push_back({fp4lab::kE1M2, fp4lab::kE1M2, ScaleKind::fp32, 16, 1, 8, 64});
  v.push_back({fp4lab::kE2M1, fp4lab::kE1M2, ScaleKind::fp32, 16, 64, 72, 256});
  return v;
}

QuantConfig gemm_operand_config(const ElemFormat& f, const GCase& c) {
  QuantConfig q;
  q.format = f;
  q.scale = c.scale;
  q.block = c.block;
  return q;
}

// The fast kernel's BF16 or FP32 C, with its output check setting bit 4 of `flag`.
fc::GemmOut checked_out(bool to_bf16, float* c32, uint16_t* c16, int* flag) {
  fc::GemmOut o;
  if (to_bf16)
    o.c16 = c16;
  else
    o.c32 = c32;
  o.nonfinite = flag;
  o.bit = 4;
  return o;
}

class Gemm : public ::testing::TestWithParam<GCase> {};

TEST_P(Gemm, ReferenceAndFastKernelsMatchContractBitForBit) {
  SKIP_WITHOUT_GPU();
  const GCase& c = GetParam();
  const std::vector<float> xa = random_input(51, c.M, c.K), xb = random_input(53, c.N, c.K);
  const QTensor qa = fp4lab::quantize(xa.data(), c.M, c.K, gemm_operand_config(c.fa, c));
  const QTensor qb = fp4lab::quantize(xb.data(), c.N, c.K, gemm_operand_config(c.fb, c));
  const std::vector<float> gold = fp4lab::reference::gemm_contract(qa, qb);

  fc::DQTensor da, db;
  fc::upload(qa, da);
  fc::upload(qb, db);
  fc::Buffer<float> dc(size_t(c.M * c.N));
  fc::GemmWorkspace ws;
  // The fused epilogue runs exactly where the host's fma_exact_scale passes every scale of both operands; the
  // UE4M3 cases must take it (every E4M3 value passes), so both epilogues are compared below.
  bool all_pass = true;
  for (const float v : qa.scales) all_pass = all_pass && fp4lab::fma_exact_scale(v);
  for (const float v : qb.scales) all_pass = all_pass && fp4lab::fma_exact_scale(v);
  if (c.scale == ScaleKind::ue4m3) {
    EXPECT_TRUE(all_pass);
  }
  if (c.scale == ScaleKind::fp32) {
    EXPECT_FALSE(all_pass);
  }
  size_t compared = 0;
  // kernel 0: the reference kernel; kernel v + 1: fast-kernel tile variant v, with the fused epilogue where it
  // applies; kernel n + 1 + v: variant v with the separate multiply and add always.
  const int variants = fc::gemm_fast_variants();
  for (int kernel = 0; kernel <= 2 * variants; ++kernel) {
    dc.fill_bytes(0xFF);  // poison: 0xFFFFFFFF is a NaN the contract never produces here
    const int variant = (kernel - 1) % variants;
    ws.fused_epilogue = kernel <= variants;
    if (kernel == 0) {
      fc::gemm_reference(da, db, dc.data());
    } else {
      fc::gemm_fast(da, db, dc.data(), ws, nullptr, variant);
      EXPECT_EQ(fc::gemm_fast_fused(ws), all_pass && ws.fused_epilogue) << "variant " << variant;
    }
    const std::vector<float> out = dc.to_host();
    const std::string name = kernel ? std::string("fast kernel ") + fc::gemm_fast_variant_name(variant) +
                                          (ws.fused_epilogue ? "" : " (separate multiply and add)")
                                    : std::string("reference kernel");
    int bad = 0;
    for (size_t i = 0; i < out.size(); ++i, ++compared)
      if (bits(out[i]) != bits(gold[i]) && bad++ < 5)
        ADD_FAILURE() << name << " C[" << i / c.N << ", " << i % c.N << "]: contract " << show(gold[i]) << ", gpu "
                      << show(out[i]);
    if (kernel == 0) continue;
    // The same kernel writing BF16 in its epilogue (the golden f32_to_bf16 of each contract value), and with the
    // output check on: every value is finite here, so the flag keeps only the bit it held.
    for (const bool to_bf16 : {true, false}) {
      fc::Buffer<uint16_t> d16(size_t(c.M * c.N));
      d16.fill_bytes(0xFF);
      dc.fill_bytes(0xFF);
      fc::Buffer<int> flag(1);
      flag.upload(std::vector<int>{64});
      fc::gemm_fast(da, db, checked_out(to_bf16, dc.data(), d16.data(), flag.data()), ws, nullptr, variant);
      EXPECT_EQ(flag.to_host()[0], 64) << name << (to_bf16 ? ", BF16 C" : ", FP32 C with the check");
      const std::vector<uint16_t> h16 = d16.to_host();
      const std::vector<float> h32 = dc.to_host();
      int bad16 = 0;
      for (size_t i = 0; i < gold.size(); ++i, ++compared) {
        const bool ok = to_bf16 ? h16[i] == fp4lab::f32_to_bf16(gold[i]) : bits(h32[i]) == bits(gold[i]);
        if (!ok && bad16++ < 5)
          ADD_FAILURE() << name << (to_bf16 ? ", BF16 C[" : ", FP32 C with the check [") << i / c.N << ", "
                        << i % c.N << "]: contract " << show(gold[i]) << ", gpu "
                        << (to_bf16 ? show(fp4lab::bf16_to_f32(h16[i])) : show(h32[i]));
      }
    }
  }
  EXPECT_GT(compared, size_t(0)) << "checked nothing";
}

INSTANTIATE_TEST_SUITE_P(FormatsScalesShapes, Gemm, ::testing::ValuesIn(gemm_cases()),
                         [](const ::testing::TestParamInfo<GCase>& i) { return i.param.name(); });

// A hand-made int4 operand of `rows` x 32, block 16, every code 0 and every scale 1: the two tests below set the
// codes and scales they are about.
QTensor int4_operand(int64_t rows, ScaleKind kind) {
  QTensor q;
  q.format = fp4lab::kInt4;
  q.scale_kind = kind;
  q.block = 16;
  q.rows = rows;
  q.cols = 32;
  q.codes.assign(size_t(rows) * 32, 0);  // one code per element
  q.scales.assign(size_t(rows) * 2, 1.0f);
  if (kind == ScaleKind::ue4m3) q.scale_codes.assign(size_t(rows) * 2, fp4lab::ue4m3_encode(1.0f));
  q.global_dec = 1.0f;
  return q;
}

// A UE4M3 operand whose scale is no E4M3 value (1 + 2^-23, as a hand-made QTensor may hold) must not take the
// fused epilogue, where it would give other bits: models' GemmHandWorked.SeparateMultiplyAndAddNoFma on the
// device (int4, K 32: acc = -3 + 3 (1 + 2^-23) is 2^-21 under the contract, 3 * 2^-23 fused). The same operands
// with scale 1 pass and take it.
TEST(GemmFusedEpilogue, RefusedForAScaleOutsideTheProof) {
  SKIP_WITHOUT_GPU();
  for (const float s1 : {1.0f + 0x1p-23f, 1.0f}) {
    QTensor a = int4_operand(1, ScaleKind::ue4m3), b = int4_operand(1, ScaleKind::ue4m3);
    a.codes[0] = 0b1'011;   // -3
    a.codes[16] = 0b0'011;  // 3
    b.codes[0] = b.codes[16] = 0b0'001;
    a.scales[1] = s1;
    const std::vector<float> gold = fp4lab::reference::gemm_contract(a, b);
    fc::DQTensor da, db;
    fc::upload(a, da);
    fc::upload(b, db);
    fc::Buffer<float> dc(1);
    fc::GemmWorkspace ws;
    fc::gemm_fast(da, db, dc.data(), ws);
    EXPECT_EQ(fc::gemm_fast_fused(ws), s1 == 1.0f);
    EXPECT_EQ(bits(dc.to_host()[0]), bits(gold[0])) << "scale " << show(s1);
    if (s1 != 1.0f) {
      EXPECT_EQ(bits(gold[0]), 0x35000000u);
    }
  }
}

// The fast kernel's own output check: a C value past FP32 (3e38 * 4 * 1 * 1) sets the flag's bit, BF16 or FP32 C
// alike, and keeps its other bits; the same operands with a finite product leave the flag as it was. Row 1 and the
// padded rows and columns (M 2, N 3 in a 128 x 128 tile) are finite and must not hide or fake the fault.
TEST(GemmOutput, TheEpilogueCheckFlagsAnOverflowAndKeepsOtherBits) {
  SKIP_WITHOUT_GPU();
  for (const float s0 : {3e38f, 1.0f}) {
    QTensor a = int4_operand(2, ScaleKind::fp32), b = int4_operand(3, ScaleKind::fp32);
    a.codes[0] = 0b0'100;  // 4 in row 0, block 0
    a.codes[32] = 0b0'001;  // 1 in row 1
    for (int n = 0; n < 3; ++n) b.codes[size_t(n) * 32] = 0b0'001;
    a.scales[0] = s0;
    const std::vector<float> gold = fp4lab::reference::gemm_contract(a, b);
    fc::DQTensor da, db;
    fc::upload(a, da);
    fc::upload(b, db);
    for (const bool to_bf16 : {true, false}) {
      fc::Buffer<float> d32(6);
      fc::Buffer<uint16_t> d16(6);
      fc::Buffer<int> flag(1);
      flag.upload(std::vector<int>{1});
      fc::GemmWorkspace ws;
      fc::gemm_fast(da, db, checked_out(to_bf16, d32.data(), d16.data(), flag.data()), ws);
      const bool overflow = s0 > 1.0f;
      EXPECT_EQ(flag.to_host()[0], overflow ? 5 : 1) << "scale " << show(s0) << (to_bf16 ? ", BF16 C" : ", FP32 C");
      const std::vector<float> h32 = d32.to_host();
      const std::vector<uint16_t> h16 = d16.to_host();
      for (size_t i = 0; i < 6; ++i) {
        if (to_bf16)
          EXPECT_EQ(h16[i], fp4lab::f32_to_bf16(gold[i])) << "C[" << i / 3 << ", " << i % 3 << "]";
        else
          EXPECT_EQ(bits(h32[i]), bits(gold[i])) << "C[" << i / 3 << ", " << i % 3 << "]";
      }
      if (overflow) {
        EXPECT_TRUE(std::isinf(gold[0]));
      }
    }
  }
}

TEST(GemmErrors, RejectsOperandsThatDoNotMultiply) {
  SKIP_WITHOUT_GPU();
  QuantConfig c16;
  QuantConfig c32;
  c32.block = 32;
  const std::vector<float> x = random_input(5, 32, 64), y = random_input(6, 32, 128);
  fc::DQTensor a, b, b32;
  fc::upload(fp4lab::quantize(x.data(), 32, 64, c16), a);
  fc::upload(fp4lab::quantize(y.data(), 32, 128, c16), b);
  fc::upload(fp4lab::quantize(x.data(), 32, 64, c32), b32);
  fc::Buffer<float> dc(32 * 32);
  fc::GemmWorkspace ws;
  EXPECT_THROW(fc::gemm_reference(a, b, dc.data()), std::invalid_argument);   // K 64 vs 128
  EXPECT_THROW(fc::gemm_fast(a, b32, dc.data(), ws), std::invalid_argument);  // block 16 vs 32
}

// A run refuses views its prepare did not write (int8 for the mma.sync tiles, F16 for the wgmma variant), and a
// variant the device does not offer.
TEST(GemmErrors, RunRefusesAnotherVariantsViewsAndAnAbsentVariant) {
  SKIP_WITHOUT_GPU();
  QuantConfig c;
  const std::vector<float> x = random_input(7, 32, 64), y = random_input(8, 48, 64);
  fc::DQTensor a, b;
  fc::upload(fp4lab::quantize(x.data(), 32, 64, c), a);
  fc::upload(fp4lab::quantize(y.data(), 48, 64, c), b);
  fc::Buffer<float> dc(32 * 48);
  fc::GemmWorkspace ws;
  const int n = fc::gemm_fast_variants();
  EXPECT_THROW(fc::gemm_fast(a, b, dc.data(), ws, nullptr, n), std::invalid_argument);
  fc::gemm_fast_prepare(a, b, ws, nullptr, 0);
  fc::gemm_fast_run(a, b, dc.data(), ws, nullptr, 0);  // its own views: fine
  if (n > 3) {  // the wgmma variant (SM90)
    EXPECT_THROW(fc::gemm_fast_run(a, b, dc.data(), ws, nullptr, 3), std::logic_error);
    fc::gemm_fast_prepare(a, b, ws, nullptr, 3);
    EXPECT_THROW(fc::gemm_fast_run(a, b, dc.data(), ws, nullptr, 0), std::logic_error);
    fc::gemm_fast_run(a, b, dc.data(), ws, nullptr, 3);
  }
  fc::check(cudaDeviceSynchronize(), "sync");
}

// ---- SM100 native path ------------------------------------------------------------------------------------------
// Host side, runs everywhere: the E2M3 embedding of the uniform grid, decoded independently of the encoder.
TEST(NativeSm100, E2m3EmbeddingIsExactForEveryIntegerLevel) {
  int checked = 0;
  for (int v = -7; v <= 7; ++v) {
    const uint8_t b = fc::e2m3_of_int(v);
    ASSERT_EQ(b & 0xC0, 0) << "E2M3 lives in the low 6 bits";
    const int e = (b >> 3) & 3, m = b & 7;
    const double mag = e == 0 ? m / 8.0 : (1.0 + m / 8.0) * std::ldexp(1.0, e - 1);  // bias 1
    EXPECT_EQ((b & 0x20 ? -mag : mag), double(v)) << "v = " << v << " byte " << int(b);
    ++checked;
  }
  EXPECT_EQ(checked, 15);
  EXPECT_THROW(fc::e2m3_of_int(8), std::invalid_argument);
}

// The bound must at least cover the distance between the golden result and the exact (float64) block-scaled
// sum: the golden order is one of the orders the tensor core may use.
TEST(NativeSm100, ToleranceCoversTheGoldenOrderingError) {
  for (int k = 0; k < 2; ++k) {
    QuantConfig cfg;
    cfg.format = k ? fp4lab::kE1M2 : fp4lab::kE2M1;
    cfg.scale = k ? ScaleKind::ue8m0 : ScaleKind::ue4m3;
    cfg.block = k ? 32 : 16;
    const int64_t M = 24, N = 20, K = 512;
    const std::vector<float> xa = random_input(61 + k, M, K), xb = random_input(71 + k, N, K);
    const QTensor qa = fp4lab::quantize(xa.data(), M, K, cfg), qb = fp4lab::quantize(xb.data(), N, K, cfg);
    const std::vector<float> gold = fp4lab::reference::gemm_contract(qa, qb);
    const std::vector<double> tol = fc::native_tolerance(qa, qb);
    const double g = std::ldexp(double(qa.global_dec) * double(qb.global_dec), -2 * qa.format.int_shift());
    int nonzero = 0;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double exact = 0.0, mag = 0.0;  // the exact sum, and the sum of the magnitudes of its terms
        for (int64_t j = 0; j < K; ++j) {
          const double t = double(fp4lab::decode_int(qa.format, qa.codes[m * K + j])) *
                           fp4lab::decode_int(qb.format, qb.codes[n * K + j]) *
                           qa.scales[m * K / cfg.block + j / cfg.block] * qb.scales[n * K / cfg.block + j / cfg.block];
          exact += t;
          mag += std::fabs(t);
        }
        exact *= g;
        mag *= std::fabs(g);
        const double t = tol[m * N + n];
        EXPECT_LE(std::fabs(double(gold[m * N + n]) - exact), t) << "C[" << m << ", " << n << "]";
        // (K + K/B + 2) 2^-23 is about 6e-5 here: a bound that wide is still far below the terms it sums.
        EXPECT_LT(t, 1e-4 * mag + 1e-30) << "bound too loose to mean anything at C[" << m << ", " << n << "]";
        nonzero += exact != 0.0;
      }
    EXPECT_GT(nonzero, 0);
  }
}

TEST(NativeSm100, WithinToleranceOnSm100) {
  SKIP_WITHOUT_GPU();
  std::string why;
  if (!fc::native_device_ok(&why)) GTEST_SKIP() << "SKIPPED: " << why;
  for (int k = 0; k < 3; ++k) {
    QuantConfig cfg;
    cfg.format = k == 2 ? fp4lab::kE1M2 : fp4lab::kE2M1;
    cfg.scale = k == 0 ? ScaleKind::ue4m3 : ScaleKind::ue8m0;
    cfg.block = k == 0 ? 16 : 32;
    const int64_t M = 200, N = 136, K = 320;
    const std::vector<float> xa = random_input(81, M, K), xb = random_input(83, N, K);
    const QTensor qa = fp4lab::quantize(xa.data(), M, K, cfg), qb = fp4lab::quantize(xb.data(), N, K, cfg);
    const std::vector<float> gold = fp4lab::reference::gemm_contract(qa, qb);
    const std::vector<double> tol = fc::native_tolerance(qa, qb);
    fc::DQTensor da, db;
    fc::upload(qa, da);
    fc::upload(qb, db);
    ASSERT_TRUE(fc::native_supported(da, db, &why)) << why;
    fc::Buffer<float> dc(size_t(M * N));
    dc.fill_bytes(0xFF);
    fc::GemmWorkspace ws;
    fc::gemm_native_sm100(da, db, dc.data(), ws);
    const std::vector<float> out = dc.to_host();
    int bad = 0;
    for (size_t i = 0; i < out.size(); ++i)
      if (!(std::fabs(double(out[i]) - double(gold[i])) <= tol[i]) && bad++ < 5)
        ADD_FAILURE() << cfg.label() << " C[" << i / N << ", " << i % N << "]: golden " << show(gold[i]) << ", native "
                      << show(out[i]) << ", tolerance " << tol[i];
  }
}

}  // namespace
