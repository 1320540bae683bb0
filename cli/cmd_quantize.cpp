// fp4lab quantize: block-quantise one 2-D tensor along its last dimension with fp4lab::quantize and write
// codes, scales and the dequantised tensor to a safetensors file.
#include <iostream>

#include "commands.hpp"
#include "files.hpp"
#include "fp4lab/analysis.hpp"
#include "fp4lab/io/files.hpp"
#include "fp4lab/io/safetensors.hpp"
#include "options.hpp"

namespace fp4lab::cli {

int cmd_quantize(const Invocation& inv) {
  po::options_description desc("fp4lab quantize options");
  desc.add_options()
      ("in", po::value<std::string>()->required()->value_name("FILE"), "input .safetensors file")
      ("tensor", po::value<std::string>()->required()->value_name("NAME"), "2-D tensor to quantise along its last dim")
      ("out", po::value<std::string>()->required()->value_name("FILE"), "output .safetensors file");
  po::options_description knobs("recipe and knobs");
  add_recipe_options(knobs, /*with_role=*/true);
  desc.add(knobs);
  add_common_options(desc);
  po::variables_map vm;
  if (!parse_args(inv, desc, "--in FILE --tensor NAME [--recipe R] [knobs] --out FILE [--json FILE|-]", vm))
    return kExitOk;
  const JsonOut json(vm);
  const Pass pass = selected_pass(vm);
  const Operand operand = selected_operand(vm, pass);
  const QuantConfig cfg = operand_config(vm, pass, operand);
  const std::string in = vm["in"].as<std::string>(), name = vm["tensor"].as<std::string>();
  const std::string out = vm["out"].as<std::string>();
  check_outputs(vm, {out}, {in});

  const Tensor x = load_matrix(in, name);
  const int64_t rows = x.shape[0], cols = x.shape[1];
  try {
    validate(cfg, rows, cols);
  } catch (const std::invalid_argument& e) {
    data_error(in, "tensor '" + name + "' " + shape_string(x.shape) + ": " + e.what());
  }

  QTensor q;
  std::vector<float> seen;  // SQNR reference: rotated when RHT is on
  try {
    q = quantize(x.v.data(), rows, cols, cfg);
    seen = rotate(x.v.data(), rows, cols, cfg);
  } catch (const std::invalid_argument& e) {  // e.g. "RHT overflows FP32 at row r, block b"
    data_error(in, "tensor '" + name + "': " + e.what());
  }
  const std::vector<float> dq = q.dequantize();
  const int64_t n = rows * cols;
  const double sqnr = sqnr_db(seen.data(), dq.data(), n), be = beff(q), alpha = shrinkage_alpha(seen.data(), dq.data(), n);

  const Json config = config_json(cfg);
  const std::string recipe = vm.count("recipe") ? vm["recipe"].as<std::string>() : "custom";
  std::map<std::string, std::string> meta = {{"fp4lab.command", inv.command_line},
                                             {"fp4lab.source", in + ":" + name},
                                             {"fp4lab.recipe", recipe},
                                             {"fp4lab.pass", pass_name(pass)},
                                             {"fp4lab.role", operand_role(pass, operand)},
                                             {"fp4lab.config", cfg.label()}};
  put_metadata(meta, "fp4lab.config.", config);
  const int64_t kb = q.kblocks();
  std::vector<io::OutTensor> outs;
  outs.push_back(io::make_u8(name + ".codes", {rows, cols}, q.codes));
  outs.push_back(io::make_f32(name + ".scales", {rows, kb}, q.scales));
  if (!q.scale_codes.empty()) outs.push_back(io::make_u8(name + ".scale_codes", {rows, kb}, q.scale_codes));
  outs.push_back(io::make_f32(name + ".global_scale", {1}, {q.global_dec}));
  outs.push_back(io::make_f32(name + ".dequant", {rows, cols}, dq));
  // Written and closed now, renamed into place only after the JSON is written too.
  io::AtomicFile out_file(out);
  io::write_safetensors(out_file, outs, meta);

  if (json.table()) {
    std::cout << fmt("%s:%s %s -> %s\n", printable(in).c_str(), printable(name).c_str(), shape_string(x.shape).c_str(),
                     printable(out).c_str());
    std::cout << fmt("config   %s (recipe %s, pass %s, role %s)\n", cfg.label().c_str(), recipe.c_str(),
                     pass_name(pass), operand_role(pass, operand));
    std::cout << fmt("SQNR     %s%s\n", sqnr_text(sqnr, 0, 4).c_str(), cfg.rht ? " (against the rotated tensor)" : "");
    std::cout << fmt("B_eff    %.4f\nalpha    %.6f\n", be, alpha);
  }
  json.write({{"command", "quantize"},
              {"input", in},
              {"tensor", name},
              {"shape", x.shape},
              {"recipe", recipe},
              {"pass", pass_name(pass)},
              {"role", operand_role(pass, operand)},
              {"config", config},
              {"sqnr_db", sqnr},
              {"beff", be},
              {"alpha", alpha},
              {"global_scale", q.global_dec},
              {"out", out}});
  out_file.commit();
  return kExitOk;
}

}  // namespace fp4lab::cli
