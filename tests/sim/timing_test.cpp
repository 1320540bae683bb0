// Cycle counts of the teaching configuration (sim/configs/teaching.cfg), worked out by hand from its numbers:
//   DRAM 64 B/cycle, latency 10; quantiser 16 elements/cycle, latency 2; RHT 16 elements/cycle, 1 cycle per
//   stage (d = 16: 4 butterfly stages + the 1/4 scale = 5); MAC array 4 block units (64 MAC/cycle), latency 2;
//   accumulator 8 operations/cycle, latency 1; tile 16 x 16 x 64; 2 operand-buffer slots; BF16 in, FP32 out.
// Per k-step of a 16 x 16 tile (frontend mode, BF16 operands fetched and quantised in the TCU):
//   fetch  A and B: 16 x 64 x 2 B = 2048 B each -> 32 + 32 cycles on the DRAM port, +10 latency
//   quant  2 x 1024 elements / 16 = 128 cycles, +2
//   MAC    16 x 16 x (64 / 16) = 1024 block products / 4 units = 256 cycles, +2
//   acc    16 x 16 x 4 = 1024 scale-accumulates / 8 = 128 cycles; the last k-step adds the 256 final
//          multiplies: 1280 / 8 = 160 cycles; +1
//   write  16 x 16 x 4 B = 1024 B / 64 = 16 cycles, +10
// The numbers below are these sums, not outputs of the model.
#include <gtest/gtest.h>

#include "sim_test_util.hpp"

