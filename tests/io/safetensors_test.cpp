// safetensors reader and writer: round trips for every dtype, the exact bytes the writer produces, and one
// test per malformed-file fault (the bad bytes are built here), each checking the one-line message.
#include <algorithm>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <random>

#include "fp4lab/io/files.hpp"
#include "io_test_util.hpp"

namespace fp4lab::io::test {
namespace {

using Safetensors = TempDir;

// ---- writer: exact bytes -------------------------------------------------------------------------

TEST_F(Safetensors, WriterProducesSpecLayoutWithSpacePaddedHeader) {
  const std::string p = path("a.safetensors");
  write_safetensors(p, {make_f32("a", {2}, {1.0f, -2.0f}), make_u8("b", {1, 3}, {7, 8, 9})}, {{"k", "v"}});
  const std::string json =
      R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"U8","shape":[1,3],"data_offsets":[8,11]}})";
  std::string header = json;
  header.append((8 - json.size() % 8) % 8, ' ');
  ASSERT_EQ(header.size() % 8, 0u);
  // 1.0f = 0x3F800000, -2.0f = 0xC0000000, little-endian.
  const std::vector<uint8_t> data = {0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0xC0, 7, 8, 9};
  EXPECT_EQ(read_bytes(p), image(header, data));
}

TEST_F(Safetensors, WriterPadsEveryHeaderLengthToEightBytes) {
  // Names of growing length walk the JSON size through every residue mod 8.
  for (int len = 1; len <= 8; ++len) {
    const std::string p = path("pad" + std::to_string(len) + ".safetensors");
    write_safetensors(p, {make_u8(std::string(size_t(len), 'n'), {1}, {uint8_t(len)})});
    const std::vector<uint8_t> b = read_bytes(p);
    uint64_t n;
    std::memcpy(&n, b.data(), 8);
    EXPECT_EQ(n % 8, 0u) << "name length " << len;
    EXPECT_EQ(b.size(), 8 + n + 1);
    EXPECT_EQ(b.back(), uint8_t(len));
    SafetensorsFile f(p);
    EXPECT_EQ(f.read_bytes(std::string(size_t(len), 'n'))[0], uint8_t(len));
  }
}

// ---- round trips ---------------------------------------------------------------------------------

TEST_F(Safetensors, RoundTripEveryDtypeKeepsBytesShapeAndOrder) {
  const DType all[] = {DType::F32, DType::BF16, DType::F16,  DType::U8,  DType::I32,     DType::F64,    DType::BOOL,
                       DType::I8,  DType::I16,  DType::U16,  DType::U32, DType::I64,     DType::U64,    DType::F8_E4M3,
                       DType::F8_E5M2};
  const char* names[] = {"F32", "BF16", "F16", "U8", "I32", "F64", "BOOL", "I8",
                         "I16", "U16",  "U32", "I64", "U64", "F8_E4M3", "F8_E5M2"};
  const size_t sizes[] = {4, 2, 2, 1, 4, 8, 1, 1, 2, 2, 4, 8, 8, 1, 1};
  std::mt19937 rng(1234);
  std::vector<OutTensor> out;
  for (size_t i = 0; i < std::size(all); ++i) {
    EXPECT_STREQ(dtype_name(all[i]), names[i]);
    EXPECT_EQ(dtype_size(all[i]), sizes[i]);
    const std::vector<int64_t> shape = {int64_t(i % 3 + 1), 5};
    std::vector<uint8_t> b(size_t(shape[0] * shape[1]) * sizes[i]);
    for (auto& x : b) x = uint8_t(rng());
    // Reverse-alphabetical names: the reader must keep header (write) order, not sort.
    out.push_back({std::string("t") + char('z' - i), all[i], shape, b});
  }
  out.push_back({"empty", DType::F32, {0, 4}, {}});
  out.push_back({"scalar", DType::I32, {}, {1, 2, 3, 4}});
  const std::string p = path("all.safetensors");
  write_safetensors(p, out);
  SafetensorsFile f(p);
  ASSERT_EQ(f.tensors().size(), out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    const TensorInfo& t = f.tensors()[i];
    EXPECT_EQ(t.name, out[i].name);
    EXPECT_EQ(t.dtype, out[i].dtype) << t.name;
    EXPECT_EQ(t.shape, out[i].shape) << t.name;
    EXPECT_EQ(uint64_t(t.numel()) * dtype_size(t.dtype), t.end - t.begin);
    EXPECT_TRUE(f.has(t.name));
    EXPECT_EQ(&f.info(t.name), &t);
    EXPECT_EQ(f.read_bytes(t.name), out[i].bytes) << t.name;
  }
  EXPECT_EQ(f.tensors()[std::size(all)].numel(), 0);
  EXPECT_EQ(f.tensors()[std::size(all) + 1].numel(), 1);
  EXPECT_FALSE(f.has("nope"));
  EXPECT_TRUE(f.metadata().empty());
}

