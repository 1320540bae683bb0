#include "fp4lab/sim/report.hpp"

#include <cmath>
#include <cstdio>
#include <iomanip>
#include <sstream>

namespace fp4lab::sim {

double Report::total_cycles() const {
  double s = 0;
  for (const auto& j : jobs) s += j.count * double(j.cycles);
  return s;
}
double Report::total_time_us() const {
  double s = 0;
  for (const auto& j : jobs) s += j.count * j.time_us;
  return s;
}
double Report::total_energy_pj() const {
  double s = 0;
  for (const auto& j : jobs) s += j.count * j.energy_total_pj;
  return s;
}
double Report::total_macs() const {
  double s = 0;
  for (const auto& j : jobs) s += j.count * j.macs;
  return s;
}
int64_t Report::total_mismatches() const {
  int64_t s = 0;
  for (const auto& j : jobs) s += j.mismatches;
  return s;
}
int64_t Report::total_checked() const {
  int64_t s = 0;
  for (const auto& j : jobs) s += j.outputs_checked;
  return s;
}

nlohmann::json job_json(const JobReport& j) {
  nlohmann::json o = {{"gemm", j.name},
                      {"layer", j.layer},
                      {"pass", j.pass},
                      {"M", j.M},
                      {"N", j.N},
                      {"K", j.K},
                      {"format", j.format},
                      {"scale", j.scale},
                      {"block", j.block},
                      {"rht", j.rht},
                      {"prep_mode", j.prep_mode},
                      {"native", j.native},
                      {"count", j.count},
                      {"cycles", j.cycles},
                      {"prep_cycles", j.prep_cycles},
                      {"time_us", j.time_us},
                      {"macs", j.macs},
                      {"mac_util", j.mac_util},
                      {"busy", j.busy},
                      {"bytes", j.bytes},
                      {"stall_cycles", j.stalls},
                      {"energy_pj", j.energy_pj},
                      {"energy_total_pj", j.energy_total_pj}};
  if (j.checked) o["check"] = {{"outputs", j.outputs_checked}, {"mismatches", j.mismatches}};
  if (j.kernel != "step") o["kernel"] = j.kernel;  // one kernel of the job alone (fp4lab sim --kernel)
  return o;
}

nlohmann::json area_json(const Config& c) {
  if (!c.priced()) return nullptr;
  return {{"mac_array_nand2", c.mac_array_nand2()},
          {"unit_nand2", c.unit_nand2()},
          {"mac_array_mm2", c.mm2(c.mac_array_nand2())},
          {"unit_mm2", c.mm2(c.unit_nand2())},
          {"static_mw", c.static_mw()}};
}

nlohmann::json Report::to_json() const {
  nlohmann::json js = nlohmann::json::array();
  std::map<std::string, double> stalls, bytes, energy;
  for (const auto& j : jobs) {
    js.push_back(job_json(j));
    for (const auto& [k, v] : j.stalls) stalls[k] += j.count * v;
    for (const auto& [k, v] : j.bytes) bytes[k] += j.count * v;
    for (const auto& [k, v] : j.energy_pj) energy[k] += j.count * v;
  }
  const double peak = double(peak_macs_per_cycle);
  const double cyc = total_cycles();
  nlohmann::json total = {{"cycles", cyc},
                          {"time_us", total_time_us()},
                          {"macs", total_macs()},
                          {"mac_util", cyc > 0 && peak > 0 ? total_macs() / (peak * cyc) : 0.0},
                          {"stall_cycles", stalls},
                          {"bytes", bytes},
                          {"energy_pj", energy},
                          {"energy_total_pj", total_energy_pj()}};
  if (checked) total["check"] = {{"outputs", total_checked()}, {"mismatches", total_mismatches()}};
  if (tokens > 0) {  // a model's step: the figures per token
    const double t = total_time_us();
    total["tokens"] = tokens;
    total["tokens_per_s"] = t > 0 ? double(tokens) / (t * 1e-6) : 0.0;
    total["energy_per_token_pj"] = total_energy_pj() / double(tokens);
  }
  nlohmann::json out = {{"fp4lab.sim.version", 1}, {"config", config},   {"peak_macs_per_cycle", peak_macs_per_cycle},
                        {"datapath", datapath},    {"recipe", recipe},   {"source", source},
                        {"gemms", js},             {"total", total}};
  if (!area.is_null()) out["area"] = area;
  return out;
}

namespace {
std::string si(double v, const char* unit) {
  static const char* up[] = {"", "k", "M", "G", "T"};
  static const char* down[] = {"", "m", "u", "n", "p"};
  const char* prefix = "";
  if (v != 0 && std::abs(v) < 1) {
    int i = 0;
    while (std::abs(v) < 1 && i < 4) {
      v *= 1000;
      ++i;
    }
    prefix = down[i];
  } else {
    int i = 0;
    while (std::abs(v) >= 1000 && i < 4) {
      v /= 1000;
      ++i;
    }
    prefix = up[i];
  }
  char b[64];
  std::snprintf(b, sizeof b, "%.3g %s%s", v, prefix, unit);
  return b;
}
std::string pct(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f%%", 100 * x);
  return b;
}
}  // namespace

void Report::print(std::ostream& os) const {
  const auto& c = config;
  os << "fp4lab sim  config " << c.value("name", std::string("?")) << ": " << c.value("tcu.count", 0) << " TCU x "
     << c.value("mac.units", 0) << " " << c.value("mac.kind", std::string("?")) << " block units at "
     << c.value("clock.ghz", 0.0) << " GHz, prep " << c.value("prep.mode", std::string("?")) << "; recipe " << recipe
     << "; " << source << "\n\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-34s %17s %12s %10s %6s %7s %6s %6s %6s %9s %9s%s\n", "gemm", "M x N x K", "cycles",
                "time", "util", "compute", "bw", "rht", "quant", "DRAM", "energy", checked ? "  check" : "");
  os << line;
  for (const auto& j : jobs) {
    const double cyc = double(std::max<int64_t>(j.cycles, 1));
    const std::string shape = std::to_string(j.M) + "x" + std::to_string(j.N) + "x" + std::to_string(j.K);
    std::snprintf(line, sizeof line, "%-34s %17s %12lld %10s %6s %7s %6s %6s %6s %9s %9s", j.name.c_str(),
                  shape.c_str(), (long long)j.cycles, si(j.time_us * 1e-6, "s").c_str(), pct(j.mac_util).c_str(),
                  pct(j.stalls.at("compute") / cyc).c_str(), pct(j.stalls.at("bandwidth") / cyc).c_str(),
                  pct(j.stalls.at("rht") / cyc).c_str(), pct(j.stalls.at("quant") / cyc).c_str(),
                  si(j.bytes.at("dram_read") + j.bytes.at("dram_write"), "B").c_str(),
                  si(j.energy_total_pj * 1e-12, "J").c_str());
    os << line;
    if (j.checked) os << "  " << j.mismatches << " / " << j.outputs_checked;
    if (j.count != 1) os << "  (x" << j.count << ")";
    os << "\n";
  }
  const nlohmann::json t = to_json()["total"];
  const double cyc = std::max(1.0, t["cycles"].get<double>());
  os << "\ntotal" << (jobs.size() > 1 ? " (weighted by count)" : "") << ": " << si(cyc, "cycles") << ", "
     << si(t["time_us"].get<double>() * 1e-6, "s") << ", MAC utilisation " << pct(t["mac_util"].get<double>())
     << ", energy " << si(t["energy_total_pj"].get<double>() * 1e-12, "J") << "\n";
  os << "  stalls:";
  for (const std::string& s : stall_categories()) os << "  " << s << " " << pct(t["stall_cycles"].value(s, 0.0) / cyc);
  os << "\n  bytes: ";
  for (const auto& [k, v] : t["bytes"].items()) os << "  " << k << " " << si(v.get<double>(), "B");
  os << "\n  energy:";
  for (const auto& [k, v] : t["energy_pj"].items()) os << "  " << k << " " << si(v.get<double>() * 1e-12, "J");
  os << "\n";
  if (!area.is_null())
    os << "  area:   MAC array " << si(area["mac_array_mm2"].get<double>(), "mm2") << ", whole unit "
       << si(area["unit_mm2"].get<double>(), "mm2") << " (" << si(area["unit_nand2"].get<double>(), "NAND2") << "), static "
       << si(area["static_mw"].get<double>() * 1e-3, "W") << "\n";
  if (tokens > 0)
    os << "  per token: " << si(t["energy_per_token_pj"].get<double>() * 1e-12, "J") << ", "
       << si(t["tokens_per_s"].get<double>(), "tokens/s") << "\n";
  if (!jobs.empty()) {
    // Busy shares, weighted by each GEMM's cycles.
    std::map<std::string, double> busy;
    for (const auto& j : jobs)
      for (const auto& [k, v] : j.busy) busy[k] += v * j.count * double(j.cycles);
    os << "  busy:  ";
    for (const std::string& u : unit_names()) os << "  " << u << " " << pct(busy[u] / cyc);
    os << "\n";
  }
  if (checked)
    os << "  check: " << total_mismatches() << " mismatches in " << total_checked()
       << " outputs (bit patterns against fp4lab::gemm)\n";
}

}  // namespace fp4lab::sim
