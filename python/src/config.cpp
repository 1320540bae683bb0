// QuantConfig, the formats, the recipe table, one operand's settings and the scale codecs.
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fp4lab/settings.hpp"
#include "fp4lab/quantize.hpp"
#include "fp4lab/recipe.hpp"
#include "fp4lab/rht.hpp"
#include "fp4lab/scale.hpp"

#include "common.hpp"

using namespace nb::literals;

namespace fp4lab::py {
namespace {

constexpr int kNumFormats = int(sizeof(kAllFormats) / sizeof(kAllFormats[0]));

// A format, scale or rounding given as the enum member or its name (the spelling the command line takes).
ElemFormat format_of(nb::handle h) {
  if (nb::isinstance<FormatId>(h)) return kAllFormats[int(nb::cast<FormatId>(h))];
  if (nb::isinstance<nb::str>(h)) return parse_format(nb::cast<std::string>(h));
  throw nb::type_error("QuantConfig(): format must be an fp4lab.Format or its name (str)");
}
ScaleKind scale_of(nb::handle h) {
  if (nb::isinstance<ScaleKind>(h)) return nb::cast<ScaleKind>(h);
  if (nb::isinstance<nb::str>(h)) return parse_scale(nb::cast<std::string>(h));
  throw nb::type_error("QuantConfig(): scale must be an fp4lab.Scale or its name (str)");
}
Rounding rounding_of(nb::handle h) {
  if (nb::isinstance<Rounding>(h)) return nb::cast<Rounding>(h);
  if (nb::isinstance<nb::str>(h)) return parse_rounding(nb::cast<std::string>(h));
  throw nb::type_error("QuantConfig(): rounding must be an fp4lab.Rounding or its name (str)");
}
SrDraw sr_draw_of(nb::handle h) {
  if (nb::isinstance<SrDraw>(h)) return nb::cast<SrDraw>(h);
  if (nb::isinstance<nb::str>(h)) return parse_sr_draw(nb::cast<std::string>(h));
  throw nb::type_error("QuantConfig(): sr_draw must be an fp4lab.SrDraw or its name (str)");
}

// rht_signs as given: None (Transformer Engine's vector for d = 16; no signs without RHT), "te", or a sequence of
// +1/-1 entries.
std::vector<float> signs_of(nb::handle h, int rht) {
  if (h.is_none()) return rht == 16 ? rht_signs_te(16) : std::vector<float>();
  if (nb::isinstance<nb::str>(h)) {
    if (nb::cast<std::string>(h) != "te") throw std::invalid_argument("QuantConfig(): rht_signs is 'te' or a sequence of +1/-1");
    return rht_signs_te(rht == 0 ? 16 : rht);
  }
  std::vector<float> s;
  for (nb::handle v : h) {
    if (nb::isinstance<nb::bool_>(v) || !(nb::isinstance<nb::int_>(v) || nb::isinstance<nb::float_>(v)))
      throw nb::type_error("QuantConfig(): rht_signs entries are +1 or -1");
    const double x = nb::cast<double>(v);
    if (x != 1.0 && x != -1.0)
      throw std::invalid_argument("QuantConfig(): rht_signs entries are +1 or -1, not " + nb::cast<std::string>(nb::repr(v)));
    s.push_back(float(x));
  }
  return s;
}

// The rules a QuantConfig obeys, whichever way it was made (keywords, replace, unpickling): operand_config's
// rules (fp4lab/settings.hpp) on a whole config, then the model's own validate() on a shape every valid setting accepts.
QuantConfig checked(QuantConfig c) {
  if (c.rht < 0 || (c.rht != 0 && !rht_size_ok(c.rht))) throw std::invalid_argument("QuantConfig(): " + rht_size_fault(c.rht));
  if (c.rht == 0 && !c.rht_signs.empty()) throw std::invalid_argument("QuantConfig(): rht_signs given without an RHT size (rht=D)");
  if (c.rht != 0 && int(c.rht_signs.size()) != c.rht) {
    if (!c.rht_signs.empty())
      throw std::invalid_argument("QuantConfig(): rht=" + std::to_string(c.rht) + " needs " + std::to_string(c.rht) +
                                  " signs, got " + std::to_string(c.rht_signs.size()));
    throw std::invalid_argument("QuantConfig(): rht=" + std::to_string(c.rht) +
                                " needs rht_signs (Transformer Engine's vector is defined for d = 16 only)");
  }
  for (float x : c.rht_signs)
    if (x != 1.0f && x != -1.0f) throw std::invalid_argument("QuantConfig(): rht_signs entries are +1 or -1");
  if (c.rht_bf16 && c.rht == 0) throw std::invalid_argument("QuantConfig(): rht_bf16 needs an RHT (rht=D)");
  if (c.tile2d && c.block != 16)
    throw std::invalid_argument("QuantConfig(): tile2d (16x16 scale tiles) needs block 16, not " + std::to_string(c.block));
  try {
    validate(c, 16, 128);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("QuantConfig(): ") + e.what());
  }
  return c;
}

QuantConfig make_config(nb::handle format, int block, nb::handle scale, bool tile2d, int rht, nb::handle rht_signs,
                        bool rht_bf16, nb::handle rounding, uint64_t seed, uint32_t stream, nb::handle sr_draw) {
  QuantConfig c;
  c.format = format_of(format);
  c.block = block;
  c.scale = scale_of(scale);
  c.tile2d = tile2d;
  c.rht = rht;
  c.rht_signs = signs_of(rht_signs, rht);
  c.rht_bf16 = rht_bf16;
  c.rounding = rounding_of(rounding);
  c.seed = seed;
  c.stream = stream;
  c.sr_draw = sr_draw_of(sr_draw);
  return checked(std::move(c));
}

// The keyword call that builds c (its repr): signs as 'te' where they are Transformer Engine's vector.
std::string config_repr(const QuantConfig& c) {
  std::string signs = "None";
  if (c.rht != 0 && !(c.rht == 16 && c.rht_signs == rht_signs_te(16))) {
    signs = "[";
    for (size_t i = 0; i < c.rht_signs.size(); ++i) signs += (i ? ", " : "") + std::string(c.rht_signs[i] < 0 ? "-1" : "1");
    signs += "]";
  }
  return std::string("fp4lab.QuantConfig(format='") + c.format.name + "', block=" + std::to_string(c.block) +
         ", scale='" + scale_name(c.scale) + "', tile2d=" + (c.tile2d ? "True" : "False") +
         ", rht=" + std::to_string(c.rht) + ", rht_signs=" + signs + ", rht_bf16=" + (c.rht_bf16 ? "True" : "False") +
         ", rounding='" + rounding_name(c.rounding) + "', seed=" + std::to_string(c.seed) +
         ", stream=" + std::to_string(c.stream) + ", sr_draw='" + sr_draw_name(c.sr_draw) + "')";
}

// Pickling state: every field of QuantConfig::fields(), in that order, formats, scales and roundings by the names
// the knobs parse, so copies, torch.save and multiprocessing work.
using ConfigState = std::tuple<std::string, int, bool, std::string, int, std::vector<float>, bool, std::string,
                               uint64_t, uint32_t, std::string>;
// The state pickled before sr_draw existed: those configs drew SR under philox1, and load as such.
using ConfigState10 = std::tuple<std::string, int, bool, std::string, int, std::vector<float>, bool, std::string,
                                 uint64_t, uint32_t>;
std::string state_of(const ElemFormat& f) { return f.name; }
std::string state_of(ScaleKind k) { return scale_name(k); }
std::string state_of(Rounding r) { return rounding_name(r); }
std::string state_of(SrDraw d) { return sr_draw_name(d); }
template <class T>
const T& state_of(const T& v) { return v; }
void from_state(ElemFormat& f, const std::string& s) { f = parse_format(s); }
void from_state(ScaleKind& k, const std::string& s) { k = parse_scale(s); }
void from_state(Rounding& r, const std::string& s) { r = parse_rounding(s); }
void from_state(SrDraw& d, const std::string& s) { d = parse_sr_draw(s); }
template <class T>
void from_state(T& v, const T& s) { v = s; }

ConfigState config_state(const QuantConfig& c) {
  return std::apply([](const auto&... f) { return ConfigState(state_of(f)...); }, c.fields());
}
template <size_t... I>
QuantConfig config_of_state(const ConfigState& s, std::index_sequence<I...>) {
  QuantConfig v;
  auto f = v.fields();
  (from_state(std::get<I>(f), std::get<I>(s)), ...);
  return v;
}
QuantConfig config_of_state(const ConfigState& s) {
  return config_of_state(s, std::make_index_sequence<std::tuple_size_v<ConfigState>>());
}
QuantConfig config_of_state(const ConfigState10& s) {
  return config_of_state(std::tuple_cat(s, std::make_tuple(std::string(sr_draw_name(SrDraw::philox1)))));
}

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
  d["sr_draw"] = sr_draw_name(c.sr_draw);
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

FormatId format_id(const ElemFormat& f) { return FormatId(format_index(f)); }

void bind_config(nb::module_& m) {
  nb::enum_<FormatId> fmt(m, "Format", "The 4-bit element formats (docs/spec.md §1), named as the command line names them.");
  for (int i = 0; i < kNumFormats; ++i) fmt.value(kAllFormats[i].name, FormatId(i));
  nb::enum_<ScaleKind> sc(m, "Scale", "Block-scale encodings (docs/spec.md §2).");
  // Member names are identifiers ("ue8m0_ceil"); the names the command line spells ("ue8m0-ceil") are taken too.
  static std::vector<std::string> scale_members;
  for (ScaleKind k : kAllScales) {
    std::string n = scale_name(k);
    std::replace(n.begin(), n.end(), '-', '_');
    scale_members.push_back(n);
  }
  for (size_t i = 0; i < scale_members.size(); ++i) sc.value(scale_members[i].c_str(), kAllScales[i]);
  nb::enum_<Rounding> rd(m, "Rounding", "Rounding of a scaled element: round to nearest even, or stochastic.");
  for (Rounding r : kRoundings) rd.value(rounding_name(r), r);
  nb::enum_<SrDraw> sd(m, "SrDraw", "How stochastic rounding draws its random words (docs/spec.md §4): philox1, one "
                                    "Philox4x32-10 block per element (the original draw); philox4, one per four "
                                    "consecutive elements (the default); philox16, one per sixteen, 8 random bits "
                                    "an element.");
  for (SrDraw d : kSrDraws) sd.value(sr_draw_name(d), d);

  nb::class_<QuantConfig>(m, "QuantConfig",
      "The quantiser settings of one operand, typed. ``fp4lab.QuantConfig(format=\"e1m2\", block=16, scale=\"fp32\", "
      "rht=16, rounding=\"sr\", seed=3)`` builds one from keywords (enum members or their names); "
      "``fp4lab.config(recipe, pass_=..., operand=...)`` gives a recipe's. Immutable, compared and hashed by value; "
      "``replace(**changes)`` gives a changed copy; its repr is the call that builds it.")
      .def("__init__", [](QuantConfig* self, nb::handle format, int block, nb::handle scale, bool tile2d, int rht,
                          nb::handle rht_signs, bool rht_bf16, nb::handle rounding, uint64_t seed, uint32_t stream,
                          nb::handle sr_draw) {
        new (self) QuantConfig(
            make_config(format, block, scale, tile2d, rht, rht_signs, rht_bf16, rounding, seed, stream, sr_draw));
      }, nb::kw_only(), "format"_a = "e1m2", "block"_a = 16, "scale"_a = "fp32", "tile2d"_a = false, "rht"_a = 0,
         "rht_signs"_a = nb::none(), "rht_bf16"_a = false, "rounding"_a = "rtne", "seed"_a = 0, "stream"_a = 0,
         "sr_draw"_a = sr_draw_name(QuantConfig{}.sr_draw),
         "rht_signs: None (Transformer Engine's vector for rht=16), 'te', or rht entries of +1/-1. A setting the "
         "quantiser cannot take raises ValueError with the reason.")
      .def_prop_ro("format", [](const QuantConfig& c) { return format_id(c.format); })
      .def_prop_ro("block", [](const QuantConfig& c) { return c.block; })
      .def_prop_ro("scale", [](const QuantConfig& c) { return c.scale; })
      .def_prop_ro("tile2d", [](const QuantConfig& c) { return c.tile2d; })
      .def_prop_ro("rht", [](const QuantConfig& c) { return c.rht; })
      .def_prop_ro("rht_signs", [](const QuantConfig& c) -> nb::object {
        if (c.rht == 0) return nb::none();
        nb::list l;
        for (float x : c.rht_signs) l.append(x < 0 ? -1 : 1);
        return nb::tuple(l);
      }, "The rotation's signs as a tuple of +1/-1 (None without RHT).")
      .def_prop_ro("rht_bf16", [](const QuantConfig& c) { return c.rht_bf16; })
      .def_prop_ro("rounding", [](const QuantConfig& c) { return c.rounding; })
      .def_prop_ro("seed", [](const QuantConfig& c) { return c.seed; })
      .def_prop_ro("stream", [](const QuantConfig& c) { return c.stream; })
      .def_prop_ro("sr_draw", [](const QuantConfig& c) { return c.sr_draw; })
      .def_prop_ro("label", &QuantConfig::label)
      .def_prop_ro_static("FIELDS", [](nb::handle) {
        nb::list l;
        for (const char* n : QuantConfig::kFieldNames) l.append(n);
        return nb::tuple(l);
      }, "The settings' names (the constructor's keywords), in the order of the pickled state.")
      .def("replace", [](const QuantConfig& c, nb::kwargs changes) {
        const auto& names = QuantConfig::kFieldNames;
        for (auto [k, v] : changes) {
          (void)v;
          const std::string key = nb::cast<std::string>(k);
          if (std::find_if(names.begin(), names.end(), [&](const char* f) { return key == f; }) == names.end())
            throw nb::type_error(("QuantConfig.replace(): no setting '" + key + "'").c_str());
        }
        auto get = [&](const char* k, nb::object now) { return changes.contains(k) ? nb::borrow(changes[k]) : now; };
        // A new RHT size without signs takes that size's default signs, not the old size's.
        nb::object signs = changes.contains("rht_signs") ? nb::borrow(changes["rht_signs"])
                           : changes.contains("rht") ? nb::none()
                           : c.rht == 0 ? nb::none() : nb::cast(c.rht_signs);
        return make_config(get("format", nb::str(c.format.name)), nb::cast<int>(get("block", nb::int_(c.block))),
                           get("scale", nb::str(scale_name(c.scale))), nb::cast<bool>(get("tile2d", nb::bool_(c.tile2d))),
                           nb::cast<int>(get("rht", nb::int_(c.rht))), signs,
                           nb::cast<bool>(get("rht_bf16", nb::bool_(c.rht_bf16))),
                           get("rounding", nb::str(rounding_name(c.rounding))),
                           nb::cast<uint64_t>(get("seed", nb::cast(c.seed))),
                           nb::cast<uint32_t>(get("stream", nb::cast(c.stream))),
                           get("sr_draw", nb::str(sr_draw_name(c.sr_draw))));
      }, "A copy with the given settings changed (as dataclasses.replace).")
      .def("to_dict", &config_dict)
      .def("__eq__", [](const QuantConfig& a, nb::handle b) {
        return nb::isinstance<QuantConfig>(b) && a == nb::cast<const QuantConfig&>(b);
      })
      .def("__hash__", [](const QuantConfig& c) { return nb::hash(nb::str(config_repr(c).c_str())); })
      .def("__getstate__", &config_state)
      // A pickle is data: its settings obey the constructor's rules, or the load fails with the reason.
      .def("__setstate__", [](QuantConfig& c, const ConfigState& s) { new (&c) QuantConfig(checked(config_of_state(s))); })
      .def("__setstate__", [](QuantConfig& c, const ConfigState10& s) { new (&c) QuantConfig(checked(config_of_state(s))); })
      .def("__repr__", &config_repr)
      // A training step's settings from its layer's: only the SR key changes from step to step (docs/spec.md §12),
      // and a copy is cheaper than parsing the knobs again, hundreds of times a step.
      .def("with_seed", [](const QuantConfig& c, uint64_t seed) {
        QuantConfig v = c;
        v.seed = seed;
        return v;
      }, "seed"_a, "A copy of these settings with another stochastic-rounding seed.");
  // The training GEMMs in their order (kPasses): the one list every module of the package iterates.
  {
    nb::list passes;
    for (Pass p : kPasses) passes.append(pass_name(p));
    m.attr("PASSES") = nb::tuple(passes);
  }
  // The typed settings of one operand (fp4lab/settings.hpp): fp4lab.config's keywords after the package typed
  // them (format, scale and rounding as a member or its name; None: the recipe's).
  m.def("operand_config", [](std::optional<std::string> recipe, const std::string& pass, const std::string& role,
                             const std::string& operand, nb::handle format, std::optional<int> block,
                             nb::handle scale, std::optional<bool> tile2d, std::optional<int> rht,
                             std::optional<std::vector<float>> rht_signs, bool rht_signs_te,
                             std::optional<uint64_t> rht_seed, std::optional<bool> rht_bf16, nb::handle rounding,
                             std::optional<uint64_t> seed, std::optional<uint32_t> stream, nb::handle sr_draw) {
    OperandSettings st;
    st.recipe = std::move(recipe);
    if (!format.is_none()) st.format = format_of(format);
    st.block = block;
    if (!scale.is_none()) st.scale = scale_of(scale);
    st.tile2d = tile2d;
    st.rht = rht;
    st.rht_signs = std::move(rht_signs);
    st.rht_signs_te = rht_signs_te;
    st.rht_seed = rht_seed;
    st.rht_bf16 = rht_bf16;
    if (!rounding.is_none()) st.rounding = rounding_of(rounding);
    st.seed = seed;
    st.stream = stream;
    if (!sr_draw.is_none()) st.sr_draw = sr_draw_of(sr_draw);
    const Pass p = !pass.empty() ? parse_pass(pass) : !role.empty() ? role_pass(role) : Pass::fwd_y;
    Operand o = Operand::a;
    if (operand == "b") o = Operand::b;
    else if (!operand.empty() && operand != "a") throw std::invalid_argument("operand must be 'a' or 'b', not '" + operand + "'");
    else if (operand.empty() && !role.empty()) o = role_operand(role, p);
    return operand_config(st, p, o);
  }, "recipe"_a = nb::none(), "pass_"_a = "", "role"_a = "", "operand"_a = "", "format"_a = nb::none(),
     "block"_a = nb::none(), "scale"_a = nb::none(), "tile2d"_a = nb::none(), "rht"_a = nb::none(),
     "rht_signs"_a = nb::none(), "rht_signs_te"_a = false, "rht_seed"_a = nb::none(), "rht_bf16"_a = nb::none(),
     "rounding"_a = nb::none(), "seed"_a = nb::none(), "stream"_a = nb::none(), "sr_draw"_a = nb::none(),
        "Quantiser settings of one operand: the recipe's, then the settings given on top (docs/spec.md's rules).");
  // The settings fp4lab.config takes on top of a recipe, in the order the command line's help lists them.
  m.attr("SETTINGS") = nb::make_tuple("format", "block", "scale", "tile2d", "rht", "rht_signs", "rht_seed",
                                      "rht_bf16", "rounding", "sr_draw", "seed", "stream");
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
