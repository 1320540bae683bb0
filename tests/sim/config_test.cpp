// Bad configurations, shape lists and jobs give one-line errors that name the file (and line) and the fault.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "fp4lab/sim/run.hpp"
#include "sim_test_util.hpp"

namespace fp4lab::sim::test {
namespace {

namespace fs = std::filesystem;

// Every file write_temp makes is removed when the test program exits, also where a test returns early or a
// failed assertion skips its own removal.
struct TempFiles {
  std::vector<fs::path> paths;
  ~TempFiles() {
    std::error_code ec;
    for (const fs::path& p : paths) fs::remove(p, ec);
  }
};
TempFiles& temp_files() {
  static TempFiles files;
  return files;
}

std::string write_temp(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / ("fp4lab_sim_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p) << text;
  temp_files().paths.push_back(p);
  return p.string();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Config, BothShippedConfigurationsLoad) {
  const Config t = config("teaching"), h = config("h100-class");
  EXPECT_EQ(t.name, "teaching");
  EXPECT_EQ(t.peak_macs_per_cycle(), 64);
  EXPECT_EQ(h.name, "h100-class");
  EXPECT_EQ(h.tcus, 132);
  EXPECT_EQ(h.prep, PrepMode::fused);
}

// A report's configuration (Config::to_json) holds every key a configuration file takes, and read back as a
// file (JSON form) gives the same Config: the energy table included, doubles to the last bit.
TEST(Config, JsonFormHoldsEveryKeyAndReadsBackEqual) {
  std::set<std::string> keys;
  const boost::program_options::options_description desc = cli::sim_config_options();
  for (const auto& o : desc.options()) keys.insert(o->long_name());
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"teaching", {}},
      {"h100-class", {}},
      // Values with no short decimal form, and 0 for quant.sr_lanes (meaning quant.lanes).
      {"teaching", {"clock.ghz=1.0000000000000002", "energy.mac_dual_pj=0.30000000000000004",
                    "dram.bandwidth=0.1", "energy.sr_pj=1e-300", "quant.sr_lanes=0", "mac.kind=e1m2"}},
      // Area and leakage set (all but the accumulator lane, left out at 0).
      {"h200-class-e1m2", {"area.um2_per_nand2=0.1"}}};
  for (const auto& [name, overrides] : cases) {
    const Config c = config(name, overrides);
    const nlohmann::json j = c.to_json();
    std::set<std::string> got, want = keys;
    for (const auto& [k, v] : j.items()) got.insert(k);
    // A key added after reports were published is written only when set (ConfigKey::omit_zero).
    for (const ConfigKey& k : config_keys())
      if (k.omit_zero && !j.contains(k.name)) want.erase(k.name);
    EXPECT_EQ(got, want) << name;
    const std::string file = write_temp(name + ".json", j.dump(1));
    EXPECT_TRUE(load(file) == c) << name << ": " << j.dump();
    // As a report holds it: under "config", beside the results.
    const std::string report = write_temp(name + "-report.json", nlohmann::json{{"config", j}, {"total", 1}}.dump());
    EXPECT_TRUE(load(report) == c) << name;
    fs::remove(file);
    fs::remove(report);
  }
  EXPECT_EQ(config("teaching").to_json()["energy.mac_dual_pj"], 0.022);  // sim/configs/teaching.cfg
}

TEST(Config, JsonFormErrorsNameTheFileAndTheKey) {
  const std::string unk = write_temp("unk.json", R"({"mac.unitz": 4})");
  std::string e = error_of([&] { load(unk); });
  EXPECT_EQ(e.rfind(unk + ": ", 0), 0u) << e;
  EXPECT_NE(e.find("mac.unitz"), std::string::npos) << e;
  const std::string nested = write_temp("nested.json", R"({"mac": {"units": 4}})");
  e = error_of([&] { load(nested); });
  EXPECT_NE(e.find(nested + ": "), std::string::npos) << e;
  const std::string bad = write_temp("bad.json", "{\"name\": \"x\",");
  e = error_of([&] { load(bad); });
  EXPECT_NE(e.find(bad + ": not valid JSON"), std::string::npos) << e;
  const std::string type = write_temp("type.json", R"({"tile.m": 16.5})");
  e = error_of([&] { load(type); });
  EXPECT_NE(e.find("16.5"), std::string::npos) << e;
  for (const auto& f : {unk, nested, bad, type}) fs::remove(f);
}

TEST(Config, OverridesWinOverTheFile) {
  const Config c = config("teaching", {"mac.units=8", "prep.mode=unfused"});
  EXPECT_EQ(c.mac_units, 8);
  EXPECT_EQ(c.prep, PrepMode::unfused);
}

TEST(Config, ErrorsNameTheFileAndTheFault) {
  const std::string missing = write_temp("missing.cfg", "name = x\nclock.ghz = 1\n");
  std::string e = error_of([&] { load(missing); });
  EXPECT_NE(e.find(missing), std::string::npos) << e;
  EXPECT_NE(e.find("missing key 'tcu.count'"), std::string::npos) << e;

  const std::string typo = write_temp("typo.cfg", "[mac]\nunits = 4\nunitz = 5\n");
  e = error_of([&] { load(typo); });
  EXPECT_NE(e.find(typo), std::string::npos) << e;
  EXPECT_NE(e.find("unitz"), std::string::npos) << e;

  e = error_of([&] { config("teaching", {"mac.kind=quad"}); });
  EXPECT_NE(e.find("teaching.cfg"), std::string::npos) << e;
  EXPECT_NE(e.find("mac.kind 'quad'"), std::string::npos) << e;

  e = error_of([&] { config("teaching", {"tile.k=48"}); });
  EXPECT_NE(e.find("tile.k must be a multiple of 32 (both block sizes), not 48"), std::string::npos) << e;
  e = error_of([&] { config("teaching", {"pass.elems=48"}); });
  EXPECT_NE(e.find("pass.elems must be a multiple of 32 (both block sizes), not 48"), std::string::npos) << e;

  e = error_of([&] { config("teaching", {"buffer.bytes=1000"}); });
  EXPECT_NE(e.find("cannot hold, per tile slot (tcu.ctas = 1), buffer.slots = 2"), std::string::npos) << e;

  e = error_of([&] { load("/nonexistent/x.cfg"); });
  EXPECT_NE(e.find("/nonexistent/x.cfg: cannot open"), std::string::npos) << e;
}

TEST(Config, ShippedShapeListsParse) {
  for (const char* f : {"dense-1.5b", "moe-mixtral-8x7b", "llama2-7b", "llama2-70b", "square-8192"}) {
    const auto layers = read_shapes(root() + "/workloads/shapes/" + f + ".csv");
    ASSERT_FALSE(layers.empty()) << f;
    for (const auto& l : layers) {
      EXPECT_EQ(l.tokens % 32, 0) << f << " " << l.gemm;
      EXPECT_EQ(l.in % 32, 0) << f << " " << l.gemm;
      EXPECT_EQ(l.out % 32, 0) << f << " " << l.gemm;
    }
  }
  const auto l70 = read_shapes(root() + "/workloads/shapes/llama2-70b.csv");
  EXPECT_EQ(l70[0].gemm, "linear_qkv");
  EXPECT_EQ(l70[0].out, (64 + 2 * 8) * 128);  // GQA: 64 query heads, 8 KV heads of 128
  EXPECT_EQ(l70[3].in, 28672);
  EXPECT_EQ(l70[3].count, 80);
}

TEST(Config, ShapeListErrorsNameFileAndLine) {
  const std::string bad = write_temp("bad.csv", "# c\ngemm,tokens,in,out\nfc1,4096,4096,11008\nfc2,4096,x,4096\n");
  std::string e = error_of([&] { read_shapes(bad); });
  EXPECT_NE(e.find(bad + ":4: in = 'x' is not a positive integer"), std::string::npos) << e;
  const std::string nohead = write_temp("nohead.csv", "fc1,1,2,3\n");
  e = error_of([&] { read_shapes(nohead); });
  EXPECT_NE(e.find(nohead + ":1: expected the header"), std::string::npos) << e;
  const std::string empty = write_temp("empty.csv", "gemm,tokens,in,out\n");
  e = error_of([&] { read_shapes(empty); });
  EXPECT_NE(e.find("no layers listed"), std::string::npos) << e;
}

TEST(Config, JobsTheHardwareCannotRunAreRefused) {
  Simulator sim(config("teaching"));
  std::string e = error_of([&] { sim.run(job(16, 16, 40)); });
  EXPECT_NE(e.find("K = 40 is not a multiple of the block size 16"), std::string::npos) << e;
  e = error_of([&] { sim.run(job(16, 16, 64, plain(128))); });
  EXPECT_NE(e.find("RHT size 128 must divide"), std::string::npos) << e;
}

// Every key has a documented range (docs/sim.md); NaN, Inf and values that would overflow the model's int
// arithmetic, hang it (a million TCU threads) or make its cycle counts meaningless are refused, naming the key.
TEST(Config, ValuesOutsideTheirRangeAreRefused) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"clock.ghz=inf", "clock.ghz = inf is outside"},
      {"clock.ghz=nan", "clock.ghz = nan is outside"},
      {"clock.ghz=1e-9", "clock.ghz"},
      {"dram.bandwidth=1e-300", "dram.bandwidth = 1e-300 is outside"},
      {"dram.bandwidth=inf", "dram.bandwidth"},
      {"energy.acc_pj=-1", "energy.acc_pj = -1 is outside"},
      {"energy.quant_pj=nan", "energy.quant_pj = nan is outside"},
      {"tile.m=2147483647", "tile.m = 2.14748e+09 is outside"},
      {"tile.k=2147483616", "tile.k"},
      {"tcu.count=1000000", "tcu.count = 1e+06 is outside"},
      {"mac.fallback_rate=1e-300", "mac.fallback_rate"},
      {"dram.latency=9223372036854775807", "dram.latency"},
      {"buffer.bytes=9223372036854775807", "buffer.bytes"},
  };
  for (const auto& [kv, want] : cases) {
    const std::string e = error_of([&] { config("teaching", {kv}); });
    EXPECT_NE(e.find(want), std::string::npos) << kv << ": " << e;
  }
}

