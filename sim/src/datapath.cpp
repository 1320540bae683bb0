#include "fp4lab/sim/datapath.hpp"

#include <stdexcept>
#include <vector>

#include "fp4lab/gemm.hpp"

namespace fp4lab::sim {

// Laid out so the compiler vectorises across the tile's columns j: B's step is transposed once into
// [element][j] integer views, then every block's dot products for a row i are a run of broadcast-multiply-adds.
// 16-bit lanes are exact here: |product| <= 12 * 12 = 144 and a 32-element block sums to at most 4608 < 2^15.
void GoldenDatapath::block_dots(const TileStep& s, int32_t* p) {
  int16_t la[16], lb[16];
  for (int c = 0; c < 16; ++c) {
    la[c] = int16_t(code_valid(s.fa, uint8_t(c)) ? decode_int(s.fa, uint8_t(c)) : 0);
    lb[c] = int16_t(code_valid(s.fb, uint8_t(c)) ? decode_int(s.fb, uint8_t(c)) : 0);
  }
  const int K = s.nblk * s.block, tn = s.tn;
  std::vector<int16_t> bt(size_t(K) * tn);
  for (int j = 0; j < tn; ++j)
    for (int e = 0; e < K; ++e) bt[size_t(e) * tn + j] = lb[s.b[j * s.ldb + e] & 15];
#pragma omp parallel if (int64_t(s.tm) * tn * K > (1 << 20))
  {
    std::vector<int16_t> row(static_cast<size_t>(tn));
#pragma omp for schedule(static)
    for (int i = 0; i < s.tm; ++i) {
      for (int k = 0; k < s.nblk; ++k) {
        int16_t* r = row.data();
        for (int j = 0; j < tn; ++j) r[j] = 0;
        for (int e = k * s.block; e < (k + 1) * s.block; ++e) {
          const int16_t x = la[s.a[i * s.lda + e] & 15];
          const int16_t* bj = &bt[size_t(e) * tn];
          for (int j = 0; j < tn; ++j) r[j] = int16_t(r[j] + x * bj[j]);
        }
        int32_t* dst = p + (size_t(i) * s.nblk + k) * tn;
        for (int j = 0; j < tn; ++j) dst[j] = r[j];
      }
    }
  }
}

void GoldenDatapath::scale_accumulate(const TileStep& s, const int32_t* p, float* acc) {
  const int tn = s.tn;
  std::vector<float> sbt(size_t(s.nblk) * tn);  // B's scales as [block][j]
  for (int j = 0; j < tn; ++j)
    for (int k = 0; k < s.nblk; ++k) sbt[size_t(k) * tn + j] = s.sb[j * s.lsb + k];
#pragma omp parallel for schedule(static) if (int64_t(s.tm) * tn * s.nblk > (1 << 18))
  for (int i = 0; i < s.tm; ++i) {
    float* a = acc + size_t(i) * tn;
    for (int k = 0; k < s.nblk; ++k) {  // ascending block order, as the contract requires
      const float sa = s.sa[i * s.lsa + k];
      const int32_t* pk = p + (size_t(i) * s.nblk + k) * tn;
      const float* sb = &sbt[size_t(k) * tn];
      for (int j = 0; j < tn; ++j) a[j] = contract_step(a[j], pk[j], sa, sb[j]);
    }
  }
}

void Datapath::output_tiles(const QTensor&, const QTensor&, const std::vector<OutputTile>&, float*) {
  throw std::logic_error("datapath '" + name() + "' works on k-steps; output_tiles is not for it");
}

void GoldenDatapath::finish(const float* acc, int64_t n, float ga, float gb, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = contract_finish(acc[i], ga, gb);
}

}  // namespace fp4lab::sim

namespace fp4lab::sim {

#ifdef FP4LAB_SIM_HAS_RTL
std::shared_ptr<Datapath> make_rtl_datapath();  // sim/src/rtl_datapath.cpp
#endif

std::vector<std::string> datapath_names() {
#ifdef FP4LAB_SIM_HAS_RTL
  return {"golden", "rtl"};
#else
  return {"golden"};
#endif
}

std::shared_ptr<Datapath> make_datapath(const std::string& name) {
  if (name == "golden") return std::make_shared<GoldenDatapath>();
#ifdef FP4LAB_SIM_HAS_RTL
  if (name == "rtl") return make_rtl_datapath();
#else
  if (name == "rtl")
    throw std::invalid_argument("this build has no RTL datapath (the Verilated RTL was not built: FP4LAB_RTL=OFF or "
                                "Verilator missing)");
#endif
  std::string known;
  for (const auto& n : datapath_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown datapath '" + name + "' (known: " + known + ")");
}

}  // namespace fp4lab::sim
