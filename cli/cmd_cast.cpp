// fp4lab cast: round every element of a tensor onto a grid with scale 1 (|x| > gmax saturates): the codec
// alone, with the model's round_rtne / round_sr. The ml_dtypes oracle test drives this.
#include <cmath>
#include <iostream>

#include "commands.hpp"
#include "files.hpp"
#include "fp4lab/io/files.hpp"
#include "fp4lab/io/safetensors.hpp"
#include "fp4lab/philox.hpp"
#include "options.hpp"

namespace fp4lab::cli {

int cmd_cast(const Invocation& inv) {
  po::options_description desc("fp4lab cast options");
  desc.add_options()
      ("in", po::value<std::string>()->required()->value_name("FILE"), "input .safetensors file")
      ("tensor", po::value<std::string>()->required()->value_name("NAME"), "tensor to cast (any shape)")
      ("format", po::value<std::string>()->required()->value_name("F"),
       ("element grid " + knob_choices("format", "|")).c_str())
      ("rounding", po::value<std::string>()->default_value(rounding_name(Rounding::rtne))->value_name("R"),
       knob_choices("rounding", "|").c_str())
      ("seed", po::value<std::string>()->default_value("0")->value_name("S"), "stochastic-rounding seed")
      ("stream", po::value<std::string>()->default_value("0")->value_name("N"),
       "SR stream; element i draws sr_word(D, seed, stream, i)")
      ("sr-draw", po::value<std::string>()->default_value(sr_draw_name(QuantConfig{}.sr_draw))->value_name("D"),
       (knob_choices("sr_draw", "|") + ": SR's random words, one Philox block per 1, 4 or 16 elements").c_str())
      ("out", po::value<std::string>()->required()->value_name("FILE"), "output .safetensors file");
  add_common_options(desc);
  po::variables_map vm;
  if (!parse_args(inv, desc,
                  "--in FILE --tensor NAME --format F [--rounding " + knob_choices("rounding", "|") +
                      " --seed S] --out FILE",
                  vm))
    return kExitOk;
  const JsonOut json(vm);
  const ElemFormat f = parse_format(vm["format"].as<std::string>());
  const Rounding rounding = parse_rounding(vm["rounding"].as<std::string>());
  const uint64_t seed = uint_option(vm, "seed", UINT64_MAX);
  const uint32_t stream = uint32_t(uint_option(vm, "stream", UINT32_MAX));
  const SrDraw draw = parse_sr_draw(vm["sr-draw"].as<std::string>());
  const std::string in = vm["in"].as<std::string>(), name = vm["tensor"].as<std::string>();
  const std::string out = vm["out"].as<std::string>();
  check_outputs(vm, {out}, {in});

  const Tensor x = load_tensor(in, name);
  const int64_t n = int64_t(x.v.size());
  std::vector<uint8_t> codes(static_cast<size_t>(n));
  std::vector<float> dq(static_cast<size_t>(n));
  int64_t saturated = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x.v[size_t(i)];
    codes[size_t(i)] = rounding == Rounding::rtne ? round_rtne(f, v) : round_sr(f, v, sr_word(draw, seed, stream, uint64_t(i)));
    dq[size_t(i)] = decode(f, codes[size_t(i)]);
    saturated += std::fabs(v) > f.gmax();
  }

  const std::string rname = rounding_name(rounding);
  std::map<std::string, std::string> meta = {{"fp4lab.command", inv.command_line},
                                             {"fp4lab.source", in + ":" + name},
                                             {"fp4lab.format", f.name},
                                             {"fp4lab.rounding", rname},
                                             {"fp4lab.seed", std::to_string(seed)},
                                             {"fp4lab.stream", std::to_string(stream)},
                                             {"fp4lab.sr_draw", sr_draw_name(draw)}};
  io::AtomicFile out_file(out);  // renamed into place after the JSON is written
  io::write_safetensors(out_file, {io::make_u8(name + ".codes", x.shape, codes), io::make_f32(name + ".dequant", x.shape, dq)},
                        meta);

  if (json.table())
    std::cout << fmt("%s:%s %s -> %s: %lld values cast to %s (%s), %lld saturated at gmax %g\n",
                     printable(in).c_str(), printable(name).c_str(), shape_string(x.shape).c_str(), printable(out).c_str(), (long long)n, f.name, rname.c_str(),
                     (long long)saturated, double(f.gmax()));
  json.write({{"command", "cast"},
              {"input", in},
              {"tensor", name},
              {"shape", x.shape},
              {"format", f.name},
              {"rounding", rname},
              {"seed", seed},
              {"stream", stream},
              {"sr_draw", sr_draw_name(draw)},
              {"count", n},
              {"saturated", saturated},
              {"out", out}});
  out_file.commit();
  return kExitOk;
}

}  // namespace fp4lab::cli
