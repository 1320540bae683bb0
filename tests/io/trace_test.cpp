// Trace v1: a valid folder (ordering, extras, loading values bit for bit) and every rejection in docs/spec.md §7.
#include <cmath>

#include "io_test_util.hpp"

namespace fp4lab::io::test {
namespace {

// Values k/8 - 4 for small k are exact in BF16 and F32, so the expected loads are known without rounding.
std::vector<float> ramp(int64_t n, int seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float((i * 7 + seed) % 64) / 8.0f - 4.0f;
  return v;
}

struct Gemm {
  std::string name;
  int64_t tokens, in, out;
  bool bf16 = false;
};

std::vector<OutTensor> gemm_tensors(const Gemm& g) {
  auto mk = [&](const std::string& suffix, int64_t r, int64_t c, int seed) {
    return g.bf16 ? make_bf16(g.name + suffix, {r, c}, ramp(r * c, seed)) : make_f32(g.name + suffix, {r, c}, ramp(r * c, seed));
  };
  return {mk(".fwd_x", g.tokens, g.in, 1), mk(".fwd_w", g.out, g.in, 2), mk(".bwd_dy", g.tokens, g.out, 3)};
}

const std::map<std::string, std::string> kV1 = {{"fp4lab.trace.version", "1"}, {"model", "tiny"}, {"step", "100"}};

class TraceTest : public TempDir {
 protected:
  std::string write_trace_file(const std::string& name, const std::vector<Gemm>& gemms,
                               const std::map<std::string, std::string>& md = kV1, std::vector<OutTensor> extra = {}) {
    std::vector<OutTensor> ts;
    for (const Gemm& g : gemms)
      for (OutTensor& t : gemm_tensors(g)) ts.push_back(std::move(t));
    for (OutTensor& t : extra) ts.push_back(std::move(t));
    const std::string p = path(name);
    write_safetensors(p, ts, md);
    return p;
  }
};

TEST_F(TraceTest, ValidFolderOrdersByFileThenAppearanceAndLoadsExactValues) {
  // Written b before a, and gemms within a not in alphabetical order: order must come from names and headers.
  const std::string b = write_trace_file("b.safetensors", {{"layer2.fc2", 32, 16, 48}});
  const std::string a = write_trace_file(
      "a.safetensors", {{"layer1.fc1", 16, 64, 32, true}, {"layer0.qkv", 48, 32, 16}}, kV1,
      {make_u8("layer1.fc1.scale_hint", {1}, {3}), {"step", DType::I64, {1}, std::vector<uint8_t>(8)}});
  write_bytes(path("notes.txt"), {'h', 'i'});  // not a .safetensors file: ignored
  Trace t(dir_, 16);
  ASSERT_EQ(t.records().size(), 3u);
  const TraceRecord want[] = {{"layer1.fc1", a, 16, 64, 32}, {"layer0.qkv", a, 48, 32, 16}, {"layer2.fc2", b, 32, 16, 48}};
  for (size_t i = 0; i < 3; ++i) {
    const TraceRecord& r = t.records()[i];
    EXPECT_EQ(r.gemm, want[i].gemm);
    EXPECT_EQ(r.file, want[i].file);
    EXPECT_EQ(r.tokens, want[i].tokens) << r.gemm;
    EXPECT_EQ(r.in, want[i].in) << r.gemm;
    EXPECT_EQ(r.out, want[i].out) << r.gemm;
    const Trace::Layer l = t.load(r);
    const std::vector<float> x = ramp(r.tokens * r.in, 1), w = ramp(r.out * r.in, 2), dy = ramp(r.tokens * r.out, 3);
    ASSERT_EQ(l.x.size(), x.size());
    ASSERT_EQ(l.w.size(), w.size());
    ASSERT_EQ(l.dy.size(), dy.size());
    for (size_t k = 0; k < x.size(); ++k) ASSERT_EQ(bits(l.x[k]), bits(x[k])) << r.gemm << " x[" << k << "]";
    for (size_t k = 0; k < w.size(); ++k) ASSERT_EQ(bits(l.w[k]), bits(w[k])) << r.gemm << " w[" << k << "]";
    for (size_t k = 0; k < dy.size(); ++k) ASSERT_EQ(bits(l.dy[k]), bits(dy[k])) << r.gemm << " dy[" << k << "]";
  }
  EXPECT_EQ(t.metadata(a).at("model"), "tiny");
  EXPECT_EQ(t.metadata(b).at("step"), "100");
  expect_error([&] { t.metadata("other"); }, "other", "not a file of this trace");
  expect_error([&] { t.load({"g", "other", 16, 16, 16}); }, "other", "not a file of this trace");
}

TEST_F(TraceTest, SingleFileAndOpenFiles) {
  const std::string p = write_trace_file("one.safetensors", {{"m.proj", 16, 16, 16}});
  Trace t(p);
  ASSERT_EQ(t.records().size(), 1u);
  EXPECT_EQ(t.records()[0].file, p);
  Trace u(std::vector<std::shared_ptr<SafetensorsFile>>{std::make_shared<SafetensorsFile>("mem", read_bytes(p))});
  ASSERT_EQ(u.records().size(), 1u);
  EXPECT_EQ(u.records()[0].file, "mem");
  EXPECT_EQ(u.load(u.records()[0]).x, ramp(256, 1));
}

TEST_F(TraceTest, MissingTensor) {
  std::vector<OutTensor> ts = gemm_tensors({"l.fc", 16, 16, 16});
  ts.pop_back();  // no bwd_dy
  write_safetensors(path("m.safetensors"), ts, kV1);
  expect_error([&] { Trace t(dir_); }, path("m.safetensors"), "gemm 'l.fc': tensor 'l.fc.bwd_dy' is missing");
  ts.erase(ts.begin());
  write_safetensors(path("m.safetensors"), ts, kV1);
  expect_error([&] { Trace t(dir_); }, path("m.safetensors"), "gemm 'l.fc': tensor 'l.fc.fwd_x' is missing");
}

TEST_F(TraceTest, ShapeMismatch) {
  auto bad = [&](int which, std::vector<int64_t> shape, const std::string& fault) {
    std::vector<OutTensor> ts = gemm_tensors({"g", 32, 16, 48});
    ts[size_t(which)] = make_f32(ts[size_t(which)].name, shape, ramp(shape[0] * shape[1], 0));
    const std::string p = path("s.safetensors");
    write_safetensors(p, ts, kV1);
    expect_error([&] { Trace t(p); }, p, fault);
  };
  bad(1, {48, 32}, "gemm 'g': in mismatch: fwd_x [32, 16] [tokens, in] vs fwd_w [48, 32] [out, in]");
  bad(2, {16, 48}, "gemm 'g': tokens mismatch: fwd_x [32, 16] [tokens, in] vs bwd_dy [16, 48] [tokens, out]");
  bad(2, {32, 16}, "gemm 'g': out mismatch: fwd_w [48, 16] [out, in] vs bwd_dy [32, 16] [tokens, out]");
}

TEST_F(TraceTest, WrongRankOrDtype) {
  std::vector<OutTensor> ts = gemm_tensors({"g", 16, 16, 16});
  ts[0] = make_f32("g.fwd_x", {1, 16, 16}, ramp(256, 1));
  write_safetensors(path("r.safetensors"), ts, kV1);
  expect_error([&] { Trace t(path("r.safetensors")); }, path("r.safetensors"),
               "gemm 'g': 'g.fwd_x' has shape [1, 16, 16]; trace v1 takes 2-D tensors");
  ts = gemm_tensors({"g", 16, 16, 16});
  ts[1] = {"g.fwd_w", DType::F16, {16, 16}, std::vector<uint8_t>(512)};
  write_safetensors(path("r.safetensors"), ts, kV1);
  expect_error([&] { Trace t(path("r.safetensors")); }, path("r.safetensors"),
               "gemm 'g': 'g.fwd_w' has dtype F16; trace v1 takes BF16 or F32");
}

TEST_F(TraceTest, DimensionNotMultipleOfBlock) {
  const std::string p = write_trace_file("d.safetensors", {{"g", 32, 24, 64}});
  expect_error([&] { Trace t(p, 16); }, p, "gemm 'g': in = 24 is not a multiple of the block size 16");
  EXPECT_EQ(Trace(p, 8).records().size(), 1u);  // the same file is fine at block 8
  const std::string q = write_trace_file("e.safetensors", {{"h", 40, 32, 32}});
  expect_error([&] { Trace t(q, 16); }, q, "gemm 'h': tokens = 40 is not a multiple of the block size 16");
  const std::string r = write_trace_file("f.safetensors", {{"k", 32, 32, 33}});
  expect_error([&] { Trace t(r, 32); }, r, "gemm 'k': out = 33 is not a multiple of the block size 32");
  const std::string z = write_trace_file("z.safetensors", {{"e", 0, 32, 32}});
  expect_error([&] { Trace t(z, 32); }, z, "gemm 'e': tokens = 0: the gemm is empty");
  expect_error([&] { Trace t(p, 0); }, p, "block size 0 is not positive");
}

TEST_F(TraceTest, NanInDataRejectedOnLoad) {
  std::vector<OutTensor> ts = gemm_tensors({"g", 16, 32, 16, true});
  std::vector<float> w = ramp(16 * 32, 2);
  w[37] = NAN;
  ts[1] = make_bf16("g.fwd_w", {16, 32}, w);
  const std::string p = path("n.safetensors");
  write_safetensors(p, ts, kV1);
  Trace t(p);  // opening reads headers only
  ASSERT_EQ(t.records().size(), 1u);
  expect_error([&] { t.load(t.records()[0]); }, p, "tensor 'g.fwd_w' element 37 is NaN");
}

TEST_F(TraceTest, MissingVersion) {
  const std::string p = write_trace_file("v.safetensors", {{"g", 16, 16, 16}}, {{"model", "tiny"}});
  expect_error([&] { Trace t(p); }, p, "__metadata__ lacks \"fp4lab.trace.version\"");
  const std::string q = write_trace_file("w.safetensors", {{"g", 16, 16, 16}}, {});
  expect_error([&] { Trace t(q); }, q, "__metadata__ lacks \"fp4lab.trace.version\"");
}

TEST_F(TraceTest, WrongVersion) {
  const std::string p = write_trace_file("v.safetensors", {{"g", 16, 16, 16}}, {{"fp4lab.trace.version", "2"}});
  expect_error([&] { Trace t(p); }, p, "\"fp4lab.trace.version\" is '2'; this reader understands '1'");
}

TEST_F(TraceTest, TruncatedFile) {
  const std::string p = write_trace_file("t.safetensors", {{"g", 16, 16, 16}});
  std::vector<uint8_t> b = read_bytes(p);
  b.resize(b.size() - 100);
  write_bytes(p, b);
  expect_error([&] { Trace t(dir_); }, p, "'g.bwd_dy': data_offsets [2048, 3072) run past the end of the data section (2972");
  b.resize(40);  // inside the header
  write_bytes(p, b);
  expect_error([&] { Trace t(dir_); }, p, "runs past the end of the file (40 bytes)");
  b.resize(3);
  write_bytes(p, b);
  expect_error([&] { Trace t(dir_); }, p, "file is 3 bytes, shorter than the 8-byte header length");
}

TEST_F(TraceTest, DuplicateGemmAcrossFiles) {
  const std::string a = write_trace_file("a.safetensors", {{"g", 16, 16, 16}});
  const std::string b = write_trace_file("b.safetensors", {{"h", 16, 16, 16}, {"g", 16, 16, 16}});
  expect_error([&] { Trace t(dir_); }, b, "gemm 'g': already captured in " + a);
}

TEST_F(TraceTest, EmptyOrMissingTrace) {
  expect_error([&] { Trace t(dir_); }, dir_, "folder holds no .safetensors files");
  write_safetensors(path("x.safetensors"), {make_u8("notes", {1}, {1})}, kV1);
  expect_error([&] { Trace t(dir_); }, dir_, "trace holds no gemm records");
  const std::string p = path("nowhere");
  expect_error([&] { Trace t(p); }, p, "no such file or folder");
  expect_error([&] { Trace t(std::vector<std::shared_ptr<SafetensorsFile>>{}); }, "trace", "no files given");
}

TEST_F(TraceTest, EmptyGemmName) {
  std::vector<OutTensor> ts = gemm_tensors({"", 16, 16, 16});
  const std::string p = path("e.safetensors");
  write_safetensors(p, ts, kV1);
  expect_error([&] { Trace t(p); }, p, "tensor '.fwd_x' has an empty gemm name");
}

// A file truncated, replaced or removed after its header was read (a trace being rewritten while it is analysed): the
// read that finds it is one Error naming the file and the tensor, never a SIGBUS (a mapped file ends the process so).
TEST_F(TraceTest, SigbusFileTruncatedWhileOpenIsAnError) {
  const std::string p = write_trace_file("t.safetensors", {{"a.fc", 64, 64, 64}, {"b.fc", 64, 64, 64, true}});
  Trace t(p);
  ASSERT_EQ(t.records().size(), 2u);
  const SafetensorsFile& f = t.file(p);
  const uint64_t head = 8 + [&] {  // the header's length: the file keeps its header and loses every tensor's data
    const std::vector<uint8_t> b = read_bytes(p);
    uint64_t n;
    std::memcpy(&n, b.data(), 8);
    return n;
  }();
  // Cut inside a tensor: the read finds the end partway; what is still there reads as before.
  std::filesystem::resize_file(p, head + 64 * 64 * 4 + 100);
  expect_error([&] { f.read_f32("a.fc.fwd_w"); }, p, "needs bytes [" + std::to_string(head + 64 * 64 * 4) + ", ");
  EXPECT_EQ(f.read_f32("a.fc.fwd_x"), ramp(64 * 64, 1));
  std::filesystem::resize_file(p, head);
  expect_error([&] { t.load(t.records()[0]); }, p, "truncated to " + std::to_string(head) + " bytes while in use: tensor 'a.fc.fwd_x'");
  expect_error([&] { t.load(t.records()[1], /*in_place=*/0); }, p, "tensor 'b.fc.fwd_x'");  // BF16 kept as BF16
  expect_error([&] { f.read_f32("b.fc.bwd_dy"); }, p, "truncated");
}

TEST_F(TraceTest, FileReplacedOrRemovedWhileOpenIsAnError) {
  const std::string p = write_trace_file("t.safetensors", {{"a.fc", 16, 16, 16}});
  Trace t(p);
  // Written to another name and renamed over it, as a capture writes: another file, whose header was never checked.
  write_trace_file("new.safetensors", {{"a.fc", 16, 16, 16}});
  std::filesystem::rename(path("new.safetensors"), p);
  expect_error([&] { t.load(t.records()[0]); }, p, "replaced by another file while in use");
  std::filesystem::remove(p);
  expect_error([&] { t.load(t.records()[0]); }, p, "cannot open again to read tensor 'a.fc.fwd_x': No such file");
}

TEST_F(TraceTest, RelativePathReadsAfterChdir) {
  write_trace_file("t.safetensors", {{"a.fc", 16, 16, 16}});
  const std::filesystem::path was = std::filesystem::current_path();
  std::filesystem::current_path(dir_);
  Trace t("t.safetensors");
  std::filesystem::current_path(was);  // the file is read where it was opened, not relative to the new folder
  EXPECT_EQ(t.load(t.records()[0]).w, ramp(16 * 16, 2));
}

}  // namespace
}  // namespace fp4lab::io::test
