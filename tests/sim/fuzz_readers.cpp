// libFuzzer target for fp4lab's text readers: the simulator's configuration file (cli::load_sim_config), the GEMM
// shape list (sim::read_shapes), a config file's text in either form, `key = value` or JSON
// (cli::parse_option_text, what every --config FILE goes through), and the sweep file of `fp4lab sim --sweep`
// (cli::parse_sweep). The first byte picks the reader (its value mod 4), the rest is the file. Any input may be
// rejected, but only with the reader's own exception, one line of bounded length (naming the file where the reader
// knows it); a crash, a sanitizer report, a hang or any other exception escaping is a finding. What a reader
// accepts must hold the documented ranges and limits (docs/spec.md §11.1).
//
// With FP4LAB_FUZZ_SEEDS=<dir> set, the binary writes its seed corpus (the bundled configs, shape lists and sweep
// file, and broken variants) and exits; FP4LAB_ROOT names the repository for the bundled files.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <set>
#include <string>

#include "fp4lab/sim/config.hpp"
#include "fp4lab/sim/workload.hpp"
#include "option_file.hpp"
#include "sim_config.hpp"
#include "sweep_reader.hpp"

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

enum Reader : char { kShapes = 0, kConfig = 1, kOptionText = 2, kSweep = 3 };

void seed(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  const char* root = std::getenv("FP4LAB_ROOT");
  int n = 0;
  auto put = [&](Reader kind, const std::string& text) {
    std::ofstream(dir + "/seed" + std::to_string(n++), std::ios::binary) << char(kind) << text;
  };
  if (root) {
    for (const char* sub : {"/sim/configs", "/workloads/shapes", "/sim/experiments"}) {
      for (const auto& e : fs::directory_iterator(std::string(root) + sub)) {
        const std::string ext = e.path().extension().string();
        if (ext != ".cfg" && ext != ".csv" && ext != ".toml") continue;
        std::ifstream in(e.path(), std::ios::binary);
        const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        const Reader kind = ext == ".cfg" ? kConfig : ext == ".csv" ? kShapes : kSweep;
        put(kind, text);
        put(kind, text.substr(0, text.size() / 2));  // truncated
      }
    }
  }
  put(kConfig, "clock_ghz = inf\n");
  put(kConfig, "tcu.count = 1000000\n");
  put(kConfig, "config = other.cfg\n");
  put(kConfig, "{\"clock_ghz\": 1.5, \"mac.units\": [4, 8]}");
  put(kShapes, "gemm,tokens,in,out\nx,9223372036854775807,16,16\n");
  put(kShapes, "gemm,tokens,in,out,count\nx,16,16,16,nan\n");
  put(kShapes, "gemm,tokens,in,out,count\nx,16,16,16,1e300\ny,16,16,16,2147483648\n");
  put(kOptionText, "recipe = ufp4\nrht = 16\nformat = e1m2\n");
  put(kOptionText, "{\"recipe\": \"ufp4\", \"rht\": 16, \"rht-signs\": [\"+1\", \"-1\"], \"tile2d\": true}");
  put(kOptionText, "{\"config\": {\"recipe\": \"nvfp4\", \"recipe\": \"ufp4\"}, \"total\": {}}");
  put(kOptionText, "{\"\": 1, \"format\": \"e2\\u0000m1\"}");
  // An unknown key holding the parser's own placeholder: Boost wording its error never ended (found by this target).
  put(kOptionText, "recipe-option '%canonical_option%'1 = x\n");
  put(kSweep, "[defaults]\nrecipe = \"ufp4\"\n[[grid]]\nname = \"{recipe}_{mac.kind}\"\nmac.kind = [\"e2m1\", \"dual\"]\n");
  put(kSweep, "[[grid]]\nname = \"{a}\"\na = [\"{a}{a}\", \"x\"]\nb = [1, 2, 3]\nc = [1.5, true, false]\n");
  put(kSweep, "[meta]\nwho = \"x\"\n[[grid]]\nprep.mode = \"fused\"\n\"prep.mode\" = \"frontend\"\n");
}

// What a refusal may look like: one line, not megabytes long (a message echoes at most an excerpt of the input).
bool one_bounded_line(const std::string& m) { return !m.empty() && m.size() <= 600 && m.find('\n') == std::string::npos; }

void option_text(const std::string& text) {
  namespace po = boost::program_options;
  po::options_description desc;
  desc.add_options()("recipe", po::value<std::string>())("format", po::value<std::string>())(
      "rht", po::value<std::string>())("rht-signs", po::value<std::string>())("block", po::value<int>())(
      "tile2d", po::value<bool>()->implicit_value(true))("formats", po::value<std::vector<std::string>>()->multitoken())(
      "config", po::value<std::string>())("mac.units", po::value<std::vector<int>>()->multitoken());
  try {
    const po::parsed_options parsed = fp4lab::cli::parse_option_text(text, desc);
    for (const po::option& o : parsed.options)
      for (const std::string& v : o.value)
        if (v.size() > fp4lab::cli::kMaxOptionValue || v.find('\0') != std::string::npos) __builtin_trap();
    po::variables_map vm;
    fp4lab::cli::store_option_text(parsed, vm);  // may refuse a value of the wrong type or a repeated option: po::error
    po::notify(vm);
  } catch (const po::error& e) {
    if (!one_bounded_line(e.what())) __builtin_trap();
  } catch (const std::runtime_error& e) {  // io::Error: a %placeholder% in the text
    if (!one_bounded_line(e.what())) __builtin_trap();
  }
}

void sweep(const std::string& text) {
  namespace cli = fp4lab::cli;
  try {
    nlohmann::ordered_json meta;
    const std::vector<cli::SweepRun> runs = cli::parse_sweep(text, "s.toml", meta);
    if (runs.empty() || runs.size() > cli::kMaxSweepRuns) __builtin_trap();
    std::set<std::string> names;
    for (const cli::SweepRun& r : runs) {
      if (r.name.size() > cli::kMaxSweepName || !names.insert(r.name).second) __builtin_trap();
      for (const auto& [k, v] : r.opts)
        if (k.empty() || k == "sweep" || k == "out" || k == "json" || k == "help" || k == "version") __builtin_trap();
    }
  } catch (const cli::SweepError& e) {
    const std::string m = e.what();
    if (m.rfind("s.toml", 0) != 0 || !one_bounded_line(m)) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] & 3) {
    case kOptionText:
      option_text(text);
      return 0;
    case kSweep:
      sweep(text);
      return 0;
    default:
      break;
  }
  const std::string path = scratch_path();
  write_file(path, data + 1, size - 1);
  try {
    if (data[0] & 1) {
      const fp4lab::sim::Config c = fp4lab::cli::load_sim_config(path);
      if (!(c.clock_ghz > 0) || !std::isfinite(c.clock_ghz)) __builtin_trap();  // accepted means in range
    } else {
      for (const fp4lab::sim::LayerShape& s : fp4lab::sim::read_shapes(path))
        if (s.tokens <= 0 || s.in <= 0 || s.out <= 0 || !(s.count >= 1) || s.count > fp4lab::sim::kMaxShapeCount ||
            s.count != std::floor(s.count))
          __builtin_trap();
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
