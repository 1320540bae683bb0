// The trace analysis library (fp4lab/trace_analysis.hpp): a split of the records into batches, serialised and
// merged in record order, gives the JSON of one batch of all records byte for byte (what MPI ranks do, without
// MPI); faults stop at the first failing record; option faults are usage faults naming the option.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fp4lab/trace_analysis.hpp"

namespace fp4lab::test {
namespace {

const std::string kTrace = std::string(FP4LAB_SOURCE_DIR) + "/workloads/tiny-lm/step_005000";

// Two small records of the bundled trace, given as two files (so entries name their trace), and the options that
// make every kind of entry: both grids with and without RHT (the inversion), and one recipe (SR keyed by record).
AnalysisOptions small_options() {
  AnalysisOptions o;
  o.traces = {kTrace + "/layers.0.attn.proj.safetensors", kTrace + "/layers.7.attn.proj.safetensors"};
  o.recipes = {{"nvfp4"}};
  return o;
}

std::string json_text(const AnalysisResult& r) { return analysis_json(r, "cmd").dump(2); }

TEST(TraceAnalysis, RecordsSplitSerialisedAndMergedEqualOnePass) {
  const AnalysisOptions o = small_options();
  const TraceAnalysis ta(o.traces, plan_analysis(o));
  ta.validate();
  ASSERT_EQ(ta.records(), 2u);
  RecordBatch all = ta.analyze({0, 1});
  ASSERT_FALSE(all.fault);
  const std::string want = json_text(ta.merge(std::move(all.results)));

  // Each record alone (as two ranks would), in reverse order of analysis, through the byte form.
  std::vector<RecordResult> merged(2);
  for (size_t i : {size_t(1), size_t(0)}) {
    RecordBatch b = ta.analyze({i});
    ASSERT_FALSE(b.fault);
    ASSERT_EQ(b.results.size(), 1u);
    merged[i] = record_from_bytes(to_bytes(b.results[0]));
  }
  EXPECT_EQ(json_text(ta.merge(std::move(merged))), want);
  // The one-call form gives the same (its wall time aside).
  AnalysisResult one = analyze_traces(o);
  one.seconds = 0;
  EXPECT_EQ(json_text(one), want);
}

// A record's SR figures are keyed by its identity, not its place among the records (docs/spec.md §4): the second
// record analysed alone gives the entries it gives after the first, bit for bit (test_record_sr_key.py covers
// folders, order and paths through the command line).
TEST(TraceAnalysis, RecordFiguresDoNotDependOnNeighbours) {
  const AnalysisOptions o = small_options();
  AnalysisOptions alone = o;
  alone.traces = {o.traces[1]};
  const AnalysisResult both = analyze_traces(o), one = analyze_traces(alone);
  ASSERT_EQ(both.records.size(), 2u);
  ASSERT_EQ(one.records.size(), 1u);
  const RecordResult &a = both.records[1], &b = one.records[0];
  ASSERT_EQ(a.gemms.size(), b.gemms.size());
  size_t sr = 0;
  for (size_t i = 0; i < a.gemms.size(); ++i) {
    const GemmResult &x = a.gemms[i].g, &y = b.gemms[i].g;
    EXPECT_EQ(x.recipe + "/" + x.pass, y.recipe + "/" + y.pass);
    // Bit for bit: the same doubles, not close ones.
    EXPECT_EQ(std::memcmp(&x.sqnr_db, &y.sqnr_db, sizeof(double)), 0) << x.recipe << " " << x.pass;
    EXPECT_EQ(std::memcmp(&x.eta, &y.eta, sizeof(double)), 0) << x.recipe << " " << x.pass;
    EXPECT_EQ(std::memcmp(&x.eta_measured, &y.eta_measured, sizeof(double)), 0) << x.recipe << " " << x.pass;
    sr += !x.recipe.empty() && x.pass != "fwd_y";
  }
  EXPECT_EQ(sr, 2u);  // nvfp4's bwd_dx and bwd_dw, which round dY stochastically
}

// The key's definition (docs/spec.md §4), on values computed from it by hand (FNV-1a's published vectors; the seeds
// by tests/analysis/test_record_sr_key.py's independent Python FNV-1a and Philox4x32-10).
TEST(TraceAnalysis, RecordKeyIsFnv1aOfNameAndStepThroughPhilox) {
  EXPECT_EQ(record_identity_hash("", nullptr), 0xcbf29ce484222325ull);
  EXPECT_EQ(record_identity_hash("a", nullptr), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(record_identity_hash("foobar", nullptr), 0x85944171f73967e8ull);
  const std::string step = "5000";
  EXPECT_EQ(record_identity_hash("layers.7.attn.proj", &step), 0xabccfdf2c2a51bb6ull);
  EXPECT_EQ(record_sr_seed(0, "layers.7.attn.proj", {{"step", "5000"}, {"model", "m"}}), 0x8a09105156942079ull);
  EXPECT_EQ(record_sr_seed(0, "layers.7.attn.proj", {{"model", "m"}}), 0xb59d536b39f6820eull);
  EXPECT_EQ(record_sr_seed(7, "g", {}), 0xf82033a0a3879ca7ull);
}

TEST(TraceAnalysis, ByteFormKeepsInfinitiesAndAbsentDeltas) {
  RecordResult r;
  TensorEntry t;
  t.trace = 1;
  t.gemm = "g";
  t.t.role = "fwd_x";
  t.t.format = "e1m2";
  t.t.sqnr_db = INFINITY;
  t.t.bias_per_level = {{0, 0.0, 3, -0.0}, {1, 0.25, 0, 1e-300}};
  t.tokens = 16;
  r.tensors = {t, t};
  r.tensors[1].delta_sqnr_db = -0.0;
  r.gemm_rows = {{"g", "fwd_y", {INFINITY}, {}, {0.1}}};
  r.elements = 7;
  const RecordResult back = record_from_bytes(to_bytes(r));
  ASSERT_EQ(back.tensors.size(), 2u);
  EXPECT_TRUE(std::isinf(back.tensors[0].t.sqnr_db));
  EXPECT_FALSE(back.tensors[0].delta_sqnr_db.has_value());
  ASSERT_TRUE(back.tensors[1].delta_sqnr_db.has_value());
  EXPECT_TRUE(std::signbit(*back.tensors[1].delta_sqnr_db));
  EXPECT_TRUE(std::signbit(back.tensors[0].t.bias_per_level[0].mean_error));
  EXPECT_EQ(back.tensors[0].t.bias_per_level[1].mean_error, 1e-300);
  EXPECT_EQ(back.tensors[0].t.bias_per_level[0].count, 3);
  EXPECT_EQ(back.tensors[0].trace, 1u);
  EXPECT_EQ(back.gemm_rows[0].eta[0], 0.1);
  EXPECT_EQ(back.elements, 7);
}

// The report written piece by piece is the document's dump(2), byte for byte: on real records (two traces, a recipe,
// the inversion lists), on one setting (no inversion), and on a hand-made result with what JSON cannot hold as
// such (an infinite SQNR, a name that is not UTF-8) and empty lists.
TEST(TraceAnalysis, StreamedReportIsTheDocumentsText) {
  const nlohmann::ordered_json tail = {{"fp4lab_version", "v"}, {"git_commit", "c"}};
  auto check = [&](const AnalysisResult& r) {
    nlohmann::ordered_json doc = analysis_json(r, "cmd");
    for (const auto& [k, v] : tail.items()) doc[k] = v;
    std::string got;
    write_analysis_json(r, "cmd", tail, [&](const std::string& piece) { got += piece; });
    EXPECT_EQ(got, doc.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
  };
  AnalysisOptions o = small_options();
  check(analyze_traces(o));
  o.traces.resize(1);
  o.formats = {kE1M2};
  o.rht = {0};
  o.recipes.reset();
  check(analyze_traces(o));

  AnalysisResult r;
  r.traces = {"t\xff" "1", "t2"};  // bytes t, 0xff, 1 (one literal would read \xff1 as one escape)
  r.plan = plan_analysis(AnalysisOptions{});
  RecordResult rec;
  TensorEntry t;
  t.trace = 1;
  t.gemm = "g\xff";
  t.t.role = "fwd_x";
  t.t.sqnr_db = INFINITY;
  rec.tensors = {t};
  r.records = {rec, RecordResult{}};
  r.inversion = Inversion{};
  check(r);
}

TEST(TraceAnalysis, StopsAtTheFirstFailingRecord) {
  // A copy of a record with a NaN as its last element, after a good record: the good one's results come back,
  // then the fault, naming the file.
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "fp4lab_analysis_test_nan";
  std::filesystem::create_directories(dir);
  const std::string bad = (dir / "z.safetensors").string();
  std::filesystem::copy_file(kTrace + "/layers.0.attn.proj.safetensors", bad,
                             std::filesystem::copy_options::overwrite_existing);
  {
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-2, std::ios::end);
    f.write("\xc0\x7f", 2);  // BF16 NaN
  }
  AnalysisOptions o = small_options();
  o.traces = {o.traces[1], bad};
  const TraceAnalysis ta(o.traces, plan_analysis(o));
  RecordBatch b = ta.analyze({0, 1});
  EXPECT_EQ(b.results.size(), 1u);
  EXPECT_EQ(b.fault_at, 1u);
  ASSERT_TRUE(b.fault);
  try {
    std::rethrow_exception(b.fault);
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("NaN"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(TraceAnalysis, OptionFaultsAreUsageFaultsNamingTheOption) {
  auto fault = [](AnalysisOptions o) -> std::pair<bool, std::string> {
    try {
      plan_analysis(o);
    } catch (const AnalysisError& e) {
      return {e.usage, e.what()};
    }
    return {false, "no fault"};
  };
  AnalysisOptions o;
  o.formats = {kE2M1, kE1M2, kE2M1};
  EXPECT_EQ(fault(o), std::make_pair(true, std::string("--formats: e2m1 is given twice")));
  o = {};
  o.rht = {16, 0, 16};
  EXPECT_EQ(fault(o), std::make_pair(true, std::string("--rht: 16 is given twice")));
  o = {};
  o.block = 64;
  EXPECT_EQ(fault(o), std::make_pair(true, std::string("--block: block size must be 16 or 32, not 64")));
  o = {};
  o.recipes = {{"ufp4", "fp8"}};
  EXPECT_TRUE(fault(o).first);
  EXPECT_EQ(fault(o).second.rfind("--recipe: ", 0), 0u) << fault(o).second;
  // The inversion compares no RHT with the first RHT size given.
  o = {};
  o.rht = {32, 0, 16};
  EXPECT_EQ(plan_analysis(o).inversion_rht, 32);
  // Typed values the command line cannot spell are refused as it refuses their text.
  o = {};
  o.rht = {0, 24};
  EXPECT_EQ(fault(o), std::make_pair(true, std::string("--rht: RHT size must be a power of two from 16 to 128, not 24 "
                                                       "(none or 0: RHT off)")));
  o = {};
  o.formats.clear();
  EXPECT_EQ(fault(o), std::make_pair(true, std::string("--formats lists no format")));
  o = {};
  o.rht = {32};
  o.rht_signs = AnalysisOptions::RhtSigns{false, std::vector<float>(16, 1.0f)};
  EXPECT_EQ(fault(o), std::make_pair(true, std::string("--rht-signs gives 16 signs but the RHT size is 32")));
  o.rht_signs = AnalysisOptions::RhtSigns{true, {}};
  EXPECT_EQ(fault(o).second.rfind("--rht-signs te: ", 0), 0u) << fault(o).second;
}

}  // namespace
}  // namespace fp4lab::test
