#include "cuda_tools.hpp"

#include <stdexcept>

#include "fp4lab/rht.hpp"
#include "options.hpp"

#ifdef FP4LAB_CLI_HAS_CUDA
#include <map>
#include <random>
#include <sstream>
#endif

namespace fp4lab::cli::gpu {

Recipe preset(const std::string& name) {
  try {
    return Recipe::preset(name);
  } catch (const std::invalid_argument& e) {
    usage_error(e.what());
  }
}

QuantConfig plain_config(const Recipe& r) {
  QuantConfig c;
  c.format = r.format;
  c.block = r.block;
  c.scale = r.scale;
  c.rounding = Rounding::rtne;
  return c;
}

QuantConfig rht16_config(const QuantConfig& plain) {
  QuantConfig c = plain;
  c.rht = 16;
  c.rht_signs = rht_signs_te(16);
  return c;
}

#ifndef FP4LAB_CLI_HAS_CUDA
void require_gpu() {
  throw Error(kExitNoCuda, "this fp4lab was built without CUDA (FP4LAB_CUDA=OFF or no nvcc found when configured)");
}
#else
void require_gpu() {
  std::string why;
  if (!fc::device_available(&why)) throw Error(kExitNoDevice, "no usable CUDA device (" + why + ")");
}

std::vector<float> random_tensor(int64_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> N(0.0f, 1.0f);
  std::uniform_real_distribution<float> U(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = U(g) < 0.001f ? 20.0f * N(g) : N(g);
  return v;
}

std::string fixed(double x, int prec) {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(prec);
  o << x;
  return o.str();
}

std::string pad(const std::string& s, size_t w) { return s.size() >= w ? s : std::string(w - s.size(), ' ') + s; }

fc::Buffer<float> device_random(int64_t n, uint64_t seed) {
  static std::map<uint64_t, std::vector<float>> drawn;  // per seed, drawn once
  std::vector<float>& h = drawn[seed];
  if (h.empty()) h = random_tensor(int64_t(1) << 22, seed);
  const int64_t chunk = std::min<int64_t>(n, int64_t(h.size()));
  fc::Buffer<float> b(static_cast<size_t>(n));
  fc::check(cudaMemcpy(b.data(), h.data(), size_t(chunk) * 4, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  for (int64_t done = chunk; done < n;) {
    const int64_t c = std::min(done, n - done);
    fc::check(cudaMemcpy(b.data() + done, b.data(), size_t(c) * 4, cudaMemcpyDeviceToDevice), "cudaMemcpy D2D");
    done += c;
  }
  // The copies run on the legacy stream, which the benches' non-blocking streams do not wait for.
  fc::check(cudaDeviceSynchronize(), "device_random");
  return b;
}

QuantTimes time_quantize(Timer& T, const fc::DeviceInfo& dev, double copy_gbs, int64_t rows, int64_t K,
                         const QuantConfig& plain, const QuantConfig& rot, int reps, cudaStream_t s) {
  QuantTimes r;
  const int64_t n = rows * K;
  const size_t in_bytes = size_t(n) * 4;
  const int nbuf = int(std::clamp<size_t>((4 * dev.l2_bytes + in_bytes - 1) / in_bytes, 1, 1024));
  std::vector<fc::Buffer<float>> xs;
  xs.push_back(device_random(n, 7));
  for (int i = 1; i < nbuf; ++i) {
    xs.emplace_back(static_cast<size_t>(n));
    fc::check(cudaMemcpy(xs.back().data(), xs[0].data(), in_bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy D2D");
  }
  fc::check(cudaDeviceSynchronize(), "cudaMemcpy D2D");  // legacy-stream copies, before stream s reads them
  fc::Buffer<float> rotated(static_cast<size_t>(n));
  fc::DQTensor q;
  fc::QuantWorkspace ws;
  const double est_us = double(in_bytes) / (copy_gbs * 1e3) * 2;
  r.buffers = nbuf;
  r.batch = std::max(nbuf, int(std::clamp(2000.0 / std::max(est_us, 1.0), 1.0, 200.0)));
  auto x = [&](int i) { return xs[size_t(i % nbuf)].data(); };
  r.plain_us = T.median_us(
      [&](int i) { fc::quantize(x(i), rows, K, plain, q, ws, s, fc::RhtPath::fused, false); }, reps, r.batch);
  r.plain_samples = T.samples;
  r.fused_us = T.median_us(
      [&](int i) { fc::quantize(x(i), rows, K, rot, q, ws, s, fc::RhtPath::fused, false); }, reps, r.batch);
  r.fused_samples = T.samples;
  r.unfused_us = T.median_us(
      [&](int i) {
        fc::rht(x(i), rotated.data(), rows, K, rot, s);
        fc::quantize(rotated.data(), rows, K, plain, q, ws, s, fc::RhtPath::fused, false);
      },
      reps, r.batch);
  r.unfused_samples = T.samples;
  r.bytes = double(n) * (4.0 + 0.5 + 4.0 / plain.block + (plain.scale == ScaleKind::fp32 ? 0.0 : 1.0 / plain.block));
  return r;
}

namespace {
// The quantised operands of an M x N x K block-scaled GEMM under gc (A [M, K], B [N, K]).
void gemm_operands(const QuantConfig& gc, int64_t M, int64_t N, int64_t K, fc::DQTensor& qa,
                   fc::DQTensor& qb, cudaStream_t s) {
  fc::QuantWorkspace ws;
  {
    fc::Buffer<float> xa = device_random(M * K, 11);
    fc::quantize(xa.data(), M, K, gc, qa, ws, s);
  }
  fc::Buffer<float> xb = device_random(N * K, 13);
  fc::quantize(xb.data(), N, K, gc, qb, ws, s);
  fc::check(cudaStreamSynchronize(s), "quantise operands");
}
}  // namespace

GemmCase::GemmCase(const QuantConfig& gc, int64_t M, int64_t N, int64_t K, cudaStream_t s)
    : dc(static_cast<size_t>(M * N)), flops(2.0 * double(M) * double(N) * double(K)) {
  gemm_operands(gc, M, N, K, qa, qb, s);
  batch = int(std::clamp(2e3 / std::max(flops / 200e12 * 1e6, 1.0), 1.0, 100.0));
}
#endif

}  // namespace fp4lab::cli::gpu
