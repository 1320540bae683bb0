#include "fp4lab/sim/config.hpp"

#include <cmath>
#include <sstream>

#include "fp4lab/io/files.hpp"
#include "fp4lab/io/option_file.hpp"
#include "fp4lab/io/safetensors.hpp"  // io::Error
#include <stdexcept>

namespace fp4lab::sim {

namespace {
std::string fmt_num(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}
}  // namespace

const char* mac_kind_name(MacKind k) {
  return k == MacKind::e2m1 ? "e2m1" : k == MacKind::e1m2 ? "e1m2" : "dual";
}
const char* prep_mode_name(PrepMode m) {
  return m == PrepMode::frontend ? "frontend" : m == PrepMode::fused ? "fused" : m == PrepMode::unfused ? "unfused" : "none";
}
const char* launch_mode_name(LaunchMode m) { return m == LaunchMode::stream ? "stream" : "graph"; }
const char* acc_issue_name(AccIssue a) { return a == AccIssue::parallel ? "parallel" : "shared"; }
LaunchMode parse_launch_mode(const std::string& s) {
  for (LaunchMode m : {LaunchMode::stream, LaunchMode::graph})
    if (s == launch_mode_name(m)) return m;
  throw std::invalid_argument("launch.mode '" + s + "' is not one of stream, graph");
}
AccIssue parse_acc_issue(const std::string& s) {
  for (AccIssue a : {AccIssue::parallel, AccIssue::shared})
    if (s == acc_issue_name(a)) return a;
  throw std::invalid_argument("acc.issue '" + s + "' is not one of parallel, shared");
}
MacKind parse_mac_kind(const std::string& s) {
  for (MacKind k : {MacKind::e2m1, MacKind::e1m2, MacKind::dual})
    if (s == mac_kind_name(k)) return k;
  throw std::invalid_argument("mac.kind '" + s + "' is not one of e2m1, e1m2, dual");
}
PrepMode parse_prep_mode(const std::string& s) {
  for (PrepMode m : {PrepMode::frontend, PrepMode::fused, PrepMode::unfused, PrepMode::none})
    if (s == prep_mode_name(m)) return m;
  throw std::invalid_argument("prep.mode '" + s + "' is not one of frontend, fused, unfused, none");
}

po::options_description Config::options() {
  po::options_description d("TCU model (config file keys; any of them also as --key VALUE)");
  // clang-format off
  d.add_options()
    ("name", po::value<std::string>()->default_value("custom"), "configuration name, printed in reports")
    ("clock.ghz", po::value<double>(), "TCU clock, GHz")
    ("tcu.count", po::value<int>(), "TCUs sharing the memory levels; output tiles are dealt round-robin")
    ("tcu.ctas", po::value<int>()->default_value(1),
     "tiles in flight per TCU, each on its share of the TCU's units and buffer (GPU CTAs resident per SM)")
    ("tile.m", po::value<int>(), "output tile rows")
    ("tile.n", po::value<int>(), "output tile columns")
    ("tile.k", po::value<int>(), "reduction elements per k-step (a multiple of 32 and of the RHT size)")
    ("tile.raster_group", po::value<int>()->default_value(1), "tile rows visited together (grouped raster order)")
    ("buffer.bytes", po::value<int64_t>(), "operand buffer per TCU, bytes")
    ("buffer.slots", po::value<int>()->default_value(2), "k-step tiles in flight from fetch to the MAC array")
    ("acc.tiles", po::value<int>()->default_value(2), "output-tile accumulators per TCU")
    ("dram.bandwidth", po::value<double>(), "off-chip memory bandwidth, bytes per cycle")
    ("dram.latency", po::value<int64_t>(), "off-chip memory latency, cycles")
    ("dram.write_cost", po::value<double>()->default_value(1),
     "port time of a written byte relative to a read byte (read/write turnarounds make writes dearer)")
    ("l2.bytes", po::value<int64_t>()->default_value(0), "shared cache capacity, bytes (0 = none)")
    ("l2.bandwidth", po::value<double>()->default_value(0), "shared cache bandwidth, bytes per cycle")
    ("l2.latency", po::value<int64_t>()->default_value(0), "shared cache latency, cycles")
    ("rht.lanes", po::value<double>(), "RHT front-end elements per cycle")
    ("rht.stage_latency", po::value<int>()->default_value(1), "cycles per butterfly stage")
    ("quant.lanes", po::value<double>(), "quantiser elements per cycle (RTNE)")
    ("quant.sr_lanes", po::value<double>()->default_value(0), "quantiser elements per cycle with SR (0 = quant.lanes)")
    ("quant.latency", po::value<int>(), "quantiser latency, cycles")
    ("mac.units", po::value<int>(), (std::to_string(kMacWidth) + "-element block dot-product units per TCU").c_str())
    ("mac.kind", po::value<std::string>(), "e2m1 | e1m2 | dual: grids the units take natively")
    ("mac.fallback_rate", po::value<double>()->default_value(0),
     "throughput relative to native for a grid the units lack (0 = such a GEMM is refused)")
    ("mac.latency", po::value<int>(), "MAC array latency, cycles")
    ("acc.lanes", po::value<double>(), "scale-and-accumulate operations per cycle")
    ("acc.latency", po::value<int>(), "scale-and-accumulate latency, cycles")
    ("acc.issue", po::value<std::string>()->default_value("parallel"),
     "parallel | shared: scale-and-accumulate on its own unit, or issued by the MAC array (then a k-step "
     "occupies it for its block products plus its scale-and-accumulates)")
    ("launch.mode", po::value<std::string>()->default_value("stream"),
     "stream | graph: kernels queued one by one, or replayed from a CUDA graph (which launch.* cost applies)")
    ("launch.stream_us", po::value<double>()->default_value(0), "time before a stream-launched kernel's first tile, us")
    ("launch.graph_us", po::value<double>()->default_value(0), "the same for a kernel replayed from a graph, us")
    ("pass.elems", po::value<int64_t>()->default_value(0),
     "elements per work item of a separate pass (RHT, quantise, unpack), consecutive in the operand; 0 = "
     "tile-shaped items")
    ("unpack.launches", po::value<int>()->default_value(0),
     "0: the GEMM reads packed operands; n > 0: it reads one-byte integer views and FP32 block scales, written "
     "by an unpack pass of n kernels first")
    ("prep.mode", po::value<std::string>()->default_value("frontend"),
     "frontend | fused | unfused | none: RHT + quantise in the TCU front-end, as one or two passes through "
     "memory, or not at all (operands already quantised in memory)")
    ("operand.bytes", po::value<int>()->default_value(2), "bytes per unquantised operand element (BF16 = 2)")
    ("output.bytes", po::value<int>()->default_value(4), "bytes per output element (FP32 = 4, BF16 = 2)")
    ("energy.mac_e2m1_pj", po::value<double>(), "pJ per MAC on an E2M1-only unit")
    ("energy.mac_e1m2_pj", po::value<double>(), "pJ per MAC on an E1M2-only unit")
    ("energy.mac_dual_pj", po::value<double>(), "pJ per MAC on a dual-format unit")
    ("energy.mac_fallback_pj", po::value<double>()->default_value(0), "pJ per MAC on the fallback path")
    ("energy.acc_pj", po::value<double>(), "pJ per block scale-and-accumulate")
    ("energy.rht_add_pj", po::value<double>(), "pJ per butterfly add or subtract")
    ("energy.quant_pj", po::value<double>(), "pJ per element quantised")
    ("energy.sr_pj", po::value<double>()->default_value(0), "extra pJ per stochastically rounded element")
    ("energy.dram_byte_pj", po::value<double>(), "pJ per off-chip byte")
    ("energy.l2_byte_pj", po::value<double>()->default_value(0), "pJ per shared-cache byte")
    ("energy.buffer_byte_pj", po::value<double>(), "pJ per operand-buffer byte");
  // clang-format on
  return d;
}

namespace {
// Keys without a default: a configuration must give them (checked here rather than by Boost, so that the
// message can say where they come from).
const char* const kRequired[] = {
    "clock.ghz", "tcu.count", "tile.m", "tile.n", "tile.k", "buffer.bytes", "dram.bandwidth", "dram.latency",
    "rht.lanes", "quant.lanes", "quant.latency", "mac.units", "mac.kind", "mac.latency", "acc.lanes", "acc.latency",
    "energy.mac_e2m1_pj", "energy.mac_e1m2_pj", "energy.mac_dual_pj", "energy.acc_pj", "energy.rht_add_pj",
    "energy.quant_pj", "energy.dram_byte_pj", "energy.buffer_byte_pj"};
}  // namespace

Config Config::from(const po::variables_map& vm) {
  for (const char* k : kRequired)
    if (!vm.count(k))
      throw std::invalid_argument(std::string("missing key '") + k +
                                  "' (a TCU configuration file gives it: --config sim/configs/teaching.cfg)");
  Config c;
  auto I = [&](const char* k) { return vm[k].as<int>(); };
  auto L = [&](const char* k) { return vm[k].as<int64_t>(); };
  auto D = [&](const char* k) { return vm[k].as<double>(); };
  c.name = vm["name"].as<std::string>();
  c.clock_ghz = D("clock.ghz");
  c.tcus = I("tcu.count");
  c.ctas = I("tcu.ctas");
  c.tile_m = I("tile.m");
  c.tile_n = I("tile.n");
  c.tile_k = I("tile.k");
  c.raster_group = I("tile.raster_group");
  c.buffer_bytes = L("buffer.bytes");
  c.buffer_slots = I("buffer.slots");
  c.acc_tiles = I("acc.tiles");
  c.dram = {D("dram.bandwidth"), D("dram.write_cost"), L("dram.latency"), 0};
  c.l2 = {D("l2.bandwidth"), 1, L("l2.latency"), L("l2.bytes")};
  c.rht_lanes = D("rht.lanes");
  c.rht_stage_latency = I("rht.stage_latency");
  c.quant_lanes = D("quant.lanes");
  c.quant_sr_lanes = D("quant.sr_lanes") > 0 ? D("quant.sr_lanes") : c.quant_lanes;
  c.quant_latency = I("quant.latency");
  c.mac_units = I("mac.units");
  c.mac_kind = parse_mac_kind(vm["mac.kind"].as<std::string>());
  c.mac_fallback_rate = D("mac.fallback_rate");
  c.mac_latency = I("mac.latency");
  c.acc_lanes = D("acc.lanes");
  c.acc_latency = I("acc.latency");
  c.acc_issue = parse_acc_issue(vm["acc.issue"].as<std::string>());
  c.launch_mode = parse_launch_mode(vm["launch.mode"].as<std::string>());
  c.launch_stream_us = D("launch.stream_us");
  c.launch_graph_us = D("launch.graph_us");
  c.unpack_launches = I("unpack.launches");
  c.pass_elems = L("pass.elems");
  c.prep = parse_prep_mode(vm["prep.mode"].as<std::string>());
  c.input_bytes = I("operand.bytes");
  c.output_bytes = I("output.bytes");
  Energy& e = c.energy;
  e.mac_e2m1 = D("energy.mac_e2m1_pj");
  e.mac_e1m2 = D("energy.mac_e1m2_pj");
  e.mac_dual = D("energy.mac_dual_pj");
  e.mac_fallback = D("energy.mac_fallback_pj");
  e.acc_op = D("energy.acc_pj");
  e.rht_add = D("energy.rht_add_pj");
  e.quant_elem = D("energy.quant_pj");
  e.sr_elem = D("energy.sr_pj");
  e.dram_byte = D("energy.dram_byte_pj");
  e.l2_byte = D("energy.l2_byte_pj");
  e.buffer_byte = D("energy.buffer_byte_pj");
  c.validate();
  return c;
}

void Config::validate() const {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument(what);
  };
  // Documented bounds (docs/sim.md, and each key's --help): wide enough for any real unit, narrow enough that
  // no product of them overflows the model's int64 cycle and byte counts or its 64-bit picosecond clock, and
  // that the model's per-TCU threads and per-tile work stay small. NaN fails every comparison, so each check
  // is written as "inside the range".
  auto in_range = [&](double v, double lo, double hi, const char* key) {
    need(std::isfinite(v) && v >= lo && v <= hi,
         std::string(key) + " = " + fmt_num(v) + " is outside [" + fmt_num(lo) + ", " + fmt_num(hi) + "]");
  };
  in_range(clock_ghz, kMinClockGhz, kMaxClockGhz, "clock.ghz");
  in_range(tcus, 1, kMaxTcus, "tcu.count");
  in_range(ctas, 1, kMaxSlots, "tcu.ctas");
  in_range(double(tcus) * ctas, 1, kMaxTcus, "tcu.count x tcu.ctas");
  need(mac_units % ctas == 0, "mac.units = " + std::to_string(mac_units) + " is not a multiple of tcu.ctas = " +
                                  std::to_string(ctas) + " (each tile slot takes an equal share of the units)");
  in_range(launch_stream_us, 0, kMaxLaunchUs, "launch.stream_us");
  in_range(launch_graph_us, 0, kMaxLaunchUs, "launch.graph_us");
  in_range(unpack_launches, 0, kMaxSlots, "unpack.launches");
  in_range(double(pass_elems), 0, kMaxBytes, "pass.elems");
  need(pass_elems % 32 == 0, "pass.elems must be a multiple of 32 (both block sizes), not " + std::to_string(pass_elems));
  in_range(tile_m, 1, kMaxTile, "tile.m");
  in_range(tile_n, 1, kMaxTile, "tile.n");
  in_range(tile_k, 32, kMaxTileK, "tile.k");
  need(tile_k % 32 == 0, "tile.k must be a positive multiple of 32 (both block sizes), not " + std::to_string(tile_k));
  in_range(raster_group, 1, kMaxUnits, "tile.raster_group");
  in_range(buffer_slots, 1, kMaxSlots, "buffer.slots");
  in_range(acc_tiles, 1, kMaxSlots, "acc.tiles");
  in_range(double(buffer_bytes), 0, kMaxBytes, "buffer.bytes");
  in_range(dram.bandwidth, kMinBandwidth, kMaxBandwidth, "dram.bandwidth");
  in_range(double(dram.latency), 0, kMaxLatency, "dram.latency");
  in_range(dram.write_cost, 1, 16, "dram.write_cost");
  in_range(double(l2.bytes), 0, kMaxBytes, "l2.bytes");
  if (l2.bytes > 0) {
    in_range(l2.bandwidth, kMinBandwidth, kMaxBandwidth, "l2.bandwidth (an L2, l2.bytes > 0, needs it)");
    in_range(double(l2.latency), 0, kMaxLatency, "l2.latency");
  } else {
    in_range(l2.bandwidth, 0, kMaxBandwidth, "l2.bandwidth");
    in_range(double(l2.latency), 0, kMaxLatency, "l2.latency");
  }
  in_range(rht_lanes / ctas, kMinLanes, kMaxUnits, "rht.lanes / tcu.ctas");
  in_range(rht_stage_latency, 0, kMaxLatency, "rht.stage_latency");
  in_range(quant_lanes / ctas, kMinLanes, kMaxUnits, "quant.lanes / tcu.ctas");
  in_range(quant_sr_lanes / ctas, kMinLanes, kMaxUnits, "quant.sr_lanes / tcu.ctas");
  in_range(quant_latency, 0, kMaxLatency, "quant.latency");
  in_range(mac_units, 1, kMaxUnits, "mac.units");
  in_range(mac_latency, 0, kMaxLatency, "mac.latency");
  need(std::isfinite(mac_fallback_rate) && (mac_fallback_rate == 0 || (mac_fallback_rate >= kMinRate && mac_fallback_rate <= 1)),
       "mac.fallback_rate = " + fmt_num(mac_fallback_rate) + " must be 0 (refuse) or lie in [" + fmt_num(kMinRate) + ", 1]");
  in_range(acc_lanes / ctas, kMinLanes, kMaxUnits, "acc.lanes / tcu.ctas");
  in_range(acc_latency, 0, kMaxLatency, "acc.latency");
  in_range(input_bytes, 1, 8, "operand.bytes");
  in_range(output_bytes, 1, 8, "output.bytes");
  const std::pair<const char*, double> energies[] = {
      {"energy.mac_e2m1_pj", energy.mac_e2m1}, {"energy.mac_e1m2_pj", energy.mac_e1m2},
      {"energy.mac_dual_pj", energy.mac_dual}, {"energy.mac_fallback_pj", energy.mac_fallback},
      {"energy.acc_pj", energy.acc_op},        {"energy.rht_add_pj", energy.rht_add},
      {"energy.quant_pj", energy.quant_elem},  {"energy.sr_pj", energy.sr_elem},
      {"energy.dram_byte_pj", energy.dram_byte}, {"energy.l2_byte_pj", energy.l2_byte},
      {"energy.buffer_byte_pj", energy.buffer_byte}};
  for (const auto& [key, v] : energies) in_range(v, 0, kMaxEnergyPj, key);
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

int64_t Config::launch_cycles() const {
  const double us = launch_mode == LaunchMode::stream ? launch_stream_us : launch_graph_us;
  return int64_t(std::llround(us * 1e3 * clock_ghz));
}

Config Config::per_slot() const {
  Config c = *this;
  c.tcus = tcus * ctas;
  c.mac_units = mac_units / ctas;
  c.acc_lanes = acc_lanes / ctas;
  c.rht_lanes = rht_lanes / ctas;
  c.quant_lanes = quant_lanes / ctas;
  c.quant_sr_lanes = quant_sr_lanes / ctas;
  c.buffer_bytes = buffer_bytes / ctas;
  return c;  // ctas kept: slots s and s + tcu.count share TCU s (see Plan::share)
}

Config Config::load(const std::string& path, const std::vector<std::string>& overrides) {
  const po::options_description desc = options();
  po::variables_map vm;
  try {
    std::vector<std::string> args;
    for (const std::string& o : overrides) {
      io::refuse_option_placeholders(o, "override");
      args.push_back("--" + o);
    }
    po::store(po::command_line_parser(args)
                  .options(desc)
                  .style(po::command_line_style::default_style & ~po::command_line_style::allow_guessing)
                  .run(),
              vm);
    // A FIFO or device is refused, not waited on; config files do not nest.
    const std::string text = io::read_regular_file(path, "config file");
    io::refuse_option_placeholders(text, path);
    const po::parsed_options parsed = io::parse_option_text(text, desc);  // `key = value` lines or JSON
    po::store(parsed, vm);
    po::notify(vm);
    return from(vm);
  } catch (const io::Error& e) {  // already "<path>: <fault>"
    throw std::invalid_argument(e.what());
  } catch (const std::exception& e) {
    throw std::invalid_argument(path + ": " + e.what());
  }
}

nlohmann::json Config::to_json() const {
  // The keys of options(), so a report's configuration is a configuration file (fp4lab/io/option_file.hpp);
  // quant.sr_lanes is written resolved (0 in a file means quant.lanes).
  return {{"name", name},
          {"clock.ghz", clock_ghz},
          {"tcu.count", tcus},
          {"tcu.ctas", ctas},
          {"tile.m", tile_m},
          {"tile.n", tile_n},
          {"tile.k", tile_k},
          {"tile.raster_group", raster_group},
          {"buffer.bytes", buffer_bytes},
          {"buffer.slots", buffer_slots},
          {"acc.tiles", acc_tiles},
          {"dram.bandwidth", dram.bandwidth},
          {"dram.latency", dram.latency},
          {"dram.write_cost", dram.write_cost},
          {"l2.bytes", l2.bytes},
          {"l2.bandwidth", l2.bandwidth},
          {"l2.latency", l2.latency},
          {"rht.lanes", rht_lanes},
          {"rht.stage_latency", rht_stage_latency},
          {"quant.lanes", quant_lanes},
          {"quant.sr_lanes", quant_sr_lanes},
          {"quant.latency", quant_latency},
          {"mac.units", mac_units},
          {"mac.kind", mac_kind_name(mac_kind)},
          {"mac.fallback_rate", mac_fallback_rate},
          {"mac.latency", mac_latency},
          {"acc.lanes", acc_lanes},
          {"acc.latency", acc_latency},
          {"acc.issue", acc_issue_name(acc_issue)},
          {"launch.mode", launch_mode_name(launch_mode)},
          {"launch.stream_us", launch_stream_us},
          {"launch.graph_us", launch_graph_us},
          {"unpack.launches", unpack_launches},
          {"pass.elems", pass_elems},
          {"prep.mode", prep_mode_name(prep)},
          {"operand.bytes", input_bytes},
          {"output.bytes", output_bytes},
          {"energy.mac_e2m1_pj", energy.mac_e2m1},
          {"energy.mac_e1m2_pj", energy.mac_e1m2},
          {"energy.mac_dual_pj", energy.mac_dual},
          {"energy.mac_fallback_pj", energy.mac_fallback},
          {"energy.acc_pj", energy.acc_op},
          {"energy.rht_add_pj", energy.rht_add},
          {"energy.quant_pj", energy.quant_elem},
          {"energy.sr_pj", energy.sr_elem},
          {"energy.dram_byte_pj", energy.dram_byte},
          {"energy.l2_byte_pj", energy.l2_byte},
          {"energy.buffer_byte_pj", energy.buffer_byte}};
}

}  // namespace fp4lab::sim