// docs/sim.md's table of ranges is config_keys()'s: every numeric key in exactly one row, with its bounds, and the
// row saying so where the bound is on each tile slot's share, where the value must be a multiple of 32, and where
// 0 is allowed besides the range.
TEST(Config, DocumentedRangesAreTheKeyTable) {
  std::ifstream doc(root() + "/docs/sim.md");
  std::string line;
  while (std::getline(doc, line) && line != "| keys | range |") {
  }
  ASSERT_TRUE(std::getline(doc, line)) << "docs/sim.md has no table headed '| keys | range |'";
  auto is_number_key = [](const ConfigKey& k) {
    return std::holds_alternative<ConfigKey::Member<int>>(k.field) ||
           std::holds_alternative<ConfigKey::Member<int64_t>>(k.field) ||
           std::holds_alternative<ConfigKey::Member<double>>(k.field);
  };
  auto number = [](const std::string& t) {  // "0.001", "1024", "2^50", "10^9"
    const size_t hat = t.find('^');
    return hat == std::string::npos ? std::stod(t) : std::pow(std::stod(t.substr(0, hat)), std::stod(t.substr(hat + 1)));
  };
  const std::regex key_re("`([^`]+)`"), range_re("([0-9.^]+) \\.\\. ([0-9.^]+)");
  std::map<std::string, std::string> row_of;  // key -> its range cell
  while (std::getline(doc, line) && line.rfind("| ", 0) == 0) {
    const size_t bar = line.find(" | ", 2);
    ASSERT_NE(bar, std::string::npos) << line;
    const std::string keys = line.substr(2, bar - 2), range = line.substr(bar + 3);
    for (std::sregex_iterator m(keys.begin(), keys.end(), key_re), end; m != end; ++m) {
      const std::string pattern = (*m)[1];
      int matched = 0;
      for (const ConfigKey& k : config_keys()) {
        const bool match = pattern.rfind("*", 0) == 0 ? k.name.ends_with(pattern.substr(1))
                           : pattern.ends_with("*")   ? k.name.starts_with(pattern.substr(0, pattern.size() - 1))
                                                      : k.name == pattern;
        if (!match) continue;
        ++matched;
        EXPECT_TRUE(row_of.emplace(k.name, range).second) << k.name << " is in two rows of docs/sim.md";
      }
      EXPECT_GT(matched, 0) << "docs/sim.md names `" << pattern << "`, which is no key";
    }
  }
  for (const ConfigKey& k : config_keys()) {
    if (!is_number_key(k)) continue;
    SCOPED_TRACE(k.name);
    const auto it = row_of.find(k.name);
    ASSERT_NE(it, row_of.end()) << "no row of docs/sim.md's range table";
    const std::string& cell = it->second;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(cell, m, range_re)) << cell;
    EXPECT_EQ(number(m[1]), k.range.lo) << cell;
    EXPECT_EQ(number(m[2]), k.range.hi) << cell;
    EXPECT_EQ(cell.find("per tile slot") != std::string::npos, k.range.per_slot) << cell;
    EXPECT_EQ(cell.find("a multiple of 32") != std::string::npos, k.range.whole_blocks) << cell;
    EXPECT_EQ(cell.rfind("0, or ", 0) == 0, k.range.or_zero) << cell;
  }
}

