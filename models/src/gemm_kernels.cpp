// Bit-exact block-scaled GEMM kernels for the CPU (see gemm_kernels.hpp for the contract they keep).
//
// Layout. SIMD lanes run across N: lane l of a vector holds output column n0 + l, and performs exactly
// the scalar contract sequence for that output, so vectorising cannot change a bit. B is pre-packed per
// vector panel of L columns into one streaming record per K block:
//   [G groups x L lanes x 4 int8 codes][L x int32 correction][L x float block scale]     (G = block / 4)
// The int8 dot product wants unsigned x signed bytes (vpdpbusd, vpmaddubsw), so A's integer view is
// biased by +16 (|value| <= 12, so 4..28 fits a byte) and the packed correction -16 * sum_j b_j undoes
// the bias exactly: p = corr + sum (a_j + 16) * b_j = sum a_j * b_j. Integer sums are exact in any order.
#include "gemm_kernels.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "fp4lab/gemm.hpp"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define FP4LAB_GEMM_AVX512 1
#endif
#if defined(__AVX2__)
#define FP4LAB_GEMM_AVX2 1
#endif
#if defined(FP4LAB_GEMM_AVX512) || defined(FP4LAB_GEMM_AVX2)
#include <immintrin.h>
#endif
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 warns inside its own AVX-512 intrinsics (the _mm512_undefined_ps passthrough of
// _mm512_cvtepi32_ps, GCC PR 105593); every value here is defined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace fp4lab::detail {
namespace {

constexpr int kBias = 16;  // > the largest |integer view| (12, e2m1), so biased A fits an unsigned byte
// Below this many multiply-accumulates a GEMM runs on one thread: waking a second one costs more.
constexpr double kParallelMacs = 1 << 21;
constexpr int64_t kParallelBytes = 1 << 18;  // likewise for packing an operand

// Integer view of each of the 16 codes, decoded exactly as the reference does (decode_int).
struct IntLut {
  int8_t v[16];
  explicit IntLut(const ElemFormat& f) {
    for (int c = 0; c < 16; ++c) v[c] = int8_t(decode_int(f, uint8_t(c)));
  }
  int8_t operator()(uint8_t code) const { return v[code & 15]; }
};

// Uninitialised 64-byte aligned byte buffer (packed operands are fully written before use).
class AlignedBytes {
 public:
  explicit AlignedBytes(size_t n) : raw_(new uint8_t[n + 64]) {
    ptr_ = raw_.get() + (64 - reinterpret_cast<uintptr_t>(raw_.get()) % 64) % 64;
  }
  uint8_t* data() { return ptr_; }
  const uint8_t* data() const { return ptr_; }

 private:
  std::unique_ptr<uint8_t[]> raw_;
  uint8_t* ptr_;
};

// ---- scalar path: the contract written plainly on int8 views (used where no SIMD path is compiled) ----
void gemm_scalar(const QTensor& a, const QTensor& b, float* c) {
  const int64_t M = a.rows, N = b.rows, K = a.cols, B = a.block, KB = K / B;
  const IntLut la(a.format), lb(b.format);
  std::vector<int8_t> ia(a.codes.size()), ib(b.codes.size());
  for (size_t i = 0; i < ia.size(); ++i) ia[i] = la(a.codes[i]);
  for (size_t i = 0; i < ib.size(); ++i) ib[i] = lb(b.codes[i]);
  const float ga = tensor_factor(a.format, a.global_dec), gb = tensor_factor(b.format, b.global_dec);
#pragma omp parallel for schedule(dynamic, 4) if (double(M) * double(N) * double(K) > kParallelMacs)
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const int8_t* ar = ia.data() + m * K;
      const int8_t* br = ib.data() + n * K;
      float acc = 0.0f;
      for (int64_t k = 0; k < KB; ++k) {
        int32_t p = 0;
        for (int64_t j = k * B; j < (k + 1) * B; ++j) p += int32_t(ar[j]) * int32_t(br[j]);
        acc = contract_step(acc, p, a.scales[m * KB + k], b.scales[n * KB + k]);
      }
      c[m * N + n] = contract_finish(acc, ga, gb);
    }
}

#if defined(FP4LAB_GEMM_AVX512) || defined(FP4LAB_GEMM_AVX2)

// Rows [row0, row0 + rows) of A as biased unsigned bytes, row-major: a 16-byte table lookup, 16 codes at a time
// (the element count is a multiple of the block, so of 16).
AlignedBytes pack_a(const QTensor& a, int64_t row0, int64_t rows) {
  const IntLut lut(a.format);
  uint8_t biased[16];
  for (int c = 0; c < 16; ++c) biased[c] = uint8_t(lut.v[c] + kBias);
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(biased));
  const __m128i low4 = _mm_set1_epi8(0x0F);
  const int64_t n = rows * a.cols;
  AlignedBytes out{size_t(n)};
  uint8_t* o = out.data();
  const uint8_t* codes = a.codes.data() + row0 * a.cols;
#pragma omp parallel for schedule(static) if (n > kParallelBytes)
  for (int64_t i = 0; i < n; i += 16) {
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i), _mm_shuffle_epi8(table, _mm_and_si128(c, low4)));
  }
  return out;
}

