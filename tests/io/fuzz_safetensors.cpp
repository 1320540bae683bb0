// libFuzzer target for the safetensors reader and the trace v1 validation (built and run by run_fuzz.sh).
// Any input may be rejected, but only with fp4lab::io::Error: a crash, a sanitizer report, a leak, a hang
// or any other exception escaping is a finding. Inputs whose size is a multiple of 16 also go through the
// file constructor, which must reach the same verdict as the in-memory one.
//
// With FP4LAB_FUZZ_SEEDS=<dir> set, the binary writes its seed corpus (valid and broken files) and exits.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fp4lab/io/safetensors.hpp"

using namespace fp4lab::io;

namespace {

void exercise_tensors(const SafetensorsFile& f) {
  for (const TensorInfo& t : f.tensors()) {
    const TensorInfo& again = f.info(t.name);
    if (&again != &t) __builtin_trap();
    // A copy of the bytes: ASan sees any range that escaped validation.
    if (f.read_bytes(t.name).size() != size_t(t.end - t.begin)) __builtin_trap();
    if (t.dtype == DType::F32 || t.dtype == DType::BF16 || t.dtype == DType::F16) {
      if (f.read_f32(t.name, /*check_finite=*/false).size() != size_t(t.numel())) __builtin_trap();
      try {
        f.read_f32(t.name, /*check_finite=*/true);
      } catch (const Error&) {
      }
    } else {
      try {
        f.read_f32(t.name);
        __builtin_trap();  // other dtypes must be refused
      } catch (const Error&) {
      }
    }
  }
}

void exercise_trace(const std::shared_ptr<SafetensorsFile>& f, int block) {
  try {
    Trace tr(std::vector<std::shared_ptr<SafetensorsFile>>{f}, block);
    for (const TraceRecord& r : tr.records()) {
      if (r.tokens % block || r.in % block || r.out % block) __builtin_trap();
      try {
        const Trace::Layer l = tr.load(r);
        if (l.x.size() != size_t(r.tokens * r.in) || l.dy.size() != size_t(r.tokens * r.out)) __builtin_trap();
      } catch (const Error&) {
      }
    }
    tr.metadata(f->path());
  } catch (const Error&) {
  }
}

std::string verdict(const std::string& name, const std::vector<uint8_t>& bytes, bool via_file) {
  try {
    if (via_file) {
      SafetensorsFile f(name);
      return "ok " + std::to_string(f.tensors().size()) + " " + std::to_string(f.metadata().size());
    }
    SafetensorsFile f(name, bytes);
    return "ok " + std::to_string(f.tensors().size()) + " " + std::to_string(f.metadata().size());
  } catch (const Error& e) {
    return e.what();
  }
}

// ---- seed corpus ---------------------------------------------------------------------------------

std::vector<float> ramp(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(int(i % 13) - 6) / 4.0f;
  return v;
}

void write_seeds(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::map<std::string, std::string> v1 = {{"fp4lab.trace.version", "1"}, {"model", "seed"}};
  auto p = [&](const char* n) { return dir + "/" + n; };
  // A valid two-gemm trace (BF16 and F32), dims 16.
  write_safetensors(p("trace_ok"), {make_bf16("l0.fc.fwd_x", {16, 16}, ramp(256)), make_bf16("l0.fc.fwd_w", {16, 16}, ramp(256)),
                                    make_bf16("l0.fc.bwd_dy", {16, 16}, ramp(256)), make_f32("l1.q.fwd_x", {16, 16}, ramp(256)),
                                    make_f32("l1.q.fwd_w", {16, 16}, ramp(256)), make_f32("l1.q.bwd_dy", {16, 16}, ramp(256)),
                                    make_u8("extra", {2}, {1, 2})},
                    v1);
  // Valid plain file: several dtypes, metadata, an empty and a scalar tensor.
  const std::vector<uint8_t> f16 = {0x01, 0x00, 0x00, 0x3C, 0xFF, 0x03, 0x00, 0x7C};  // subnormals, 1, +Inf
  write_safetensors(p("plain_ok"), {make_f32("a", {2, 2}, {1, 2, 3, 4}), {"h", DType::F16, {4}, f16},
                                    {"i", DType::I64, {1}, std::vector<uint8_t>(8, 1)}, {"e", DType::F32, {0}, {}},
                                    {"s", DType::I32, {}, {1, 0, 0, 0}}},
                    {{"k", "v"}});
  // A trace whose shapes disagree, one without a version, and one with a NaN.
  write_safetensors(p("trace_shape"), {make_f32("g.fwd_x", {16, 32}, ramp(512)), make_f32("g.fwd_w", {16, 16}, ramp(256)),
                                       make_f32("g.bwd_dy", {16, 16}, ramp(256))},
                    v1);
  write_safetensors(p("trace_block"), {make_f32("g.fwd_x", {16, 24}, ramp(384)), make_f32("g.fwd_w", {16, 24}, ramp(384)),
                                       make_f32("g.bwd_dy", {16, 16}, ramp(256))},
                    v1);
  write_safetensors(p("trace_rank"), {make_f32("g.fwd_x", {1, 16, 16}, ramp(256)), {"g.fwd_w", DType::F16, {16, 16}, std::vector<uint8_t>(512)},
                                      make_f32("g.bwd_dy", {16, 16}, ramp(256))},
                    v1);
  write_safetensors(p("trace_nover"), {make_u8("g.fwd_x", {16, 16}, std::vector<uint8_t>(256))}, {{"model", "x"}});
  std::vector<float> nan = ramp(256);
  nan[7] = __builtin_nanf("");
  write_safetensors(p("trace_nan"), {make_f32("g.fwd_x", {16, 16}, nan), make_f32("g.fwd_w", {16, 16}, ramp(256)),
                                     make_f32("g.bwd_dy", {16, 16}, ramp(256))},
                    v1);
  // Hand-made broken headers.
  auto raw = [&](const char* n, const std::string& h, size_t data) {
    std::vector<uint8_t> b(8 + h.size() + data, 0);
    const uint64_t len = h.size();
    std::memcpy(b.data(), &len, 8);
    std::memcpy(b.data() + 8, h.data(), h.size());
    std::ofstream(p(n), std::ios::binary).write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  };
  raw("overlap", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", 24);
  raw("badmeta", R"({"__metadata__":{"k":1},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1);
  raw("badjson", R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,)", 4);
  raw("negshape", R"({"a":{"dtype":"BF16","shape":[-1,2],"data_offsets":[0,4]}})", 4);
  raw("nonint", R"({"a":{"dtype":"U8","shape":[2.5],"data_offsets":[0,2]}})", 2);
  raw("strshape", R"({"a":{"dtype":"U8","shape":["2"],"data_offsets":[0,2]}})", 2);
  raw("metaarr", R"({"__metadata__":["fp4lab.trace.version"]})", 0);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* d = std::getenv("FP4LAB_FUZZ_SEEDS")) {
    write_seeds(d);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> bytes(data, data + size);
  std::shared_ptr<SafetensorsFile> f;
  try {
    f = std::make_shared<SafetensorsFile>("fuzz.safetensors", bytes);
  } catch (const Error&) {
  }
  if (size % 16 == 0) {
    // The file path must agree with the in-memory path, message for message.
    struct Tmp {
      std::string path = (std::filesystem::temp_directory_path() / ("fp4lab_fuzz_" + std::to_string(getpid()) + ".safetensors")).string();
      ~Tmp() { std::remove(path.c_str()); }
    };
    static const Tmp t;
    const std::string& tmp = t.path;
    std::ofstream(tmp, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), std::streamsize(size));
    std::string a = verdict(tmp, bytes, true), b = verdict(tmp, bytes, false);
    if (a != b) {
      std::fprintf(stderr, "file and memory verdicts differ:\n  %s\n  %s\n", a.c_str(), b.c_str());
      __builtin_trap();
    }
  }
  if (!f) return 0;
  exercise_tensors(*f);
  exercise_trace(f, 16);
  exercise_trace(f, 1);  // block 1 admits every shape, so load() runs on more inputs
  return 0;
}
