#include "fp4lab/sim/config.hpp"

#include <cmath>
#include <span>
#include <sstream>
#include <type_traits>

#include <stdexcept>

namespace fp4lab::sim {

namespace {
std::string fmt_num(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

std::span<const char* const> names_of(MacKind) { return kMacKindNames; }
std::span<const char* const> names_of(PrepMode) { return kPrepModeNames; }
std::span<const char* const> names_of(LaunchMode) { return kLaunchModeNames; }
std::span<const char* const> names_of(AccIssue) { return kAccIssueNames; }

std::string joined(std::span<const char* const> names, const char* sep) {
  std::string r;
  for (const char* n : names) r.append(r.empty() ? "" : sep).append(n);
  return r;
}

template <class E>
E parse_choice(const std::string& key, const std::string& s) {
  const std::span<const char* const> names = names_of(E{});
  for (size_t i = 0; i < names.size(); ++i)
    if (s == names[i]) return E(i);
  throw std::invalid_argument(key + " '" + s + "' is not one of " + joined(names, ", "));
}

// The member a key reads and writes, named by its path from Config: member<&Config::dram, &MemLevel::bandwidth>.
template <auto... Path>
constexpr auto member = +[](Config& c) -> auto& { return (c .* ... .* Path); };

// The members only name a field; validate() and to_json() read through them and write nothing.
template <class T>
const T& read(ConfigKey::Member<T> m, const Config& c) {
  return m(const_cast<Config&>(c));
}

// Ranges with a rule besides lo..hi (ConfigKey::Range), named so that the table reads as words.
constexpr ConfigKey::Range per_slot(double lo, double hi) { return {.lo = lo, .hi = hi, .per_slot = true}; }
constexpr ConfigKey::Range or_zero(double lo, double hi) { return {.lo = lo, .hi = hi, .or_zero = true}; }
constexpr ConfigKey::Range whole_blocks(double lo, double hi) { return {.lo = lo, .hi = hi, .whole_blocks = true}; }

// The type of the member a ConfigKey::Member<T> gives.
template <class T>
using Value = std::remove_cvref_t<decltype(std::declval<T>()(std::declval<Config&>()))>;
}  // namespace

const char* mac_kind_name(MacKind k) { return kMacKindNames[size_t(k)]; }
const char* prep_mode_name(PrepMode m) { return kPrepModeNames[size_t(m)]; }
const char* launch_mode_name(LaunchMode m) { return kLaunchModeNames[size_t(m)]; }
const char* acc_issue_name(AccIssue a) { return kAccIssueNames[size_t(a)]; }

const std::vector<ConfigKey>& config_keys() {
  using C = Config;
  using M = MemLevel;
  using E = Energy;
  using A = Area;
  constexpr bool kRequired = true, kDefault = false;
  // clang-format off
  static const std::vector<ConfigKey> keys = {
    // key                  member                              required   range, help
    {"name",                   member<&C::name>,                   kDefault,  {},
     "configuration name, printed in reports"},
    {"clock.ghz",              member<&C::clock_ghz>,              kRequired, {C::kMinClockGhz, C::kMaxClockGhz},
     "TCU clock, GHz"},
    {"tcu.count",              member<&C::tcus>,                   kRequired, {1, C::kMaxTcus},
     "TCUs sharing the memory levels; output tiles are dealt round-robin"},
    {"tcu.ctas",               member<&C::ctas>,                   kDefault,  {1, C::kMaxSlots},
     "tiles in flight per TCU, each on its share of the TCU's units and buffer (GPU CTAs resident per SM)"},
    {"tile.m",                 member<&C::tile_m>,                 kRequired, {1, C::kMaxTile}, "output tile rows"},
    {"tile.n",                 member<&C::tile_n>,                 kRequired, {1, C::kMaxTile}, "output tile columns"},
    {"tile.k",                 member<&C::tile_k>,                 kRequired, whole_blocks(32, C::kMaxTileK),
     "reduction elements per k-step (a multiple of 32 and of the RHT size)"},
    {"tile.raster_group",      member<&C::raster_group>,           kDefault,  {1, C::kMaxUnits},
     "tile rows visited together (grouped raster order)"},
    {"buffer.bytes",           member<&C::buffer_bytes>,           kRequired, {0, C::kMaxBytes},
     "operand buffer per TCU, bytes"},
    {"buffer.slots",           member<&C::buffer_slots>,           kDefault,  {1, C::kMaxSlots},
     "k-step tiles in flight from fetch to the MAC array"},
    {"acc.tiles",              member<&C::acc_tiles>,              kDefault,  {1, C::kMaxSlots},
     "output-tile accumulators per TCU"},
    {"dram.bandwidth",         member<&C::dram, &M::bandwidth>,    kRequired, {C::kMinBandwidth, C::kMaxBandwidth},
     "off-chip memory bandwidth, bytes per cycle"},
    {"dram.latency",           member<&C::dram, &M::latency>,      kRequired, {0, C::kMaxLatency},
     "off-chip memory latency, cycles"},
    {"dram.write_cost",        member<&C::dram, &M::write_cost>,   kDefault,  {1, 16},
     "port time of a written byte relative to a read byte (read/write turnarounds make writes dearer)"},
    {"l2.bytes",               member<&C::l2, &M::bytes>,          kDefault,  {0, C::kMaxBytes},
     "shared cache capacity, bytes (0 = none)"},
    // At least kMinBandwidth when there is an L2 (validate()).
    {"l2.bandwidth",           member<&C::l2, &M::bandwidth>,      kDefault,  {0, C::kMaxBandwidth},
     "shared cache bandwidth, bytes per cycle"},
    {"l2.latency",             member<&C::l2, &M::latency>,        kDefault,  {0, C::kMaxLatency},
     "shared cache latency, cycles"},
    {"rht.lanes",              member<&C::rht_lanes>,              kRequired, per_slot(C::kMinLanes, C::kMaxUnits),
     "RHT front-end elements per cycle"},
    {"rht.stage_latency",      member<&C::rht_stage_latency>,      kDefault,  {0, C::kMaxLatency},
     "cycles per butterfly stage"},
    {"quant.lanes",            member<&C::quant_lanes>,            kRequired, per_slot(C::kMinLanes, C::kMaxUnits),
     "quantiser elements per cycle (RTNE)"},
    {"quant.sr_lanes",         member<&C::quant_sr_lanes>,         kDefault,  per_slot(C::kMinLanes, C::kMaxUnits),
     "Philox calls per cycle: SR elements per cycle under philox1, x4 under philox4, x16 under philox16 "
     "(to quant.lanes; 0 = quant.lanes)"},
    {"quant.latency",          member<&C::quant_latency>,          kRequired, {0, C::kMaxLatency},
     "quantiser latency, cycles"},
    {"mac.units",              member<&C::mac_units>,              kRequired, {1, C::kMaxUnits},
     std::to_string(kMacWidth) + "-element block dot-product units per TCU"},
    {"mac.kind",               member<&C::mac_kind>,               kRequired, {}, "grids the units take natively"},
    {"mac.fallback_rate",      member<&C::mac_fallback_rate>,      kDefault,  or_zero(C::kMinRate, 1),
     "throughput relative to native for a grid the units lack (0 = such a GEMM is refused)"},
    {"mac.latency",            member<&C::mac_latency>,            kRequired, {0, C::kMaxLatency},
     "MAC array latency, cycles"},
    {"acc.lanes",              member<&C::acc_lanes>,              kRequired, per_slot(C::kMinLanes, C::kMaxUnits),
     "scale-and-accumulate operations per cycle"},
    {"acc.fused_lanes",        member<&C::acc_fused_lanes>,        kDefault,  per_slot(C::kMinLanes, C::kMaxUnits),
     "scale-and-accumulate operations per cycle where both operands' block scales are UE4M3 or UE8M0 (0 = "
     "acc.lanes)"},
    {"acc.latency",            member<&C::acc_latency>,            kRequired, {0, C::kMaxLatency},
     "scale-and-accumulate latency, cycles"},
    {"acc.issue",              member<&C::acc_issue>,              kDefault,  {},
     "scale-and-accumulate on its own unit, or issued by the MAC array (then a k-step occupies it for its "
     "block products plus its scale-and-accumulates)"},
    {"launch.mode",            member<&C::launch_mode>,            kDefault,  {},
     "kernels queued one by one, or replayed from a CUDA graph (which launch.* cost applies)"},
    {"launch.stream_us",       member<&C::launch_stream_us>,       kDefault,  {0, C::kMaxLaunchUs},
     "time before a stream-launched kernel's first tile, us"},
    {"launch.graph_us",        member<&C::launch_graph_us>,        kDefault,  {0, C::kMaxLaunchUs},
     "the same for a kernel replayed from a graph, us"},
    {"pass.elems",             member<&C::pass_elems>,             kDefault,  whole_blocks(0, C::kMaxBytes),
     "elements per work item of a separate pass (RHT, quantise, unpack), consecutive in the operand; 0 = "
     "tile-shaped items"},
    {"unpack.launches",        member<&C::unpack_launches>,        kDefault,  {0, C::kMaxSlots},
     "0: the GEMM reads packed operands; n > 0: it reads one-byte integer views and FP32 block scales, "
     "written by an unpack pass of n kernels first"},
    {"prep.mode",              member<&C::prep>,                   kDefault,  {},
     "RHT + quantise in the TCU front-end, as one or two passes through memory, or not at all (operands "
     "already quantised in memory)"},
    {"operand.bytes",          member<&C::input_bytes>,            kDefault,  {1, 8},
     "bytes per unquantised operand element (BF16 = 2)"},
    {"output.bytes",           member<&C::output_bytes>,           kDefault,  {1, 8},
     "bytes per output element (FP32 = 4, BF16 = 2)"},
    {"energy.mac_e2m1_pj",     member<&C::energy, &E::mac_e2m1>,   kRequired, {0, C::kMaxEnergyPj},
     "pJ per MAC on an E2M1-only unit"},
    {"energy.mac_e1m2_pj",     member<&C::energy, &E::mac_e1m2>,   kRequired, {0, C::kMaxEnergyPj},
     "pJ per MAC on an E1M2-only unit"},
    {"energy.mac_dual_pj",     member<&C::energy, &E::mac_dual>,   kRequired, {0, C::kMaxEnergyPj},
     "pJ per MAC on a dual-format unit"},
    {"energy.mac_fallback_pj", member<&C::energy, &E::mac_fallback>, kDefault, {0, C::kMaxEnergyPj},
     "pJ per MAC on the fallback path"},
    {"energy.acc_pj",          member<&C::energy, &E::acc_op>,     kRequired, {0, C::kMaxEnergyPj},
     "pJ per block scale-and-accumulate"},
    {"energy.rht_add_pj",      member<&C::energy, &E::rht_add>,    kRequired, {0, C::kMaxEnergyPj},
     "pJ per butterfly add or subtract"},
    {"energy.quant_pj",        member<&C::energy, &E::quant_elem>, kRequired, {0, C::kMaxEnergyPj},
     "pJ per element quantised"},
    {"energy.sr_pj",           member<&C::energy, &E::sr_elem>,    kDefault,  {0, C::kMaxEnergyPj},
     "extra pJ per Philox call of SR (one per element under philox1, per 4 under philox4, per 16 under philox16)"},
    {"energy.dram_byte_pj",    member<&C::energy, &E::dram_byte>,  kRequired, {0, C::kMaxEnergyPj},
     "pJ per off-chip byte"},
    {"energy.l2_byte_pj",      member<&C::energy, &E::l2_byte>,    kDefault,  {0, C::kMaxEnergyPj},
     "pJ per shared-cache byte"},
    {"energy.buffer_byte_pj",  member<&C::energy, &E::buffer_byte>, kRequired, {0, C::kMaxEnergyPj},
     "pJ per operand-buffer byte"},
    {"energy.leak_mw_per_mm2", member<&C::energy, &E::leak_mw_per_mm2>, kDefault, {0, C::kMaxLeakMwPerMm2},
     "static (leakage) power per mm^2 of the built units (area.*), mW; paid for the whole run time", true},
    {"area.mac_e2m1_nand2",    member<&C::area, &A::mac_e2m1>,     kDefault,  {0, C::kMaxNand2},
     "area of one E2M1-only block unit, NAND2 equivalents", true},
    {"area.mac_e1m2_nand2",    member<&C::area, &A::mac_e1m2>,     kDefault,  {0, C::kMaxNand2},
     "area of one E1M2-only block unit, NAND2 equivalents", true},
    {"area.mac_dual_nand2",    member<&C::area, &A::mac_dual>,     kDefault,  {0, C::kMaxNand2},
     "area of one dual-format block unit, NAND2 equivalents", true},
    {"area.rht_lane_nand2",    member<&C::area, &A::rht_lane>,     kDefault,  {0, C::kMaxNand2},
     "area of one RHT lane (an element per cycle), NAND2 equivalents", true},
    {"area.quant_lane_nand2",  member<&C::area, &A::quant_lane>,   kDefault,  {0, C::kMaxNand2},
     "area of one quantiser lane (an element per cycle), NAND2 equivalents", true},
    {"area.acc_lane_nand2",    member<&C::area, &A::acc_lane>,     kDefault,  {0, C::kMaxNand2},
     "area of one scale-and-accumulate lane not inside the block units, NAND2 equivalents", true},
    {"area.um2_per_nand2",     member<&C::area, &A::um2_per_nand2>, kDefault, {0, C::kMaxUm2PerNand2},
     "um^2 of one NAND2 equivalent at the node (area in mm^2 and static power need it)", true},
  };
  // clang-format on
  return keys;
}

std::span<const char* const> key_choices(const ConfigKey& key) {
  return std::visit(
      [](auto m) -> std::span<const char* const> {
        using T = Value<decltype(m)>;
        if constexpr (std::is_enum_v<T>)
          return names_of(T{});
        else
          return {};
      },
      key.field);
}

ConfigValue Config::value(const ConfigKey& key) const {
  return std::visit(
      [&](auto m) -> ConfigValue {
        using T = Value<decltype(m)>;
        if constexpr (std::is_enum_v<T>)
          return std::string(names_of(T{})[size_t(read(m, *this))]);
        else
          return read(m, *this);
      },
      key.field);
}

Config Config::from(const std::map<std::string, ConfigValue>& values) {
  // Checked here rather than by the reader, so that the message can say where the keys come from.
  for (const ConfigKey& k : config_keys())
    if (k.required && !values.count(k.name))
      throw std::invalid_argument("missing key '" + k.name +
                                  "' (a TCU configuration file gives it: --config sim/configs/teaching.cfg)");
  Config c;
  for (const ConfigKey& k : config_keys()) {
    const auto it = values.find(k.name);
    if (it == values.end()) continue;
    std::visit(
        [&](auto m) {
          using T = Value<decltype(m)>;
          if constexpr (std::is_enum_v<T>)
            m(c) = parse_choice<T>(k.name, std::get<std::string>(it->second));
          else
            m(c) = std::get<T>(it->second);
        },
        k.field);
  }
  if (!(c.quant_sr_lanes > 0)) c.quant_sr_lanes = c.quant_lanes;  // 0 in a file: as fast as RTNE
  if (!(c.acc_fused_lanes > 0)) c.acc_fused_lanes = c.acc_lanes;   // 0 in a file: no faster than FP32 scales
  c.validate();
  return c;
}

void Config::validate() const {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument(what);
  };
  // Documented bounds (config_keys(), docs/sim.md): wide enough for any real unit, narrow enough that no product
  // of them overflows the model's int64 cycle and byte counts or its 64-bit picosecond clock, and that the model's
  // per-TCU threads and per-tile work stay small. NaN fails every comparison, so each check is written as "inside
  // the range".
  auto in_range = [&](double v, double lo, double hi, const std::string& key) {
    need(std::isfinite(v) && v >= lo && v <= hi,
         key + " = " + fmt_num(v) + " is outside [" + fmt_num(lo) + ", " + fmt_num(hi) + "]");
  };
  // The keys one by one, in table order: tcu.ctas comes before the per-slot rates that divide by it.
  for (const ConfigKey& k : config_keys()) {
    std::visit(
        [&](auto m) {
          using T = Value<decltype(m)>;
          if constexpr (std::is_arithmetic_v<T>) {
            const ConfigKey::Range& r = k.range;
            const double v = double(read(m, *this));
            if (r.or_zero) {
              need(std::isfinite(v) && (v == 0 || (v >= r.lo && v <= r.hi)),
                   k.name + " = " + fmt_num(v) + " must be 0 or lie in [" + fmt_num(r.lo) + ", " + fmt_num(r.hi) + "]");
            } else if (r.per_slot) {
              in_range(v / ctas, r.lo, r.hi, k.name + " / tcu.ctas");
            } else {
              in_range(v, r.lo, r.hi, k.name);
            }
            if constexpr (std::is_integral_v<T>)
              if (r.whole_blocks && read(m, *this) % 32 != 0)
                need(false, k.name + " must be a multiple of 32 (both block sizes), not " +
                                std::to_string(read(m, *this)));
          }
        },
        k.field);
  }
  // Rules between keys.
  in_range(double(tcus) * ctas, 1, kMaxTcus, "tcu.count x tcu.ctas");
  need(mac_units % ctas == 0, "mac.units = " + std::to_string(mac_units) + " is not a multiple of tcu.ctas = " +
                                  std::to_string(ctas) + " (each tile slot takes an equal share of the units)");
  need(!(energy.leak_mw_per_mm2 > 0) || area.um2_per_nand2 > 0,
       "energy.leak_mw_per_mm2 needs area.um2_per_nand2 (the area it leaks over, in mm^2)");
  if (l2.bytes > 0)
    in_range(l2.bandwidth, kMinBandwidth, kMaxBandwidth, "l2.bandwidth (an L2, l2.bytes > 0, needs it)");
  // The streaming slots alone must fit in each tile slot's share of the buffer: every slot holds one A and one
  // B k-step tile, unquantised in the front-end; otherwise at most one byte an element (unpacked integer
  // views) plus FP32 block scales of 16, or 4-bit codes plus those scales.
  const int64_t elems = (int64_t(tile_m) + tile_n) * tile_k;
  const int64_t slot = prep == PrepMode::frontend ? elems * input_bytes
                       : unpack_launches > 0     ? elems + elems / 4
                                                 : elems / 2 + elems / 4;
  need(buffer_bytes / ctas >= int64_t(buffer_slots) * slot,
       "buffer.bytes = " + std::to_string(buffer_bytes) + " cannot hold, per tile slot (tcu.ctas = " +
           std::to_string(ctas) + "), buffer.slots = " + std::to_string(buffer_slots) +
           " k-step tiles of (tile.m + tile.n) x tile.k elements (" + std::to_string(slot) + " bytes each)");
}

double Config::mac_array_nand2() const {
  const double unit = mac_kind == MacKind::e2m1 ? area.mac_e2m1 : mac_kind == MacKind::e1m2 ? area.mac_e1m2 : area.mac_dual;
  return double(tcus) * mac_units * unit;
}

double Config::unit_nand2() const {
  return mac_array_nand2() +
         double(tcus) * (rht_lanes * area.rht_lane + quant_lanes * area.quant_lane + acc_lanes * area.acc_lane);
}

int64_t Config::launch_cycles() const {
  const double us = launch_mode == LaunchMode::stream ? launch_stream_us : launch_graph_us;
  return int64_t(std::llround(us * 1e3 * clock_ghz));
}

Config Config::per_slot() const {
  Config c = *this;
  c.tcus = tcus * ctas;
  c.mac_units = mac_units / ctas;
  c.acc_lanes = acc_lanes / ctas;
  c.acc_fused_lanes = acc_fused_lanes / ctas;
  c.rht_lanes = rht_lanes / ctas;
  c.quant_lanes = quant_lanes / ctas;
  c.quant_sr_lanes = quant_sr_lanes / ctas;
  c.buffer_bytes = buffer_bytes / ctas;
  return c;  // ctas kept: slots s and s + tcu.count share TCU s (see Plan::share)
}

nlohmann::json Config::to_json() const {
  // The keys of config_keys(), so that a report's configuration reads back as a configuration file;
  // quant.sr_lanes is written resolved (0 in a file means quant.lanes).
  nlohmann::json j = nlohmann::json::object();
  for (const ConfigKey& k : config_keys()) {
    std::visit(
        [&](auto m) {
          using T = Value<decltype(m)>;
          if constexpr (std::is_enum_v<T>)
            j[k.name] = names_of(T{})[size_t(read(m, *this))];
          else if (!k.omit_zero || read(m, *this) != T{})
            j[k.name] = read(m, *this);
        },
        k.field);
  }
  return j;
}

}  // namespace fp4lab::sim
