// Configuration of the tensor-core unit (TCU) model: every unit's throughput and latency, the memory levels,
// the tile scheduler and the per-operation energy table. Every key is one row of config_keys(); a front-end reads
// the keys' values from its own text (the command line reads configuration files, sim/configs/*.cfg, and `--key
// VALUE` options: cli/sim_config.hpp) and builds a Config from the typed values (Config::from).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "fp4lab/gemm.hpp"  // kMacWidth

namespace fp4lab::sim {

// Which element grids a block dot-product unit (kMacWidth elements a beat) multiplies natively.
enum class MacKind : uint8_t { e2m1, e1m2, dual };
// Where RHT and quantisation run: in the TCU's front-end on operand tiles as they are fetched (BF16 in), as
// one separate pass through memory (RHT + quantise fused in one kernel), or as two passes (an RHT pass, then
// a quantise pass) -- the paper's fused-versus-unfused question. `none`: the operands are already quantised in
// memory (say FP4 weights kept quantised), so the job is the GEMM alone.
enum class PrepMode : uint8_t { frontend, fused, unfused, none };
// How kernels reach the device, for the launch overhead each pass or GEMM pays before its first tile: queued one
// by one on a stream, or replayed from a captured CUDA graph (a smaller gap between kernels).
enum class LaunchMode : uint8_t { stream, graph };
// Who issues the scale-and-accumulate work. `parallel`: its own unit beside the MAC array (a TCU with a block
// accumulator). `shared`: the MAC array's own instruction stream (an emulation kernel in which the same warps
// issue the tensor-core products and the FP32 epilogue), so a k-step occupies the MAC array for both.
enum class AccIssue : uint8_t { parallel, shared };

// Each enum's spellings, indexed by its value: the one list that parsing, --help, errors and JSON use.
inline constexpr const char* kMacKindNames[] = {"e2m1", "e1m2", "dual"};
inline constexpr const char* kPrepModeNames[] = {"frontend", "fused", "unfused", "none"};
inline constexpr const char* kLaunchModeNames[] = {"stream", "graph"};
inline constexpr const char* kAccIssueNames[] = {"parallel", "shared"};

const char* mac_kind_name(MacKind k);
const char* prep_mode_name(PrepMode m);
const char* launch_mode_name(LaunchMode m);
const char* acc_issue_name(AccIssue a);

// One key's value, typed: an enum key's value is its name (kMacKindNames, ...).
using ConfigValue = std::variant<std::string, int, int64_t, double>;

struct MemLevel {
  double bandwidth = 0;  // bytes per cycle (shared by every TCU)
  double write_cost = 1; // port time of a written byte, in read bytes (DRAM only: bus turnarounds, write recovery)
  int64_t latency = 0;   // cycles from the end of a transfer to the data being usable
  int64_t bytes = 0;     // capacity (L2 only; 0 = no L2)
  bool operator==(const MemLevel&) const = default;
};

// Energy per operation, picojoules.
struct Energy {
  double mac_e2m1 = 0, mac_e1m2 = 0, mac_dual = 0;  // per multiply-add inside a block dot product, by unit kind
  double mac_fallback = 0;   // per multiply-add of a grid the unit lacks, run on its wider fallback path
  double acc_op = 0;         // per block scale-and-accumulate (two FP32 multiplies and one add)
  double rht_add = 0;        // per FP32 add or subtract in the butterfly
  double quant_elem = 0;     // per element quantised (amax compare, scale, round)
  double sr_elem = 0;        // extra per Philox4x32-10 block SR draws (one per 1, 4 or 16 elements: sr_draw_group)
  double dram_byte = 0, l2_byte = 0, buffer_byte = 0;  // per byte moved at each level
  double leak_mw_per_mm2 = 0;  // static (leakage) power per mm^2 of built units, paid for the whole run time
  bool operator==(const Energy&) const = default;
};

// Silicon area of the built units in NAND2 equivalents (rtl/area.json: docs/sim.md), and the node's factor to
// mm^2. All 0 (the default) = not priced: the report then has no area and no static energy.
struct Area {
  double mac_e2m1 = 0, mac_e1m2 = 0, mac_dual = 0;  // per block unit (mac.units), by mac.kind
  double rht_lane = 0;    // per RHT lane (rht.lanes, elements per cycle)
  double quant_lane = 0;  // per quantiser lane (quant.lanes)
  double acc_lane = 0;    // per scale-and-accumulate lane (acc.lanes) not already inside the block units
  double um2_per_nand2 = 0;  // um^2 of one NAND2 equivalent at the node
  bool operator==(const Area&) const = default;
};

struct Config;

// One configuration key (config_keys() lists them all). A key without `required` defaults to its member's value in
// Config{}, so the initialisers below are the defaults a file may leave out.
struct ConfigKey {
  // Where the value lives: a function giving the member of a Config (the path may go through dram, l2, energy).
  template <class T>
  using Member = T& (*)(Config&);
  using Field = std::variant<Member<std::string>, Member<int>, Member<int64_t>, Member<double>, Member<MacKind>,
                             Member<PrepMode>, Member<LaunchMode>, Member<AccIssue>>;
  // What validate() holds a number to (names and enums have none): lo <= value <= hi.
  struct Range {
    double lo = 0, hi = 0;
    bool per_slot = false;      // value / tcu.ctas, the share of each tile slot, is held to the range instead
    bool or_zero = false;       // 0 is also allowed (it turns the feature off)
    bool whole_blocks = false;  // a multiple of 32, so whole blocks of either size (16 or 32)
  };