TEST_F(Safetensors, F32RoundTripIsBitExactIncludingSpecials) {
  const std::vector<float> v = {0.0f, -0.0f, 1.0f, -3.5f, std::numeric_limits<float>::denorm_min(),
                                std::numeric_limits<float>::max(), from_bits(0x7FC00001u), INFINITY};
  const std::string p = path("f.safetensors");
  write_safetensors(p, {make_f32("v", {2, 4}, v)});
  SafetensorsFile f(p);
  const std::vector<float> r = f.read_f32("v", /*check_finite=*/false);
  ASSERT_EQ(r.size(), v.size());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(bits(r[i]), bits(v[i])) << i;
}

TEST_F(Safetensors, MakeBf16RoundsToNearestEven) {
  // Inputs beside their expected BF16 encodings, worked out by hand.
  const std::pair<float, uint16_t> cases[] = {
      {1.0f, 0x3F80},
      {from_bits(0x3F808000u), 0x3F80},  // 1 + 2^-8: tie between 0x3F80 and 0x3F81 -> even 0x3F80
      {from_bits(0x3F818000u), 0x3F82},  // 1 + 3*2^-8: tie between 0x3F81 and 0x3F82 -> even 0x3F82
      {from_bits(0x3F808001u), 0x3F81},  // one ulp above the tie rounds up
      {from_bits(0x3F807FFFu), 0x3F80},  // one ulp below the tie rounds down
      {-2.0f, 0xC000},
      {-0.0f, 0x8000},
      {from_bits(0x00018000u), 0x0002},  // subnormal tie -> even
      {from_bits(0x7F7F8000u), 0x7F80},  // tie above the largest BF16 rounds to +Inf
      {INFINITY, 0x7F80},
      {-INFINITY, 0xFF80},
  };
  std::vector<float> v;
  for (auto& c : cases) v.push_back(c.first);
  v.push_back(from_bits(0x7F800001u));  // a NaN whose payload sits only in the dropped bits
  const std::string p = path("bf.safetensors");
  write_safetensors(p, {make_bf16("b", {int64_t(v.size())}, v)});
  SafetensorsFile f(p);
  const std::vector<uint8_t> bytes = f.read_bytes("b");
  const uint8_t* d = bytes.data();
  for (size_t i = 0; i < std::size(cases); ++i) {
    uint16_t got;
    std::memcpy(&got, d + 2 * i, 2);
    EXPECT_EQ(got, cases[i].second) << "input bits 0x" << std::hex << bits(cases[i].first);
  }
  uint16_t nan;
  std::memcpy(&nan, d + 2 * std::size(cases), 2);
  EXPECT_EQ(nan & 0x7F80, 0x7F80);
  EXPECT_NE(nan & 0x007F, 0) << "NaN must stay NaN, not become Inf";
  const std::vector<float> r = f.read_f32("b", /*check_finite=*/false);
  EXPECT_EQ(bits(r[1]), 0x3F800000u);
  EXPECT_EQ(bits(r[2]), 0x3F820000u);  // 1.015625
  EXPECT_TRUE(std::isnan(r.back()));
}

