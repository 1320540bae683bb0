// fp4lab gemm: C = A . B^T with A [M, K] and B [N, K] both K-major, each operand block-quantised with its
// recipe config for the chosen pass, multiplied under the datapath contract (fp4lab::gemm), beside the
// float64 product of the unquantised operands.
#include <cmath>
#include <iostream>

#include "commands.hpp"
#include "files.hpp"
#include "fp4lab/analysis.hpp"
#include "fp4lab/gemm.hpp"
#include "fp4lab/io/files.hpp"
#include "fp4lab/io/safetensors.hpp"
#include "options.hpp"

namespace fp4lab::cli {

namespace {
struct QuantOperand {
  Tensor t;
  QuantConfig cfg;
  QTensor q;
  double alpha = 0, sqnr = 0;
};

QuantOperand quantize_operand(Tensor t, const QuantConfig& cfg) {
  QuantOperand o{std::move(t), cfg, {}, 0, 0};
  const int64_t rows = o.t.shape[0], cols = o.t.shape[1];
  try {
    validate(cfg, rows, cols);
  } catch (const std::invalid_argument& e) {
    data_error(o.t.file, "tensor '" + o.t.name + "' " + shape_string(o.t.shape) + ": " + e.what());
  }
  std::vector<float> seen;
  try {
    o.q = quantize(o.t.v.data(), rows, cols, cfg);
    seen = rotate(o.t.v.data(), rows, cols, cfg);
  } catch (const std::invalid_argument& e) {  // e.g. "RHT overflows FP32 at row r, block b"
    data_error(o.t.file, "tensor '" + o.t.name + "': " + e.what());
  }
  const std::vector<float> dq = o.q.dequantize();
  o.alpha = shrinkage_alpha(seen.data(), dq.data(), rows * cols);
  o.sqnr = sqnr_db(seen.data(), dq.data(), rows * cols);
  return o;
}
}  // namespace

int cmd_gemm(const Invocation& inv) {
  po::options_description desc("fp4lab gemm options");
  desc.add_options()
      ("a", po::value<std::string>()->required()->value_name("FILE:NAME"), "operand A [M, K]")
      ("b", po::value<std::string>()->required()->value_name("FILE:NAME"), "operand B [N, K] (C = A . B^T)")
      ("bf16-out", po::value<bool>()->default_value(false)->implicit_value(true)->value_name("BOOL"),
       "write C as BF16 (RTNE of the FP32 result)")
      ("out", po::value<std::string>()->required()->value_name("FILE"), "output .safetensors file (C, C.ref)");
  po::options_description knobs("recipe and knobs (applied to operand A and B of --pass)");
  add_recipe_options(knobs, /*with_role=*/false);
  desc.add(knobs);
  add_common_options(desc);
  po::variables_map vm;
  if (!parse_args(inv, desc, "--a FILE:NAME --b FILE:NAME [--recipe R] [knobs] [--bf16-out] --out FILE", vm))
    return kExitOk;
  const JsonOut json(vm);
  const Pass pass = selected_pass(vm);
  const QuantConfig cfg_a = operand_config(vm, pass, Operand::a), cfg_b = operand_config(vm, pass, Operand::b);
  {
    // The pairing rule of the contract (docs/spec.md §5) on the two configurations, before any file is read.
    try {
      check_gemm_operands(OperandMeta::of(cfg_a, 0, 0), OperandMeta::of(cfg_b, 0, 0));
    } catch (const std::invalid_argument& e) {
      usage_error(e.what());
    }
  }
  const auto [file_a, name_a] = split_file_tensor(vm["a"].as<std::string>(), "--a");
  const auto [file_b, name_b] = split_file_tensor(vm["b"].as<std::string>(), "--b");
  const std::string out = vm["out"].as<std::string>();
  const bool bf16 = vm["bf16-out"].as<bool>();
  check_outputs(vm, {out}, {file_a, file_b});

  Tensor ta = load_matrix(file_a, name_a), tb = load_matrix(file_b, name_b);
  const int64_t M = ta.shape[0], N = tb.shape[0], K = ta.shape[1];
  if (tb.shape[1] != K)
    data_error(file_b, "tensor '" + name_b + "' " + shape_string(tb.shape) + ": K = " + std::to_string(tb.shape[1]) +
                           " does not match A's K = " + std::to_string(K) + " (" + file_a + ":" + name_a + " " +
                           shape_string(ta.shape) + "); both operands are K-major, C = A . B^T");
  const std::vector<double> ref = gemm_f64(ta.v.data(), tb.v.data(), M, N, K);
  const QuantOperand a = quantize_operand(std::move(ta), cfg_a), b = quantize_operand(std::move(tb), cfg_b);

  std::vector<float> c;
  try {
    c = gemm(a.q, b.q);
  } catch (const std::invalid_argument& e) {  // "GEMM output overflows FP32 at C[i, j]"
    data_error(file_a + ":" + name_a + " . " + file_b + ":" + name_b + "^T", e.what());
  }
  if (bf16)
    for (float& v : c) v = round_to_bf16(v);  // the values written, so the SQNR is that of the output
  // BF16 rounding of a value near FLT_MAX can carry into Inf: the written C must be finite too.
  for (size_t i = 0; i < c.size(); ++i)
    if (!std::isfinite(c[i]))
      data_error(file_a + ":" + name_a + " . " + file_b + ":" + name_b + "^T",
                 fmt("GEMM output overflows BF16 at C[%lld, %lld]", (long long)(int64_t(i) / N), (long long)(int64_t(i) % N)));
  const double sqnr = sqnr_db(ref.data(), c.data(), M * N), eta = a.alpha * b.alpha;
  // C.ref is written as FP32: a float64 product past FLT_MAX would become Inf there, which is no reference
  // (the quantised product can stay finite: int4's saturation keeps it below the unquantised one).
  const std::vector<float> ref32(ref.begin(), ref.end());
  for (size_t i = 0; i < ref32.size(); ++i)
    if (!std::isfinite(ref32[i]))
      data_error(file_a + ":" + name_a + " . " + file_b + ":" + name_b + "^T",
                 fmt("the float64 reference C.ref[%lld, %lld] = %g overflows FP32", (long long)(int64_t(i) / N),
                     (long long)(int64_t(i) % N), ref[i]));

  const std::string recipe = vm.count("recipe") ? vm["recipe"].as<std::string>() : "custom";
  std::map<std::string, std::string> meta = {{"fp4lab.command", inv.command_line},
                                             {"fp4lab.a", file_a + ":" + name_a},
                                             {"fp4lab.b", file_b + ":" + name_b},
                                             {"fp4lab.recipe", recipe},
                                             {"fp4lab.pass", pass_name(pass)},
                                             {"fp4lab.contract", "fp4lab datapath contract (docs/datapath.md)"},
                                             {"fp4lab.a.config", cfg_a.label()},
                                             {"fp4lab.b.config", cfg_b.label()}};
  put_metadata(meta, "fp4lab.a.config.", config_json(cfg_a));
  put_metadata(meta, "fp4lab.b.config.", config_json(cfg_b));
  io::AtomicFile out_file(out);  // renamed into place after the JSON is written
  io::write_safetensors(out_file, {bf16 ? io::make_bf16("C", {M, N}, c) : io::make_f32("C", {M, N}, c),
                              io::make_f32("C.ref", {M, N}, ref32)},
                        meta);

  if (json.table()) {
    std::cout << fmt("C[%lld, %lld] = A[%lld, %lld] . B[%lld, %lld]^T -> %s (%s)\n", (long long)M, (long long)N,
                     (long long)M, (long long)K, (long long)N, (long long)K, printable(out).c_str(), bf16 ? "BF16" : "FP32");
    std::cout << fmt("recipe %s, pass %s\n", recipe.c_str(), pass_name(pass));
    std::cout << fmt("A  %-34s SQNR %s  alpha %.6f\n", cfg_a.label().c_str(), sqnr_text(a.sqnr, 11, 4).c_str(), a.alpha);
    std::cout << fmt("B  %-34s SQNR %s  alpha %.6f\n", cfg_b.label().c_str(), sqnr_text(b.sqnr, 11, 4).c_str(), b.alpha);
    std::cout << fmt("GEMM-output SQNR %s (against the float64 product)  eta = alpha_A * alpha_B = %.6f\n",
                     sqnr_text(sqnr, 0, 4).c_str(), eta);
  }
  json.write({{"command", "gemm"},
              {"a", {{"input", file_a}, {"tensor", name_a}, {"shape", {M, K}}, {"config", config_json(cfg_a)},
                     {"sqnr_db", a.sqnr}, {"alpha", a.alpha}}},
              {"b", {{"input", file_b}, {"tensor", name_b}, {"shape", {N, K}}, {"config", config_json(cfg_b)},
                     {"sqnr_db", b.sqnr}, {"alpha", b.alpha}}},
              {"recipe", recipe},
              {"pass", pass_name(pass)},
              {"M", M},
              {"N", N},
              {"K", K},
              {"bf16_out", bf16},
              {"sqnr_db", sqnr},
              {"eta", eta},
              {"out", out}});
  out_file.commit();
  return kExitOk;
}

}  // namespace fp4lab::cli
