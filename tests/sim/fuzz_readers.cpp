// libFuzzer target for the simulator's text readers: the configuration file (sim::Config::load) and the GEMM
// shape list (sim::read_shapes). The first byte picks the reader, the rest is the file. Any input may be
// rejected, but only with std::invalid_argument naming the file; a crash, a sanitizer report, a hang or any
// other exception escaping is a finding. An accepted configuration must hold the documented ranges.
//
// With FP4LAB_FUZZ_SEEDS=<dir> set, the binary writes its seed corpus (the bundled configs and shape lists and
// broken variants) and exits; FP4LAB_ROOT names the repository for the bundled files.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "fp4lab/sim/config.hpp"
#include "fp4lab/sim/workload.hpp"

namespace {

std::string scratch_path() {
  static const std::string p =
      (std::filesystem::temp_directory_path() / ("fp4lab_fuzz_readers_" + std::to_string(::getpid()))).string();
  return p;
}

void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
}

void seed(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  const char* root = std::getenv("FP4LAB_ROOT");
  int n = 0;
  auto put = [&](char kind, const std::string& text) {
    std::ofstream(dir + "/seed" + std::to_string(n++), std::ios::binary) << kind << text;
  };
  if (root) {
    for (const char* sub : {"/sim/configs", "/workloads/shapes"}) {
      for (const auto& e : fs::directory_iterator(std::string(root) + sub)) {
        const std::string ext = e.path().extension().string();
        if (ext != ".cfg" && ext != ".csv") continue;
        std::ifstream in(e.path(), std::ios::binary);
        const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        put(ext == ".cfg" ? 'c' : 's', text);
        put(ext == ".cfg" ? 'c' : 's', text.substr(0, text.size() / 2));  // truncated
      }
    }
  }
  put('c', "clock_ghz = inf\n");
  put('c', "tcu.count = 1000000\n");
  put('c', "config = other.cfg\n");
  put('s', "gemm,tokens,in,out\nx,9223372036854775807,16,16\n");
  put('s', "gemm,tokens,in,out,count\nx,16,16,16,nan\n");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string path = scratch_path();
  write_file(path, data + 1, size - 1);
  try {
    if (data[0] & 1) {
      const fp4lab::sim::Config c = fp4lab::sim::Config::load(path);
      if (!(c.clock_ghz > 0) || !std::isfinite(c.clock_ghz)) __builtin_trap();  // accepted means in range
    } else {
      for (const fp4lab::sim::LayerShape& s : fp4lab::sim::read_shapes(path))
        if (s.tokens <= 0 || s.in <= 0 || s.out <= 0 || !(s.count > 0) || !std::isfinite(s.count)) __builtin_trap();
    }
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).rfind(path, 0) != 0) __builtin_trap();  // the message names the file first
  }
  return 0;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("FP4LAB_FUZZ_SEEDS")) {
    seed(dir);
    std::exit(0);
  }
  return 0;
}