TEST_F(Safetensors, F16DecodesEveryCodeExactly) {
  std::vector<uint8_t> b(65536 * 2);
  for (uint32_t c = 0; c < 65536; ++c) std::memcpy(b.data() + 2 * c, &c, 2);  // little-endian low half
  const std::string p = path("h.safetensors");
  write_safetensors(p, {{"h", DType::F16, {65536}, b}});
  SafetensorsFile f(p);
  const std::vector<float> r = f.read_f32("h", /*check_finite=*/false);
  ASSERT_EQ(r.size(), 65536u);
  // Literal anchors: smallest and largest subnormal, smallest normal, one, max, signed zero, infinities.
  EXPECT_EQ(r[0x0001], 5.9604644775390625e-08f);  // 2^-24
  EXPECT_EQ(r[0x03FF], 6.09755516052246094e-05f);  // 1023 * 2^-24
  EXPECT_EQ(r[0x0400], 6.103515625e-05f);          // 2^-14
  EXPECT_EQ(r[0x3C00], 1.0f);
  EXPECT_EQ(r[0x3555], 0.333251953125f);
  EXPECT_EQ(r[0x7BFF], 65504.0f);
  EXPECT_EQ(r[0xC000], -2.0f);
  EXPECT_EQ(bits(r[0x8000]), 0x80000000u);
  EXPECT_EQ(r[0x7C00], INFINITY);
  EXPECT_EQ(r[0xFC00], -INFINITY);
  EXPECT_EQ(bits(r[0x7E00]), 0x7FC00000u);  // NaN payload moves to the top of the FP32 mantissa
  size_t checked = 0;
#ifdef __FLT16_MAX__
  // Every code against the compiler's own _Float16 -> float conversion.
  for (uint32_t c = 0; c < 65536; ++c) {
    const uint16_t h = uint16_t(c);
    _Float16 x;
    std::memcpy(&x, &h, 2);
    const float ref = float(x);
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(r[c])) << std::hex << c;
      EXPECT_EQ(std::signbit(ref), std::signbit(r[c])) << std::hex << c;
    } else {
      EXPECT_EQ(bits(r[c]), bits(ref)) << "code 0x" << std::hex << c;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 65536u);
#else
  GTEST_SKIP() << "no _Float16 in this compiler: only the literal anchors were checked";
#endif
}

TEST_F(Safetensors, MetadataRoundTrips) {
  const std::map<std::string, std::string> md = {
      {"fp4lab.trace.version", "1"}, {"model", "llama-tiny"}, {"cmd", "python train.py --step 7"}, {"empty", ""}};
  const std::string p = path("m.safetensors");
  write_safetensors(p, {make_u8("x", {1}, {1})}, md);
  SafetensorsFile f(p);
  EXPECT_EQ(f.metadata(), md);
  // No tensors at all is a valid file too.
  write_safetensors(path("none.safetensors"), {}, {{"a", "b"}});
  SafetensorsFile g(path("none.safetensors"));
  EXPECT_TRUE(g.tensors().empty());
  EXPECT_EQ(g.metadata().at("a"), "b");
}

TEST_F(Safetensors, InMemoryConstructorMatchesFile) {
  const std::string p = path("m.safetensors");
  write_safetensors(p, {make_f32("a", {3}, {1, 2, 3})}, {{"k", "v"}});
  SafetensorsFile f("memory-name", read_bytes(p));
  EXPECT_EQ(f.path(), "memory-name");
  EXPECT_EQ(f.read_f32("a"), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(f.metadata().at("k"), "v");
  expect_error([] { SafetensorsFile("mem", std::vector<uint8_t>{1, 2}); }, "mem", "shorter than the 8-byte");
}

TEST_F(Safetensors, ReaderAcceptsUnpaddedHeaderUnalignedDataAndExtraEntryKeys) {
  // Other writers may skip padding; F32 data then starts unaligned. Unknown keys inside an entry are ignored.
  const std::string p = path("u.safetensors");
  write_bytes(p, image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1}})", {0, 0, 0x40, 0x40}));
  SafetensorsFile f(p);
  EXPECT_EQ(f.read_f32("a"), std::vector<float>{3.0f});
}

// ---- writer and make_* errors --------------------------------------------------------------------

TEST_F(Safetensors, WriterRejectsBadInput) {
  const std::string p = path("w.safetensors");
  expect_error([&] { make_f32("a", {2, 2}, {1, 2, 3}); }, "make_f32", "holds 4 elements but 3 values were given");
  expect_error([&] { make_bf16("a", {-1}, {}); }, "make_bf16", "negative dimension");
  expect_error([&] { make_u8("a", {2}, {1}); }, "make_u8", "holds 2 elements but 1");
  expect_error([&] { write_safetensors(p, {make_u8("a", {1}, {1}), make_u8("a", {1}, {2})}); }, p, "given twice");
  expect_error([&] { write_safetensors(p, {make_u8("__metadata__", {1}, {1})}); }, p, "reserved");
  expect_error([&] { write_safetensors(p, {{"a", DType::F32, {2}, {1, 2, 3, 4, 5, 6}}}); }, p, "a whole number");
  expect_error([&] { write_safetensors(p, {{"a", DType::F32, {3}, {1, 2, 3, 4, 5, 6, 7, 8}}}); }, p,
               "holds 3 elements but 2 are in its bytes");
  expect_error([&] { write_safetensors(p, {make_u8("bad\xff", {1}, {1})}); }, p, "not valid UTF-8");
  const std::string nodir = path("missing/dir/x.safetensors");
  expect_error([&] { write_safetensors(nodir, {make_u8("a", {1}, {1})}); }, nodir, "cannot create");
}