// Keys without a default must be given; a file that leaves out any other key gets its member's value in Config{}.
TEST(Config, RequiredKeysAndDefaults) {
  const Config full = config("teaching");
  const nlohmann::json j = full.to_json();
  const Config plain;
  for (const ConfigKey& k : config_keys()) {
    SCOPED_TRACE(k.name);
    nlohmann::json without = j;
    without.erase(k.name);
    const std::string file = write_temp("without.json", without.dump());
    if (k.required) {
      const std::string e = error_of([&] { load(file); });
      EXPECT_NE(e.find("missing key '" + k.name + "'"), std::string::npos) << e;
    } else {
      nlohmann::json want = j;
      if (const nlohmann::json p = plain.to_json(); p.contains(k.name))
        want[k.name] = p[k.name];
      else
        want.erase(k.name);  // at 0, left out (ConfigKey::omit_zero)
      if (k.name == "quant.sr_lanes") want[k.name] = j["quant.lanes"];  // 0, the default, means quant.lanes
      if (k.name == "acc.fused_lanes") want[k.name] = j["acc.lanes"];   // and here acc.lanes
      Config c;
      const std::string e = error_of([&] { c = load(file); });
      ASSERT_EQ(e, "(no error)");
      EXPECT_EQ(c.to_json(), want);
    }
    fs::remove(file);
  }
}