// Bytes of one packed B record (one vector panel, one K block) for L lanes and G 4-byte groups.
constexpr int64_t record_bytes(int L, int G) { return int64_t(G + 2) * L * 4; }

// Vector panels [v0, v0 + nvp) of B, each of L columns (see the file comment); columns past N are zero. Each
// panel's L rows are first turned into integer views a row at a time (a 16-byte table lookup, vectorised), then
// moved into the records 4 bytes (one group) at a time.
AlignedBytes pack_b(const QTensor& b, int L, int64_t v0, int64_t nvp) {
  const IntLut lut(b.format);
  const int64_t N = b.rows, K = b.cols, B = b.block, KB = K / B, G = B / 4;
  const int64_t rec = record_bytes(L, int(G));
  AlignedBytes out{size_t(nvp * KB * rec)};
  uint8_t* base = out.data();
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lut.v));
  const __m128i low4 = _mm_set1_epi8(0x0F);
#pragma omp parallel if (nvp * L * K > kParallelBytes)
  {
    std::vector<int8_t> view(size_t(L * K));  // the panel's rows as integer views, zero past N
#pragma omp for schedule(static)
    for (int64_t v = v0; v < v0 + nvp; ++v) {
      for (int l = 0; l < L; ++l) {
        const int64_t n = v * L + l;
        int8_t* row = view.data() + l * K;
        if (n >= N) {
          std::fill(row, row + K, int8_t(0));
          continue;
        }
        const uint8_t* codes = b.codes.data() + n * K;
        for (int64_t j = 0; j < K; j += 16) {  // K is a multiple of the block, so of 16
          const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + j));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(row + j), _mm_shuffle_epi8(table, _mm_and_si128(c, low4)));
        }
      }
      for (int64_t k = 0; k < KB; ++k) {
        uint8_t* r = base + ((v - v0) * KB + k) * rec;
        for (int l = 0; l < L; ++l) {
          const int64_t n = v * L + l;
          const int8_t* x = view.data() + l * K + k * B;
          int32_t sum = 0;
          for (int64_t j = 0; j < B; ++j) sum += x[j];
          for (int64_t g = 0; g < G; ++g) std::memcpy(r + g * L * 4 + l * 4, x + 4 * g, 4);
          const float scale = n < N ? b.scales[n * KB + k] : 0.0f;
          const int32_t corr = -kBias * sum;
          std::memcpy(r + G * L * 4 + l * 4, &corr, 4);
          std::memcpy(r + (G + 1) * L * 4 + l * 4, &scale, 4);
        }
      }
    }
  }
  return out;
}

// One output tile: MR rows of A against NV vector panels of B, all K blocks.
struct TileArgs {
  const uint8_t* a;   // biased A, first row of the tile
  const float* sa;    // A's block scales, first row of the tile
  int64_t K, KB;
  const uint8_t* b;   // first packed panel of the tile
  int64_t panel;      // bytes between consecutive vector panels
  float gg;           // ga * gb, rounded once (contract step 6)
  float* c;           // output, first element of the tile
  int64_t ldc;
  int64_t ncols;      // valid columns in this tile (<= NV * L)
};

