// The docs/spec.md §6 analyses of a whole trace, as a library: options -> opened traces -> per-record results ->
// one merged result, with the analysis JSON v1 written from it (the command line prints the Q1 table from it). `fp4lab analyze` (cli/) is a
// front-end over it, which spreads the records over MPI ranks; `fp4lab.analyze` (python/src/analyze.cpp) calls it
// directly. Every figure is defined by its order of operations (docs/spec.md §6.1): records are analysed
// independently and merged in record order, so any split of the records over threads or ranks gives the same bits.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4lab/io/safetensors.hpp"
#include "fp4lab/layer_analysis.hpp"

namespace fp4lab {

// A fault of an analysis, one line: a usage fault (an option value; exit code 2 on the command line) or a data fault
// (a trace, "<file>: <fault>"; exit code 1). Names and paths appear as they are; each front-end escapes the line it
// shows. Faults of the trace reader arrive as fp4lab::io::Error (data).
struct AnalysisError : std::runtime_error {
  bool usage;
  AnalysisError(bool is_usage, const std::string& msg) : std::runtime_error(msg), usage(is_usage) {}
};

// The options of an analysis, typed (cli/cmd_analyze.cpp reads them from its text; the Python package hands them
// over typed). plan_analysis checks them; its faults name the command line's option ("--rht: ...").
struct AnalysisOptions {
  std::vector<std::string> traces;                  // trace v1 folders or files, in order
  std::vector<ElemFormat> formats = {kE2M1, kE1M2};  // grids to compare, each once
  std::vector<int> rht = {0, 16};                   // RHT settings to compare, each once: 0 (none) and sizes
  // The signs of every setting with RHT: Transformer Engine's vector (te; d = 16 only), or d entries of +1 or -1.
  // Absent: te for d = 16, seeded (rht_seed) for other sizes.
  struct RhtSigns {
    bool te = false;
    std::vector<float> signs;  // when not te
  };
  std::optional<RhtSigns> rht_signs;
  uint64_t rht_seed = 0;
  int block = 16;
  ScaleKind scale = ScaleKind::fp32;
  // Also the three GEMMs under these training recipes (Recipe::preset names, in order), SR seeded by `seed`.
  std::optional<std::vector<std::string>> recipes;
  uint64_t seed = 0;  // stochastic-rounding seed of the recipe runs
  SrDraw sr_draw = kDefaultSrDraw;  // how the recipe runs' SR draws its words (docs/spec.md §4)
};

// The options resolved: every (grid, RHT) setting, in the order formats x rht, and the recipes. Throws
// AnalysisError (usage).
struct AnalysisPlan {
  std::vector<AnalysisSetting> settings;
  std::vector<Recipe> recipes;
  int block = 16;
  ScaleKind scale = ScaleKind::fp32;
  int inversion_rht = 0;  // the first RHT size given: the inversion compares it with no RHT
};
AnalysisPlan plan_analysis(const AnalysisOptions& o);

// One row of the Q1 table: a tensor (what = role) or GEMM (what = pass) of a record, one value per setting.
struct AnalysisRow {
  std::string gemm, what;  // gemm is "<folder>:<gemm>" when several traces are given
  std::vector<double> sqnr, beff, eta;
};
struct TensorEntry {
  size_t trace = 0;  // index into the traces given
  std::string gemm;
  TensorResult t;
  std::optional<double> delta_sqnr_db;  // with RHT, when the same grid without RHT came before it
  int64_t tokens = 0;
};
struct GemmEntry {
  size_t trace = 0;
  std::string gemm;
  GemmResult g;  // g.recipe empty: a (grid, RHT) setting
};
// One record's results: per setting its tensors and GEMMs (setting order), then its recipe GEMMs.
struct RecordResult {
  std::vector<TensorEntry> tensors;
  std::vector<GemmEntry> gemms;
  std::vector<AnalysisRow> tensor_rows, gemm_rows;  // fwd_x, fwd_w, bwd_dy; fwd_y, bwd_dx, bwd_dw
  int64_t elements = 0;
};
// Exact serialisation (CBOR; doubles as their IEEE bits, infinities kept), for records analysed elsewhere (MPI).
std::string to_bytes(const RecordResult& r);
RecordResult record_from_bytes(const std::string& bytes);

// The results of a set of records, in the order asked for. Analysis stops at the first record that fails, as one
// process going through them in order would: `results` holds the records before it, `fault` its exception (the
// reader's io::Error as is; a fault of its numerics as AnalysisError "<file>: gemm '<g>': <fault>").
struct RecordBatch {
  std::vector<RecordResult> results;
  size_t fault_at = SIZE_MAX;  // position in the records asked for
  std::exception_ptr fault;
};

struct Inversion {
  int rht = 0;
  std::vector<std::string> tensors, gemms;  // "<gemm>/<role or pass>" of the rows that invert
  size_t tensors_total = 0, gemms_total = 0;
};

struct AnalysisResult {
  std::vector<std::string> traces;
  AnalysisPlan plan;
  // Every record's results, in record order: the report's lists are these records' lists one after the other
  // (kept per record rather than copied into lists of the whole trace, which briefly needed both).
  std::vector<RecordResult> records;
  int64_t elements = 0;
  // E2M1 ahead without RHT and E1M2 ahead with it; absent unless both grids are given with and without RHT.
  std::optional<Inversion> inversion;
  std::map<std::string, double> decay;  // setting label -> prod eta over the fwd_y GEMMs
  double seconds = 0;                   // wall time, set by whoever timed the run
};

// The stochastic-rounding key of a trace record under the recipes (docs/spec.md §4): its identity, what the record
// carries -- its gemm name and, where its file's __metadata__ has one, its "step" -- never its place among the
// records analysed with it or the path it was reached by, so that its figures do not depend on either.
// record_identity_hash: 64-bit FNV-1a of the gemm name's UTF-8 bytes, then, with a step, of the byte 0xFF (never in
// UTF-8) and the step's bytes. record_sr_seed: the first two Philox4x32-10 words (low word first) under key `seed`
// and counter (hash low, hash high, kRecordStream, 0); the record's GEMM id is 0 (streams pass*2 + operand).
inline constexpr uint32_t kRecordStream = 0x52454344u;  // "RECD"
uint64_t record_identity_hash(const std::string& gemm, const std::string* step);
uint64_t record_sr_seed(uint64_t seed, const std::string& gemm, const std::map<std::string, std::string>& metadata);

// Called as each record starts: (records started, records in the batch, gemm name). The command line shows it.
using AnalysisProgress = std::function<void(size_t, size_t, const std::string&)>;

// The traces of an analysis, opened: every header read and its shapes validated (no tensor data yet), the
// records in order (the traces as given, each trace's records in its order).
class TraceAnalysis {
 public:
  // Throws io::Error or AnalysisError (data) for a trace that cannot be read or holds no record, AnalysisError
  // (usage) for a record given twice (the same file and gemm through two paths).
  TraceAnalysis(std::vector<std::string> traces, AnalysisPlan plan);
  ~TraceAnalysis();