// Option names are matched exactly: Boost's prefix guessing made `mac.unit` set mac.units.
TEST(Config, KeysAreNotGuessedFromPrefixes) {
  const std::string e = error_of([&] { config("teaching", {"mac.unit=3"}); });
  EXPECT_NE(e.find("mac.unit"), std::string::npos) << e;
  EXPECT_EQ(e.find("(no error)"), std::string::npos) << e;
}

// Boost.Program_options loops forever wording an error about a value holding '%value%' (found by the readers'
// fuzz target): refused in the file and in overrides before the parser sees it (alarm turns a hang into a failure).
TEST(Config, OptionPlaceholdersAreRefusedNotLoopedOn) {
  ::alarm(30);
  const std::string cfg = write_temp("ph.cfg", "tcu.count = 1argument ('%value%')0l0000\n");
  std::string e = error_of([&] { load(cfg); });
  EXPECT_EQ(e.rfind(cfg + ": ", 0), 0u) << e;
  EXPECT_NE(e.find("%value%"), std::string::npos) << e;
  e = error_of([&] { config("teaching", {"tcu.count=%option%"}); });
  EXPECT_NE(e.find("%option%"), std::string::npos) << e;
  // Any %name%: the fuzz target's second finding was %invalid_line%, in a line that is not `key = value`.
  const std::string bad_line = write_temp("ph2.cfg", "c tcu.count %invalid_line%%canonical_option%\n");
  e = error_of([&] { load(bad_line); });
  EXPECT_NE(e.find("%invalid_line%"), std::string::npos) << e;
  fs::remove(bad_line);
  ::alarm(0);
  fs::remove(cfg);
}

