// fp4lab bias --format F: the analytic per-level shrinkage bias (docs/spec.md §6; the paper's Figure 1a).
#include <iostream>

#include "commands.hpp"
#include "fp4lab/analysis.hpp"
#include "options.hpp"

namespace fp4lab::cli {

int cmd_bias(const Invocation& inv) {
  po::options_description desc("fp4lab bias options");
  desc.add_options()("format", po::value<std::string>()->required()->value_name("F"),
                     ("element grid " + knob_choices("format", "|")).c_str());
  add_common_options(desc);
  po::variables_map vm;
  if (!parse_args(inv, desc, "--format F [--json FILE|-]", vm)) return kExitOk;
  const JsonOut json(vm);
  const ElemFormat f = parse_format(vm["format"].as<std::string>());

  const std::vector<LevelBias> rows = analytic_bias(f);
  Json levels = Json::array();
  for (const LevelBias& b : rows)
    levels.push_back({{"index", b.index},
                      {"level", b.level},
                      {"left_halfgap", b.left_halfgap},
                      {"right_halfgap", b.right_halfgap},
                      {"bias", b.bias}});

  if (json.table()) {
    std::cout << fmt("analytic shrinkage bias of %s: E[q - x] = (l - r) / 2 over the RTNE bin [g - l, g + r]\n", f.name);
    std::cout << fmt("%5s %8s %8s %8s %9s\n", "index", "level", "left", "right", "bias");
    for (const LevelBias& b : rows)
      std::cout << fmt("%5d %8g %8g %8g %9g\n", b.index, b.level, b.left_halfgap, b.right_halfgap, b.bias);
    std::cout << "(level 0's bin starts at 0; the top level's bin is one-sided, values never exceed gmax)\n";
  }
  json.write({{"format", f.name}, {"levels", levels}});
  return kExitOk;
}

}  // namespace fp4lab::cli