namespace fp4lab::sim::test {
namespace {

TEST(Timing, TeachingPipelineFillOneTileOneStep) {
  Simulator sim(config("teaching"));
  const JobReport r = sim.run(job(16, 16, 64));
  // 64 (A then B on the port) + 10 + 128 + 2 + 256 + 2 + 160 + 1 + 16 + 10
  EXPECT_EQ(r.cycles, 649);
  EXPECT_EQ(r.prep_cycles, 0);
  EXPECT_DOUBLE_EQ(r.stalls.at("fill"), 64 + 10 + 128 + 2);
  EXPECT_DOUBLE_EQ(r.stalls.at("compute"), 256);
  EXPECT_DOUBLE_EQ(r.stalls.at("tail"), 2 + 160 + 1 + 16 + 10);
  EXPECT_DOUBLE_EQ(r.bytes.at("dram_read"), 4096);
  EXPECT_DOUBLE_EQ(r.bytes.at("dram_write"), 1024);
  EXPECT_DOUBLE_EQ(r.busy.at("mac"), 256.0 / 649.0);
  EXPECT_DOUBLE_EQ(r.mac_util, 16.0 * 16 * 64 / (64.0 * 649));
}

TEST(Timing, TeachingComputeBound) {
  Simulator sim(config("teaching"));
  const JobReport r = sim.run(job(16, 16, 1024));
  // 16 k-steps. The MAC array (256 cycles/step) is slower than fetch (64) and quantiser (128), and two slots
  // cover the refill: step k is fetched when the MAC finishes step k-2, at 204 + 256(k-1); it is quantised
  // by 256(k-1) + 408 < 204 + 256k, when the MAC wants it. So the MAC runs back to back from cycle 204:
  //   fill 64 + 10 + 128 + 2 = 204, then 16 x 256 = 4096, then 2 + 160 + 1 + 16 + 10 = 189.
  EXPECT_EQ(r.cycles, 204 + 4096 + 189);
  EXPECT_DOUBLE_EQ(r.stalls.at("fill"), 204);
  EXPECT_DOUBLE_EQ(r.stalls.at("compute"), 4096);
  EXPECT_DOUBLE_EQ(r.stalls.at("bandwidth"), 0);
  EXPECT_DOUBLE_EQ(r.stalls.at("tail"), 189);
  EXPECT_DOUBLE_EQ(r.bytes.at("dram_read"), 16 * 4096);
}

// The MAC array's rate is kMacWidth multiply-adds per unit per cycle (fp4lab::kMacWidth, the RTL units' N):
// a compute-bound job keeps the array busy for M x N x K / (units x kMacWidth) cycles, at any unit count and
// block size, and the peak rate the utilisation divides by is the same product.
TEST(Timing, ComputeCyclesAreBlockBeatsOverUnits) {
  for (int units : {1, 2, 4})
    for (int block : {16, 32}) {
      Simulator sim(config("teaching", {"mac.units=" + std::to_string(units), "quant.lanes=1024", "acc.lanes=1024",
                                        "dram.bandwidth=100000"}));
      const JobReport r = sim.run(job(16, 16, 1024, plain(0, block)));
      EXPECT_DOUBLE_EQ(r.stalls.at("compute"), 16.0 * 16 * 1024 / (units * kMacWidth)) << units << " " << block;
      EXPECT_EQ(sim.config().peak_macs_per_cycle(), int64_t(units) * kMacWidth);
    }
}

TEST(Timing, TeachingBandwidthBound) {
  Simulator sim(config("teaching", {"dram.bandwidth=8"}));
  const JobReport r = sim.run(job(16, 16, 1024));
  // At 8 B/cycle a step's operands take 2 x 2048 / 8 = 512 cycles on the port, twice the MAC's 256. The port
  // never idles (a slot frees at 512k - 116, before the port does at 512k), so step k's data lands at
  // 512(k+1) + 10 and reaches the MAC at 512(k+1) + 10 + 128 + 2.
  //   total = 16 x 512 + 10 + 128 + 2 + 256 + 2 + 160 + 1 + 128 (1024 B at 8 B/cycle) + 10 = 8889
  EXPECT_EQ(r.cycles, 8889);
  EXPECT_DOUBLE_EQ(r.stalls.at("fill"), 512 + 10 + 128 + 2);
  EXPECT_DOUBLE_EQ(r.stalls.at("compute"), 4096);
  EXPECT_DOUBLE_EQ(r.stalls.at("bandwidth"), 15 * (512 - 256));  // the MAC waits 256 cycles before each later step
  EXPECT_DOUBLE_EQ(r.stalls.at("rht") + r.stalls.at("quant"), 0);
  EXPECT_DOUBLE_EQ(r.stalls.at("tail"), 2 + 160 + 1 + 128 + 10);
}

TEST(Timing, TeachingRhtFrontEnd) {
  Simulator sim(config("teaching"));
  const JobReport r = sim.run(job(16, 16, 64, plain(16)));
  // The RHT adds 2048 / 16 = 128 cycles of occupancy and 5 of latency in front of the quantiser: 649 + 133.
  EXPECT_EQ(r.cycles, 649 + 128 + 5);
  EXPECT_DOUBLE_EQ(r.busy.at("rht"), 128.0 / 782.0);
  // 2048 elements x 4 butterfly adds (the 1/4 scale is an exponent decrement, not counted as an add)
  EXPECT_DOUBLE_EQ(r.energy_pj.at("rht"), 2048 * 4 * 0.18);
}

TEST(Timing, TeachingRhtBound) {
  Simulator sim(config("teaching", {"rht.lanes=4"}));
  const JobReport r = sim.run(job(16, 16, 1024, plain(16)));
  // 4 lanes: 2048 / 4 = 512 RHT cycles per step, twice the MAC's 256. The first step reaches the RHT at 74,
  // leaves it at 586 (+5), the quantiser at 719 (+2): the MAC starts at 721. The RHT then runs back to back, so
  // step k reaches the MAC at 721 + 512k; the MAC waits 256 cycles before every later step, blamed on the RHT.
  //   total = 721 + 15 x 512 + 256 + 2 + 160 + 1 + 16 + 10 = 8846
  EXPECT_EQ(r.cycles, 8846);
  EXPECT_DOUBLE_EQ(r.stalls.at("fill"), 721);
  EXPECT_DOUBLE_EQ(r.stalls.at("rht"), 15 * 256);
  EXPECT_DOUBLE_EQ(r.stalls.at("bandwidth") + r.stalls.at("quant"), 0);
  EXPECT_DOUBLE_EQ(r.stalls.at("tail"), 189);
}

TEST(Timing, TeachingQuantiserBound) {
  Simulator sim(config("teaching", {"quant.lanes=4"}));
  const JobReport r = sim.run(job(16, 16, 1024));
  // 4 lanes: 2048 / 4 = 512 quantiser cycles per step. First step: fetched by 74, quantised 74..586, +2: the MAC
  // starts at 588 and then every 512 cycles, waiting 256 before each later step, blamed on the quantiser.
  //   total = 588 + 15 x 512 + 256 + 2 + 160 + 1 + 16 + 10 = 8713
  EXPECT_EQ(r.cycles, 8713);
  EXPECT_DOUBLE_EQ(r.stalls.at("quant"), 15 * 256);
  EXPECT_DOUBLE_EQ(r.stalls.at("bandwidth") + r.stalls.at("rht"), 0);
}

TEST(Timing, TeachingOperandReuseAcrossTiles) {
  Simulator sim(config("teaching"));
  const JobReport r = sim.run(job(32, 16, 64));
  // Two output tiles in one column. The operand buffer keeps 16 KiB - 2 x 4 KiB streaming = 8 KiB of panels;
  // B's panel (16 x 64 codes + 64 fp32 scales = 768 B) fits, so the second tile fetches only A:
  //   DRAM reads 2048 (A0) + 2048 (B) + 2048 (A1).
  EXPECT_DOUBLE_EQ(r.bytes.at("dram_read"), 6144);
  // Tile 2's step (1024 elements) is quantised 202..266 and waits for the MAC, free at 460: MAC 460..716,
  // accumulate (+2) 718..878, +1, write 879..895, +10.
  EXPECT_EQ(r.cycles, 905);
  EXPECT_DOUBLE_EQ(r.stalls.at("compute"), 512);
}

TEST(Timing, TeachingFusedPrepPass) {
  Simulator sim(config("teaching", {"prep.mode=fused"}));
  const JobReport r = sim.run(job(16, 16, 64, plain(16)));
  // Pass 1 (RHT + quantise through memory), A then B, one 16 x 64 chunk each:
  //   A: read 0..32 (+10) -> RHT 42..106 (+5) -> quant 111..175 (+2) -> write 768 B 177..189 (+10)
  //   B: read 32..64 (+10) -> RHT 106..170 (+5) -> quant 175..239 (+2) -> write 241..253 (+10) = 263
  // GEMM on the quantised operands: read 768 + 768 B 263..287 (+10), MAC 297..553 (+2), acc 555..715 (+1),
  // write 716..732 (+10) = 742.
  EXPECT_EQ(r.prep_cycles, 263);
  EXPECT_EQ(r.cycles, 742);
  EXPECT_DOUBLE_EQ(r.stalls.at("prep"), 263);
  EXPECT_DOUBLE_EQ(r.bytes.at("dram_read"), 4096 + 1536);
  EXPECT_DOUBLE_EQ(r.bytes.at("dram_write"), 1536 + 1024);
}

TEST(Timing, TeachingUnfusedPrepPasses) {
  Simulator sim(config("teaching", {"prep.mode=unfused"}));
  const JobReport r = sim.run(job(16, 16, 64, plain(16)));
  // Pass 1 (RHT, BF16 out): A read 0..32 (+10), RHT 42..106 (+5), write 2048 B 111..143 (+10);
  //                         B read 32..64 (+10), RHT 106..170 (+5), write 175..207 (+10): barrier at 217.
  // Pass 2 (quantise):      A read 217..249 (+10), quant 259..323 (+2), write 768 B 325..337 (+10);
  //                         B read 249..281 (+10), quant 323..387 (+2), write 389..401 (+10): barrier at 411.
  // GEMM as in the fused case, 148 cycles later: 411 + (742 - 263) = 890.
  EXPECT_EQ(r.prep_cycles, 411);
  EXPECT_EQ(r.cycles, 890);
  EXPECT_DOUBLE_EQ(r.bytes.at("dram_read"), 4096 + 4096 + 1536);
  EXPECT_DOUBLE_EQ(r.bytes.at("dram_write"), 4096 + 1536 + 1024);
}

TEST(Timing, UnitsTakeTheirGridsAndFallBack) {
  {
    Simulator sim(config("teaching", {"mac.kind=e2m1"}));
    EXPECT_THROW(sim.run(job(16, 16, 64)), std::invalid_argument);  // e1m2 on E2M1-only units, no fallback
  }
  Simulator sim(config("teaching", {"mac.kind=e2m1", "mac.fallback_rate=0.5"}));
  const JobReport r = sim.run(job(16, 16, 64));
  // At half rate the MAC takes 1024 / 2 = 512 cycles: 649 + 256.
  EXPECT_EQ(r.cycles, 649 + 256);
  EXPECT_FALSE(r.native);
  QuantConfig e2 = plain();
  e2.format = kE2M1;
  EXPECT_EQ(sim.run(job(16, 16, 64, e2)).cycles, 649);
}

TEST(Timing, Block32HalvesTheAccumulatorWork) {
  Simulator sim(config("teaching"));
  const JobReport r = sim.run(job(16, 16, 64, plain(0, 32)));
  // 16 x 16 x 2 blocks of 32 + 256 final multiplies = 768 / 8 = 96 accumulator cycles instead of 160; the MAC
  // still takes 16-element passes (1024 / 4 = 256).
  EXPECT_EQ(r.cycles, 649 - 160 + 96);
}

// acc.fused_lanes: the accumulator's rate where both operands' block scales are UE4M3 or UE8M0 (a GPU kernel's
// fused epilogue); FP32 scales keep acc.lanes.
TEST(Timing, FusedLanesApplyToUe8m0AndUe4m3ScalesOnly) {
  QuantConfig mx = plain(0, 32);
  mx.format = kE2M1;
  mx.scale = ScaleKind::ue8m0;
  {
    Simulator sim(config("teaching", {"acc.fused_lanes=16"}));
    // FP32 scales, block 32: as in Block32HalvesTheAccumulatorWork, 768 / 8 = 96 accumulator cycles.
    EXPECT_EQ(sim.run(job(16, 16, 64, plain(0, 32))).cycles, 649 - 160 + 96);
    // UE8M0: 768 / 16 = 48 accumulator cycles.
    EXPECT_EQ(sim.run(job(16, 16, 64, mx)).cycles, 649 - 160 + 48);
    // One operand with FP32 scales: acc.lanes.
    GemmJob mixed = job(16, 16, 64, mx);
    mixed.b = plain(0, 32);
    mixed.b.format = kE2M1;
    EXPECT_EQ(sim.run(mixed).cycles, 649 - 160 + 96);
  }
  {
    // Issued by the MAC array (acc.issue = shared), one k-step: 256 + 48 cycles with UE8M0, 256 + 96 with FP32
    // scales, then its latency, the accumulator's and the write: the same totals.
    Simulator sim(config("teaching", {"acc.fused_lanes=16", "acc.issue=shared"}));
    EXPECT_EQ(sim.run(job(16, 16, 64, mx)).cycles, 204 + 256 + 48 + 2 + 1 + 16 + 10);
    EXPECT_EQ(sim.run(job(16, 16, 64, plain(0, 32))).cycles, 204 + 256 + 96 + 2 + 1 + 16 + 10);
  }
  // Unset (0), the fused rate is acc.lanes.
  Simulator sim(config("teaching"));
  EXPECT_EQ(sim.run(job(16, 16, 64, mx)).cycles, 649 - 160 + 96);
  EXPECT_DOUBLE_EQ(sim.config().acc_fused_lanes, 8);
}

TEST(Timing, StallsSumToCycles) {
  for (const char* mode : {"prep.mode=frontend", "prep.mode=fused", "prep.mode=unfused"}) {
    Simulator sim(config("teaching", {mode, "tcu.count=3"}));
    const JobReport r = sim.run(job(80, 48, 320, plain(16)));
    double sum = 0;
    for (const auto& [k, v] : r.stalls) sum += v;
    EXPECT_NEAR(sum, double(r.cycles), 1e-6) << mode;
    EXPECT_GT(r.stalls.at("compute"), 0) << mode;
  }
}

TEST(Timing, AJobsResultDoesNotDependOnTheJobsBeforeIt) {
  // Three TCUs contend for one DRAM port; same-cycle requests must be served in the same order whatever ran
  // before (a fresh Simulator versus one that has run other jobs).
  const std::vector<std::string> ov = {"tcu.count=3", "tile.raster_group=2", "prep.mode=unfused"};
  QuantConfig q = plain(16);
  q.scale = ScaleKind::ue4m3;  // adds the amax pass
  int64_t fresh = 0;
  {
    Simulator sim(config("teaching", ov));
    fresh = sim.run(job(64, 160, 96, q)).cycles;
  }
  Simulator sim(config("teaching", ov));
  sim.run(job(96, 64, 160, q));
  sim.run(job(48, 48, 320));
  EXPECT_EQ(sim.run(job(64, 160, 96, q)).cycles, fresh);
  EXPECT_EQ(sim.run(job(64, 160, 96, q)).cycles, fresh);
}

// ---- one kernel alone (fp4lab sim --kernel), launches, the unpack pass, shared issue, CTAs per TCU ----------

GemmJob kernel_job(JobKind kind, int64_t M, int64_t N, int64_t K, const QuantConfig& q = plain()) {
  GemmJob j = job(M, N, K, q);
  j.kind = kind;
  return j;
}

TEST(Timing, TeachingQuantizeKernelAloneAndItsLaunch) {
  {
    Simulator sim(config("teaching", {"prep.mode=fused"}));
    // Operand A of the fused pass alone (TeachingFusedPrepPass's first chunk): read 0..32 (+10), RHT 42..106
    // (+5), quantise 111..175 (+2), write 768 B 177..189 (+10).
    const JobReport r = sim.run(kernel_job(JobKind::quantize, 16, 16, 64, plain(16)));
    EXPECT_EQ(r.cycles, 199);
    EXPECT_DOUBLE_EQ(r.bytes.at("dram_read"), 2048);
    EXPECT_DOUBLE_EQ(r.bytes.at("dram_write"), 768);
    EXPECT_DOUBLE_EQ(r.macs, 0);
  }
  {
    // 0.05 us at 1 GHz = 50 cycles before the kernel's first chunk; graph launches cost their own figure.
    Simulator sim(config("teaching", {"prep.mode=fused", "launch.stream_us=0.05", "launch.graph_us=0.02"}));
    EXPECT_EQ(sim.run(kernel_job(JobKind::quantize, 16, 16, 64, plain(16))).cycles, 50 + 199);
  }
  {
    Simulator sim(config("teaching", {"prep.mode=fused", "launch.stream_us=0.05", "launch.graph_us=0.02",
                                      "launch.mode=graph"}));
    EXPECT_EQ(sim.run(kernel_job(JobKind::quantize, 16, 16, 64, plain(16))).cycles, 20 + 199);
  }
  {
    // Unfused: an RHT kernel (read 0..32 (+10), RHT 42..106 (+5), write 2048 B 111..143 (+10) = 153), then a
    // quantise kernel 50 cycles after the barrier: read 203..235 (+10), quantise 245..309 (+2), write 768 B
    // 311..323 (+10) = 333.
    Simulator sim(config("teaching", {"prep.mode=unfused", "launch.stream_us=0.05"}));
    EXPECT_EQ(sim.run(kernel_job(JobKind::quantize, 16, 16, 64, plain(16))).cycles, 50 + 333);
  }
  Simulator sim(config("teaching"));  // frontend: a quantise kernel has nothing to run
  EXPECT_THROW(sim.run(kernel_job(JobKind::quantize, 16, 16, 64)), std::invalid_argument);
}

TEST(Timing, TeachingDramWriteCost) {
  // Written bytes take twice a read's port time: the quantise kernel's 768 B write 177..201 (not ..189), +10.
  Simulator sim(config("teaching", {"prep.mode=fused", "dram.write_cost=2"}));
  const JobReport r = sim.run(kernel_job(JobKind::quantize, 16, 16, 64, plain(16)));
  EXPECT_EQ(r.cycles, 211);
  EXPECT_DOUBLE_EQ(r.bytes.at("dram_write"), 768);  // bytes moved, not port time
}

TEST(Timing, TeachingLaunchesOfATrainingGemm) {
  Simulator sim(config("teaching", {"prep.mode=fused", "launch.stream_us=0.05"}));
  // TeachingFusedPrepPass with a quantise kernel per operand (2 x 50 cycles before the pass) and the GEMM
  // kernel's 50: prep 263 + 100, the whole 742 + 150.
  const JobReport r = sim.run(job(16, 16, 64, plain(16)));
  EXPECT_EQ(r.prep_cycles, 263 + 100);
  EXPECT_EQ(r.cycles, 742 + 150);
}

TEST(Timing, TeachingUnpackPassAndTheGemmOnUnpackedOperands) {
  {
    Simulator sim(config("teaching", {"prep.mode=none", "unpack.launches=4"}));
    // Unpack alone: A's packed 768 B read 0..12 (+10), B's 12..24 (+10); A's 16 x 64 int8 + 16 x 4 FP32
    // scales = 1280 B written once the port is free, 24..44 (+10); B's 44..64 (+10) = 74.
    const JobReport u = sim.run(kernel_job(JobKind::unpack, 16, 16, 64));
    EXPECT_EQ(u.cycles, 74);
    EXPECT_DOUBLE_EQ(u.bytes.at("dram_read"), 1536);
    EXPECT_DOUBLE_EQ(u.bytes.at("dram_write"), 2560);
    // The GEMM alone reads the unpacked 1280 + 1280 B: 0..40 (+10), MAC 50..306 (+2), acc 308..468 (+1),
    // write 469..485 (+10) = 495 (on packed operands, 24 read cycles: 479).
    EXPECT_EQ(sim.run(kernel_job(JobKind::mma, 16, 16, 64)).cycles, 495);
    // Both, as one call: 74 + 495.
    EXPECT_EQ(sim.run(kernel_job(JobKind::gemm, 16, 16, 64)).cycles, 74 + 495);
  }
  Simulator sim(config("teaching", {"prep.mode=none"}));
  EXPECT_EQ(sim.run(kernel_job(JobKind::mma, 16, 16, 64)).cycles, 479);
  EXPECT_THROW(sim.run(kernel_job(JobKind::unpack, 16, 16, 64)), std::invalid_argument);  // no unpack pass
}

TEST(Timing, TeachingSharedIssueSerialisesTheAccumulator) {
  Simulator sim(config("teaching", {"acc.issue=shared"}));
  const JobReport r = sim.run(job(16, 16, 1024));
  // TeachingComputeBound with the scale-accumulates issued by the MAC array: 256 + 128 cycles a k-step, 256 +
  // 160 the last; the accumulator then only adds its latency. Fill 204, 15 x 384 + 416, then 2 + 1 + 16 + 10.
  EXPECT_EQ(r.cycles, 204 + 15 * 384 + 416 + 29);
  EXPECT_DOUBLE_EQ(r.stalls.at("compute"), 15 * 384 + 416);
}

TEST(Timing, TeachingTwoCtasShareATcusUnits) {
  Simulator sim(config("teaching", {"tcu.ctas=2"}));
  // One tile alone on the TCU has all of its units (the tail-wave share): as with one slot, 649.
  EXPECT_EQ(sim.run(job(16, 16, 64)).cycles, 649);
  // Two tiles, one per slot, each with half the units: quantise 2048 / 8 = 256, MAC 1024 / 2 = 512, accumulate
  // 1280 / 4 = 320 cycles. Tile 0: A0 and B read 0..64 (+10), quantise 74..330 (+2), MAC 332..844 (+2),
  // accumulate 846..1166 (+1), write 1167..1183 (+10). Tile 1 (its own slot fetches B too): A1 and B read
  // 64..128 (+10), quantise 138..394, MAC 396..908, accumulate 910..1230, write 1231..1247 (+10) = 1257.
  EXPECT_EQ(sim.run(job(32, 16, 64)).cycles, 1257);
  EXPECT_EQ(sim.config().tcus, 1);  // as given; the model runs config().per_slot()
  const Config s = sim.config().per_slot();
  EXPECT_EQ(s.tcus, 2);
  EXPECT_EQ(s.mac_units, 2);
  EXPECT_EQ(s.acc_lanes, 4);
  EXPECT_EQ(s.buffer_bytes, 8192);
  EXPECT_THROW(config("teaching", {"tcu.ctas=3"}), std::invalid_argument);  // 4 MAC units do not split in 3
}

TEST(Timing, TeachingPassItemsShareTheirTcusLanes) {
  {
    // One item on a two-slot TCU has the whole TCU's 16 RHT and quantiser lanes: as with one slot, 199.
    Simulator sim(config("teaching", {"prep.mode=fused", "tcu.ctas=2"}));
    EXPECT_EQ(sim.run(kernel_job(JobKind::quantize, 16, 16, 64, plain(16))).cycles, 199);
  }
  // Two items of 512 elements, one per slot, 8 lanes each. Item 0: read 0..16 (+10), RHT 26..90 (+5),
  // quantise 95..159 (+2), write 384 B 161..167 (+10). Item 1: read 16..32 (+10), RHT 42..106 (+5), quantise
  // 111..175 (+2), write 177..183 (+10) = 193.
  Simulator sim(config("teaching", {"prep.mode=fused", "tcu.ctas=2", "pass.elems=512"}));
  EXPECT_EQ(sim.run(kernel_job(JobKind::quantize, 16, 16, 64, plain(16))).cycles, 193);
}

TEST(Timing, TeachingPassWorkItemsReachEveryTcu) {
  // A's 16 x 64 operand as four work items of 256 elements on four TCUs: item i read 8i..8i+8 (+10), RHT 16
  // (+5), quantise 16 (+2), write 192 B (+10). The last: read 24..32, RHT 42..58, quantise 63..79, write
  // 81..84, +10.
  Simulator sim(config("teaching", {"prep.mode=fused", "tcu.count=4", "pass.elems=256"}));
  EXPECT_EQ(sim.run(kernel_job(JobKind::quantize, 16, 16, 64, plain(16))).cycles, 94);
}

// SR's Philox calls (docs/spec.md §4): quant.sr_lanes calls per cycle serve that many SR elements under philox1,
// four times as many under philox4 and sixteen times under philox16 (up to quant.lanes); energy.sr_pj is charged per
// call.
TEST(Timing, TeachingSrDrawSetsThePhiloxRateAndEnergy) {
  Simulator sim(config("teaching", {"quant.lanes=4", "quant.sr_lanes=1"}));
  QuantConfig q = plain();
  q.rounding = Rounding::sr;
  const JobReport r4 = sim.run(job(16, 16, 1024, q));
  q.sr_draw = SrDraw::philox1;
  const JobReport r1 = sim.run(job(16, 16, 1024, q));
  // philox4 at 4 calls' worth per cycle is the RTNE rate: TeachingQuantiserBound's 8713 cycles.
  EXPECT_EQ(r4.cycles, 8713);
  // philox1: 2048 / 1 = 2048 quantiser cycles per step instead of 512, the MAC waiting on every step.
  EXPECT_GT(r1.cycles, 3 * r4.cycles);
  EXPECT_GT(r1.stalls.at("quant"), 15 * 1536);
  // Both operands' 16 x 1024 elements each under SR: 32768 calls under philox1, 8192 under philox4.
  EXPECT_DOUBLE_EQ(r1.energy_pj.at("quant") - r4.energy_pj.at("quant"), (32768 - 8192) * 14.0);
  // philox16: 2048 calls; at quant.lanes=4 the rate is capped at RTNE's, the cycles philox4's.
  q.sr_draw = SrDraw::philox16;
  const JobReport r16 = sim.run(job(16, 16, 1024, q));
  EXPECT_EQ(r16.cycles, 8713);
  EXPECT_DOUBLE_EQ(r4.energy_pj.at("quant") - r16.energy_pj.at("quant"), (8192 - 2048) * 14.0);
}

// With quant.lanes=16 and one Philox call per cycle: philox16 (sixteen elements a call) keeps the RTNE rate, philox4
// runs at four elements a cycle and the MAC waits on it.
TEST(Timing, TeachingPhilox16KeepsTheRtneRateWhereSixteenLanesShareACall) {
  Simulator sim(config("teaching", {"quant.lanes=16", "quant.sr_lanes=1"}));
  QuantConfig q = plain();
  const JobReport rtne = sim.run(job(16, 16, 1024, q));
  q.rounding = Rounding::sr;
  q.sr_draw = SrDraw::philox16;
  const JobReport r16 = sim.run(job(16, 16, 1024, q));
  q.sr_draw = SrDraw::philox4;
  const JobReport r4 = sim.run(job(16, 16, 1024, q));
  EXPECT_EQ(r16.cycles, rtne.cycles);
  EXPECT_GT(r4.cycles, r16.cycles);
  EXPECT_GT(r4.stalls.at("quant"), r16.stalls.at("quant"));
}

}  // namespace
}  // namespace fp4lab::sim::test