  std::string name;  // "mac.units": `[mac] units = ` in a file, --mac.units, the JSON key
  Field field;
  bool required;     // no default: every configuration file gives it
  Range range;
  std::string help;  // --help text (an enum key's list of values is put in front of it)
  // Written to a report's configuration only when not 0: keys added after reports were published (area and
  // leakage), so that a configuration without them reports exactly as before.
  bool omit_zero = false;
};

struct Config {
  std::string name = "custom";  // "teaching", "h100-class", ...
  double clock_ghz = 1;
  int tcus = 1;              // TCUs working on one GEMM; they share the memory levels
  int ctas = 1;              // tiles in flight per TCU, each on its 1/ctas share of the TCU's units and buffer

  // tile scheduler
  int tile_m = 0, tile_n = 0, tile_k = 0;
  int raster_group = 1;      // output tiles visited in groups of this many tile rows (1 = row by row)
  int64_t buffer_bytes = 0;  // operand buffer per TCU: streaming slots plus resident operand panels
  int buffer_slots = 2;      // k-step tiles in flight between fetch and the MAC array (2 = double buffering)
  int acc_tiles = 2;         // output-tile accumulators per TCU (2 = write-back overlaps the next tile)

  MemLevel dram, l2;

  double rht_lanes = 0;      // elements per cycle through the d-point butterfly (fractional: a rate)
  int rht_stage_latency = 1; // cycles per butterfly stage (latency = (log2 d + 1) stages, the last the 1/sqrt(d))
  double quant_lanes = 0;    // elements per cycle (amax, scale, RTNE)
  double quant_sr_lanes = 0; // Philox calls per cycle: SR elements per cycle under philox1 (x4 philox4, x16 philox16)
  int quant_latency = 0;

  int mac_units = 0;         // block dot-product units per TCU, kMacWidth MACs a cycle each
  MacKind mac_kind = MacKind::dual;
  double mac_fallback_rate = 0;  // throughput, relative to native, for a grid the units lack (0 = refuse)
  int mac_latency = 0;
  double acc_lanes = 0;      // block scale-and-accumulate operations per cycle
  double acc_fused_lanes = 0;  // the same where both operands' block scales are UE4M3 or UE8M0 (a GPU kernel's
                               // fused epilogue: fewer instructions each); 0 in a file = acc.lanes
  int acc_latency = 0;
  AccIssue acc_issue = AccIssue::parallel;

  // Kernel launches: the time before a pass's or the GEMM's first tile, per kernel, by how they are issued.
  LaunchMode launch_mode = LaunchMode::stream;
  double launch_stream_us = 0, launch_graph_us = 0;
  // Unpack pass: 0 = the GEMM reads the packed quantised operands; n > 0 = it reads one-byte-per-element
  // integer views and FP32 block scales, which a pass of n kernels writes from the packed operands first.
  int unpack_launches = 0;
  // Elements per work item of a separate pass (RHT, quantise, unpack), consecutive in the row-major operand:
  // 0 = tile-shaped items (a tile's rows by a k-step). A GPU kernel's CTA covers a fixed run of elements, far
  // fewer than a GEMM tile, so small tensors still reach every SM and no item is an edge tile.
  int64_t pass_elems = 0;