inline int32_t load_i32(const uint8_t* p) {
  int32_t w;
  std::memcpy(&w, p, 4);
  return w;
}

// Calls Tile<MR', NV'>::run with MR' = mr <= MR and NV' = nv <= NV chosen at compile time.
template <template <int, int> class Tile, int MR, int NV>
void dispatch(int mr, int nv, const TileArgs& t) {
  if constexpr (NV > 1) {
    if (nv < NV) return dispatch<Tile, MR, NV - 1>(mr, nv, t);
  }
  if constexpr (MR > 1) {
    if (mr < MR) return dispatch<Tile, MR - 1, NV>(mr, nv, t);
  }
  Tile<MR, NV>::run(t);
}

// Runs every tile of C, threads splitting the (panel group, row tile) grid panel-major so each thread
// keeps its B panels in its own L2 while A streams from the shared L3. The larger packed operand is packed a chunk
// (about 4 MB) at a time, the smaller one whole, so that the packed copies never hold a large operand whole; tiles
// only divide the outputs among them, so every output is computed as without chunks.
template <template <int, int> class Tile, int MR, int NV, int L>
void gemm_tiled(const QTensor& a, const QTensor& b, float* c) {
  const int64_t M = a.rows, N = b.rows, K = a.cols, KB = K / a.block;
  const int64_t panel = KB * record_bytes(L, a.block / 4);
  const float gg = FP4LAB_FMUL(tensor_factor(a.format, a.global_dec), tensor_factor(b.format, b.global_dec));
  const int64_t nvp = (N + L - 1) / L;
  constexpr int64_t kChunkBytes = int64_t(1) << 22;
  const bool chunk_a = M * K >= nvp * panel;
  const int64_t mchunk = chunk_a ? std::max<int64_t>(MR, kChunkBytes / K / MR * MR) : M;
  const int64_t vchunk = chunk_a ? nvp : std::max<int64_t>(NV, kChunkBytes / panel / NV * NV);
  std::optional<AlignedBytes> pa, pb;
  if (!chunk_a) pa.emplace(pack_a(a, 0, M));
  else pb.emplace(pack_b(b, L, 0, nvp));
  const bool parallel = double(M) * double(N) * double(K) > kParallelMacs;
  for (int64_t mc0 = 0; mc0 < M; mc0 += mchunk)
    for (int64_t vc0 = 0; vc0 < nvp; vc0 += vchunk) {
      const int64_t mc = std::min(mchunk, M - mc0), vc = std::min(vchunk, nvp - vc0);
      if (chunk_a) pa.emplace(pack_a(a, mc0, mc));
      else pb.emplace(pack_b(b, L, vc0, vc));
      const int64_t groups = (vc + NV - 1) / NV, mtiles = (mc + MR - 1) / MR;
#pragma omp parallel for collapse(2) schedule(static) if (parallel)
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t mt = 0; mt < mtiles; ++mt) {
          const int64_t m0 = mc0 + mt * MR, v0 = vc0 + g * NV, n0 = v0 * L;
          TileArgs t;
          t.a = pa->data() + (m0 - (chunk_a ? mc0 : 0)) * K;
          t.sa = a.scales.data() + m0 * KB;
          t.K = K;
          t.KB = KB;
          t.b = pb->data() + (v0 - (chunk_a ? 0 : vc0)) * panel;
          t.panel = panel;
          t.gg = gg;
          t.c = c + m0 * N + n0;
          t.ldc = N;
          t.ncols = std::min<int64_t>(NV * L, N - n0);
          dispatch<Tile, MR, NV>(int(std::min<int64_t>(MR, mc0 + mc - m0)), int(std::min<int64_t>(NV, vc0 + vc - v0)), t);
        }
    }
}

#endif  // any SIMD path

