#include "fp4lab/cuda/timing.hpp"

#include <random>

#include "fp4lab/rht.hpp"
#include "fp4lab/scale.hpp"

namespace fp4lab::cuda {

Stream::Stream() { check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreate"); }

Stream::~Stream() {
  if (s_) cudaStreamDestroy(s_);
}

void Stream::close() {
  cudaStream_t s = s_;
  s_ = nullptr;
  check(cudaStreamDestroy(s), "cudaStreamDestroy");
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

std::vector<float> random_tensor(int64_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> N(0.0f, 1.0f);
  std::uniform_real_distribution<float> U(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = U(g) < 0.001f ? 20.0f * N(g) : N(g);
  return v;
}

Buffer<float> device_random(int64_t n, uint64_t seed) {
  static std::map<uint64_t, std::vector<float>> drawn;  // per seed, drawn once
  std::vector<float>& h = drawn[seed];
  if (h.empty()) h = random_tensor(int64_t(1) << 22, seed);
  const int64_t chunk = std::min<int64_t>(n, int64_t(h.size()));
  Buffer<float> b(static_cast<size_t>(n));
  check(cudaMemcpy(b.data(), h.data(), size_t(chunk) * 4, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  for (int64_t done = chunk; done < n;) {
    const int64_t c = std::min(done, n - done);
    check(cudaMemcpy(b.data() + done, b.data(), size_t(c) * 4, cudaMemcpyDeviceToDevice), "cudaMemcpy D2D");
    done += c;
  }
  // The copies run on the legacy stream, which the benches' non-blocking streams do not wait for.
  check(cudaDeviceSynchronize(), "device_random");
  return b;
}

Buffer<uint16_t> device_random_bf16(int64_t n, uint64_t seed) {
  const std::vector<float> h = random_tensor(std::min<int64_t>(n, int64_t(1) << 22), seed);
  std::vector<uint16_t> hb(h.size());
  for (size_t i = 0; i < h.size(); ++i) hb[i] = f32_to_bf16(h[i]);
  Buffer<uint16_t> b(static_cast<size_t>(n));
  check(cudaMemcpy(b.data(), hb.data(), hb.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  for (int64_t done = int64_t(hb.size()); done < n;) {
    const int64_t c = std::min(done, n - done);
    check(cudaMemcpy(b.data() + done, b.data(), size_t(c) * 2, cudaMemcpyDeviceToDevice), "cudaMemcpy D2D");
    done += c;
  }
  // The copies run on the legacy stream, which the benches' non-blocking streams do not wait for.
  check(cudaDeviceSynchronize(), "device_random_bf16");
  return b;
}

// ---- the copy baseline ----------------------------------------------------------------------------------------------

CopyTime time_copy(Timer& T, size_t bytes, int reps) {
  Buffer<uint8_t> c0(bytes), c1(bytes);
  c0.fill_bytes(1);
  CopyTime r;
  r.us = T.median_us(
      [&](int) { check(cudaMemcpyAsync(c1.data(), c0.data(), bytes, cudaMemcpyDeviceToDevice, T.s), "copy"); }, reps);
  r.gbs = 2.0 * double(bytes) / r.us / 1e3;
  return r;
}

CopyWalk::CopyWalk(size_t span) : span_(std::max<size_t>(size_t(1) << 30, span)), c0_(span_), c1_(span_) {
  c0_.fill_bytes(1);
}

CopyWalk::Time CopyWalk::time(Timer& T, int64_t b, int reps) {
  const size_t nb = span_ / size_t(b);
  const double est_us = 2.0 * double(b) / 4e6;
  Time r;
  r.batch = int(std::clamp(2000.0 / std::max(est_us, 1.0), 1.0, 500.0));
  r.us = T.median_us(
      [&](int i) {
        const size_t off = size_t(i) % nb * size_t(b);
        check(cudaMemcpyAsync(c1_.data() + off, c0_.data() + off, size_t(b), cudaMemcpyDeviceToDevice, T.s), "copy");
      },
      reps, r.batch);
  return r;
}

// ---- the FP32 quantiser ---------------------------------------------------------------------------------------------

QuantTimes time_quantize(Timer& T, const DeviceInfo& dev, double copy_gbs, int64_t rows, int64_t K,
                         const QuantConfig& plain, const QuantConfig& rot, int reps) {
  cudaStream_t s = T.s;
  QuantTimes r;
  const int64_t n = rows * K;
  const size_t in_bytes = size_t(n) * 4;
  const int nbuf = int(std::clamp<size_t>((4 * dev.l2_bytes + in_bytes - 1) / in_bytes, 1, 1024));
  std::vector<Buffer<float>> xs;
  xs.push_back(device_random(n, 7));
  for (int i = 1; i < nbuf; ++i) {
    xs.emplace_back(static_cast<size_t>(n));
    check(cudaMemcpy(xs.back().data(), xs[0].data(), in_bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy D2D");
  }
  check(cudaDeviceSynchronize(), "cudaMemcpy D2D");  // legacy-stream copies, before stream s reads them
  Buffer<float> rotated(static_cast<size_t>(n));
  DQTensor q;
  QuantWorkspace ws;
  const double est_us = double(in_bytes) / (copy_gbs * 1e3) * 2;
  r.buffers = nbuf;
  r.batch = std::max(nbuf, int(std::clamp(2000.0 / std::max(est_us, 1.0), 1.0, 200.0)));
  auto x = [&](int i) { return xs[size_t(i % nbuf)].data(); };
  r.plain_us = T.median_us(
      [&](int i) { quantize(x(i), rows, K, plain, q, ws, s, RhtPath::fused, false); }, reps, r.batch);
  r.plain_samples = T.samples;
  r.fused_us = T.median_us(
      [&](int i) { quantize(x(i), rows, K, rot, q, ws, s, RhtPath::fused, false); }, reps, r.batch);
  r.fused_samples = T.samples;
  r.unfused_us = T.median_us(
      [&](int i) {
        rht(x(i), rotated.data(), rows, K, rot, s);
        quantize(rotated.data(), rows, K, plain, q, ws, s, RhtPath::fused, false);
      },
      reps, r.batch);
  r.unfused_samples = T.samples;
  r.bytes = double(n) * (4.0 + 0.5 + 4.0 / plain.block + (plain.scale == ScaleKind::fp32 ? 0.0 : 1.0 / plain.block));
  return r;
}

// ---- the BF16 quantiser ---------------------------------------------------------------------------------------------

Bf16Variants bf16_variants(const Recipe& rec) {
  Bf16Variants v;
  v.plain.format = rec.format;
  v.plain.block = rec.block;
  v.plain.scale = rec.scale;
  v.plain.seed = 0x5eed;
  v.plain.stream = 3;
  v.rht16 = v.plain;
  v.sr = v.plain;
  v.rht16.rht = 16;
  v.rht16.rht_signs = rht_signs_te(16);
  v.rht16.rht_bf16 = rec.rht_bf16;
  v.sr.rounding = Rounding::sr;
  v.sr.sr_draw = SrDraw::philox4;
  v.sr1 = v.sr;
  v.sr1.sr_draw = SrDraw::philox1;
  v.rht16_sr = v.rht16;
  v.rht16_sr.rounding = Rounding::sr;
  v.rht16_sr.sr_draw = SrDraw::philox4;
  v.sr16 = v.sr;
  v.sr16.sr_draw = SrDraw::philox16;
  v.rht16_sr16 = v.rht16_sr;
  v.rht16_sr16.sr_draw = SrDraw::philox16;
  return v;
}

Bf16QuantBench::Bf16QuantBench(const DeviceInfo& dev, int64_t R, int64_t C) : R_(R), C_(C) {
  const int64_t n = R * C;
  const size_t in_bytes = size_t(n) * 2;
  nbuf_ = int(std::clamp<size_t>((4 * dev.l2_bytes + in_bytes - 1) / in_bytes, 2, 256));
  // Each input buffer holds 1.5 x the input: the copy that moves fake_both's bytes (6 per element, 3 read) reads
  // past the input's own 2.
  const size_t cap = size_t(n) + size_t(n) / 2 + 8;
  const Buffer<uint16_t> random = device_random_bf16(n, 7);
  for (int i = 0; i < nbuf_; ++i) {
    xs_.emplace_back(cap);
    check(cudaMemcpy(xs_.back().data(), random.data(), in_bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy D2D");
    check(cudaMemset(xs_.back().data() + n, 0, (cap - size_t(n)) * 2), "cudaMemset");
  }
  check(cudaDeviceSynchronize(), "cudaMemcpy D2D");  // legacy-stream copies, before the timer's stream reads them
  xt_.resize(static_cast<size_t>(n));
  xt2_.resize(static_cast<size_t>(n));
  bound_.resize(static_cast<size_t>(fake_quantize_both_bound_words(R_, C_)));
  bound_t_.resize(static_cast<size_t>(fake_quantize_both_bound_words(R_, C_)));
  dst_.resize(size_t(n) * 3 + 16);  // the largest copy: fake_both's 6 bytes per element, half of them written
  batch_ = std::max(nbuf_, int(std::clamp(3000.0 / std::max(double(in_bytes) / 4e3 * 2, 1.0), 1.0, 200.0)));
}

double Bf16QuantBench::bytes(const QuantConfig& cfg, Bf16Layout layout) const {
  if (layout == Bf16Layout::fake_row || layout == Bf16Layout::fake_transposed) return double(R_ * C_) * 4.0;
  if (layout == Bf16Layout::fake_both) return double(R_ * C_) * 6.0;
  return double(R_ * C_) * (2.0 + 0.5 + 4.0 / cfg.block + (cfg.scale == ScaleKind::fp32 ? 0.0 : 1.0 / cfg.block)) + 4;
}

CopyTime Bf16QuantBench::copy(Timer& T, double bytes, int reps) {
  const size_t b = size_t(bytes) & ~size_t(15);
  if (!copy_us_.count(b))
    copy_us_[b] = T.median_us(
        [&](int i) {
          check(cudaMemcpyAsync(dst_.data(), xs_[size_t(i % nbuf_)].data(), b / 2, cudaMemcpyDeviceToDevice, T.s),
                "copy");
        },
        reps, batch_);
  return {copy_us_[b], double(b) / copy_us_[b] / 1e3};
}

double Bf16QuantBench::time(Timer& T, const QuantConfig& cfg, Bf16Layout layout, int reps) {
  const cudaStream_t s = T.s;
  const int64_t R = R_, C = C_;
  const size_t in_bytes = size_t(R * C) * 2;
  auto x = [&](int i) { return xs_[size_t(i % nbuf_)].data(); };
  return T.median_us(
      [&](int i) {
        if (layout == Bf16Layout::row_wise) {
          quantize_bf16(x(i), R, C, cfg, q_, ws_, s, RhtPath::fused, false);
        } else if (layout == Bf16Layout::transposed) {
          quantize_transposed_bf16(x(i), R, C, cfg, q_, ws_, s, RhtPath::fused, false);
        } else if (layout == Bf16Layout::fake_row || layout == Bf16Layout::fake_transposed) {
          fake_quantize(x(i), true, layout == Bf16Layout::fake_transposed, R, C, cfg, xt_.data(), nullptr, ws_, s,
                        RhtPath::fused, false);
        } else if (layout == Bf16Layout::fake_both) {
          fake_quantize_both(x(i), true, R, C, cfg, xt_.data(), cfg, xt2_.data(), ws_, ws_t_, s, RhtPath::fused, false,
                             nullptr, nullptr, bound_.data(), bound_t_.data());
        } else {
          check(cudaMemcpyAsync(xt_.data(), x(i), in_bytes, cudaMemcpyDeviceToDevice, s), "copy");
          quantize_bf16(xt_.data(), C, R, cfg, q_, ws_, s, RhtPath::fused, false);
        }
      },
      reps, batch_);
}

// ---- the block-scaled GEMM ------------------------------------------------------------------------------------------

GemmCase::GemmCase(const QuantConfig& gc, int64_t M, int64_t N, int64_t K, cudaStream_t s)
    : dc(static_cast<size_t>(M * N)), flops(2.0 * double(M) * double(N) * double(K)), M_(M), N_(N), K_(K) {
  // The quantised operands (A [M, K], B [N, K]) under gc.
  QuantWorkspace ws;
  {
    Buffer<float> xa = device_random(M * K, 11);
    quantize(xa.data(), M, K, gc, qa, ws, s);
  }
  Buffer<float> xb = device_random(N * K, 13);
  quantize(xb.data(), N, K, gc, qb, ws, s);
  check(cudaStreamSynchronize(s), "quantise operands");
  batch = int(std::clamp(2e3 / std::max(flops / 200e12 * 1e6, 1.0), 1.0, 100.0));
}

bool GemmCase::prepare_fused(cudaStream_t s) {
  gemm_fast_prepare(qa, qb, gws, s);
  return gemm_fast_fused(gws, s);
}

double GemmCase::time_unpack(Timer& T, int reps, int variant) {
  return T.median_us([&](int) { gemm_fast_prepare(qa, qb, gws, T.s, variant); }, reps, batch, false);
}

double GemmCase::time_mma(Timer& T, int reps, int variant) {
  return T.median_us([&](int) { gemm_fast_run(qa, qb, dc.data(), gws, T.s, variant); }, reps, batch, false);
}

double GemmCase::time_mma_unfused(Timer& T, int reps, int variant) {
  gws.fused_epilogue = false;
  const double us = time_mma(T, reps, variant);
  gws.fused_epilogue = true;
  return us;
}

double GemmCase::time_fast(Timer& T, int reps, int variant) {
  return T.median_us([&](int) { gemm_fast(qa, qb, dc.data(), gws, T.s, variant); }, reps, batch, false);
}

double GemmCase::time_cublas_bf16(Timer& T, CublasBf16& cublas, int reps) {
  std::vector<uint16_t> ha(static_cast<size_t>(M_ * K_)), hb(static_cast<size_t>(N_ * K_));
  const std::vector<float> fa = random_tensor(M_ * K_, 17), fb = random_tensor(N_ * K_, 19);
  for (size_t i = 0; i < ha.size(); ++i) ha[i] = f32_to_bf16(fa[i]);
  for (size_t i = 0; i < hb.size(); ++i) hb[i] = f32_to_bf16(fb[i]);
  Buffer<uint16_t> da, db;
  da.upload(ha);
  db.upload(hb);
  // A plain launch loop: cuBLAS under stream capture needs its own workspace setup.
  return T.median_us([&](int) { cublas.gemm(da.data(), db.data(), dc.data(), M_, N_, K_, T.s); }, reps, batch, false);
}

}  // namespace fp4lab::cuda
