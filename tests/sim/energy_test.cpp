// The MAC energies of the shipped configurations against the RTL's gate counts. sim/configs/h100-class.md
// derives them from rtl/area.json: an E1M2-only or dual-format unit costs the E2M1-only figure times the
// logic-gate ratio of its block dot-product unit (Yosys builds dot_e1m2, dot_dual over dot_e2m1), written to
// three decimals of a pJ; teaching.cfg and h200.cfg copy the h100-class table. A rerun of scripts/area.sh that moves the
// gate counts, or an edit of one .cfg, fails here until the configurations and the derivation agree again.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "sim_test_util.hpp"

namespace fp4lab::sim::test {
namespace {

namespace fs = std::filesystem;

nlohmann::json area_builds() {
  std::ifstream in(root() + "/rtl/area.json");
  EXPECT_TRUE(in) << "rtl/area.json";
  return nlohmann::json::parse(in).at("builds");
}
double gates(const nlohmann::json& builds, const char* build) { return builds.at(build).at("gates").get<double>(); }

// Every configuration under sim/configs/ takes its MAC energies from that derivation; one that derives them
// otherwise would need its own check here.
std::vector<fs::path> shipped_configs() {
  std::vector<fs::path> v;
  for (const auto& e : fs::directory_iterator(root() + "/sim/configs"))
    if (e.path().extension() == ".cfg") v.push_back(e.path());
  return v;
}

TEST(Energy, MacEnergiesFollowTheRtlGateCounts) {
  const nlohmann::json b = area_builds();
  const double e1m2_ratio = gates(b, "dot_e1m2") / gates(b, "dot_e2m1");
  const double dual_ratio = gates(b, "dot_dual") / gates(b, "dot_e2m1");
  const double half_digit = 0.0005 + 1e-12;  // the .cfg values are rounded to 0.001 pJ
  const auto configs = shipped_configs();
  ASSERT_GE(configs.size(), 2u);  // teaching and h100-class at least: an empty glob must not pass
  for (const fs::path& p : configs) {
    SCOPED_TRACE(p.filename().string());
    const Energy e = load(p.string()).energy;
    EXPECT_NEAR(e.mac_e1m2, e.mac_e2m1 * e1m2_ratio, half_digit) << "energy.mac_e1m2_pj";
    EXPECT_NEAR(e.mac_dual, e.mac_e2m1 * dual_ratio, half_digit) << "energy.mac_dual_pj";
  }
}

// teaching.cfg and h200.cfg copy the h100-class table (the same assumptions; h200.cfg: the same GH100 die).
TEST(Energy, TeachingAndH200CopyTheH100ClassTable) {
  const Energy h = config("h100-class").energy;
  for (const char* name : {"teaching", "h200"}) {
    SCOPED_TRACE(name);
    const Energy t = config(name).energy;
    EXPECT_EQ(t.mac_e2m1, h.mac_e2m1);
    EXPECT_EQ(t.mac_e1m2, h.mac_e1m2);
    EXPECT_EQ(t.mac_dual, h.mac_dual);
    EXPECT_EQ(t.mac_fallback, h.mac_fallback);
    EXPECT_EQ(t.acc_op, h.acc_op);
    EXPECT_EQ(t.rht_add, h.rht_add);
    EXPECT_EQ(t.quant_elem, h.quant_elem);
    EXPECT_EQ(t.sr_elem, h.sr_elem);
    EXPECT_EQ(t.dram_byte, h.dram_byte);
    EXPECT_EQ(t.l2_byte, h.l2_byte);
    EXPECT_EQ(t.buffer_byte, h.buffer_byte);
  }
}

// The derivation in h100-class.md quotes the gate counts it used; they must be the current ones.
TEST(Energy, DerivationQuotesTheCurrentGateCounts) {
  const nlohmann::json b = area_builds();
  std::ifstream in(root() + "/sim/configs/h100-class.md");
  std::stringstream md;
  md << in.rdbuf();
  for (const char* unit : {"dot_e1m2", "dot_dual"}) {
    const std::string ratio = std::to_string(int(gates(b, unit))) + " / " + std::to_string(int(gates(b, "dot_e2m1")));
    EXPECT_NE(md.str().find(ratio), std::string::npos) << "h100-class.md does not quote " << unit << " as " << ratio;
  }
}

}  // namespace
}  // namespace fp4lab::sim::test