// ---- malformed files: one test per fault ---------------------------------------------------------

class Malformed : public TempDir {
 protected:
  // Writes `bytes` and checks that opening fails naming the file and the fault.
  void expect_bad(const std::vector<uint8_t>& bytes, const std::string& fault) {
    const std::string p = path("bad.safetensors");
    write_bytes(p, bytes);
    expect_error([&] { SafetensorsFile f(p); }, p, fault);
    // The in-memory constructor runs the same checks.
    expect_error([&] { SafetensorsFile f("mem", bytes); }, "mem", fault);
  }
  static std::string entry(const std::string& dtype, const std::string& shape, const std::string& offsets) {
    return R"({"t":{"dtype":)" + dtype + R"(,"shape":)" + shape + R"(,"data_offsets":)" + offsets + "}}";
  }
};

TEST_F(Malformed, FileShorterThanEightBytes) {
  expect_bad({}, "file is 0 bytes, shorter than the 8-byte header length");
  expect_bad({1, 2, 3, 4, 5}, "file is 5 bytes, shorter than the 8-byte header length");
}

TEST_F(Malformed, HeaderLengthPastEndOfFile) {
  expect_bad(image("{}", {}, 1000), "header length 1000 runs past the end of the file (10 bytes)");
  expect_bad(image("", {}, 1), "header length 1 runs past the end of the file (8 bytes)");
}

TEST_F(Malformed, HeaderLengthAbsurd) {
  expect_bad(image("{}", {}, uint64_t(1) << 63), "header length 9223372036854775808 is absurd");
  expect_bad(image("{}", {}, UINT64_MAX - 1), "is absurd");
}

TEST_F(Malformed, HeaderNotJson) {
  expect_bad(image(R"({"t":{"dtype":"F32",)"), "header is not valid JSON");
  expect_bad(image(""), "header is not valid JSON");
  expect_bad(image("{} trailing"), "header is not valid JSON");
  expect_bad(image("{\"\xff\":1}"), "header is not valid JSON");  // not UTF-8
  expect_bad(image(R"({"t":{"dtype":"U8","shape":[1e999],"data_offsets":[0,0]}})"),
             "header is not valid JSON (a number is out of range)");
}

TEST_F(Malformed, HeaderNotAnObject) {
  expect_bad(image("[1,2]"), "header is not a JSON object (it is a array)");
  expect_bad(image("\"str\""), "header is not a JSON object (it is a string)");
}

TEST_F(Malformed, HeaderDuplicateKeyOrTooDeep) {
  expect_bad(image(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"a":{}})"), "duplicate key 'a'");
  expect_bad(image(std::string(100, '[') + std::string(100, ']')), "nests deeper than 64 levels");
}

TEST_F(Malformed, EntryNotAnObject) { expect_bad(image(R"({"t":[1]})"), "tensor 't': entry is not a JSON object"); }

TEST_F(Malformed, EntryLacksDtype) {
  expect_bad(image(R"({"t":{"shape":[1],"data_offsets":[0,1]}})", {0}), "tensor 't': entry lacks \"dtype\"");
}
TEST_F(Malformed, EntryLacksShape) {
  expect_bad(image(R"({"t":{"dtype":"U8","data_offsets":[0,1]}})", {0}), "tensor 't': entry lacks \"shape\"");
}
TEST_F(Malformed, EntryLacksDataOffsets) {
  expect_bad(image(R"({"t":{"dtype":"U8","shape":[1]}})", {0}), "tensor 't': entry lacks \"data_offsets\"");
}

TEST_F(Malformed, UnknownDtype) {
  expect_bad(image(entry(R"("F17")", "[1]", "[0,4]"), {0, 0, 0, 0}), "tensor 't': unknown dtype \"F17\"");
  expect_bad(image(entry("4", "[1]", "[0,4]"), {0, 0, 0, 0}), "tensor 't': dtype 4 is not a string");
}