#if defined(FP4LAB_GEMM_AVX512)
// 16 lanes; the block dot product is vpdpbusd (4 byte products summed into each int32 lane).
template <int G>
struct Avx512 {
  static constexpr int L = 16, R = (G + 2) * 64;
  template <int MR, int NV>
  struct Tile {
    static void run(const TileArgs& t) {
      __m512 acc[MR][NV];
      for (int r = 0; r < MR; ++r)
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();  // +0.0f, as the contract starts
      for (int64_t k = 0; k < t.KB; ++k) {
        const uint8_t* rec[NV];
        for (int v = 0; v < NV; ++v) rec[v] = t.b + v * t.panel + k * R;
        __m512i p[MR][NV];
        for (int v = 0; v < NV; ++v) {
          const __m512i corr = _mm512_load_si512(rec[v] + G * 64);
          for (int r = 0; r < MR; ++r) p[r][v] = corr;
        }
        // Step 1: exact int32 block dot products.
        for (int g = 0; g < G; ++g) {
          __m512i bv[NV];
          for (int v = 0; v < NV; ++v) bv[v] = _mm512_load_si512(rec[v] + g * 64);
          for (int r = 0; r < MR; ++r) {
            const __m512i av = _mm512_set1_epi32(load_i32(t.a + r * t.K + k * 4 * G + 4 * g));
            for (int v = 0; v < NV; ++v) p[r][v] = _mm512_dpbusd_epi32(p[r][v], av, bv[v]);
          }
        }
        // Steps 2-5, per lane exactly contract_step: s = sa*sb; x = float(p)*s; acc = acc + x.
        __m512 sb[NV];
        for (int v = 0; v < NV; ++v) sb[v] = _mm512_load_ps(reinterpret_cast<const float*>(rec[v] + (G + 1) * 64));
        for (int r = 0; r < MR; ++r) {
          const __m512 sa = _mm512_set1_ps(t.sa[r * t.KB + k]);
          for (int v = 0; v < NV; ++v) {
            const __m512 s = _mm512_mul_ps(sa, sb[v]);
            const __m512 x = _mm512_mul_ps(_mm512_cvtepi32_ps(p[r][v]), s);
            acc[r][v] = _mm512_add_ps(acc[r][v], x);
          }
        }
      }
      // Step 6: out = acc * (ga * gb).
      const __m512 gg = _mm512_set1_ps(t.gg);
      for (int v = 0; v < NV; ++v) {
        const int64_t valid = std::clamp<int64_t>(t.ncols - v * L, 0, L);
        const __mmask16 mask = __mmask16((1u << valid) - 1u);
        for (int r = 0; r < MR; ++r)
          _mm512_mask_storeu_ps(t.c + r * t.ldc + v * L, mask, _mm512_mul_ps(acc[r][v], gg));
      }
    }
  };
};
template <int MR, int NV>
using Avx512B16 = Avx512<4>::Tile<MR, NV>;
template <int MR, int NV>
using Avx512B32 = Avx512<8>::Tile<MR, NV>;
#endif

