// fp4lab recipes: what each operand of each training GEMM gets under every preset (and, with --ablations, every
// ablation of the paper's study). Every row is
// Recipe::preset(name).operand(pass, operand), so the table cannot disagree with what the other subcommands
// quantise. docs/spec.md §2 holds the same table (--markdown prints it); tests/cli checks the two agree.
#include <algorithm>
#include <iostream>

#include "commands.hpp"
#include "fp4lab/rht.hpp"
#include "options.hpp"

namespace fp4lab::cli {

namespace {
// Where an operand's RHT signs come from: "te" (Transformer Engine's fixed vector), "seed" (derived from the
// recipe's seed by rht_signs_from_seed), "explicit" (any other vector), "-" without RHT.
std::string signs_kind(const QuantConfig& c) {
  if (c.rht == 0) return "-";
  if (c.rht == 16 && c.rht_signs == rht_signs_te(16)) return "te";
  if (c.rht_signs == rht_signs_from_seed(c.rht, c.seed)) return "seed";
  return "explicit";
}
const char* yes_no(bool b) { return b ? "yes" : "no"; }
}  // namespace

int cmd_recipes(const Invocation& inv) {
  po::options_description desc("fp4lab recipes options");
  desc.add_options()("markdown", po::bool_switch(), "print the table as Markdown (the table of docs/spec.md §2)")(
      "ablations", po::bool_switch(), "also the ablations of the paper's study, after the presets");
  add_common_options(desc);
  po::variables_map vm;
  if (!parse_args(inv, desc, "[--markdown] [--ablations] [--json FILE|-]", vm)) return kExitOk;
  const JsonOut json(vm);
  const bool markdown = vm["markdown"].as<bool>();
  const std::vector<std::string>& names = vm["ablations"].as<bool>() ? Recipe::names() : Recipe::preset_names();
  int width = 9;  // the recipe column: the presets' width, wider for the ablations' names
  for (const std::string& n : names) width = std::max(width, int(n.size()) + 1);

  Json rows = Json::array();
  for (const std::string& name : names) {
    const Recipe r = Recipe::preset(name);
    for (Pass p : kPasses)
      for (Operand o : {Operand::a, Operand::b}) {
        const QuantConfig c = r.operand(p, o);
        Json row = {{"recipe", name},
                    {"pass", pass_name(p)},
                    {"operand", o == Operand::a ? "A" : "B"},
                    {"role", operand_role(p, o)}};
        row.update(config_json(c));
        row["rht_signs_kind"] = signs_kind(c);
        rows.push_back(row);
      }
  }

  if (json.table()) {
    auto s = [](const Json& j, const char* k) { return j[k].get<std::string>(); };
    if (markdown) {
      std::cout << "| recipe | pass | operand | role | grid | block | scale | 2-D tiles | RHT | RHT signs "
                   "| BF16 rotation | rounding |\n"
                   "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
      for (const Json& j : rows)
        std::cout << fmt("| `%s` | %s | %s | %s | %s | %d | %s | %s | %d | %s | %s | %s |\n",
                         s(j, "recipe").c_str(), s(j, "pass").c_str(), s(j, "operand").c_str(),
                         s(j, "role").c_str(), s(j, "format").c_str(), j["block"].get<int>(), s(j, "scale").c_str(),
                         yes_no(j["tile2d"].get<bool>()), j["rht"].get<int>(), s(j, "rht_signs_kind").c_str(),
                         yes_no(j["rht_bf16"].get<bool>()), s(j, "rounding").c_str());
    } else {
      std::cout << "what each operand of each training GEMM gets (C = A . B^T, blocks and RHT along K)\n";
      std::cout << fmt("%-*s %-7s %-2s %-7s %-6s %5s %-6s %-6s %4s %-6s %-5s %s\n", width, "recipe", "pass", "op",
                       "role", "grid", "block", "scale", "tile2d", "rht", "signs", "bf16", "rounding");
      for (const Json& j : rows)
        std::cout << fmt("%-*s %-7s %-2s %-7s %-6s %5d %-6s %-6s %4d %-6s %-5s %s\n", width, s(j, "recipe").c_str(),
                         s(j, "pass").c_str(), s(j, "operand").c_str(), s(j, "role").c_str(),
                         s(j, "format").c_str(), j["block"].get<int>(), s(j, "scale").c_str(),
                         yes_no(j["tile2d"].get<bool>()), j["rht"].get<int>(), s(j, "rht_signs_kind").c_str(),
                         yes_no(j["rht_bf16"].get<bool>()), s(j, "rounding").c_str());
      std::cout << "(rht: Hadamard size, 0 = none; signs: te = Transformer Engine's vector; bf16: rotated values "
                   "rounded to BF16; rounding: rtne or sr, stochastic)\n";
    }
  }
  json.write({{"recipes", names}, {"operands", rows}});
  return kExitOk;
}

}  // namespace fp4lab::cli
