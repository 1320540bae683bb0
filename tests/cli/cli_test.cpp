// End-to-end tests of the fp4lab command line: each subcommand is run as a process on files written here,
// and its outputs are compared bit for bit with the golden model called directly (fp4lab::quantize,
// fp4lab::reference::gemm_contract), with literal tables from docs/spec.md, and every bad input must give one
// line on stderr naming the file and the fault, with exit code 1 (data) or 2 (usage).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "options.hpp"
#include "fp4lab/analysis.hpp"
#include "fp4lab/format.hpp"
#include "fp4lab/gemm.hpp"
#include "fp4lab/io/safetensors.hpp"
#include "fp4lab/philox.hpp"
#include "fp4lab/quantize.hpp"
#include "fp4lab/recipe.hpp"
#include "fp4lab/rht.hpp"
#include "reference/contract_gemm.hpp"

#ifndef FP4LAB_BIN
#error "FP4LAB_BIN (path of the fp4lab executable) must be defined by the build"
#endif

namespace fp4lab {
namespace {

using nlohmann::json;

struct Result {
  int code = -1;
  std::string out, err;
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}
std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
template <class T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<float> normal(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

constexpr int64_t kRows = 32, kCols = 128, kN = 48;

struct ErrCase {
  std::vector<std::string> args;  // "@name" stands for path("name")
  int code;
  std::vector<std::string> want;  // substrings of the message ("@name" likewise)
};

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "fp4lab_cli_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    // x: Gaussian with outliers and one all-zero block; w: Gaussian; xb: x rounded to BF16, stored as BF16.
    x_ = normal(size_t(kRows * kCols), 1);
    x_[5] = 40.0f;
    x_[3 * kCols + 77] = -25.0f;
    for (int j = 0; j < 16; ++j) x_[7 * kCols + 32 + j] = 0.0f;
    w_ = normal(size_t(kN * kCols), 2, 0.05f);
    xb_ = x_;
    for (float& v : xb_) v = round_to_bf16(v);
    io::write_safetensors(path("in.safetensors"),
                          {io::make_f32("x", {kRows, kCols}, x_), io::make_f32("w", {kN, kCols}, w_),
                           io::make_bf16("xb", {kRows, kCols}, xb_)});
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string path(const std::string& name) const { return (std::filesystem::path(dir_) / name).string(); }

  // Runs each case and checks that it ends as one line starting with prefix(args) (the arguments with
  // "@name" expanded), with the case's exit code and wanted substrings; `no_output` also requires that path("o") was
  // not written.
  void expect_one_line_errors(const std::vector<ErrCase>& cases,
                              const std::function<std::string(const std::vector<std::string>&)>& prefix,
                              bool no_output) const {
    auto expand = [&](const std::string& s) {
      const size_t at = s.find('@');
      return at == std::string::npos ? s : s.substr(0, at) + path(s.substr(at + 1));
    };
    for (const ErrCase& k : cases) {
      std::vector<std::string> args;
      std::string shown;
      for (const auto& a : k.args) {
        args.push_back(expand(a));
        shown += " " + a;
      }
      SCOPED_TRACE("fp4lab" + shown);
      const Result r = run(args);
      EXPECT_EQ(r.code, k.code) << r.err;
      ASSERT_FALSE(r.err.empty());
      EXPECT_EQ(r.err.back(), '\n');
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
      EXPECT_EQ(r.err.rfind(prefix(args), 0), 0u) << r.err;
      for (const auto& w : k.want) EXPECT_NE(r.err.find(expand(w)), std::string::npos) << "want '" << expand(w) << "' in " << r.err;
      if (no_output) {
        EXPECT_FALSE(std::filesystem::exists(path("o"))) << "an output was written despite the error";
      }
    }
  }

  // stdout goes to `out` (a file of the test folder unless given). A hang becomes exit 124 (timeout), so a
  // regression fails the test instead of stalling the suite. `shell` goes first: variables (VAR=value) or commands
  // (ulimit -f 8;) for the run.
  Result run(const std::vector<std::string>& args, const std::string& out = "", const std::string& shell = "") const {
    std::string cmd = shell + " timeout 120 " + quote(FP4LAB_BIN);
    for (const auto& a : args) cmd.append(" ").append(quote(a));  // not " " + ...: GCC 12 -Wrestrict false positive
    cmd += " >" + quote(out.empty() ? path("stdout.txt") : out) + " 2>" + quote(path("stderr.txt"));
    const int st = std::system(cmd.c_str());
    Result r;
    r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    r.out = out.empty() ? slurp(path("stdout.txt")) : "";
    r.err = slurp(path("stderr.txt"));
    return r;
  }

  std::string dir_;
  std::vector<float> x_, w_, xb_;
};

// Raw bytes and shape of one output tensor, checked for dtype.
std::vector<uint8_t> tensor_bytes(const io::SafetensorsFile& f, const std::string& name, io::DType dt,
                                  const std::vector<int64_t>& shape) {
  EXPECT_TRUE(f.has(name)) << f.path() << " lacks " << name;
  if (!f.has(name)) return {};
  const io::TensorInfo& i = f.info(name);
  EXPECT_EQ(int(i.dtype), int(dt)) << name;
  EXPECT_EQ(i.shape, shape) << name;
  return f.read_bytes(name);
}

// ---- formats and bias: literal tables from docs/spec.md §1 and §6 ------------------------------------
TEST_F(Cli, FormatsJsonMatchesSpecTable) {
  const Result r = run({"formats", "--json", "-"});
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);  // stdout holds nothing but the JSON with --json -
  struct Row {
    const char* name;
    std::vector<double> levels;
    std::vector<int> ints;
    double factor, gmax;
    int emax;
  };
  const Row spec[] = {
      {"e2m1", {0, 0.5, 1, 1.5, 2, 3, 4, 6}, {0, 1, 2, 3, 4, 6, 8, 12}, 2, 6, 2},
      {"e1m2", {0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75}, {0, 1, 2, 3, 4, 5, 6, 7}, 4, 1.75, 0},
      {"int4", {0, 1, 2, 3, 4, 5, 6, 7}, {0, 1, 2, 3, 4, 5, 6, 7}, 1, 7, 2},
      {"e2m1_max2", {0, 0.5, 1, 1.5, 2}, {0, 1, 2, 3, 4}, 2, 2, 1},
  };
  ASSERT_EQ(j["formats"].size(), std::size(spec));
  for (size_t k = 0; k < std::size(spec); ++k) {
    const json& f = j["formats"][k];
    SCOPED_TRACE(spec[k].name);
    EXPECT_EQ(f["name"], spec[k].name);
    EXPECT_EQ(f["levels"].get<std::vector<double>>(), spec[k].levels);
    EXPECT_EQ(f["int_levels"].get<std::vector<int>>(), spec[k].ints);
    EXPECT_EQ(f["int_factor"].get<double>(), spec[k].factor);
    EXPECT_EQ(f["gmax"].get<double>(), spec[k].gmax);
    EXPECT_EQ(f["emax"].get<int>(), spec[k].emax);
  }
  std::vector<std::string> scales;
  for (const auto& s : j["scales"]) scales.push_back(s["name"]);
  EXPECT_EQ(scales, (std::vector<std::string>{"fp32", "ue4m3", "ue8m0", "ue8m0-ceil"}));
  EXPECT_EQ(j["scales"][1]["max"].get<double>(), 448.0);
}

TEST_F(Cli, FormatsTableListsEveryGrid) {
  const Result r = run({"formats"});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* s : {"e2m1", "e1m2", "int4", "e2m1_max2", "0 1 2 3 4 6 8 12", "ue4m3", "ue8m0-ceil"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << " missing from\n" << r.out;
}

TEST_F(Cli, BiasE2M1MatchesPaper) {
  const Result r = run({"bias", "--format", "e2m1", "--json", "-"});
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_EQ(j["levels"].size(), 8u);
  // The paper: E2M1 level 2 (index 4) has bin [1.75, 2.5], half-gaps 0.25 / 0.5, bias -0.125.
  const json& l2 = j["levels"][4];
  EXPECT_EQ(l2["level"].get<double>(), 2.0);
  EXPECT_EQ(l2["left_halfgap"].get<double>(), 0.25);
  EXPECT_EQ(l2["right_halfgap"].get<double>(), 0.5);
  EXPECT_EQ(l2["bias"].get<double>(), -0.125);
  const std::vector<LevelBias> model = analytic_bias(kE2M1);
  for (size_t i = 0; i < model.size(); ++i) EXPECT_EQ(j["levels"][i]["bias"].get<double>(), model[i].bias) << i;
}

TEST_F(Cli, BiasE1M2InteriorLevelsAreUnbiased) {
  const Result r = run({"bias", "--format", "e1m2", "--json", path("bias.json")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("bias"), std::string::npos);  // the table still goes to stdout
  const json j = json::parse(slurp(path("bias.json")));
  ASSERT_EQ(j["levels"].size(), 8u);
  for (int i = 1; i < 7; ++i) EXPECT_EQ(j["levels"][i]["bias"].get<double>(), 0.0) << i;
}

// ---- recipes: the table of every preset, and docs/spec.md's copy of it ---------------------------------------
json recipe_rows(const Result& r) {
  EXPECT_EQ(r.code, 0) << r.err;
  return json::parse(r.out)["operands"];
}
const json* find_row(const json& rows, const std::string& recipe, const std::string& pass, const std::string& op) {
  for (const json& j : rows)
    if (j["recipe"] == recipe && j["pass"] == pass && j["operand"] == op) return &j;
  return nullptr;
}

// --ablations adds the ablations' rows after the presets' own (unchanged); each checked against its name in
// docs/spec.md §2 (what the ablation turns off or on), not against recipe.cpp.
TEST_F(Cli, RecipesListsTheAblationsWhenAsked) {
  const json presets = recipe_rows(run({"recipes", "--json", "-"}));
  const json all = recipe_rows(run({"recipes", "--ablations", "--json", "-"}));
  ASSERT_EQ(all.size(), Recipe::names().size() * 3 * 2);
  for (size_t i = 0; i < presets.size(); ++i) EXPECT_EQ(all[i], presets[i]) << i;
  const json* r = find_row(all, "ufp4-rht-none", "fwd_y", "A");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ((*r)["rht"], 0);
  EXPECT_EQ((*r)["format"], "e1m2");
  r = find_row(all, "ufp4-rht-wgrad", "bwd_dw", "B");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ((*r)["rht"], 16);
  r = find_row(all, "ufp4-sr-grads", "bwd_dx", "B");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ((*r)["rounding"], "sr");
  r = find_row(all, "ufp4-sr-none", "bwd_dx", "A");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ((*r)["rounding"], "rtne");
  r = find_row(all, "e2m1-rht-all", "fwd_y", "A");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ((*r)["format"], "e2m1");
  EXPECT_EQ((*r)["rht"], 16);
  const Result text = run({"recipes", "--ablations"});
  EXPECT_EQ(text.code, 0);
  EXPECT_NE(text.out.find("\nufp4-rht-fwd-wgrad  fwd_y   A  fwd_x   e1m2"), std::string::npos) << text.out;
}

TEST_F(Cli, RecipesListsWhatEachOperandGets) {
  const json rows = recipe_rows(run({"recipes", "--json", "-"}));
  ASSERT_EQ(rows.size(), Recipe::preset_names().size() * 3 * 2);
  // Rows written out from docs/spec.md §2's description of the presets, not from recipe.cpp.
  const json* r = find_row(rows, "ufp4", "bwd_dx", "A");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ((*r)["role"], "bwd_dy");
  EXPECT_EQ((*r)["format"], "e1m2");
  EXPECT_EQ((*r)["rounding"], "sr");
  EXPECT_EQ((*r)["rht"], 16);
  EXPECT_EQ((*r)["rht_signs_kind"], "te");
  r = find_row(rows, "ufp4", "bwd_dx", "B");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ((*r)["role"], "fwd_w");
  EXPECT_EQ((*r)["rounding"], "rtne");
  r = find_row(rows, "nvfp4", "fwd_y", "B");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ((*r)["role"], "fwd_w");
  EXPECT_EQ((*r)["tile2d"], true);
  EXPECT_EQ((*r)["scale"], "ue4m3");
  EXPECT_EQ((*r)["rht"], 0);
  r = find_row(rows, "nvfp4", "bwd_dw", "B");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ((*r)["role"], "fwd_x");
  EXPECT_EQ((*r)["tile2d"], false);
  EXPECT_EQ((*r)["rht"], 16);
  EXPECT_EQ((*r)["rht_bf16"], true);
  r = find_row(rows, "e2m1-ref", "fwd_y", "A");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ((*r)["rht"], 0);
  EXPECT_EQ((*r)["rht_signs_kind"], "-");
  for (const json& j : rows) {
    if (j["recipe"] != "mxfp4") continue;
    SCOPED_TRACE(j.dump());
    EXPECT_EQ(j["format"], "e2m1");
    EXPECT_EQ(j["block"], 32);
    EXPECT_EQ(j["scale"], "ue8m0");
    EXPECT_EQ(j["rht"], 0);
    EXPECT_EQ(j["rounding"], "rtne");
  }
  // And every row is what the model gives that operand.
  for (const json& j : rows) {
    SCOPED_TRACE(j.dump());
    const Pass p = j["pass"] == "fwd_y" ? Pass::fwd_y : j["pass"] == "bwd_dx" ? Pass::bwd_dx : Pass::bwd_dw;
    const Operand o = j["operand"] == "A" ? Operand::a : Operand::b;
    const QuantConfig c = Recipe::preset(j["recipe"].get<std::string>()).operand(p, o);
    EXPECT_EQ(j["role"], operand_role(p, o));
    EXPECT_EQ(j["label"], c.label());
    EXPECT_EQ(j["rht_bf16"], c.rht_bf16);
  }
}

// docs/spec.md §3 states the RHT sizes the knob parser accepts (one definition: kMinRht..kMaxRht), and the
// command line refuses the first size outside them.
TEST_F(Cli, SpecRhtSizesAgreeWithTheParser) {
  const std::string doc = slurp(FP4LAB_SOURCE_DIR "/docs/spec.md");
  EXPECT_NE(doc.find("a power of two from " + std::to_string(kMinRht) + " to " + std::to_string(kMaxRht)),
            std::string::npos);
  EXPECT_EQ(run({"analyze", "--rht", std::to_string(kMinRht / 2)}).code, 2);
}

// docs/spec.md §2 carries the table `fp4lab recipes --markdown --ablations` prints (presets, then ablations); it
// is parsed here and compared cell by cell with the JSON, so the document cannot drift from the code.
TEST_F(Cli, SpecRecipeTableAgreesWithRecipes) {
  const json rows = recipe_rows(run({"recipes", "--ablations", "--json", "-"}));
  std::istringstream doc(slurp(FP4LAB_SOURCE_DIR "/docs/spec.md"));
  auto cells = [](const std::string& line) {
    std::vector<std::string> c;
    std::stringstream ss(line.substr(1));
    for (std::string cell; std::getline(ss, cell, '|');) {
      cell.erase(std::remove(cell.begin(), cell.end(), '`'), cell.end());
      const size_t b = cell.find_first_not_of(' '), e = cell.find_last_not_of(' ');
      c.push_back(b == std::string::npos ? "" : cell.substr(b, e - b + 1));
    }
    return c;
  };
  // Column heading -> JSON key.
  const std::vector<std::pair<std::string, std::string>> columns = {
      {"recipe", "recipe"}, {"pass", "pass"},       {"operand", "operand"},     {"role", "role"},
      {"grid", "format"},   {"block", "block"},     {"scale", "scale"},         {"2-D tiles", "tile2d"},
      {"RHT", "rht"},       {"RHT signs", "rht_signs_kind"}, {"BF16 rotation", "rht_bf16"}, {"rounding", "rounding"}};
  std::vector<std::string> heading;
  for (const auto& [h, k] : columns) heading.push_back(h);
  std::vector<std::vector<std::string>> table;
  bool in_table = false;
  for (std::string line; std::getline(doc, line);) {
    if (!in_table) {
      in_table = line.rfind("|", 0) == 0 && cells(line) == heading;
      if (in_table) std::getline(doc, line);  // the |---| line
      continue;
    }
    if (line.rfind("|", 0) != 0) break;
    table.push_back(cells(line));
  }
  ASSERT_TRUE(in_table) << "docs/spec.md has no recipe table with the columns of `fp4lab recipes --markdown "
                           "--ablations`";
  ASSERT_EQ(table.size(), rows.size()) << "docs/spec.md's recipe table has another number of rows";
  for (size_t i = 0; i < rows.size(); ++i) {
    ASSERT_EQ(table[i].size(), columns.size()) << "row " << i + 1;
    for (size_t c = 0; c < columns.size(); ++c) {
      const json& v = rows[i][columns[c].second];
      const std::string want = v.is_boolean() ? (v.get<bool>() ? "yes" : "no")
                               : v.is_string() ? v.get<std::string>()
                                               : v.dump();
      EXPECT_EQ(table[i][c], want) << "docs/spec.md recipe table row " << i + 1 << " (" << rows[i]["recipe"] << " "
                                   << rows[i]["pass"] << " " << rows[i]["operand"] << "), column "
                                   << columns[c].first;
    }
  }
}

// ---- quantize: outputs equal fp4lab::quantize bit for bit ---------------------------------------------
struct QCase {
  const char* name;
  const char* tensor;
  std::vector<std::string> args;
  QuantConfig cfg;  // written out here, independently of the CLI's option code
};

QuantConfig cfg_with(QuantConfig c, auto&& edit) {
  edit(c);
  return c;
}

std::vector<QCase> quantize_cases() {
  std::vector<float> signs16 = {1, -1, -1, 1, 1, 1, -1, 1, -1, -1, 1, -1, 1, 1, 1, -1};
  return {
      {"e1m2_b16_fp32scale_rht0_rtne", "x", {}, QuantConfig{}},
      {"e1m2_b16_fp32scale_rht0_rtne_bf16in", "xb", {}, QuantConfig{}},
      {"e2m1_b16_ue4m3scale_rht0_rtne", "x", {"--format", "e2m1", "--scale", "ue4m3"},
       cfg_with(QuantConfig{}, [](QuantConfig& c) { c.format = kE2M1; c.scale = ScaleKind::ue4m3; })},
      {"int4_b32_ue8m0scale_rht0_rtne", "x", {"--format", "int4", "--block", "32", "--scale", "ue8m0"},
       cfg_with(QuantConfig{}, [](QuantConfig& c) { c.format = kInt4; c.block = 32; c.scale = ScaleKind::ue8m0; })},
      {"e2m1_max2_b16_ue8m0-ceilscale_rht0_rtne", "x", {"--format", "e2m1_max2", "--scale", "ue8m0-ceil"},
       cfg_with(QuantConfig{}, [](QuantConfig& c) { c.format = kE2M1Max2; c.scale = ScaleKind::ue8m0_ceil; })},
      {"e1m2_b16_fp32scale_rht32seed7_sr", "x",
       {"--rht", "32", "--rht-seed", "7", "--rounding", "sr", "--seed", "11", "--stream", "3"},
       cfg_with(QuantConfig{}, [](QuantConfig& c) {
         c.rht = 32;
         c.rht_signs = rht_signs_from_seed(32, 7);
         c.rounding = Rounding::sr;
         c.seed = 11;
         c.stream = 3 * 8;  // GEMM id 3, pass fwd_y, operand A
       })},
      {"e1m2_b16_fp32scale_rht16signs_rtne", "x",
       {"--rht-signs", "+1,-1,-1,1,+,1,-,1,-1,-1,1,-1,1,1,1,-1"},
       cfg_with(QuantConfig{}, [&](QuantConfig& c) { c.rht = 16; c.rht_signs = signs16; })},
      {"mxfp4_fwd_x", "x", {"--recipe", "mxfp4"},
       cfg_with(QuantConfig{}, [](QuantConfig& c) { c.format = kE2M1; c.block = 32; c.scale = ScaleKind::ue8m0; })},
      {"nvfp4_fwd_w_tile2d", "x", {"--recipe", "nvfp4", "--role", "fwd_w"},
       cfg_with(QuantConfig{}, [](QuantConfig& c) {
         c.format = kE2M1;
         c.scale = ScaleKind::ue4m3;
         c.tile2d = true;
         c.stream = 1;
       })},
      {"nvfp4_bwd_dw_dy_rht16bf16_sr", "x", {"--recipe", "nvfp4", "--pass", "bwd_dw", "--role", "bwd_dy", "--seed", "5"},
       cfg_with(QuantConfig{}, [](QuantConfig& c) {
         c.format = kE2M1;
         c.scale = ScaleKind::ue4m3;
         c.rht = 16;
         c.rht_signs = rht_signs_te(16);
         c.rht_bf16 = true;
         c.rounding = Rounding::sr;
         c.seed = 5;
         c.stream = 2 * 2;  // pass bwd_dw, operand A
       })},
      {"ufp4_dy_overridden_e2m1_rtne", "x", {"--recipe", "ufp4", "--role", "bwd_dy", "--format", "e2m1", "--rounding", "rtne"},
       cfg_with(QuantConfig{}, [](QuantConfig& c) {
         c.format = kE2M1;
         c.rht = 16;
         c.rht_signs = rht_signs_te(16);
         c.stream = 1 * 2;  // pass bwd_dx, operand A
       })},
      {"nvfp4_fwd_w_tile2d_off", "x", {"--recipe", "nvfp4", "--role", "fwd_w", "--tile2d=false"},
       cfg_with(QuantConfig{}, [](QuantConfig& c) { c.format = kE2M1; c.scale = ScaleKind::ue4m3; c.stream = 1; })},
  };
}

class Quantize : public Cli, public ::testing::WithParamInterface<QCase> {};

TEST_P(Quantize, OutputsEqualModel) {
  const QCase& k = GetParam();
  const std::string out = path("q.safetensors");
  std::vector<std::string> args = {"quantize", "--in", path("in.safetensors"), "--tensor", k.tensor, "--out", out,
                                   "--json", path("q.json")};
  args.insert(args.end(), k.args.begin(), k.args.end());
  const Result r = run(args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");

  const std::vector<float>& x = std::string(k.tensor) == "xb" ? xb_ : x_;
  const QTensor q = quantize(x.data(), kRows, kCols, k.cfg);
  const int64_t kb = kCols / k.cfg.block;
  const std::string t = k.tensor;
  const io::SafetensorsFile f(out);
  EXPECT_EQ(tensor_bytes(f, t + ".codes", io::DType::U8, {kRows, kCols}), q.codes);
  EXPECT_EQ(tensor_bytes(f, t + ".scales", io::DType::F32, {kRows, kb}), bytes_of(q.scales));
  EXPECT_EQ(f.has(t + ".scale_codes"), k.cfg.scale != ScaleKind::fp32);
  if (k.cfg.scale != ScaleKind::fp32) {
    EXPECT_EQ(tensor_bytes(f, t + ".scale_codes", io::DType::U8, {kRows, kb}), q.scale_codes);
  }
  EXPECT_EQ(tensor_bytes(f, t + ".global_scale", io::DType::F32, {1}), bytes_of(std::vector<float>{q.global_dec}));
  const std::vector<float> dq = q.dequantize();
  EXPECT_EQ(tensor_bytes(f, t + ".dequant", io::DType::F32, {kRows, kCols}), bytes_of(dq));
  EXPECT_EQ(f.metadata().at("fp4lab.config"), k.cfg.label());
  EXPECT_EQ(f.metadata().at("fp4lab.config.rht_signs").size(), k.cfg.rht ? k.cfg.rht * 3 - 1 : 0u);
  EXPECT_NE(f.metadata().at("fp4lab.command").find("quantize"), std::string::npos);

  // Summary figures: SQNR and alpha against the values the quantiser saw (rotated when RHT is on).
  const std::vector<float> seen = rotate(x.data(), kRows, kCols, k.cfg);
  const json j = json::parse(slurp(path("q.json")));
  EXPECT_EQ(j["config"]["label"], k.cfg.label());
  EXPECT_EQ(j["sqnr_db"].get<double>(), sqnr_db(seen.data(), dq.data(), kRows * kCols));
  EXPECT_EQ(j["beff"].get<double>(), beff(q));
  EXPECT_EQ(j["alpha"].get<double>(), shrinkage_alpha(seen.data(), dq.data(), kRows * kCols));
  EXPECT_NE(r.out.find(k.cfg.label()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("SQNR"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Configs, Quantize, ::testing::ValuesIn(quantize_cases()),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

// The same options from a config file; the command line wins where both give one.
TEST_F(Cli, ConfigFileSharesOptionsAndCommandLineWins) {
  std::ofstream(path("q.cfg")) << "# knobs for the wgrad dY operand\nrecipe = nvfp4\npass = bwd_dw\nrole = bwd_dy\n"
                                  "seed = 9\nformat = int4\nstream = 2\n";
  const Result r = run({"quantize", "--config", path("q.cfg"), "--format", "e2m1", "--in", path("in.safetensors"),
                        "--tensor", "x", "--out", path("q.safetensors")});
  ASSERT_EQ(r.code, 0) << r.err;
  Recipe rec = Recipe::preset("nvfp4");
  rec.seed = 9;
  QuantConfig c = rec.operand(Pass::bwd_dw, Operand::a, 2);
  ASSERT_EQ(c.format.name, std::string("e2m1"));  // the preset's grid, which the command line restates
  ASSERT_EQ(c.stream, 2u * 8 + 4);
  const QTensor q = quantize(x_.data(), kRows, kCols, c);
  const io::SafetensorsFile f(path("q.safetensors"));
  EXPECT_EQ(tensor_bytes(f, "x.codes", io::DType::U8, {kRows, kCols}), q.codes);
  EXPECT_EQ(tensor_bytes(f, "x.scale_codes", io::DType::U8, {kRows, kCols / 16}), q.scale_codes);
  EXPECT_EQ(f.metadata().at("fp4lab.config"), "e2m1_b16_ue4m3scale_rht16_sr-philox4");
  EXPECT_EQ(f.metadata().at("fp4lab.config.seed"), "9");

  // Without the command-line --format, the config file's int4 applies.
  const Result r2 = run({"quantize", "--config", path("q.cfg"), "--in", path("in.safetensors"), "--tensor", "x",
                         "--out", path("q2.safetensors")});
  ASSERT_EQ(r2.code, 0) << r2.err;
  c.format = kInt4;
  const QTensor q2 = quantize(x_.data(), kRows, kCols, c);
  const io::SafetensorsFile f2(path("q2.safetensors"));
  EXPECT_EQ(tensor_bytes(f2, "x.codes", io::DType::U8, {kRows, kCols}), q2.codes);
  EXPECT_EQ(f2.metadata().at("fp4lab.config"), "int4_b16_ue4m3scale_rht16_sr-philox4");

  // The same options as a JSON object (cli/option_file.hpp) give the same bytes.
  std::ofstream(path("q.json")) << R"({"recipe": "nvfp4", "pass": "bwd_dw", "role": "bwd_dy", "seed": 9,
                                      "format": "int4", "stream": 2})";
  const Result r3 = run({"quantize", "--config", path("q.json"), "--in", path("in.safetensors"), "--tensor", "x",
                         "--out", path("q3.safetensors")});
  ASSERT_EQ(r3.code, 0) << r3.err;
  EXPECT_EQ(tensor_bytes(io::SafetensorsFile(path("q3.safetensors")), "x.codes", io::DType::U8, {kRows, kCols}),
            q2.codes);
}

// ---- cast: the codec alone -----------------------------------------------------------------------------
TEST_F(Cli, CastRtneE2M1LiteralCodes) {
  // Ties at every midpoint go to the even code; |x| > 6 saturates; -0 keeps its sign bit.
  const std::vector<float> v = {0.0f, -0.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f,
                                7.0f, 1e30f, -0.2f, -0.3f, -2.6f, -100.0f, 0.2500001f, 4.9999995f};
  const std::vector<uint8_t> want = {0b0'000, 0b1'000, 0b0'000, 0b0'010, 0b0'010, 0b0'100, 0b0'100, 0b0'110, 0b0'110,
                                     0b0'111, 0b0'111, 0b0'111, 0b1'000, 0b1'001, 0b1'101, 0b1'111, 0b0'001, 0b0'110};
  io::write_safetensors(path("v.safetensors"), {io::make_f32("v", {int64_t(v.size())}, v)});
  const Result r = run({"cast", "--in", path("v.safetensors"), "--tensor", "v", "--format", "e2m1", "--out",
                        path("c.safetensors"), "--json", "-"});
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["count"].get<int64_t>(), int64_t(v.size()));
  EXPECT_EQ(j["saturated"].get<int64_t>(), 3);  // 7, 1e30, -100 (6 itself is a level)
  const io::SafetensorsFile f(path("c.safetensors"));
  const std::vector<int64_t> shape = {int64_t(v.size())};
  EXPECT_EQ(tensor_bytes(f, "v.codes", io::DType::U8, shape), want);
  std::vector<float> dq;
  for (uint8_t c : want) dq.push_back(decode(kE2M1, c));
  EXPECT_EQ(tensor_bytes(f, "v.dequant", io::DType::F32, shape), bytes_of(dq));
}

TEST_F(Cli, CastEveryFormatAndSrEqualModel) {
  const std::vector<float> v = normal(4096, 3, 3.0f);
  io::write_safetensors(path("v.safetensors"), {io::make_f32("v", {64, 64}, v)});
  // "sr" with the default draw (philox4: word i mod 4 of the block at i / 4), with --sr-draw philox1 (the first word
  // of the block at i) and with --sr-draw philox16 (byte i mod 4 of word (i / 4) mod 4 of the block at i / 16, as
  // the word byte << 24 | 2^23).
  for (const ElemFormat& fm : kAllFormats)
    for (const char* rounding : {"rtne", "sr", "sr1", "sr16"}) {
      SCOPED_TRACE(std::string(fm.name) + " " + rounding);
      const std::string rd = rounding;
      const bool sr1 = rd == "sr1", sr16 = rd == "sr16";
      std::vector<std::string> args = {"cast", "--in", path("v.safetensors"), "--tensor", "v", "--format", fm.name,
                                       "--rounding", rd == "rtne" ? "rtne" : "sr", "--seed", "1234567890123",
                                       "--stream", "6", "--out", path("c.safetensors")};
      if (sr1) args.insert(args.end(), {"--sr-draw", "philox1"});
      if (sr16) args.insert(args.end(), {"--sr-draw", "philox16"});
      const Result r = run(args);
      ASSERT_EQ(r.code, 0) << r.err;
      std::vector<uint8_t> want(v.size());
      const uint32_t k[2] = {uint32_t(1234567890123ull), uint32_t(1234567890123ull >> 32)};
      for (size_t i = 0; i < v.size(); ++i) {
        const uint32_t c[4] = {uint32_t(sr1 ? i : sr16 ? i / 16 : i / 4), 0u, 6u, 0u};
        uint32_t o[4];
        Philox4x32::generate(c, k, o);
        const uint32_t w = sr1 ? o[0] : sr16 ? (((o[i / 4 % 4] >> (8 * (i % 4))) & 0xFFu) << 24) | 0x800000u : o[i % 4];
        want[i] = rd == "rtne" ? round_rtne(fm, v[i]) : round_sr(fm, v[i], w);
      }
      const io::SafetensorsFile f(path("c.safetensors"));
      EXPECT_EQ(tensor_bytes(f, "v.codes", io::DType::U8, {64, 64}), want);
    }
}

// An SR draw that is not one is a usage error in one line naming the known draws, before anything is written; the
// same option in every command that takes it.
TEST_F(Cli, UnknownSrDrawIsAUsageErrorInOneLine) {
  io::write_safetensors(path("v.safetensors"), {io::make_f32("v", {16, 64}, normal(1024, 4, 1.0f))});
  const std::vector<std::vector<std::string>> cmds = {
      {"cast", "--in", path("v.safetensors"), "--tensor", "v", "--format", "e1m2", "--rounding", "sr", "--out",
       path("c.safetensors")},
      {"quantize", "--in", path("v.safetensors"), "--tensor", "v", "--rounding", "sr", "--out", path("q.safetensors")},
      {"analyze", "--trace", FP4LAB_SOURCE_DIR "/workloads/tiny-lm/step_005000", "--recipe", "ufp4", "--json",
       path("a.json")}};
  for (std::vector<std::string> args : cmds) {
    args.insert(args.end(), {"--sr-draw", "philox2"});
    const Result r = run(args);
    SCOPED_TRACE(args[0]);
    EXPECT_EQ(r.code, cli::kExitUsage) << r.err;
    EXPECT_NE(r.err.find("unknown SR draw 'philox2' (known: philox1, philox4, philox16)"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  for (const char* f : {"c.safetensors", "q.safetensors", "a.json"}) EXPECT_FALSE(std::filesystem::exists(path(f))) << f;
}

// ---- gemm: C equals reference::gemm_contract of the model's operands --------------------------------------
struct GCase {
  const char* name;
  std::vector<std::string> args;
  QuantConfig a, b;
  bool bf16;
};

std::vector<GCase> gemm_cases() {
  const Recipe ufp4 = Recipe::preset("ufp4"), mx = Recipe::preset("mxfp4");
  Recipe nv = Recipe::preset("nvfp4");
  nv.seed = 3;
  QuantConfig ka, kb;  // knobs only: e2m1, ue4m3, RHT 16 (TE signs), SR, GEMM id 2
  for (QuantConfig* c : {&ka, &kb}) {
    c->format = kE2M1;
    c->scale = ScaleKind::ue4m3;
    c->rht = 16;
    c->rht_signs = rht_signs_te(16);
    c->rounding = Rounding::sr;
  }
  ka.stream = 2 * 8 + 0;
  kb.stream = 2 * 8 + 1;
  QuantConfig da, db;
  db.stream = 1;
  return {
      {"default_e1m2_fwd_y", {}, da, db, false},
      {"ufp4_fwd_y", {"--recipe", "ufp4"}, ufp4.operand(Pass::fwd_y, Operand::a), ufp4.operand(Pass::fwd_y, Operand::b), false},
      {"nvfp4_bwd_dw_bf16out", {"--recipe", "nvfp4", "--pass", "bwd_dw", "--seed", "3", "--bf16-out"},
       nv.operand(Pass::bwd_dw, Operand::a), nv.operand(Pass::bwd_dw, Operand::b), true},
      {"mxfp4_fwd_y", {"--recipe", "mxfp4"}, mx.operand(Pass::fwd_y, Operand::a), mx.operand(Pass::fwd_y, Operand::b), false},
      {"knobs_e2m1_ue4m3_rht16_sr", {"--format", "e2m1", "--scale", "ue4m3", "--rht", "16", "--rounding", "sr", "--stream", "2"},
       ka, kb, false},
  };
}

class Gemm : public Cli, public ::testing::WithParamInterface<GCase> {};

TEST_P(Gemm, OutputBitsEqualContractReference) {
  const GCase& k = GetParam();
  const std::string in = path("in.safetensors"), out = path("c.safetensors");
  std::vector<std::string> args = {"gemm", "--a", in + ":x", "--b", in + ":w", "--out", out, "--json", path("g.json")};
  args.insert(args.end(), k.args.begin(), k.args.end());
  const Result r = run(args);
  ASSERT_EQ(r.code, 0) << r.err;

  const QTensor qa = quantize(x_.data(), kRows, kCols, k.a), qb = quantize(w_.data(), kN, kCols, k.b);
  std::vector<float> c = reference::gemm_contract(qa, qb);
  const io::SafetensorsFile f(out);
  if (k.bf16) {
    std::vector<uint16_t> bits;
    for (float& v : c) {
      bits.push_back(f32_to_bf16(v));
      v = bf16_to_f32(bits.back());
    }
    EXPECT_EQ(tensor_bytes(f, "C", io::DType::BF16, {kRows, kN}), bytes_of(bits));
  } else {
    EXPECT_EQ(tensor_bytes(f, "C", io::DType::F32, {kRows, kN}), bytes_of(c));
  }
  const std::vector<double> ref = gemm_f64(x_.data(), w_.data(), kRows, kN, kCols);
  const std::vector<float> ref32(ref.begin(), ref.end());
  EXPECT_EQ(tensor_bytes(f, "C.ref", io::DType::F32, {kRows, kN}), bytes_of(ref32));
  // C.ref against the definition written as a plain loop (docs/spec.md §6.1): ascending k from +0.0, bit for bit.
  for (int64_t m = 0; m < kRows; ++m)
    for (int64_t n = 0; n < kN; ++n) {
      double s = 0;
      for (int64_t j = 0; j < kCols; ++j) s += double(x_[m * kCols + j]) * double(w_[n * kCols + j]);
      ASSERT_EQ(ref[m * kN + n], s) << m << "," << n;
    }
  EXPECT_EQ(f.metadata().at("fp4lab.a.config"), k.a.label());
  EXPECT_EQ(f.metadata().at("fp4lab.b.config"), k.b.label());

  const json j = json::parse(slurp(path("g.json")));
  EXPECT_EQ(j["sqnr_db"].get<double>(), sqnr_db(ref.data(), c.data(), kRows * kN));
  const std::vector<float> sa = rotate(x_.data(), kRows, kCols, k.a), sb = rotate(w_.data(), kN, kCols, k.b);
  const std::vector<float> da = qa.dequantize(), db = qb.dequantize();
  EXPECT_EQ(j["eta"].get<double>(),
            shrinkage_alpha(sa.data(), da.data(), kRows * kCols) * shrinkage_alpha(sb.data(), db.data(), kN * kCols));
  EXPECT_GT(j["sqnr_db"].get<double>(), 5.0);  // a quantised product, not noise
  EXPECT_NE(r.out.find("GEMM-output SQNR"), std::string::npos) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Configs, Gemm, ::testing::ValuesIn(gemm_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// ---- --json on every subcommand ---------------------------------------------------------------------------
TEST_F(Cli, JsonDashIsPureJsonOnEverySubcommand) {
  const std::string in = path("in.safetensors");
  const std::vector<std::vector<std::string>> cmds = {
      {"formats"},
      {"bias", "--format", "int4"},
      {"recipes"},
      {"quantize", "--in", in, "--tensor", "x", "--out", path("o1.safetensors")},
      {"cast", "--in", in, "--tensor", "x", "--format", "e1m2", "--out", path("o2.safetensors")},
      {"gemm", "--a", in + ":x", "--b", in + ":w", "--out", path("o3.safetensors")},
  };
  for (auto args : cmds) {
    SCOPED_TRACE(args[0]);
    args.insert(args.end(), {"--json", "-"});
    const Result r = run(args);
    ASSERT_EQ(r.code, 0) << r.err;
    json j;
    EXPECT_NO_THROW(j = json::parse(r.out)) << r.out;
    EXPECT_TRUE(j.is_object());
    if (args[0] != "formats" && args[0] != "bias" && args[0] != "recipes") {
      EXPECT_EQ(j["command"], args[0]);
    }
    // Every JSON output says which build wrote it.
    EXPECT_EQ(j.value("fp4lab_version", ""), FP4LAB_VERSION) << args[0];
    EXPECT_FALSE(j.value("git_commit", "").empty()) << args[0];
  }
}

// ---- usage -------------------------------------------------------------------------------------------------
TEST_F(Cli, UsageAndHelp) {
  Result r = run({"--help"});
  EXPECT_EQ(r.code, 0);
  // With no subcommand fp4lab runs `analyze` when that subcommand is built in (its own tests cover that);
  // otherwise it prints the usage on stderr and exits 2.
  if (r.out.find("analyze") == std::string::npos) {
    const Result none = run({});
    EXPECT_EQ(none.code, 2);
    EXPECT_NE(none.err.find("quantize"), std::string::npos) << none.err;
  }
  for (const char* s : {"formats", "bias", "recipes", "quantize", "cast", "gemm"}) {
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
    const Result h = run({s, "--help"});
    EXPECT_EQ(h.code, 0) << s;
    EXPECT_NE(h.out.find("--json"), std::string::npos) << s;
  }
}

// ---- errors: one line, naming the file and the fault, exit 1 (data) or 2 (usage) ------------------------------
TEST_F(Cli, ErrorsAreOneLineNamingFileAndFault) {
  std::vector<float> nan(32, 1.0f), inf(32, 1.0f);
  nan[17] = std::numeric_limits<float>::quiet_NaN();
  inf[3] = -std::numeric_limits<float>::infinity();
  io::write_safetensors(path("bad.safetensors"),
                        {io::make_f32("nan", {2, 16}, nan), io::make_f32("inf", {2, 16}, inf),
                         io::make_f32("r3", {2, 1, 16}, nan), io::make_u8("u8", {2, 16}, std::vector<uint8_t>(32, 1)),
                         io::make_f32("odd", {2, 24}, std::vector<float>(48, 1.0f)),
                         io::make_f32("k48", {4, 48}, std::vector<float>(192, 1.0f)),
                         io::make_f32("k32", {4, 32}, std::vector<float>(128, 1.0f))});
  std::ofstream(path("junk.safetensors")) << "not a safetensors file at all";
  std::ofstream(path("bad.cfg")) << "format = e2m1\nno-such-knob = 3\n";
  const std::vector<ErrCase> cases = {
      {{"quantize", "--in", "@missing.safetensors", "--tensor", "x", "--out", "@o"}, 1, {"@missing.safetensors", "cannot open"}},
      {{"quantize", "--in", "@in.safetensors", "--tensor", "nope", "--out", "@o"}, 1, {"@in.safetensors", "nope"}},
      {{"quantize", "--in", "@bad.safetensors", "--tensor", "r3", "--out", "@o"}, 1, {"@bad.safetensors", "r3", "2-D"}},
      {{"quantize", "--in", "@bad.safetensors", "--tensor", "nan", "--out", "@o"}, 1, {"@bad.safetensors", "nan", "NaN"}},
      {{"quantize", "--in", "@bad.safetensors", "--tensor", "inf", "--out", "@o"}, 1, {"@bad.safetensors", "inf", "Inf"}},
      {{"quantize", "--in", "@bad.safetensors", "--tensor", "u8", "--out", "@o"}, 1, {"@bad.safetensors", "U8"}},
      {{"quantize", "--in", "@bad.safetensors", "--tensor", "odd", "--out", "@o"}, 1, {"@bad.safetensors", "odd", "multiple of the block size 16"}},
      {{"quantize", "--in", "@bad.safetensors", "--tensor", "k48", "--block", "32", "--out", "@o"}, 1, {"@bad.safetensors", "multiple of the block size 32"}},
      {{"quantize", "--in", "@junk.safetensors", "--tensor", "x", "--out", "@o"}, 1, {"@junk.safetensors"}},
      {{"quantize", "--in", "@in.safetensors", "--tensor", "x", "--out", "@o", "--bogus"}, 2, {"--bogus"}},
      {{"quantize", "--in", "@in.safetensors", "--tensor", "x", "--out", "@o", "stray"}, 2, {"positional"}},
      {{"quantize", "--in", "@in.safetensors", "--tensor", "x"}, 2, {"--out"}},
      {{"quantize", "--in", "@in.safetensors", "--tensor", "x", "--out", "@o", "--recipe", "fp8"}, 2, {"unknown recipe 'fp8'"}},
      {{"quantize", "--in", "@in.safetensors", "--tensor", "x", "--out", "@o", "--rht-signs", "1,-1,2"}, 2, {"--rht-signs", "'2'"}},
      {{"quantize", "--in", "@in.safetensors", "--tensor", "x", "--out", "@o", "--rht", "16", "--rht-signs", "1,-1"}, 2, {"2 signs", "16"}},
      {{"quantize", "--in", "@in.safetensors", "--tensor", "x", "--out", "@o", "--rht", "32", "--rht-signs", "te"}, 2, {"d = 16"}},
      {{"quantize", "--in", "@in.safetensors", "--tensor", "x", "--out", "@o", "--block", "24"}, 2, {"block size must be 16 or 32"}},
      {{"quantize", "--in", "@in.safetensors", "--tensor", "x", "--out", "@o", "--format", "e3m0"}, 2, {"unknown format 'e3m0'"}},
      {{"quantize", "--in", "@in.safetensors", "--tensor", "x", "--out", "@o", "--seed", "-1"}, 2, {"--seed", "'-1'"}},
      {{"quantize", "--in", "@in.safetensors", "--tensor", "x", "--out", "@o", "--pass", "fwd_y", "--role", "bwd_dy"}, 2, {"bwd_dy", "fwd_y"}},
      {{"quantize", "--in", "@in.safetensors", "--tensor", "x", "--out", "@o", "--config", "@missing.cfg"}, 2, {"@missing.cfg"}},
      {{"quantize", "--in", "@in.safetensors", "--tensor", "x", "--out", "@o", "--config", "@bad.cfg"}, 2, {"@bad.cfg", "no-such-knob"}},
      {{"quantize", "--in", "@in.safetensors", "--tensor", "x", "--out", "@nodir/o.safetensors"}, 1, {"@nodir/o.safetensors"}},
      {{"cast", "--in", "@bad.safetensors", "--tensor", "nan", "--format", "e2m1", "--out", "@o"}, 1, {"@bad.safetensors", "NaN"}},
      {{"cast", "--in", "@in.safetensors", "--tensor", "x", "--format", "e2m1", "--rounding", "up", "--out", "@o"}, 2, {"rounding 'up'"}},
      {{"gemm", "--a", "@bad.safetensors:k48", "--b", "@bad.safetensors:k32", "--out", "@o"}, 1, {"@bad.safetensors", "k32", "does not match"}},
      {{"gemm", "--a", "@bad.safetensors:r3", "--b", "@in.safetensors:w", "--out", "@o"}, 1, {"@bad.safetensors", "2-D"}},
      {{"gemm", "--a", "@in.safetensors:x", "--b", "@missing.safetensors:w", "--out", "@o"}, 1, {"@missing.safetensors"}},
      {{"gemm", "--a", "@in.safetensors", "--b", "@in.safetensors:w", "--out", "@o"}, 2, {"--a", "FILE:NAME"}},
      {{"gemm", "--a", "@bad.safetensors:nan", "--b", "@bad.safetensors:inf", "--out", "@o"}, 1, {"@bad.safetensors", "NaN"}},
      {{"bias", "--format", "e5m2"}, 2, {"unknown format 'e5m2'"}},
      {{"bias"}, 2, {"--format"}},
      {{"frobnicate"}, 2, {"unknown subcommand 'frobnicate'"}},
  };
  expect_one_line_errors(cases, [](const std::vector<std::string>& args) {
    return args[0] == "frobnicate" ? std::string("fp4lab: error: ") : "fp4lab " + args[0] + ": error: ";
  }, true);
}

// ---- hostile input -------------------------------------------------------------------------------------------
// Each fault ends as one line "fp4lab <cmd>: error: ..." with exit 1 (data) or 2 (usage): never a signal, a
// hang (run() turns one into exit 124), an overwritten input, or exit 0 with a non-finite number.

// A trace v1 file with one gemm "g": fwd_x [tokens, in], fwd_w [out, in], bwd_dy [tokens, out].
void write_trace(const std::string& file, int64_t tokens, int64_t in, int64_t out, float x0 = 0.0f) {
  std::vector<float> x = normal(size_t(tokens * in), 3), w = normal(size_t(out * in), 4, 0.05f),
                     dy = normal(size_t(tokens * out), 5, 0.01f);
  if (x0 != 0.0f)
    for (int j = 0; j < 16; ++j) x[size_t(j)] = x0;
  io::write_safetensors(file, {io::make_f32("g.fwd_x", {tokens, in}, x), io::make_f32("g.fwd_w", {out, in}, w),
                               io::make_f32("g.bwd_dy", {tokens, out}, dy)},
                        {{"fp4lab.trace.version", "1"}});
}

void expect_one_line_error(const Result& r, const std::string& cmd, int code, const std::vector<std::string>& want) {
  EXPECT_EQ(r.code, code) << r.err;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.rfind("fp4lab " + cmd + ": error: ", 0), 0u) << r.err;
  for (const auto& w : want) EXPECT_NE(r.err.find(w), std::string::npos) << "want '" << w << "' in " << r.err;
}

// ---- the names a knob takes: one table each, printed by --help and errors, restated in README.md and spec.md ----
std::vector<std::string> split_list(const std::string& list) {  // "a, b, c"
  std::vector<std::string> names;
  for (size_t at = 0; at <= list.size();) {
    const size_t comma = std::min(list.find(", ", at), list.size());
    names.push_back(list.substr(at, comma - at));
    at = comma + 2;
  }
  return names;
}

// Each list holds exactly the names its parser takes, each once, and reads them back to the value they name.
TEST_F(Cli, KnobListsAreWhatTheParsersTake) {
  const std::vector<std::string> formats = split_list(knob_choices("format", ", "));
  EXPECT_EQ(formats.size(), std::size(kAllFormats));
  for (const std::string& n : formats) EXPECT_EQ(parse_format(n).name, n);
  const std::vector<std::string> scales = split_list(knob_choices("scale", ", "));
  EXPECT_EQ(scales, (std::vector<std::string>{"fp32", "ue4m3", "ue8m0", "ue8m0-ceil"}));  // docs/spec.md §1
  for (const std::string& n : scales) EXPECT_EQ(scale_name(parse_scale(n)), n);
  const std::vector<std::string> roundings = split_list(knob_choices("rounding", ", "));
  EXPECT_EQ(roundings, (std::vector<std::string>{"rtne", "sr"}));
  for (const std::string& n : roundings) EXPECT_EQ(rounding_name(parse_rounding(n)), n);
  const std::vector<std::string> draws = split_list(knob_choices("sr_draw", ", "));
  EXPECT_EQ(draws, (std::vector<std::string>{"philox1", "philox4", "philox16"}));  // docs/spec.md §4
  for (const std::string& n : draws) EXPECT_EQ(sr_draw_name(parse_sr_draw(n)), n);
  const std::vector<std::string> passes = split_list(knob_choices("pass", ", "));
  EXPECT_EQ(passes.size(), std::size(kPasses));
  for (const std::string& n : passes) EXPECT_EQ(pass_name(parse_pass(n)), n);
  EXPECT_EQ(split_list(knob_choices("role", ", ")), (std::vector<std::string>{"fwd_x", "fwd_w", "bwd_dy"}));
  for (const std::string& n : split_list(knob_choices("role", ", "))) {
    const Knobs k = {{"role", n}};
    EXPECT_EQ(operand_role(selected_pass(k), selected_operand(k, selected_pass(k))), n);
  }
  for (const std::string& n : split_list(knob_choices("recipe", ", "))) EXPECT_EQ(Recipe::preset(n).name, n);
  EXPECT_THROW(knob_choices("block", ", "), std::logic_error);
}

// A typed knob value (--block, --tile2d and --rht-bf16 as Boost parsed them; fp4lab sim's stream of each GEMM)
// means what its text means, and one out of range fails with the message its text gets.
TEST_F(Cli, TypedKnobValuesMeanWhatTheirTextMeans) {
  const Knobs text = {{"recipe", "nvfp4"}, {"block", "16"},  {"tile2d", "false"}, {"rht-bf16", "true"},
                      {"stream", "7"},     {"seed", "5"},    {"rht", "16"}};
  const Knobs typed = {{"recipe", "nvfp4"},     {"block", int64_t(16)}, {"tile2d", false}, {"rht-bf16", true},
                       {"stream", int64_t(7)}, {"seed", int64_t(5)},  {"rht", "16"}};
  for (Pass p : kPasses)
    for (Operand o : {Operand::a, Operand::b}) {
      const QuantConfig a = operand_config(text, p, o), b = operand_config(typed, p, o);
      EXPECT_EQ(a.label(), b.label());
      EXPECT_EQ(a.rht_signs, b.rht_signs);
      EXPECT_EQ(a.rht_bf16, b.rht_bf16);
      EXPECT_EQ(a.seed, b.seed);
      EXPECT_EQ(a.stream, b.stream);
    }
  auto fault = [](const Knobs& k) {
    try {
      operand_config(k, Pass::fwd_y, Operand::a);
    } catch (const KnobError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(fault({{"stream", int64_t(-1)}}), fault({{"stream", "-1"}}));
  EXPECT_EQ(fault({{"stream", int64_t(1) << 32}}), "--stream: '4294967296' is not an integer from 0 to 4294967295");
  EXPECT_EQ(fault({{"stream", int64_t(1) << 32}}), fault({{"stream", "4294967296"}}));
  EXPECT_EQ(fault({{"block", int64_t(24)}}), fault({{"block", "24"}}));
  EXPECT_EQ(fault({{"block", int64_t(1) << 40}}), "--block: '1099511627776' is not an integer");
  EXPECT_EQ(fault({{"block", int64_t(1) << 40}}), fault({{"block", "1099511627776"}}));
  EXPECT_EQ(fault({{"block", true}}), fault({{"block", "true"}}));
  EXPECT_EQ(fault({{"tile2d", int64_t(2)}}), fault({{"tile2d", "2"}}));
  EXPECT_EQ(fault({{"format", int64_t(4)}}), "--format: '4' is not text");
  // A combination fault comes before the text of the values it combines is read.
  EXPECT_EQ(fault({{"rht", "0"}, {"rht-signs", "x"}}), "--rht-signs given with --rht 0");
  EXPECT_EQ(fault({{"rht-seed", "x"}}), "--rht-seed needs an RHT size (--rht D)");
  EXPECT_EQ(fault({{"recipe", "ufp4"}, {"rht", "0"}, {"rht-seed", "-1"}}), "--rht-seed needs an RHT size (--rht D)");
  EXPECT_EQ(fault({{"recipe", "ufp4"}, {"rht-seed", "-1"}}),  // ufp4's fwd_y operand A has RHT-16: the seed is read
            "--rht-seed: '-1' is not an integer from 0 to 18446744073709551615");
  EXPECT_EQ(fault({{"rht-signs", "+1"}, {"rht-seed", "x"}}), "give --rht-signs or --rht-seed, not both");
}

// --help lists each knob's names and an unknown name is answered with the same list; README.md, kernels/README.md
// and docs/spec.md restate lists and must stay equal to them.
TEST_F(Cli, KnobListsInHelpErrorsAndDocsAreTheTables) {
  const Result h = run({"quantize", "--help"});
  ASSERT_EQ(h.code, 0) << h.err;
  for (const char* knob : {"format", "scale", "rounding", "pass", "role"})
    EXPECT_NE(h.out.find(knob_choices(knob, "|")), std::string::npos) << knob << " list missing from\n" << h.out;
  // The recipes' list is longer than a help line: separated by ", ", it wraps at the spaces.
  std::istringstream help(h.out);
  std::string flat, w;
  while (help >> w) flat += (flat.empty() ? "" : " ") + w;
  EXPECT_NE(flat.find(knob_choices("recipe", ", ")), std::string::npos) << "recipe list missing from\n" << h.out;
  const std::string in = path("in.safetensors");
  const std::pair<const char*, const char*> unknown[] = {{"format", "e3m0"}, {"scale", "ue5m2"}, {"rounding", "up"},
                                                         {"pass", "fwd"},    {"role", "fwd_dw"}, {"recipe", "fp8"}};
  for (const auto& [knob, bad] : unknown) {
    const Result r = run({"quantize", "--in", in, "--tensor", "x", "--out", path("o"), std::string("--") + knob, bad});
    const std::string want = std::string("unknown ") + knob + " '" + bad + "' (known: " + knob_choices(knob, ", ") + ")";
    expect_one_line_error(r, "quantize", 2, {want});
  }
  const std::string readme = slurp(FP4LAB_SOURCE_DIR "/README.md");
  for (const char* knob : {"format", "scale", "rounding"})
    EXPECT_NE(readme.find(std::string("`--") + knob + " " + knob_choices(knob, "|") + "`"), std::string::npos)
        << "README.md's list of --" << knob;
  EXPECT_NE(readme.find("`--sr-draw " + knob_choices("sr_draw", "|") + "`"), std::string::npos)
      << "README.md's list of --sr-draw";
  EXPECT_NE(slurp(FP4LAB_SOURCE_DIR "/kernels/README.md").find("[--recipe " + knob_choices("recipe", "|") + "]"),
            std::string::npos)
      << "kernels/README.md's list of cuda check --recipe";
  std::string presets;
  const std::vector<std::string>& names = Recipe::preset_names();
  for (size_t i = 0; i < names.size(); ++i)
    presets += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + ("`" + names[i] + "`");
  EXPECT_NE(slurp(FP4LAB_SOURCE_DIR "/docs/spec.md").find("presets are " + presets), std::string::npos)
      << "docs/spec.md §2's list of presets, " << presets;
  for (const RecipeRow& row : recipe_table()) {
    if (row.kind == RecipeKind::ablation) {
      EXPECT_NE(slurp(FP4LAB_SOURCE_DIR "/docs/spec.md").find("- `" + row.recipe.name + "` — " + row.what + "\n"),
                std::string::npos)
          << "docs/spec.md §2's list of ablations, " << row.recipe.name;
    }
  }
}

// An ablation is a recipe analyze takes by name: on the bundled trace, ufp4-rht-wgrad's GEMMs carry no RHT on fwd_y
// and bwd_dx, and its bwd_dw GEMMs, where it is ufp4, give ufp4's figures to the bit; "all" stays the presets.
TEST_F(Cli, AnalyzeTakesAnAblationByName) {
  const std::string trace = FP4LAB_SOURCE_DIR "/workloads/tiny-lm/step_005000";
  const Result r = run({"analyze", "--trace", trace, "--formats", "e1m2", "--rht", "none", "--recipe",
                        "ufp4,ufp4-rht-wgrad", "--json", "-"});
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["config"]["recipes"], json::array({"ufp4", "ufp4-rht-wgrad"}));
  std::map<std::pair<std::string, std::string>, json> ufp4;
  for (const json& g : j["gemms"])
    if (g["recipe"] == "ufp4") ufp4[{g["gemm"], g["pass"]}] = g;
  int same = 0, differ = 0;
  for (const json& g : j["gemms"]) {
    if (g["recipe"] != "ufp4-rht-wgrad") continue;
    SCOPED_TRACE(g.dump());
    const json& u = ufp4.at({g["gemm"], g["pass"]});
    EXPECT_EQ(u["rht"], 16);
    if (g["pass"] == "bwd_dw") {
      EXPECT_EQ(g["rht"], 16);
      EXPECT_EQ(g["sqnr_db"], u["sqnr_db"]);  // the same operands, quantised alike: the same bits
      EXPECT_EQ(g["eta"], u["eta"]);
      ++same;
    } else {
      EXPECT_EQ(g["rht"], 0);
      differ += g["sqnr_db"] != u["sqnr_db"];
    }
  }
  EXPECT_GT(same, 0);
  EXPECT_EQ(differ, 2 * same);  // fwd_y and bwd_dx of every GEMM, unrotated, give other figures
  const Result all = run({"analyze", "--trace", trace, "--formats", "e1m2", "--rht", "none", "--recipe", "all",
                          "--json", "-"});
  ASSERT_EQ(all.code, 0) << all.err;
  EXPECT_EQ(json::parse(all.out)["config"]["recipes"], json(Recipe::preset_names()));
}

// README's excerpt of the main job's table is what `fp4lab analyze` prints on the bundled trace, line for line
// (an excerpt: the rows it shows, in that order; `...` stands for rows left out).
TEST_F(Cli, ReadmeExcerptIsWhatAnalyzePrints) {
  const std::string readme = slurp(FP4LAB_SOURCE_DIR "/README.md");
  const size_t at = readme.find("## What the main job prints");
  ASSERT_NE(at, std::string::npos);
  const size_t open = readme.find("```\n", at), close = readme.find("```", open + 4);
  ASSERT_NE(close, std::string::npos);
  const Result r = run({"analyze", "--trace", FP4LAB_SOURCE_DIR "/workloads/tiny-lm/step_005000"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::istringstream excerpt(readme.substr(open + 4, close - open - 4));
  size_t pos = 0, shown = 0;
  for (std::string line; std::getline(excerpt, line);) {
    if (line == "...") continue;
    const size_t found = r.out.find("\n" + line + "\n", pos);
    ASSERT_NE(found, std::string::npos) << "README line not printed (in this order):\n" << line;
    pos = found + 1;
    ++shown;
  }
  EXPECT_GE(shown, 4u);
}

// The default trace is found when analyze runs, not fixed when it is built: the bundled trace of the checkout
// holding the executable (build*/bin/fp4lab), or $FP4LAB_TRACE.
TEST_F(Cli, DefaultTraceFollowsTheExecutable) {
  namespace fs = std::filesystem;
  const fs::path co = path("moved"), bin = co / "build/bin/fp4lab", bundled = co / "workloads/tiny-lm/step_005000";
  fs::create_directories(bin.parent_path());
  fs::create_directories(bundled);
  fs::copy_file(FP4LAB_BIN, bin);
  write_trace((bundled / "g.safetensors").string(), 32, 64, 48);
  write_trace(path("other.safetensors"), 32, 64, 32);
  auto trace_of = [&](const std::string& env) {
    const std::string cmd = env + " timeout 120 " + quote(bin.string()) + " analyze --json - >" + quote(path("d.json")) +
                            " 2>" + quote(path("d.err"));
    EXPECT_EQ(std::system(cmd.c_str()), 0) << slurp(path("d.err"));
    return json::parse(slurp(path("d.json")))["config"]["trace"].get<std::string>();
  };
  EXPECT_EQ(trace_of("FP4LAB_TRACE="), bundled.string());
  EXPECT_EQ(trace_of("FP4LAB_TRACE=" + quote(path("other.safetensors"))), path("other.safetensors"));
}

// analyze's numbers do not depend on the thread count: the float64 reference products run one per task, not
// split over the threads (whose split changed their summation order, and so the GEMM SQNRs' last bits, on F32
// operands spanning many binades).
TEST_F(Cli, AnalyzeDoesNotDependOnTheThreadCount) {
  std::mt19937 g(7);
  std::uniform_real_distribution<float> e(-8.0f, 8.0f);
  auto wide = [&](int64_t r, int64_t c, uint32_t seed) {
    std::vector<float> v = normal(size_t(r * c), seed);
    for (float& x : v) x *= std::exp(e(g));
    return v;
  };
  io::write_safetensors(path("wide.safetensors"),
                        {io::make_f32("g.fwd_x", {64, 1024}, wide(64, 1024, 1)),
                         io::make_f32("g.fwd_w", {48, 1024}, wide(48, 1024, 2)),
                         io::make_f32("g.bwd_dy", {64, 48}, wide(64, 48, 3))},
                        {{"fp4lab.trace.version", "1"}});
  auto results = [&](int threads) {
    const std::string cmd = "OMP_NUM_THREADS=" + std::to_string(threads) + " timeout 120 " + quote(FP4LAB_BIN) +
                            " analyze --trace " + quote(path("wide.safetensors")) + " --json - >" + quote(path("t.json")) +
                            " 2>" + quote(path("t.err"));
    EXPECT_EQ(std::system(cmd.c_str()), 0) << slurp(path("t.err"));
    const json j = json::parse(slurp(path("t.json")));
    return json{j["tensors"], j["gemms"], j["decay"]}.dump();
  };
  const std::string one = results(1);
  EXPECT_EQ(results(2), one);
  EXPECT_EQ(results(3), one);
}

// analyze rotated rows whose length the RHT size does not divide (heap corruption, SIGABRT/SIGSEGV, or a hang);
// every operand of every GEMM is now checked against every setting before any work or progress line.
TEST_F(Cli, AnalyzeChecksEveryShapeAgainstBlockAndRhtSizesFirst) {
  write_trace(path("t48.safetensors"), 48, 64, 64);  // tokens = 48: a multiple of 16, not of 32
  const Result r = run({"analyze", "--trace", path("t48.safetensors"), "--rht", "none,32", "--rht-seed", "1"});
  expect_one_line_error(r, "analyze", 1, {path("t48.safetensors"), "gemm 'g'", "bwd_dw", "48", "RHT size 32"});
  EXPECT_TRUE(r.out.empty()) << r.out;
  // The same trace is fine at RHT-16 and gives a table whose headers are not cut.
  const Result ok = run({"analyze", "--trace", path("t48.safetensors")});
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.out.find("Beff e2m1 no-rht"), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("Beff e1m2 rht16"), std::string::npos) << ok.out;
  // A bad block size is a usage fault.
  expect_one_line_error(run({"analyze", "--trace", path("t48.safetensors"), "--block", "24"}), "analyze", 2, {"--block"});
}

// Finite values near FLT_MAX rotate to Inf: quantize and gemm exited 0 with Inf/NaN outputs and analyze blamed a
// NaN that is not in the file. The golden model refuses the rotation, and a GEMM output that overflows.
TEST_F(Cli, RhtAndGemmOverflowAreDataErrorsNotInfOutputs) {
  std::vector<float> big = x_;
  for (int j = 0; j < 16; ++j) big[size_t(2 * kCols + 16 + j)] = 3.0e38f;  // row 2, block 1
  std::vector<float> huge(size_t(kN * kCols), 1.0e30f);
  io::write_safetensors(path("big.safetensors"),
                        {io::make_f32("big", {kRows, kCols}, big), io::make_f32("huge", {kN, kCols}, huge)});
  const std::string in = path("big.safetensors");
  for (const char* recipe : {"custom", "nvfp4"}) {  // the row-wise path and the tensor-scale (ue4m3) path
    SCOPED_TRACE(recipe);
    std::vector<std::string> args = {"quantize", "--in", in, "--tensor", "big", "--rht", "16", "--out", path("o")};
    if (std::string(recipe) != "custom") args.insert(args.end(), {"--recipe", recipe});
    expect_one_line_error(run(args), "quantize", 1, {in, "tensor 'big'", "RHT overflows FP32 at row 2, block 1"});
    EXPECT_FALSE(std::filesystem::exists(path("o")));
  }
  expect_one_line_error(run({"gemm", "--a", in + ":big", "--b", path("in.safetensors") + ":w", "--rht", "16", "--out",
                             path("o")}),
                        "gemm", 1, {in, "RHT overflows FP32"});
  expect_one_line_error(run({"gemm", "--a", in + ":huge", "--b", in + ":huge", "--out", path("o")}), "gemm", 1,
                        {"GEMM output overflows FP32 at C[0, 0]"});
  EXPECT_FALSE(std::filesystem::exists(path("o")));
  write_trace(path("tbig.safetensors"), 32, 64, 64, 3.0e38f);
  // --rht 16 alone: without RHT the same values make the GEMM output overflow (also refused, as above).
  expect_one_line_error(run({"analyze", "--trace", path("tbig.safetensors"), "--rht", "16"}), "analyze", 1,
                        {path("tbig.safetensors"), "gemm 'g'", "RHT overflows FP32 at row 0, block 0"});
}

// A FIFO as an input hung the open; a device or folder as --config was read or ignored. Inputs must be
// regular files; a config file cannot include another.
TEST_F(Cli, InputsMustBeRegularFiles) {
  const std::string fifo = path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::ofstream(path("nest.cfg")) << "format = e2m1\nconfig = other.cfg\n";
  const std::string in = path("in.safetensors");
  const std::vector<std::string> q = {"quantize", "--in", in, "--tensor", "x", "--out", path("o")};
  auto with = [&](std::vector<std::string> a, std::initializer_list<std::string> more) {
    a.insert(a.end(), more);
    return a;
  };
  expect_one_line_error(run({"quantize", "--in", fifo, "--tensor", "x", "--out", path("o")}), "quantize", 1,
                        {fifo, "a FIFO, not a regular file"});
  expect_one_line_error(run(with(q, {"--config", fifo})), "quantize", 2, {fifo, "config file is a FIFO"});
  expect_one_line_error(run(with(q, {"--config", "/dev/null"})), "quantize", 2, {"/dev/null", "character device"});
  expect_one_line_error(run(with(q, {"--config", dir_})), "quantize", 2, {dir_, "a directory"});
  expect_one_line_error(run(with(q, {"--config", path("nest.cfg")})), "quantize", 2,
                        {path("nest.cfg"), "'config' cannot be set in a config file"});
  expect_one_line_error(run({"analyze", "--trace", fifo}), "analyze", 1, {fifo, "a FIFO"});
  EXPECT_FALSE(std::filesystem::exists(path("o")));
}

// A config file's value of the wrong type was echoed whole and raw by Boost (12 kB of undecodable bytes for a
// 3,000-byte value); found by the configuration reader's fuzz target. One printable line naming the file.
TEST_F(Cli, ConfigValueOfTheWrongTypeIsOneBoundedLine) {
  std::ofstream(path("bad.cfg"), std::ios::binary) << "block = " << std::string(3000, '\xb5') << "\n";
  const Result r = run({"analyze", "--config", path("bad.cfg")});
  expect_one_line_error(r, "analyze", 2, {path("bad.cfg"), "\\xB5", "(3047 bytes)"});
  EXPECT_LT(r.err.size(), 600u) << r.err.size();
  EXPECT_EQ(r.err.find('\xb5'), std::string::npos);
}

// --out or --json naming an input overwrote it; outputs are checked before any work.
TEST_F(Cli, OutputsNeverOverwriteInputs) {
  const std::string in = path("in.safetensors");
  const std::string before = slurp(in);
  std::filesystem::create_hard_link(in, path("alias.safetensors"));
  std::ofstream(path("q.cfg")) << "format = e2m1\n";
  write_trace(path("t.safetensors"), 32, 64, 64);
  std::filesystem::create_directory(path("tr"));
  write_trace(path("tr/t.safetensors"), 32, 64, 64);
  const std::vector<std::vector<std::string>> cases = {
      {"quantize", "--in", in, "--tensor", "x", "--out", in},
      {"quantize", "--in", in, "--tensor", "x", "--out", path("alias.safetensors")},  // same inode
      {"quantize", "--in", in, "--tensor", "x", "--out", path("o"), "--json", in},
      {"quantize", "--in", in, "--tensor", "x", "--out", path("o"), "--config", path("q.cfg"), "--json", path("q.cfg")},
      {"quantize", "--in", in, "--tensor", "x", "--out", path("o"), "--json", path("o")},
      {"cast", "--in", in, "--tensor", "x", "--format", "e2m1", "--out", path("./in.safetensors")},
      {"gemm", "--a", in + ":x", "--b", in + ":w", "--out", in},
      {"analyze", "--trace", path("t.safetensors"), "--json", path("t.safetensors")},
      {"analyze", "--trace", path("tr"), "--json", path("tr/t.safetensors")},  // a file of a trace folder
  };
  for (const auto& args : cases) {
    SCOPED_TRACE(args.back());
    expect_one_line_error(run(args), args[0], 2, {"output"});
    EXPECT_EQ(slurp(in), before);
    EXPECT_FALSE(std::filesystem::exists(path("o")));
  }
  // An output path the file system refuses fails before work too, leaving nothing behind.
  expect_one_line_error(run({"quantize", "--in", in, "--tensor", "x", "--out", path("o"), "--json", "/dev/full"}),
                        "quantize", 1, {"/dev/full", "not a regular file"});
  expect_one_line_error(run({"quantize", "--in", in, "--tensor", "x", "--out", path("o"), "--json", path("no/j.json")}),
                        "quantize", 1, {path("no/j.json"), "no such folder"});
  EXPECT_FALSE(std::filesystem::exists(path("o")));
  // A full stdout is a failure, not exit 0.
  for (const std::vector<std::string>& args : {std::vector<std::string>{"formats"},
                                               {"quantize", "--in", in, "--tensor", "x", "--out", path("o"), "--json", "-"}}) {
    const Result r = run(args, "/dev/full");
    expect_one_line_error(r, args[0], 1, {"stdout", "write failed"});
  }
  // Outputs land under their names only when complete: no temporary file is left in the folder.
  ASSERT_EQ(run({"quantize", "--in", in, "--tensor", "x", "--out", path("o"), "--json", path("o.json")}).code, 0);
  for (const auto& e : std::filesystem::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

// Boost guessed option names from prefixes (--rec meant --recipe); a control byte in a config key reached the
// terminal raw.
TEST_F(Cli, OptionsAreSpeltOutAndEchoesAreEscaped) {
  const std::string in = path("in.safetensors");
  expect_one_line_error(run({"quantize", "--in", in, "--tensor", "x", "--out", path("o"), "--rec", "nvfp4"}), "quantize",
                        2, {"--rec"});
  expect_one_line_error(run({"quantize", "--in", in, "--tensor", "x", "--out", path("o"), "--form", "e2m1"}), "quantize",
                        2, {"--form"});
  std::ofstream(path("esc.cfg")) << "\x1b[31mevil = 1\n";
  const Result r = run({"quantize", "--in", in, "--tensor", "x", "--out", path("o"), "--config", path("esc.cfg")});
  expect_one_line_error(r, "quantize", 2, {"\\x1B[31mevil"});
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << "raw ESC on stderr";
  EXPECT_FALSE(std::filesystem::exists(path("o")));
  // A tensor name from a file, echoed in the table.
  io::write_safetensors(path("esc.safetensors"), {io::make_f32("e\x1b[31m", {kRows, kCols}, x_)});
  const Result t = run({"quantize", "--in", path("esc.safetensors"), "--tensor", "e\x1b[31m", "--out", path("o")});
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("e\\x1B[31m"), std::string::npos) << t.out;
  EXPECT_EQ(t.out.find('\x1b'), std::string::npos) << "raw ESC on stdout";
}

// Boost.Program_options loops forever wording an error about a value that holds its own placeholder (%value%);
// found by the configuration reader's fuzz target. Refused up front, on the command line and in config files
// (the simulator's own reader: tests/sim/config_test.cpp).
TEST_F(Cli, OptionPlaceholdersAreRefusedNotLoopedOn) {
  const std::string in = path("in.safetensors");
  expect_one_line_error(run({"quantize", "--in", in, "--tensor", "x", "--out", path("o"), "--block", "1%value%"}),
                        "quantize", 2, {"%value%"});
  std::ofstream(path("ph.cfg")) << "recipe = x%option%\n";
  expect_one_line_error(run({"quantize", "--in", in, "--tensor", "x", "--out", path("o"), "--config", path("ph.cfg")}),
                        "quantize", 2, {"%option%"});
}

// One spelling of an RHT setting everywhere: none (or 0) is off in quantize, gemm and sim as in analyze's list,
// and a bad size is refused with the same message by both.
TEST_F(Cli, RhtNoneMeansOffEverywhere) {
  const std::string in = path("in.safetensors");
  const QTensor plain = quantize(x_.data(), kRows, kCols, QuantConfig{});
  for (const char* off : {"none", "0"}) {
    const Result r = run({"quantize", "--in", in, "--tensor", "x", "--rht", off, "--out", path("q.safetensors")});
    ASSERT_EQ(r.code, 0) << off << ": " << r.err;
    EXPECT_EQ(tensor_bytes(io::SafetensorsFile(path("q.safetensors")), "x.codes", io::DType::U8, {kRows, kCols}),
              plain.codes)
        << off;
  }
  const Result g = run({"gemm", "--a", in + ":x", "--b", in + ":w", "--rht", "none", "--out", path("g.safetensors")});
  EXPECT_EQ(g.code, 0) << g.err;
  const Result q = run({"quantize", "--in", in, "--tensor", "x", "--rht", "24", "--out", path("q24.safetensors")});
  const Result a = run({"analyze", "--trace", in, "--rht", "none,24"});
  expect_one_line_error(q, "quantize", 2, {"--rht", "not 24"});
  expect_one_line_error(a, "analyze", 2, {"--rht", "not 24"});
  EXPECT_EQ(q.err.substr(q.err.find("error:")), a.err.substr(a.err.find("error:")));
}

TEST_F(Cli, JsonConfigFaultsNameFileAndKey) {
  const std::string in = path("in.safetensors");
  auto with = [&](const std::string& name, const std::string& text) {
    std::ofstream(path(name)) << text;
    return run({"quantize", "--in", in, "--tensor", "x", "--out", path("o"), "--config", path(name)});
  };
  expect_one_line_error(with("bad.json", "{\"recipe\": "), "quantize", 2, {path("bad.json"), "not valid JSON"});
  expect_one_line_error(with("unk.json", R"({"recipee": "ufp4"})"), "quantize", 2, {path("unk.json"), "recipee"});
  expect_one_line_error(with("obj.json", R"({"recipe": {"name": "ufp4"}})"), "quantize", 2,
                        {path("obj.json"), "option 'recipe'", "a value must be"});
  expect_one_line_error(with("nest.json", R"({"config": {"config": "other.cfg"}})"), "quantize", 2,
                        {path("nest.json"), "'config' cannot be set in a config file"});
  // A placeholder spelt with JSON escapes is refused like one in plain text (the parser would loop on it).
  expect_one_line_error(with("ph.json", R"({"block": "1\u0025value\u0025"})"), "quantize", 2, {"%value%"});
  EXPECT_FALSE(std::filesystem::exists(path("o")));
}

// The JSON form refuses what the `key = value` form refuses or cannot hold: a repeated key (nlohmann would keep the
// last), an empty key (was "ambiguous"), a NUL byte (it cut the message, and a file name short), and a value past
// 64 KiB (was echoed whole); values are echoed escaped and at most 80 bytes long.
TEST_F(Cli, JsonConfigRepeatedEmptyNulAndHugeValuesAreRefused) {
  const std::string in = path("in.safetensors");
  auto with = [&](const std::string& name, const std::string& text) {
    std::ofstream(path(name), std::ios::binary) << text;
    return run({"quantize", "--in", in, "--tensor", "x", "--out", path("o"), "--config", path(name)});
  };
  expect_one_line_error(with("dup.json", R"({"recipe": "ufp4", "format": "e1m2", "recipe": "nvfp4"})"), "quantize", 2,
                        {path("dup.json"), "key 'recipe' is given twice"});
  expect_one_line_error(with("dupr.json", R"({"config": {"rht": 16, "rht": 32}})"), "quantize", 2,
                        {path("dupr.json"), "key 'rht' is given twice"});
  const Result e = with("empty.json", R"({"": 1})");
  expect_one_line_error(e, "quantize", 2, {path("empty.json"), "an empty key"});
  EXPECT_EQ(e.err.find("ambiguous"), std::string::npos) << e.err;
  expect_one_line_error(with("nul.json", R"({"format": "e2\u0000m1"})"), "quantize", 2,
                        {path("nul.json"), "option 'format': the value 'e2\\x00m1' holds a NUL byte at byte 2"});
  expect_one_line_error(with("nul.cfg", std::string("format = e2\0m1\n", 15)), "quantize", 2,
                        {path("nul.cfg"), "the value 'e2\\x00m1' holds a NUL byte"});
  const Result h = with("huge.json", "{\"format\": \"" + std::string(1 << 20, 'y') + "\"}");
  expect_one_line_error(h, "quantize", 2, {path("huge.json"), "option 'format': a value of 1048576 bytes (at most 65536)"});
  EXPECT_LT(h.err.size(), 400u);
  // A value under the limit is named by its first 80 bytes, wherever the fault is found.
  const Result l = with("long.json", "{\"format\": \"" + std::string(5000, 'z') + "\"}");
  expect_one_line_error(l, "quantize", 2, {"unknown format '" + std::string(80, 'z') + "... (5000 bytes)'"});
  EXPECT_LT(l.err.size(), 400u);
  EXPECT_FALSE(std::filesystem::exists(path("o")));
}

// Exact quantisation has SQNR +inf (docs/spec.md §6.1), which the JSON writes as null: tables print "exact" for it
// and "n/a" for a difference with an exact side (inf - inf was "-nan"), never inf or nan, on all-zero and constant
// traces, in analyze, quantize and gemm alike.
TEST_F(Cli, ExactQuantisationPrintsExactNotInfOrNan) {
  for (const float v : {0.0f, 0.75f}) {
    SCOPED_TRACE(v);
    const std::vector<float> x(32 * 64, v), dy(32 * 32, v);
    io::write_safetensors(path("c.safetensors"), {io::make_f32("g.fwd_x", {32, 64}, x), io::make_f32("g.fwd_w", {32, 64}, x),
                                                  io::make_f32("g.bwd_dy", {32, 32}, dy)},
                          {{"fp4lab.trace.version", "1"}});
    std::vector<Result> rs = {
        run({"analyze", "--trace", path("c.safetensors"), "--recipe", "ufp4", "--json", path("a.json")}),
        run({"quantize", "--in", path("c.safetensors"), "--tensor", "g.fwd_x", "--out", path("q")}),
        run({"gemm", "--a", path("c.safetensors") + ":g.fwd_x", "--b", path("c.safetensors") + ":g.fwd_w", "--out", path("g")})};
    for (Result& r : rs) {
      ASSERT_EQ(r.code, 0) << r.err;
      for (size_t i; (i = r.out.find(path(""))) != std::string::npos;) r.out.erase(i, path("").size());  // random name
      EXPECT_NE(r.out.find("exact"), std::string::npos) << r.out;
      for (const char* bad : {"inf", "nan", "NaN", "Inf"}) EXPECT_EQ(r.out.find(bad), std::string::npos) << r.out;
    }
    EXPECT_NE(rs[0].out.find("n/a"), std::string::npos) << rs[0].out;
    const json a = json::parse(slurp(path("a.json")));
    size_t nulls = 0, exact_cells = 0;
    for (const auto& t : a["tensors"]) nulls += t["sqnr_db"].is_null();
    for (const auto& g : a["gemms"]) nulls += g["sqnr_db"].is_null();
    for (size_t i = 0; (i = rs[0].out.find("exact", i)) != std::string::npos; ++i) ++exact_cells;
    EXPECT_GT(nulls, 0u);
    EXPECT_EQ(exact_cells, nulls);  // one "exact" cell per null record, no more
  }
}

// Every *.safetensors entry of a trace folder is read: a dangling or looping link, or a FIFO of that name, is a data
// error naming it, found before any analysis (they were skipped without a word).
TEST_F(Cli, TraceFolderLinksAndFifosAreNamedNotSkipped) {
  namespace fs = std::filesystem;
  const std::string t = path("tr");
  fs::create_directory(t);
  write_trace(t + "/a.safetensors", 32, 64, 32);
  struct Case {
    std::string entry;
    std::function<void(const std::string&)> make;
    std::string want;
  };
  const std::vector<Case> cases = {
      {"b.safetensors", [](const std::string& p) { fs::create_symlink("gone.safetensors", p); },
       "link to a missing file 'gone.safetensors'"},
      {"c.safetensors", [](const std::string& p) { fs::create_symlink("c.safetensors", p); }, "link loop"},
      {"f.safetensors", [](const std::string& p) { ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0); }, "file is a FIFO"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.entry);
    const std::string p = t + "/" + c.entry;
    c.make(p);
    expect_one_line_error(run({"analyze", "--trace", t, "--json", path("a.json")}), "analyze", 1, {p + ": " + c.want});
    EXPECT_FALSE(fs::exists(path("a.json")));
    fs::remove(p);
  }
  EXPECT_EQ(run({"analyze", "--trace", t}).code, 0);
}

// Paths and names are recorded in UTF-8 (JSON, safetensors metadata): one that is not UTF-8 is a usage error naming
// it, escaped, before any work (quantize and gemm used to finish and then blame "a tensor name", analyze wrote U+FFFD
// into its report). Valid UTF-8 beyond ASCII works.
TEST_F(Cli, NonUtf8PathsAreRefusedBeforeTheWork) {
  const std::string in = path("in.safetensors"), bad = path("bad\xff");
  std::ofstream(path("c.cfg")) << "in = " << bad << "/x.safetensors\n";
  const std::vector<std::vector<std::string>> cases = {
      {"quantize", "--in", bad + "/x.safetensors", "--tensor", "x", "--out", path("o")},
      {"quantize", "--in", in, "--tensor", "x", "--out", bad + "/o"},
      {"quantize", "--in", in, "--tensor", "x", "--out", path("o"), "--json", bad + ".json"},
      {"quantize", "--config", path("c.cfg"), "--tensor", "x", "--out", path("o")},
      {"gemm", "--a", in + ":x", "--b", bad + ":x", "--out", path("o")},
      {"analyze", "--trace", bad, "--json", path("o")}};
  for (const auto& args : cases) {
    SCOPED_TRACE(args[1] + " " + args[2]);
    const Result r = run(args);
    expect_one_line_error(r, args[0], 2, {"bad\\xFF", "is not valid UTF-8"});
    EXPECT_EQ(r.err.find('\xff'), std::string::npos);  // the message itself is UTF-8
    EXPECT_FALSE(std::filesystem::exists(path("o")));
  }
  std::filesystem::create_directory(path("\xc3\xa9t\xc3\xa9"));  // "été"
  const Result ok = run({"quantize", "--in", in, "--tensor", "x", "--out", path("\xc3\xa9t\xc3\xa9/o"), "--json", "-"});
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_EQ(json::parse(ok.out)["out"], path("\xc3\xa9t\xc3\xa9/o"));
}

// The one progress reporter of analyze and sim (cli/options.hpp): silent for the first two seconds and whenever
// stderr is not a terminal, so a captured stderr holds nothing but a failure's one line.
TEST(Progress, OnlyToATerminalAndOnlyAfterTwoSeconds) {
  std::ostringstream os;
  cli::Progress p("sim");
  p.out = &os;
  p.tty = true;
  p.step(1, 3, "fc1.fwd_y");
  EXPECT_EQ(os.str(), "");  // just started
  p.t0 -= std::chrono::seconds(3);
  p.step(2, 3, "fc1.bwd_\x1b[31mdx");
  EXPECT_EQ(os.str().rfind("sim: [2/3] fc1.bwd_\\x1B[31mdx (3.0 s)\n", 0), 0u) << os.str();
  os.str("");
  p.tty = false;
  p.step(3, 3, "fc1.bwd_dw");
  EXPECT_EQ(os.str(), "");
}

#ifdef FP4LAB_TEST_SIM
// fp4lab sim's JSON report carries its configuration under the keys --config takes (the TCU keys, the energy
// table among them, and the run's own options), so the report fed back as --config repeats the run.
TEST_F(Cli, SimReportIsItsOwnConfig) {
  const std::string src = FP4LAB_SOURCE_DIR;
  const Result a = run({"sim", "--trace", src + "/workloads/tiny-lm/step_005000", "--config",
                        src + "/sim/configs/teaching.cfg", "--recipe", "ufp4", "--check", "--json", path("a.json")});
  ASSERT_EQ(a.code, 0) << a.err;
  const json ja = json::parse(slurp(path("a.json")));
  for (const char* key : {"clock.ghz", "mac.units", "energy.mac_dual_pj", "energy.sr_pj", "energy.buffer_byte_pj",
                          "recipe", "trace", "check"})
    EXPECT_TRUE(ja["config"].contains(key)) << key << " missing from " << ja["config"].dump();
  EXPECT_EQ(ja["config"]["energy.mac_dual_pj"], 0.022);  // sim/configs/teaching.cfg
  EXPECT_EQ(ja["config"]["recipe"], "ufp4");

  const Result b = run({"sim", "--config", path("a.json"), "--json", path("b.json")});
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_EQ(b.out, a.out);  // the table
  json jb = json::parse(slurp(path("b.json")));
  EXPECT_NE(jb["command"], ja["command"]);
  jb["command"] = ja["command"];
  EXPECT_EQ(jb, ja) << json::diff(ja, jb).dump(1);
  EXPECT_GT(ja["total"]["check"]["outputs"].get<int64_t>(), 0);

  // The command line still wins over the report's values, and the energy table is read from it.
  std::string text = slurp(path("a.json"));
  json edited = json::parse(text);
  edited["config"]["energy.mac_dual_pj"] = 0.044;
  std::ofstream(path("e.json")) << edited.dump();
  const Result c = run({"sim", "--config", path("e.json"), "--mac.units", "8", "--json", path("c.json")});
  ASSERT_EQ(c.code, 0) << c.err;
  const json jc = json::parse(slurp(path("c.json")));
  EXPECT_EQ(jc["config"]["mac.units"], 8);
  EXPECT_EQ(jc["config"]["energy.mac_dual_pj"], 0.044);
  // Every MAC runs on the dual unit: twice its pJ per MAC gives twice the MAC energy.
  EXPECT_DOUBLE_EQ(jc["total"]["energy_pj"]["mac"].get<double>(), 2 * ja["total"]["energy_pj"]["mac"].get<double>());
}

// A sweep's outputs are checked before its runs (they used to fail only once every run had finished).
TEST_F(Cli, SimSweepOutputsAreCheckedFirst) {
  const std::string src = FP4LAB_SOURCE_DIR;
  std::ofstream(path("one.csv")) << "gemm,tokens,in,out\nfc1,64,64,64\n";
  std::ofstream(path("s.toml")) << "[defaults]\nconfig = \"" << src << "/sim/configs/teaching.cfg\"\n"
                                << "[[grid]]\nname = \"r\"\nshapes = \"" << path("one.csv") << "\"\n";
  const Result r = run({"sim", "--sweep", path("s.toml"), "--out", path("no/such/x")});
  if (r.err.find("toml") != std::string::npos) GTEST_SKIP() << "built without toml++: " << r.err;
  expect_one_line_error(r, "sim", 1, {path("no/such/x.json"), "no such folder"});
  const Result s = run({"sim", "--sweep", path("s.toml"), "--out", path("s.toml").substr(0, path("s.toml").size() - 5)});
  EXPECT_EQ(s.code, 0) << s.err;  // PREFIX.json and PREFIX.csv beside the sweep file are fine
  EXPECT_TRUE(std::filesystem::exists(path("s.csv")));
}
#endif

TEST_F(Cli, VersionNamesReleaseAndCommit) {
  for (const std::vector<std::string>& args : {std::vector<std::string>{"--version"}, {"quantize", "--version"}}) {
    const Result r = run(args);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out.rfind(std::string("fp4lab ") + FP4LAB_VERSION + " (git ", 0), 0u) << r.out;
  }
}


// ---- exit codes: one table (fp4lab/io/exit_codes.hpp), printed by --help and copied in docs/spec.md §11.1 ------
TEST_F(Cli, ExitCodesAgreeWithSpecAndHelp) {
  std::istringstream doc(slurp(FP4LAB_SOURCE_DIR "/docs/spec.md"));
  std::vector<std::pair<std::string, std::string>> table;  // (code, meaning) as written
  bool in_table = false;
  for (std::string line; std::getline(doc, line);) {
    if (!in_table) {
      in_table = line == "| exit code | meaning |";
      if (in_table) std::getline(doc, line);  // the |---| line
      continue;
    }
    if (line.rfind("| ", 0) != 0) break;
    const size_t bar = line.find(" | ", 2);
    ASSERT_NE(bar, std::string::npos) << line;
    ASSERT_GE(line.size(), bar + 5) << line;
    table.emplace_back(line.substr(2, bar - 2), line.substr(bar + 3, line.size() - bar - 5));
  }
  ASSERT_TRUE(in_table) << "docs/spec.md has no table headed '| exit code | meaning |'";
  ASSERT_EQ(table.size(), std::size(cli::kExitCodes)) << "docs/spec.md's exit-code table has another number of rows";
  const Result help = run({"--help"});
  ASSERT_EQ(help.code, 0);
  for (size_t i = 0; i < table.size(); ++i) {
    const cli::ExitCode& e = cli::kExitCodes[i];
    EXPECT_EQ(table[i].first, std::to_string(e.code)) << "docs/spec.md exit-code row " << i + 1;
    EXPECT_EQ(table[i].second, e.meaning) << "docs/spec.md exit-code row " << i + 1;
    const std::string row = "\n  " + std::to_string(e.code) + "  " + e.meaning + "\n";
    EXPECT_NE(help.out.find(row), std::string::npos) << "fp4lab --help lacks" << row;
  }
  // The codes the subcommands use are rows of the table.
  for (int code : {cli::kExitOk, cli::kExitData, cli::kExitUsage, cli::kExitNoDevice, cli::kExitNoCuda, cli::kExitNoSim})
    EXPECT_TRUE(std::any_of(std::begin(cli::kExitCodes), std::end(cli::kExitCodes),
                            [&](const cli::ExitCode& e) { return e.code == code; }))
        << code;
}

// fp4lab sim is a subcommand of every build: a build without SystemC (the sanitizer build of scripts/test.sh) lists
// it and says in one line that it has no simulator and how to get one, with its own exit code, whatever follows.
#ifndef FP4LAB_TEST_SIM
TEST_F(Cli, SimWithoutSystemcSaysSoInOneLine) {
  const Result help = run({"--help"});
  EXPECT_NE(help.out.find("\n  sim "), std::string::npos) << help.out;
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"sim", "--list-configs"}, {"sim", "--help"}, {"sim", "--config", "h200", "--json", "-"}, {"sim"}}) {
    SCOPED_TRACE(args.back());
    const Result r = run(args);
    EXPECT_EQ(r.code, cli::kExitNoSim) << r.err;
    EXPECT_EQ(r.err.rfind("fp4lab sim: error: this fp4lab was built without the simulator (", 0), 0u) << r.err;
    EXPECT_NE(r.err.find("apt-get install libsystemc-dev"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}
#endif

// ---- fp4lab cuda: subcommands of fp4lab in every build; the GPU work only where CUDA was built ----------------
const std::string kBundledTrace = FP4LAB_SOURCE_DIR "/workloads/tiny-lm/step_005000";

TEST_F(Cli, CudaHelpListsItsSubcommands) {
  const Result top = run({"--help"});
  const Result group = run({"cuda", "--help"});
  EXPECT_EQ(group.code, 0) << group.err;
  for (const char* s : {"check", "bench", "qbench", "timings"}) {
    EXPECT_NE(group.out.find(std::string("  cuda ") + s + " "), std::string::npos) << s << " in\n" << group.out;
    EXPECT_NE(top.out.find(std::string("  cuda ") + s + " "), std::string::npos) << s;
    const Result h = run({"cuda", s, "--help"});
    EXPECT_EQ(h.code, 0) << s;
    EXPECT_EQ(h.out.rfind(std::string("usage: fp4lab cuda ") + s + " ", 0), 0u) << h.out;
    EXPECT_NE(h.out.find("--json"), std::string::npos) << s;
  }
  EXPECT_EQ(group.out.find("  quantize "), std::string::npos) << "fp4lab cuda --help lists only its members";
  const Result none = run({"cuda"});
  EXPECT_EQ(none.code, cli::kExitUsage);
  EXPECT_NE(none.err.find("cuda check"), std::string::npos) << none.err;
}

// With valid arguments, a build without CUDA ends each cuda subcommand with one line and kExitNoCuda; a CUDA
// build ends with kExitNoDevice where there is no GPU, and runs (exit 0) where there is one. The arguments are
// small so that a machine with a GPU runs each in seconds.
TEST_F(Cli, CudaWithoutCudaOrDeviceSaysSoInOneLine) {
  const std::vector<std::vector<std::string>> runs = {
      {"cuda", "check", "--trace", kBundledTrace, "--limit", "1"},
      {"cuda", "bench", "--size", "256", "--reps", "3"},
      {"cuda", "qbench", "--shape", "32x32", "--recipe", "ufp4", "--variant", "plain", "--layout", "fake-row",
       "--reps", "3"},
      {"cuda", "timings", "--copy", "4096", "--reps", "3"},
  };
  for (const auto& args : runs) {
    SCOPED_TRACE("fp4lab cuda " + args[1]);
    const Result r = run(args);
    const std::string prefix = "fp4lab cuda " + args[1] + ": error: ";
#ifdef FP4LAB_TEST_CUDA
    if (r.code == 0) continue;  // a GPU is here: the subcommand ran
    EXPECT_EQ(r.code, cli::kExitNoDevice) << r.err;
    EXPECT_EQ(r.err.rfind(prefix + "no usable CUDA device (", 0), 0u) << r.err;
#else
    EXPECT_EQ(r.code, cli::kExitNoCuda) << r.err;
    EXPECT_EQ(r.err, prefix + "this fp4lab was built without CUDA (FP4LAB_CUDA=OFF or no nvcc found when configured)\n");
#endif
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

// Bad arguments and inputs of the cuda subcommands are reported before any device is looked at: the CLI's one
// line and exit code, in every build (a build without CUDA would otherwise say kExitNoCuda).
TEST_F(Cli, CudaArgumentErrorsComeBeforeTheDevice) {
  std::filesystem::create_directory(path("empty"));
  const std::vector<ErrCase> cases = {
      {{"cuda", "check", "--trace", kBundledTrace, "--recipe", "fp8"}, 2, {"unknown recipe 'fp8'"}},
      {{"cuda", "check", "--trace", "@missing"}, 1, {"@missing", "no such file"}},
      {{"cuda", "check", "--trace", kBundledTrace, "@missing"}, 1, {"@missing"}},
      {{"cuda", "check", "--trace", "@empty"}, 1, {"@empty"}},
      {{"cuda", "check"}, 2, {"--trace", "required"}},
      {{"cuda", "check", "--trace", kBundledTrace, "--gemm", "slow"}, 2, {"--gemm", "'slow'"}},
      {{"cuda", "check", "--trace", kBundledTrace, "--bogus"}, 2, {"--bogus"}},
      {{"cuda", "check", "--trace", kBundledTrace, "--json", "@nodir/out.json"}, 1, {"@nodir/out.json"}},
      {{"cuda", "bench", "--trace", "@missing"}, 1, {"@missing"}},
      {{"cuda", "bench", "--recipe", "fp8"}, 2, {"unknown recipe 'fp8'"}},
      {{"cuda", "bench", "--size", "100"}, 2, {"--size"}},
      {{"cuda", "qbench", "--shape", "100x100"}, 2, {"--shape 100x100", "multiples of 32"}},
      {{"cuda", "qbench", "--recipe", "fp8"}, 2, {"unknown recipe 'fp8'"}},
      {{"cuda", "qbench", "--layout", "fake"}, 2, {"--layout fake", "unknown"}},
      {{"cuda", "qbench", "--variant", "sr2"}, 2, {"--variant sr2", "unknown"}},
      {{"cuda", "timings", "--quant", "12x"}, 2, {"--quant '12x'"}},
      {{"cuda", "timings", "--gemm-recipe", "fp8"}, 2, {"unknown recipe 'fp8'"}},
      {{"cuda", "timings", "--reps", "1"}, 2, {"--reps"}},
      {{"cuda", "frob"}, 2, {"unknown subcommand 'cuda frob'"}},
      {{"cuda", "--trace", kBundledTrace}, 2, {"'--trace' comes before a subcommand"}},
  };
  expect_one_line_errors(cases, [](const std::vector<std::string>& args) {
    return args[1] == "frob" ? std::string("fp4lab: error: ")
           : args[1][0] == '-' ? std::string("fp4lab cuda: error: ")
                               : "fp4lab cuda " + args[1] + ": error: ";
  }, false);
}

// ---- hostile environments: files changing under a run, thread counts, file-size limits ----------------------------

// No temporary (.NAME.tmp-XXXXXX) left in the test folder.
void expect_no_temporaries(const std::string& dir) {
  for (const auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

// The length of a safetensors file's header, 8 bytes of length included: where its tensors' data begins.
uint64_t header_end(const std::string& file) {
  uint64_t n = 0;
  std::ifstream(file, std::ios::binary).read(reinterpret_cast<char*>(&n), 8);
  return 8 + n;
}

// A trace file truncated after analyze read its header and before it read the tensors (the LD_PRELOAD hook truncates
// it there, in every run): one data error naming the file, and no output. A mapped file ended the process by SIGBUS.
TEST_F(Cli, SigbusTraceTruncatedDuringAnalyzeIsOneDataError) {
  write_trace(path("t.safetensors"), 64, 64, 64);
  const std::string file = std::filesystem::canonical(path("t.safetensors")).string();
  const uint64_t cut = header_end(file);
  // The hook's library loads before a sanitizer build's runtime, which would otherwise refuse to start.
  const std::string hook = "ASAN_OPTIONS=verify_asan_link_order=0 LD_PRELOAD=" + quote(FP4LAB_TRUNCATE_HOOK) +
                           " FP4LAB_TEST_TRUNCATE=" + quote(file + ":" + std::to_string(cut));
  const Result r = run({"analyze", "--trace", path("t.safetensors"), "--json", path("o.json")}, "", hook);
  expect_one_line_error(r, "analyze", 1,
                        {path("t.safetensors") + ": truncated to " + std::to_string(cut) + " bytes while in use",
                         "tensor 'g.fwd_x'"});
  EXPECT_EQ(std::filesystem::file_size(file), cut);  // the hook did cut it, during the run
  EXPECT_FALSE(std::filesystem::exists(path("o.json")));
  expect_no_temporaries(dir_);
#ifdef FP4LAB_TEST_SIM
  write_trace(path("t.safetensors"), 64, 64, 64);
  const Result s = run({"sim", "--trace", path("t.safetensors"), "--config", FP4LAB_SOURCE_DIR "/sim/configs/teaching.cfg",
                        "--check"}, "", hook);
  expect_one_line_error(s, "sim", 1, {path("t.safetensors"), "truncated to " + std::to_string(cut) + " bytes"});
#endif
}

// OMP_NUM_THREADS=100000 ended analyze in SIGSEGV, 40000 in libgomp's own message, and malformed values were ignored
// after a libgomp warning: every value outside the rule (1 to 1024, or a list of such) is one usage error naming the
// variable and its value, before any thread starts.
TEST_F(Cli, ThreadCountsOpenMpCannotHonourAreOneUsageError) {
  write_trace(path("t.safetensors"), 32, 32, 32);
  for (const std::string v : {"100000", "40000", "1025", "abc", "0", "-3", "4,100000", "", "8,", "2 2", "+4", "1e3"}) {
    SCOPED_TRACE("OMP_NUM_THREADS='" + v + "'");
    const Result r = run({"analyze", "--trace", path("t.safetensors")}, "", "OMP_NUM_THREADS=" + quote(v));
    expect_one_line_error(r, "analyze", 2, {"OMP_NUM_THREADS=", "not a thread count from 1 to 1024"});
    EXPECT_NE(r.err.find(v.empty() ? "''" : v), std::string::npos) << r.err;
  }
  // Within the rule the figures are those of one thread.
  const Result one = run({"analyze", "--trace", path("t.safetensors"), "--json", "-"}, "", "OMP_NUM_THREADS=1");
  ASSERT_EQ(one.code, 0) << one.err;
  for (const std::string v : {"3", " 2 ", "2,2", "1024"}) {
    SCOPED_TRACE("OMP_NUM_THREADS='" + v + "'");
    const Result r = run({"analyze", "--trace", path("t.safetensors"), "--json", "-"}, "", "OMP_NUM_THREADS=" + quote(v));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.err, "");
    EXPECT_EQ(json::parse(r.out)["gemms"], json::parse(one.out)["gemms"]);
  }
}

// Under a file-size limit (ulimit -f) the CLI died by SIGXFSZ with its temporary left: now the write fails with
// EFBIG, one data error naming the output, and nothing is left behind.
TEST_F(Cli, FileSizeLimitIsOneDataErrorWithoutTemporary) {
  write_trace(path("t.safetensors"), 64, 64, 64);
  const std::string limit = "ulimit -f 16;";  // 8 or 16 KiB, as the shell counts blocks: less than either output
  expect_one_line_error(run({"analyze", "--trace", path("t.safetensors"), "--json", path("o.json")}, "", limit),
                        "analyze", 1, {path("o.json"), "write failed", "File too large"});
  expect_one_line_error(run({"quantize", "--in", path("t.safetensors"), "--tensor", "g.fwd_x", "--out", path("o")}, "",
                            limit),
                        "quantize", 1, {path("o"), "write failed", "File too large"});
  EXPECT_FALSE(std::filesystem::exists(path("o.json")));
  EXPECT_FALSE(std::filesystem::exists(path("o")));
  expect_no_temporaries(dir_);
}

#ifdef FP4LAB_TEST_SIM
// A shape list's count of 1e300 gave totals of inf and -nan% with exit 0: a count is a whole number from 1 to 2^31,
// and whatever passes gives finite figures.
TEST_F(Cli, ShapeListCountIsAWholeNumberWithinItsBound) {
  const std::string cfg = FP4LAB_SOURCE_DIR "/sim/configs/teaching.cfg";
  for (const std::string c : {"1e300", "inf", "nan", "0.5", "0", "-1", "2147483649", "1e3", "0x10", "", "1 2"}) {
    SCOPED_TRACE("count '" + c + "'");
    std::ofstream(path("s.csv"), std::ios::trunc) << "gemm,tokens,in,out,count\nx,64,64,64," << c << "\n";
    const Result r = run({"sim", "--shapes", path("s.csv"), "--config", cfg, "--json", path("o.json")});
    expect_one_line_error(r, "sim", 1, {path("s.csv") + ":2: count = ", "not a whole number from 1 to 2147483648"});
    EXPECT_FALSE(std::filesystem::exists(path("o.json")));
  }
  std::ofstream(path("s.csv"), std::ios::trunc) << "gemm,tokens,in,out,count\nx,512,512,512,2147483648\n";
  const Result r = run({"sim", "--shapes", path("s.csv"), "--config", cfg, "--json", path("o.json")});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string text = slurp(path("o.json"));
  EXPECT_EQ(text.find("null"), std::string::npos);  // the writer spells a non-finite number null
  EXPECT_EQ(r.out.find("inf"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("nan"), std::string::npos) << r.out;
}
#endif

}  // namespace
}  // namespace fp4lab