TEST_F(Malformed, NegativeShape) {
  expect_bad(image(entry(R"("U8")", "[2,-1]", "[0,0]")), "tensor 't': shape dimension 1 is negative (-1)");
}

TEST_F(Malformed, NonIntegerShape) {
  expect_bad(image(entry(R"("U8")", "[2.5]", "[0,2]"), {0, 0}), "shape dimension 0 is 2.5, not an integer");
  expect_bad(image(entry(R"("U8")", "[2.0]", "[0,2]"), {0, 0}), "shape dimension 0 is 2.0, not an integer");
  expect_bad(image(entry(R"("U8")", R"(["2"])", "[0,2]"), {0, 0}), "shape dimension 0 is \"2\", not a number");
  expect_bad(image(entry(R"("U8")", "2", "[0,2]"), {0, 0}), "shape 2 is not an array");
  expect_bad(image(entry(R"("U8")", "[18446744073709551615]", "[0,2]"), {0, 0}), "shape dimension 0 is too large");
  expect_bad(image(entry(R"("F64")", "[4294967296,4294967296]", "[0,0]")), "has more bytes than fit in 64 bits");
}

TEST_F(Malformed, ByteCountDisagreesWithShape) {
  expect_bad(image(entry(R"("F32")", "[2,3]", "[0,20]"), std::vector<uint8_t>(24)),
             "tensor 't': shape [2, 3] of F32 needs 24 bytes but data_offsets [0, 20) hold 20");
}

TEST_F(Malformed, OffsetsOutOfRange) {
  expect_bad(image(entry(R"("U8")", "[4096]", "[0,4096]"), std::vector<uint8_t>(3000)),
             "tensor 't': data_offsets [0, 4096) run past the end of the data section (3000 bytes of data)");
  expect_bad(image(entry(R"("U8")", "[0]", "[9,9]"), std::vector<uint8_t>(8)), "data_offsets [9, 9) run past");
  expect_bad(image(entry(R"("U8")", "[1]", "[3,2]"), std::vector<uint8_t>(8)), "data_offsets [3, 2) end before they begin");
  expect_bad(image(entry(R"("U8")", "[1]", "[0]"), std::vector<uint8_t>(8)), "is not a pair of non-negative integers");
  expect_bad(image(entry(R"("U8")", "[1]", "[-1,0]"), std::vector<uint8_t>(8)), "is not a pair of non-negative integers");
}

TEST_F(Malformed, OverlappingRanges) {
  expect_bad(image(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                   R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                   std::vector<uint8_t>(24)),
             "tensors 'a' [0, 16) and 'b' [8, 24) overlap");
  // Listed out of offset order, still caught; an empty tensor inside another's range is not an overlap.
  expect_bad(image(R"({"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},"e":{"dtype":"U8","shape":[0],)"
                   R"("data_offsets":[5,5]},"a":{"dtype":"U8","shape":[5],"data_offsets":[0,5]}})",
                   std::vector<uint8_t>(8)),
             "tensors 'a' [0, 5) and 'b' [4, 8) overlap");
}

TEST_F(Malformed, MetadataNotStringMap) {
  expect_bad(image(R"({"__metadata__":{"k":1}})"), "__metadata__ is not a map of strings to strings: key 'k' holds a number");
  expect_bad(image(R"({"__metadata__":["k"]})"), "__metadata__ is not a map of strings to strings (it is a array)");
  expect_bad(image(R"({"__metadata__":{"k":{"n":"v"}}})"), "key 'k' holds a object");
}

TEST_F(Malformed, NamesWithControlCharactersStayOnOneLine) {
  expect_bad(image(R"({"a\nb":{"dtype":"F17","shape":[],"data_offsets":[0,0]}})"), "tensor 'a\\x0Ab': unknown dtype");
}

TEST_F(Malformed, NotARegularFileOrMissing) {
  expect_error([&] { SafetensorsFile f(dir_); }, dir_, "not a regular file");
  const std::string p = path("absent.safetensors");
  expect_error([&] { SafetensorsFile f(p); }, p, "cannot open: No such file or directory");
}

