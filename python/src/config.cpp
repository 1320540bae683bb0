// QuantConfig, the formats, the recipe table, the knobs and the scale codecs.
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>  // Knobs: text, or a typed value
#include <nanobind/stl/vector.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "fp4lab/knobs.hpp"
#include "fp4lab/quantize.hpp"
#include "fp4lab/recipe.hpp"
#include "fp4lab/scale.hpp"

#include "common.hpp"

using namespace nb::literals;

namespace fp4lab::py {
namespace {

nb::dict config_dict(const QuantConfig& c) {
  nb::dict d;
  d["label"] = c.label();
  d["format"] = c.format.name;
  d["block"] = c.block;
  d["tile2d"] = c.tile2d;
  d["scale"] = scale_name(c.scale);
  d["rht"] = c.rht;
  d["rht_signs"] = signs_string(c.rht_signs);
  d["rht_bf16"] = c.rht_bf16;
  d["rounding"] = rounding_name(c.rounding);
  d["seed"] = c.seed;
  d["stream"] = c.stream;
  return d;
}

nb::dict format_dict(const ElemFormat& f) {
  nb::dict d;
  std::vector<float> levels;
  std::vector<int> ints;
  for (int i = 0; i < f.num_levels(); ++i) {
    levels.push_back(f.level(i));
    ints.push_back(f.int_level(i));
  }
  d["name"] = f.name;
  d["ebits"] = f.ebits;
  d["mbits"] = f.mbits;
  d["bias"] = f.bias;
  d["max_index"] = f.max_index;
  d["levels"] = levels;
  d["int_levels"] = ints;
  d["int_shift"] = f.int_shift();
  d["gmax"] = f.gmax();
  d["emax"] = f.emax();
  return d;
}

}  // namespace

void bind_config(nb::module_& m) {
  // Pickling state: every field, in the names the knobs parse, so copies, torch.save and multiprocessing work.
  using ConfigState = std::tuple<std::string, int, bool, std::string, int, std::vector<float>, bool, std::string,
                                 uint64_t, uint32_t>;
  nb::class_<QuantConfig>(m, "QuantConfig")
      .def_prop_ro("label", &QuantConfig::label)
      .def("to_dict", &config_dict)
      .def("__getstate__", [](const QuantConfig& c) {
        return ConfigState(c.format.name, c.block, c.tile2d, scale_name(c.scale), c.rht, c.rht_signs, c.rht_bf16,
                           rounding_name(c.rounding), c.seed, c.stream);
      })
      .def("__setstate__", [](QuantConfig& c, const ConfigState& s) {
        QuantConfig v;
        v.format = parse_format(std::get<0>(s));
        v.block = std::get<1>(s);
        v.tile2d = std::get<2>(s);
        v.scale = parse_scale(std::get<3>(s));
        v.rht = std::get<4>(s);
        v.rht_signs = std::get<5>(s);
        v.rht_bf16 = std::get<6>(s);
        v.rounding = parse_rounding(std::get<7>(s));
        v.seed = std::get<8>(s);
        v.stream = std::get<9>(s);
        new (&c) QuantConfig(std::move(v));
      })
      .def("__repr__", [](const QuantConfig& c) { return "<fp4lab.QuantConfig " + c.label() + ">"; })
      // A training step's settings from its layer's: only the SR key changes from step to step (docs/spec.md §12),
      // and a copy is cheaper than parsing the knobs again, hundreds of times a step.
      .def("with_seed", [](const QuantConfig& c, uint64_t seed) {
        QuantConfig v = c;
        v.seed = seed;
        return v;
      }, "seed"_a, "A copy of these settings with another stochastic-rounding seed.");
  m.def("knob_names", &knob_names, "with_role"_a = true);
  m.def("operand_config", [](const Knobs& k, const std::string& pass, const std::string& operand) {
    const Pass p = pass.empty() ? selected_pass(k) : parse_pass(pass);
    Operand o;
    if (operand.empty()) o = selected_operand(k, p);
    else if (operand == "a") o = Operand::a;
    else if (operand == "b") o = Operand::b;
    else throw std::invalid_argument("operand must be 'a' or 'b', not '" + operand + "'");
    return operand_config(k, p, o);
  }, "knobs"_a, "pass_"_a = "", "operand"_a = "",
        "Quantiser settings of one operand: the recipe's, then the knobs on top (the CLI's rules and messages).");
  m.def("training_seed", &training_seed, "seed"_a, "step"_a);
  // The scale codecs of scale.hpp, element-wise, so tests can hold them against independent implementations.
  using F1 = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
  using U1 = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
  m.def("ue4m3_encode", [](F1 x) {
    std::vector<uint8_t> out(x.shape(0));
    for (size_t i = 0; i < out.size(); ++i) out[i] = ue4m3_encode(x.data()[i]);
    return owned(std::move(out), {x.shape(0)});
  }, "x"_a.noconvert(), "E4M3 codes of non-negative finite values (RTNE, saturating at 448), as block scales use");
  m.def("e4m3_decode", [](U1 c) {
    std::vector<float> out(c.shape(0));
    for (size_t i = 0; i < out.size(); ++i) out[i] = e4m3_decode(c.data()[i]);
    return owned(std::move(out), {c.shape(0)});
  }, "codes"_a.noconvert());
  m.def("e8m0_decode", [](U1 c) {
    std::vector<float> out(c.shape(0));
    for (size_t i = 0; i < out.size(); ++i) out[i] = e8m0_decode(c.data()[i]);
    return owned(std::move(out), {c.shape(0)});
  }, "codes"_a.noconvert());
  m.def("e8m0_encode_exp", &e8m0_encode_exp, "exponent"_a, "E8M0 code of 2^exponent (clamped to [-127, 127])");
  m.def("decode_table", [](const std::string& format) {
    const ElemFormat f = parse_format(format);
    std::vector<float> t(16);
    for (int c = 0; c < 16; ++c) t[size_t(c)] = code_valid(f, uint8_t(c)) ? decode(f, uint8_t(c)) : NAN;
    return t;
  }, "format"_a, "The value of each 4-bit code (NaN for codes the format does not use).");
  m.def("recipe_names", &Recipe::preset_names, "The presets, in table order.");
  m.def("recipe_rows", [] {
    nb::list l;
    for (const RecipeRow& row : recipe_table()) {
      nb::dict d;
      d["name"] = row.recipe.name;
      d["kind"] = recipe_kind_name(row.kind);
      d["base"] = row.base;
      d["study"] = row.study;
      d["what"] = row.what;
      l.append(d);
    }
    return l;
  }, "Every named recipe (the presets, then the ablations): name, kind, base, study (its place in the paper's "
     "ablation study, 0: none) and what.");
  m.def("formats", [] {
    nb::list l;
    for (const ElemFormat& f : kAllFormats) l.append(format_dict(f));
    return l;
  });
  m.def("recipe_table", [](const std::string& name) {
    const Recipe r = Recipe::preset(name);
    nb::dict out;
    for (Pass p : kPasses) {
      nb::dict pd;
      for (Operand o : {Operand::a, Operand::b}) {
        nb::dict od = config_dict(r.operand(p, o));
        od["role"] = operand_role(p, o);
        pd[o == Operand::a ? "a" : "b"] = od;
      }
      out[pass_name(p)] = pd;
    }
    return out;
  });
}

}  // namespace fp4lab::py
