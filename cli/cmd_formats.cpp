// fp4lab formats: every element grid (kAllFormats) and scale format (kAllScales), all values derived from
// format.hpp / scale.hpp.
#include <iostream>
#include <stdexcept>

#include "commands.hpp"
#include "options.hpp"

namespace fp4lab::cli {

namespace {
std::string join_levels(const ElemFormat& f, bool integer) {
  std::string s;
  for (int i = 0; i <= f.max_index; ++i) {
    if (i) s += ' ';
    s += integer ? std::to_string(f.int_level(i)) : fmt("%g", double(f.level(i)));
  }
  return s;
}

// One scale format's row: its width, its range from the codec itself (E4M3 codes 0x01, the smallest subnormal, and
// 0x7E, 448; E8M0 codes 0..254) and its rule. A switch, so that a ScaleKind without a row does not compile quietly.
Json scale_row(ScaleKind s) {
  const char* name = scale_name(s);
  switch (s) {
    case ScaleKind::fp32:
      return {{"name", name}, {"bits", 32}, {"min", nullptr}, {"max", nullptr},
              {"rule", "dec = amax / gmax in FP32 (the paper's UFP4 setting)"}};
    case ScaleKind::ue4m3:
      return {{"name", name}, {"bits", 8}, {"min", double(e4m3_decode(0x01))}, {"max", double(e4m3_decode(0x7E))},
              {"rule", "E4M3(min(amax * S_enc / gmax, 448)) RTNE, S_enc = 448 * gmax / amax(tensor) (NVFP4, block 16)"}};
    case ScaleKind::ue8m0:
      return {{"name", name}, {"bits", 8}, {"min", double(e8m0_decode(0))}, {"max", double(e8m0_decode(254))},
              {"rule", "2^X, X = floor(log2 amax) - emax (OCP MX; may clip at gmax)"}};
    case ScaleKind::ue8m0_ceil:
      return {{"name", name}, {"bits", 8}, {"min", double(e8m0_decode(0))}, {"max", double(e8m0_decode(254))},
              {"rule", "2^X, X = ceil(log2(amax / gmax)) (Transformer Engine's MXFP4 reference; never clips)"}};
  }
  throw std::logic_error("scale_row: a ScaleKind without a row");
}
}  // namespace

int cmd_formats(const Invocation& inv) {
  po::options_description desc("fp4lab formats options");
  add_common_options(desc);
  po::variables_map vm;
  if (!parse_args(inv, desc, "[--json FILE|-]", vm)) return kExitOk;
  const JsonOut json(vm);

  Json formats = Json::array();
  for (const ElemFormat& f : kAllFormats) {
    Json levels = Json::array(), ints = Json::array();
    for (int i = 0; i <= f.max_index; ++i) {
      levels.push_back(double(f.level(i)));
      ints.push_back(f.int_level(i));
    }
    formats.push_back({{"name", f.name},
                       {"ebits", f.ebits},
                       {"mbits", f.mbits},
                       {"bias", f.bias},
                       {"max_index", f.max_index},
                       {"levels", levels},
                       {"int_levels", ints},
                       {"int_shift", f.int_shift()},
                       {"int_factor", std::ldexp(1.0, f.int_shift())},
                       {"gmax", double(f.gmax())},
                       {"int_max", f.int_max()},
                       {"emax", f.emax()}});
  }

  Json scales = Json::array();
  for (ScaleKind s : kAllScales) scales.push_back(scale_row(s));

  if (json.table()) {
    std::cout << "element grids (sign-magnitude codes: bit 3 sign, bits 0-2 magnitude index)\n";
    std::cout << fmt("%-10s %2s %2s %4s  %-32s %-24s %6s %6s %5s\n", "name", "E", "M", "bias", "levels",
                     "integer view", "factor", "gmax", "emax");
    for (const ElemFormat& f : kAllFormats)
      std::cout << fmt("%-10s %2d %2d %4d  %-32s %-24s %6s %6g %5d\n", f.name, f.ebits, f.mbits, f.bias,
                       join_levels(f, false).c_str(), join_levels(f, true).c_str(),
                       fmt("x%g", std::ldexp(1.0, f.int_shift())).c_str(), double(f.gmax()), f.emax());
    std::cout << "\nscale formats\n";
    for (const auto& s : scales) {
      const std::string range = s["min"].is_null() ? "FP32" : fmt("%g .. %g", s["min"].get<double>(), s["max"].get<double>());
      std::cout << fmt("%-11s %2d bits  %-24s %s\n", s["name"].get<std::string>().c_str(), s["bits"].get<int>(),
                       range.c_str(), s["rule"].get<std::string>().c_str());
    }
  }
  json.write({{"formats", formats}, {"scales", scales}});
  return kExitOk;
}

}  // namespace fp4lab::cli