// A FIFO as a config file or shape list is refused at once (alarm turns a hang into a failure).
TEST(Config, FifoInputsAreRefusedNotWaitedOn) {
  const std::string fifo = write_temp("fifo", "");
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ::alarm(20);
  std::string e = error_of([&] { load(fifo); });
  EXPECT_NE(e.find(fifo + ": config file is a FIFO"), std::string::npos) << e;
  e = error_of([&] { read_shapes(fifo); });
  EXPECT_NE(e.find(fifo + ": shape list is a FIFO"), std::string::npos) << e;
  e = error_of([&] { load("/dev/null"); });
  EXPECT_NE(e.find("/dev/null: config file is a character device"), std::string::npos) << e;
  ::alarm(0);
  std::filesystem::remove(fifo);
}

// A job whose simulated time would pass the 64-bit picosecond clock is refused before it runs; it used to wrap
// and report a small cycle count.
TEST(Config, JobsPastTheClockRangeAreRefused) {
  Simulator sim(config("teaching", {"dram.bandwidth=0.001", "clock.ghz=0.001"}));
  const std::string e = error_of([&] { sim.run(job(1 << 20, 1 << 20, 1 << 20)); });
  EXPECT_NE(e.find("too large to simulate"), std::string::npos) << e;
}

// The typed interface a front-end builds a Config through, without any text: value() of every key given back to
// from() is the same Config, enums travel by name, a required key left out and a name outside an enum are refused.
TEST(Config, TypedValuesOfEveryKeyBuildTheSameConfig) {
  for (const char* name : {"teaching", "h100-class", "h200-class-e1m2"}) {
    const Config c = config(name);
    std::map<std::string, ConfigValue> values;
    for (const ConfigKey& k : config_keys()) values[k.name] = c.value(k);
    EXPECT_TRUE(Config::from(values) == c) << name;
  }
  const Config c = config("teaching", {"mac.kind=e1m2", "prep.mode=fused"});
  std::map<std::string, ConfigValue> values;
  for (const ConfigKey& k : config_keys()) values[k.name] = c.value(k);
  EXPECT_EQ(std::get<std::string>(values.at("mac.kind")), "e1m2");
  EXPECT_EQ(std::get<std::string>(values.at("prep.mode")), "fused");
  EXPECT_EQ(std::get<int>(values.at("mac.units")), c.mac_units);
  values["mac.kind"] = std::string("e3m0");
  EXPECT_EQ(error_of([&] { Config::from(values); }), "mac.kind 'e3m0' is not one of e2m1, e1m2, dual");
  values["mac.kind"] = std::string("e1m2");
  values.erase("prep.mode");
  EXPECT_TRUE(Config::from(values).prep == PrepMode::frontend);  // its default
  values.erase("mac.units");
  EXPECT_EQ(error_of([&] { Config::from(values); }),
            "missing key 'mac.units' (a TCU configuration file gives it: --config sim/configs/teaching.cfg)");
}

TEST(Config, OneSimulatorAtATime) {
  Simulator a(config("teaching"));
  EXPECT_THROW(Simulator b(config("teaching")), std::invalid_argument);
}

}  // namespace
}  // namespace fp4lab::sim::test

namespace fp4lab::sim::test {
namespace {

// fp4lab sim --kernel NAME --shape DIMS: RxK for quantize, MxNxK otherwise; the job is the kernel alone.
TEST(Config, KernelRunsTakeTheirShapes) {
  Simulator sim(config("teaching", {"prep.mode=fused"}));
  RunOptions opt;
  opt.quant = [](Pass, Operand, uint32_t) { return plain(16); };
  EXPECT_THROW(run_kernel(sim, JobKind::quantize, {16, 16, 64}, opt), std::invalid_argument);
  EXPECT_THROW(run_kernel(sim, JobKind::gemm, {16, 64}, opt), std::invalid_argument);
  const Report r = run_kernel(sim, JobKind::quantize, {16, 64}, opt);
  ASSERT_EQ(r.jobs.size(), 1u);
  EXPECT_EQ(r.jobs[0].kernel, "quantize");
  EXPECT_EQ(r.jobs[0].cycles, 199);  // as Timing.TeachingQuantizeKernelAloneAndItsLaunch works it out
  EXPECT_THROW(parse_job_kind("conv"), std::invalid_argument);
  EXPECT_EQ(parse_job_kind("unpack"), JobKind::unpack);
}

}  // namespace
}  // namespace fp4lab::sim::test
