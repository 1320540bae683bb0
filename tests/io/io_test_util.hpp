// Shared helpers for the io tests: a per-test temp folder, raw file writing, and the error-message check.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fp4lab/io/safetensors.hpp"

namespace fp4lab::io::test {

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "fp4lab_io_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (std::filesystem::path(dir_) / name).string(); }
  std::string dir_;
};

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}
inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// A safetensors image built by hand: u64 length, header text as given (no padding), data bytes.
inline std::vector<uint8_t> image(const std::string& header, const std::vector<uint8_t>& data = {},
                                  uint64_t declared_len = UINT64_MAX) {
  const uint64_t n = declared_len == UINT64_MAX ? header.size() : declared_len;
  // Sized once and filled by copy (vector::insert here trips a false GCC 12 -Warray-bounds).
  std::vector<uint8_t> b(8 + header.size() + data.size());
  std::memcpy(b.data(), &n, 8);
  std::copy(header.begin(), header.end(), b.begin() + 8);
  std::copy(data.begin(), data.end(), b.begin() + 8 + std::ptrdiff_t(header.size()));
  return b;
}

// Runs fn, which must throw fp4lab::io::Error whose message starts with "<file>: ", contains `fault`
// and is one line.
template <class F>
void expect_error(F&& fn, const std::string& file, const std::string& fault) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind(file + ": ", 0), 0u) << "message does not start with the file: " << m;
    EXPECT_NE(m.find(fault), std::string::npos) << "expected fault \"" << fault << "\" in: " << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << "message is not one line: " << m;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-io exception: " << e.what() << " (wanted: " << fault << ")";
    return;
  }
  ADD_FAILURE() << "no exception; wanted \"" << fault << "\" for " << file;
}

inline uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

}  // namespace fp4lab::io::test