  PrepMode prep = PrepMode::frontend;
  int input_bytes = 2;       // bytes per unquantised operand element in memory (BF16)
  int output_bytes = 4;      // bytes per output element (FP32)

  Energy energy;
  Area area;

  // Bounds validate() enforces (config_keys() gives each key its range; docs/sim.md lists them). They keep every
  // product of configuration values inside the model's int64 counts, a run's time inside SystemC's 64-bit
  // picosecond clock, and the number of TCU threads small; a value outside (or NaN/Inf) is a configuration error,
  // not a silently wrong result.
  static constexpr double kMinClockGhz = 1e-3, kMaxClockGhz = 1e3;  // the period is kept in whole picoseconds
  static constexpr int kMaxTcus = 1024;                  // one SystemC thread set per TCU
  static constexpr int kMaxTile = 4096, kMaxTileK = 65536;
  static constexpr int kMaxSlots = 64;                   // buffer.slots, acc.tiles
  static constexpr int kMaxUnits = 1 << 20;              // lanes, MAC units, raster group
  static constexpr double kMaxBytes = double(int64_t(1) << 50);  // buffer.bytes, l2.bytes
  static constexpr double kMinBandwidth = 1e-3, kMaxBandwidth = 1e9;  // bytes per cycle
  static constexpr double kMinRate = 1e-3;               // mac.fallback_rate, when not 0
  static constexpr double kMaxLatency = 1e9;             // cycles
  static constexpr double kMaxEnergyPj = 1e9;            // every energy.* key, >= 0
  static constexpr double kMaxNand2 = 1e12;              // area.* per unit or lane, NAND2 equivalents
  static constexpr double kMaxUm2PerNand2 = 1e3;
  static constexpr double kMaxLeakMwPerMm2 = 1e6;

  static constexpr double kMaxLaunchUs = 1e6;
  static constexpr double kMinLanes = 1e-3;             // rht/quant/acc lanes: rates, per tile slot too

  double period_ns() const { return 1.0 / clock_ghz; }
  // Cycles one kernel launch costs under launch_mode.
  int64_t launch_cycles() const;
  // The configuration of one tile slot: tcus * ctas TCUs, each with 1/ctas of the units and the buffer (ctas
  // unchanged: it says how many slots share a TCU).
  Config per_slot() const;
  int64_t peak_macs_per_cycle() const { return int64_t(tcus) * mac_units * kMacWidth; }
  // Area in NAND2 equivalents: the block units of every TCU (the MAC array), and those plus the RHT, quantiser and
  // scale-and-accumulate lanes (the whole unit). mm^2 through area.um2_per_nand2; static power through
  // energy.leak_mw_per_mm2 on the whole unit.
  double mac_array_nand2() const;
  double unit_nand2() const;
  double mm2(double nand2) const { return nand2 * area.um2_per_nand2 * 1e-6; }
  double static_mw() const { return energy.leak_mw_per_mm2 * mm2(unit_nand2()); }
  bool priced() const { return area != Area{}; }

  // A Config from the value of each key given (a key left out keeps its default; a required one is an error),
  // validated. Throws std::invalid_argument with a one-line reason.
  static Config from(const std::map<std::string, ConfigValue>& values);
  // The value of one key of config_keys() (an enum's as its name): its type is the one from() takes for it.
  ConfigValue value(const ConfigKey& key) const;
  void validate() const;
  // Every key of config_keys() with its value: a configuration file in JSON form (read back, it gives an equal
  // Config).
  nlohmann::json to_json() const;
  bool operator==(const Config&) const = default;
};

// Every key, in --help order: the one table that from(), value(), validate() and to_json() walk, and front-ends
// read their options from.
const std::vector<ConfigKey>& config_keys();
// The names an enum key takes (empty for any other key), in the order of its enum's values.
std::span<const char* const> key_choices(const ConfigKey& key);

}  // namespace fp4lab::sim