#if defined(FP4LAB_GEMM_AVX2)
// 8 lanes; vpmaddubsw sums byte pairs into int16 (|pair| <= 2*28*12, and G of them <= 5376: no
// saturation), vpmaddwd with ones widens to int32.
template <int G>
struct Avx2 {
  static constexpr int L = 8, R = (G + 2) * 32;
  template <int MR, int NV>
  struct Tile {
    static void run(const TileArgs& t) {
      const __m256i ones = _mm256_set1_epi16(1);
      __m256 acc[MR][NV];
      for (int r = 0; r < MR; ++r)
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
      for (int64_t k = 0; k < t.KB; ++k) {
        const uint8_t* rec[NV];
        for (int v = 0; v < NV; ++v) rec[v] = t.b + v * t.panel + k * R;
        __m256i p16[MR][NV];
        for (int r = 0; r < MR; ++r)
          for (int v = 0; v < NV; ++v) p16[r][v] = _mm256_setzero_si256();
        for (int g = 0; g < G; ++g) {
          __m256i bv[NV];
          for (int v = 0; v < NV; ++v) bv[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(rec[v] + g * 32));
          for (int r = 0; r < MR; ++r) {
            const __m256i av = _mm256_set1_epi32(load_i32(t.a + r * t.K + k * 4 * G + 4 * g));
            for (int v = 0; v < NV; ++v) p16[r][v] = _mm256_add_epi16(p16[r][v], _mm256_maddubs_epi16(av, bv[v]));
          }
        }
        __m256 sb[NV];
        __m256i corr[NV];
        for (int v = 0; v < NV; ++v) {
          corr[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(rec[v] + G * 32));
          sb[v] = _mm256_load_ps(reinterpret_cast<const float*>(rec[v] + (G + 1) * 32));
        }
        for (int r = 0; r < MR; ++r) {
          const __m256 sa = _mm256_set1_ps(t.sa[r * t.KB + k]);
          for (int v = 0; v < NV; ++v) {
            const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(p16[r][v], ones), corr[v]);
            const __m256 s = _mm256_mul_ps(sa, sb[v]);
            const __m256 x = _mm256_mul_ps(_mm256_cvtepi32_ps(p), s);
            acc[r][v] = _mm256_add_ps(acc[r][v], x);
          }
        }
      }
      const __m256 gg = _mm256_set1_ps(t.gg);
      const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      for (int v = 0; v < NV; ++v) {
        const int valid = int(std::clamp<int64_t>(t.ncols - v * L, 0, L));
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), lane);
        for (int r = 0; r < MR; ++r)
          _mm256_maskstore_ps(t.c + r * t.ldc + v * L, mask, _mm256_mul_ps(acc[r][v], gg));
      }
    }
  };
};
template <int MR, int NV>
using Avx2B16 = Avx2<4>::Tile<MR, NV>;
template <int MR, int NV>
using Avx2B32 = Avx2<8>::Tile<MR, NV>;
#endif

}  // namespace

const char* gemm_path_name(GemmPath p) {
  switch (p) {
    case GemmPath::scalar: return "scalar";
    case GemmPath::avx2: return "avx2";
    default: return "avx512-vnni";
  }
}

bool gemm_path_compiled(GemmPath p) {
  switch (p) {
    case GemmPath::scalar: return true;
#if defined(FP4LAB_GEMM_AVX2)
    case GemmPath::avx2: return true;
#endif
#if defined(FP4LAB_GEMM_AVX512)
    case GemmPath::avx512_vnni: return true;
#endif
    default: return false;
  }
}

GemmPath gemm_best_path() {
#if defined(FP4LAB_GEMM_AVX512)
  return GemmPath::avx512_vnni;
#elif defined(FP4LAB_GEMM_AVX2)
  return GemmPath::avx2;
#else
  return GemmPath::scalar;
#endif
}

void gemm_into(GemmPath p, const QTensor& a, const QTensor& b, float* c) {
  if (!gemm_path_compiled(p))
    throw std::invalid_argument(std::string("GEMM path ") + gemm_path_name(p) + " is not compiled into this build");
  if (a.block != 16 && a.block != 32) p = GemmPath::scalar;  // packed layouts assume 4-byte groups of 16/32
  // The byte packing (bias 16, int16 pair sums on AVX2) holds for integer views up to 12 (e2m1); a
  // wider custom grid takes the scalar path.
  for (const ElemFormat* f : {&a.format, &b.format})
    for (int code = 0; code < 16; ++code)
      if (std::abs(decode_int(*f, uint8_t(code))) > 12) p = GemmPath::scalar;
  switch (p) {
#if defined(FP4LAB_GEMM_AVX512)
    case GemmPath::avx512_vnni:
      return a.block == 16 ? gemm_tiled<Avx512B16, 6, 2, 16>(a, b, c) : gemm_tiled<Avx512B32, 6, 2, 16>(a, b, c);
#endif
#if defined(FP4LAB_GEMM_AVX2)
    case GemmPath::avx2:
      return a.block == 16 ? gemm_tiled<Avx2B16, 4, 1, 8>(a, b, c) : gemm_tiled<Avx2B32, 4, 1, 8>(a, b, c);
#endif
    default:
      return gemm_scalar(a, b, c);
  }
}

std::vector<float> gemm_on(GemmPath p, const QTensor& a, const QTensor& b) {
  std::vector<float> c(size_t(a.rows * b.rows));
  gemm_into(p, a, b, c.data());
  return c;
}

}  // namespace fp4lab::detail
