// Interop with the reference implementation: files written by Python's safetensors read here, and files
// written here read there, with BF16 rounding checked against ml_dtypes. Skipped (not passed) when
// python3 lacks safetensors or ml_dtypes.
#include <cmath>
#include <cstdlib>
#include <random>

#include "io_test_util.hpp"

namespace fp4lab::io::test {
namespace {

using Interop = TempDir;

const std::string kScript = std::string(FP4LAB_IO_TEST_DIR) + "/interop.py";

bool python_ready() {
  return std::system("python3 -c 'import safetensors.numpy, ml_dtypes' >/dev/null 2>&1") == 0;
}

TEST_F(Interop, ReadsFileWrittenByPythonSafetensors) {
  if (!python_ready()) GTEST_SKIP() << "python3 with safetensors and ml_dtypes not available";
  const std::string p = path("py.safetensors");
  ASSERT_EQ(std::system(("python3 " + kScript + " write " + p).c_str()), 0);
  SafetensorsFile f(p);
  EXPECT_EQ(f.metadata().at("fp4lab.trace.version"), "1");
  EXPECT_EQ(f.metadata().at("model"), "py");
  EXPECT_EQ(f.info("f32").shape, (std::vector<int64_t>{3, 4}));
  const std::vector<float> a = f.read_f32("f32");
  ASSERT_EQ(a.size(), 12u);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(a[size_t(i)], float(i) * 0.25f - 1.0f) << i;
  const std::vector<float> h = f.read_f32("f16");
  EXPECT_EQ(h, (std::vector<float>{5.9604644775390625e-08f, 65504.0f, -0.0f, 0.333251953125f}));
  EXPECT_TRUE(std::signbit(h[2]));
  // ml_dtypes' RTNE: the tie 1 + 2^-8 goes to 1.0, the tie 1 + 3*2^-8 to 1 + 2^-6.
  EXPECT_EQ(f.read_f32("bf16"), (std::vector<float>{1.0f, 1.0f, 1.015625f, -2.5f}));
  EXPECT_EQ(f.info("i64").dtype, DType::I64);
  int64_t i64[2];
  std::memcpy(i64, f.read_bytes("i64").data(), 16);
  EXPECT_EQ(i64[0], -1);
  EXPECT_EQ(i64[1], int64_t(1) << 40);
}

TEST_F(Interop, PythonReadsFileWrittenHereAndAgreesOnBf16Rounding) {
  if (!python_ready()) GTEST_SKIP() << "python3 with safetensors and ml_dtypes not available";
  // Random FP32 values, a quarter of them exact BF16 ties, so RTNE's tie rule is exercised.
  std::mt19937 rng(7);
  std::vector<float> src(64 * 64);
  for (size_t i = 0; i < src.size(); ++i) {
    uint32_t u = (rng() & 0x3FFFFFFFu) | (rng() & 0x80000000u);  // finite: exponent top bit clear
    if (i % 4 == 0) u = (u & 0xFFFF0000u) | 0x8000u;
    src[i] = from_bits(u);
  }
  std::vector<uint8_t> u8(10);
  for (int i = 0; i < 10; ++i) u8[size_t(i)] = uint8_t(i);
  const std::string p = path("cpp.safetensors");
  write_safetensors(p, {make_f32("src", {64, 64}, src), make_bf16("bf16", {64, 64}, src), make_u8("u8", {10}, u8)},
                    {{"fp4lab.trace.version", "1"}, {"writer", "c++"}});
  EXPECT_EQ(std::system(("python3 " + kScript + " check " + p).c_str()), 0);
}

}  // namespace
}  // namespace fp4lab::io::test