  const std::vector<std::string>& traces() const { return traces_; }
  const AnalysisPlan& plan() const { return plan_; }
  size_t records() const { return refs_.size(); }
  std::vector<uint64_t> record_sizes() const;  // elements of each record's three tensors
  std::vector<std::string> inputs() const;     // the traces, then every record's file

  // Every operand of every GEMM against every setting's and recipe's block and RHT sizes, before any work (a
  // record that fails would otherwise surface only after the records before it were analysed): AnalysisError (data).
  void validate() const;

  // The records with these indices (ascending). Two threads share the work of a record and the next one loads
  // while this one computes; memory stays near two records.
  RecordBatch analyze(const std::vector<size_t>& records, const AnalysisProgress& progress = {}) const;

  // The results of every record, in record order, merged: the inversion and the decay (exp of the sum of
  // log eta over the fwd_y GEMMs, in record order, then setting order).
  AnalysisResult merge(std::vector<RecordResult> results) const;

 private:
  struct Ref {
    size_t trace;
    const io::TraceRecord* rec;
  };
  std::vector<std::string> traces_;
  AnalysisPlan plan_;
  std::vector<std::unique_ptr<io::Trace>> open_;
  std::vector<Ref> refs_;
};

// Plans, opens, validates, analyses every record and merges, in one process; rethrows the first fault.
// `before_work`, when given, sees the opened and validated traces before any record is analysed (a caller's
// checks of its outputs against the inputs, which throw to stop).
AnalysisResult analyze_traces(const AnalysisOptions& o, const AnalysisProgress& progress = {},
                              const std::function<void(const TraceAnalysis&)>& before_work = {});

// The analysis JSON v1 (docs/spec.md §6), without the build stamps every fp4lab JSON ends with. `command` is the
// command line recorded in config.command.
nlohmann::ordered_json analysis_json(const AnalysisResult& r, const std::string& command);

// The same document with the members of `tail` appended (the build stamps), as text: exactly what
// dump(2) of it gives (no trailing newline), handed to `sink` in pieces of about 1 MB as it is made, so that
// neither the document nor its text is ever held whole (a trace of 40,000 records makes 500 MB of it).
using JsonSink = std::function<void(const std::string&)>;
void write_analysis_json(const AnalysisResult& r, const std::string& command, const nlohmann::ordered_json& tail,
                         const JsonSink& sink);

}  // namespace fp4lab