// A FIFO or a device opened as an input would block or read forever; it is refused before any read.
// alarm() turns a regression (a hang in open) into a failed test instead of a stuck one.
TEST_F(Malformed, FifoAndDeviceAreRefusedWithoutBlocking) {
  const std::string fifo = path("pipe.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ::alarm(20);
  expect_error([&] { SafetensorsFile f(fifo); }, fifo, "a FIFO, not a regular file");
  expect_error([&] { read_regular_file(fifo, "config file"); }, fifo, "config file is a FIFO");
  expect_error([&] { read_regular_file("/dev/zero"); }, "/dev/zero", "a character device, not a regular file");
  expect_error([&] { Trace t(fifo); }, fifo, "a FIFO");
  ::alarm(0);
}

// Header parsing and writing are linear in the tensor count (the ordered_json header took minutes at 100k): ten
// times the tensors takes well under 30 times as long (a quadratic parse takes 100 times). A ratio, not a time
// limit, so a loaded machine or a sanitizer build slows both sides alike.
TEST_F(Safetensors, HundredThousandTensorsParseInLinearTime) {
  // Appended rather than "t" + std::to_string(i): GCC 12 warns (-Wrestrict) about its own inlined operator+.
  auto name = [](int i) { return std::string("t").append(std::to_string(i)); };
  auto seconds = [&](int n, const std::string& p) {
    std::vector<OutTensor> out;
    out.reserve(size_t(n));
    for (int i = 0; i < n; ++i) out.push_back(make_u8(name(i), {1}, {uint8_t(i)}));
    const auto t0 = std::chrono::steady_clock::now();
    write_safetensors(p, out);
    const SafetensorsFile f(p);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(f.tensors().size(), size_t(n));
    EXPECT_EQ(f.tensors()[size_t(n) / 8].name, name(n / 8));  // header order kept
    EXPECT_EQ(f.read_bytes(name(n - 1))[0], uint8_t((n - 1) % 256));
    return s;
  };
  const double small = std::min(seconds(10000, path("s1.safetensors")), seconds(10000, path("s2.safetensors")));
  const double large = seconds(100000, path("many.safetensors"));
  EXPECT_LT(large, 30 * small) << "write + parse: 10000 tensors " << small << " s, 100000 tensors " << large << " s";
}

// Outputs appear under their final name only when complete: a failed write leaves neither the final name
// nor the temporary behind, and an existing file there is untouched.
TEST_F(Safetensors, AtomicWriteLeavesNothingOnFailure) {
  const std::string p = path("keep.safetensors");
  write_bytes(p, {1, 2, 3});
  expect_error([&] { write_safetensors(p, {make_u8("a", {1}, {1}), make_u8("a", {1}, {2})}); }, p, "given twice");
  EXPECT_EQ(read_bytes(p), (std::vector<uint8_t>{1, 2, 3}));
  {
    AtomicFile f(path("never.json"));
    f.write("{}", 2);
  }  // destroyed without commit
  EXPECT_FALSE(std::filesystem::exists(path("never.json")));
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u) << "a temporary file was left behind";
  write_file_atomic(path("done.json"), "{}\n");
  EXPECT_EQ(read_bytes(path("done.json")).size(), 3u);
}

// ---- read_f32 errors -----------------------------------------------------------------------------

TEST_F(Safetensors, ReadF32NamesNonFiniteElement) {
  const std::string p = path("nf.safetensors");
  std::vector<float> v(12, 1.0f);
  v[5] = NAN;
  std::vector<float> w(4, 0.5f);
  w[3] = INFINITY;
  const uint16_t h[3] = {0x3C00, 0xFC00, 0x3C00};  // F16: 1, -Inf, 1
  std::vector<uint8_t> hb(6);
  std::memcpy(hb.data(), h, 6);
  write_safetensors(p, {make_f32("x", {3, 4}, v), make_bf16("w", {2, 2}, w), {"h", DType::F16, {3}, hb},
                        make_u8("u", {1}, {0})});
  SafetensorsFile f(p);
  expect_error([&] { f.read_f32("x"); }, p, "tensor 'x' element 5 is NaN");
  expect_error([&] { f.read_f32("w"); }, p, "tensor 'w' element 3 is +Inf");
  expect_error([&] { f.read_f32("h"); }, p, "tensor 'h' element 1 is -Inf");
  EXPECT_TRUE(std::isnan(f.read_f32("x", /*check_finite=*/false)[5]));
  expect_error([&] { f.read_f32("u"); }, p, "tensor 'u' has dtype U8; only F32, BF16 and F16 read as FP32");
  expect_error([&] { f.info("nope"); }, p, "no tensor 'nope'");
  expect_error([&] { f.read_f32("nope"); }, p, "no tensor 'nope'");
}

}  // namespace
}  // namespace fp4lab::io::test
