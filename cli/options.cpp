#include "options.hpp"

#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <unistd.h>

#include "fp4lab/io/safetensors.hpp"
#include "fp4lab/rht.hpp"

namespace fp4lab::cli {

void usage_error(const std::string& msg) { throw Error(kExitUsage, msg); }
void data_error(const std::string& file, const std::string& msg) {
  throw Error(kExitData, file.empty() ? msg : file + ": " + msg);
}

std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  const int n = std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  if (n < 0) return {};
  if (size_t(n) < sizeof buf) return std::string(buf, size_t(n));
  std::string s(size_t(n) + 1, '\0');
  va_start(ap, f);
  std::vsnprintf(s.data(), s.size(), f, ap);
  va_end(ap);
  s.resize(size_t(n));
  return s;
}

std::string shape_string(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ", ";
    r += std::to_string(s[i]);
  }
  return r + "]";
}

// ---- parsing ---------------------------------------------------------------------------------------
void add_common_options(po::options_description& desc) {
  desc.add_options()
      ("help,h", "print this help and exit")
      ("config", po::value<std::string>()->value_name("FILE"),
       "read further options from FILE (lines `option = value`; the command line wins)")
      ("json", po::value<std::string>()->value_name("FILE|-"),
       "write machine-readable JSON to FILE, or to stdout instead of the table with -");
}

bool parse_args(const Invocation& inv, const po::options_description& desc, const std::string& synopsis,
                po::variables_map& vm) {
  const std::string hint = " (see fp4lab " + inv.command + " --help)";
  try {
    // An empty positional description makes a stray bare word an error instead of being ignored.
    const po::positional_options_description no_positionals;
    po::store(po::command_line_parser(inv.args).options(desc).positional(no_positionals).run(), vm);
    if (vm.count("help")) {
      std::cout << "usage: fp4lab " << inv.command << " " << synopsis << "\n\n" << desc;
      return false;
    }
    if (vm.count("config")) {
      const std::string path = vm["config"].as<std::string>();
      std::ifstream in(path);
      if (!in) usage_error(path + ": cannot open config file");
      try {
        // Stored after the command line: po::store keeps values already present, so the command line wins.
        po::store(po::parse_config_file(in, desc), vm);
      } catch (const po::error& e) {
        usage_error(path + ": " + e.what());
      }
    }
    po::notify(vm);
  } catch (const po::error& e) {
    usage_error(e.what() + hint);
  }
  return true;
}

JsonOut::JsonOut(const po::variables_map& vm) {
  if (vm.count("json")) {
    dest = vm["json"].as<std::string>();
    if (dest.empty()) usage_error("--json needs a file name or -");
  }
}

void JsonOut::write(const Json& j) const {
  if (dest.empty()) return;
  // Infinite SQNR (zero error) has no JSON number; nlohmann writes null for it.
  const std::string text = j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
  if (dest == "-") {
    std::cout << text;
    return;
  }
  write_text_atomic(dest, text);
}

void write_text_atomic(const std::string& path, const std::string& text) {
  // A temporary name in the same folder, renamed over `path` once complete: a reader (or a failed run) never
  // sees a partial report under the real name.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) data_error(path, "cannot open for writing");
    out << text;
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      data_error(path, "write failed");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    data_error(path, std::string("cannot rename the finished file into place: ") + std::strerror(err));
  }
}

// ---- value parsers -----------------------------------------------------------------------------------
ElemFormat parse_format(const std::string& name) {
  std::string known;
  for (const ElemFormat& f : kAllFormats) {
    if (name == f.name) return f;
    known.append(known.empty() ? "" : ", ").append(f.name);
  }
  usage_error("unknown format '" + name + "' (known: " + known + ")");
}

ScaleKind parse_scale(const std::string& name) {
  for (ScaleKind s : {ScaleKind::fp32, ScaleKind::ue4m3, ScaleKind::ue8m0, ScaleKind::ue8m0_ceil})
    if (name == scale_name(s)) return s;
  usage_error("unknown scale '" + name + "' (known: fp32, ue4m3, ue8m0, ue8m0-ceil)");
}

Rounding parse_rounding(const std::string& name) {
  if (name == "rtne") return Rounding::rtne;
  if (name == "sr") return Rounding::sr;
  usage_error("unknown rounding '" + name + "' (known: rtne, sr)");
}

uint64_t parse_uint(const std::string& text, const std::string& option, uint64_t max) {
  // Decimal digits only: strtoull would accept "-1" (and wrap it), "+1", spaces and "0x..".
  const bool digits = !text.empty() && text.size() <= 20 && text.find_first_not_of("0123456789") == std::string::npos;
  errno = 0;
  const unsigned long long v = digits ? std::strtoull(text.c_str(), nullptr, 10) : 0;
  if (!digits || errno == ERANGE || v > max)
    usage_error("--" + option + ": '" + text + "' is not an integer from 0 to " + std::to_string(max));
  return v;
}

uint64_t uint_option(const po::variables_map& vm, const std::string& option, uint64_t max) {
  return parse_uint(vm[option].as<std::string>(), option, max);
}

Pass parse_pass(const std::string& name) {
  for (Pass p : kPasses)
    if (name == pass_name(p)) return p;
  usage_error("unknown pass '" + name + "' (known: fwd_y, bwd_dx, bwd_dw)");
}

std::vector<float> parse_rht_signs(const std::string& text, int d) {
  if (text == "te") {
    try {
      return rht_signs_te(d);
    } catch (const std::invalid_argument& e) {
      usage_error(std::string("--rht-signs te: ") + e.what());
    }
  }
  std::vector<float> s;
  size_t pos = 0;
  while (true) {
    const size_t comma = text.find(',', pos);
    const std::string tok = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (tok == "+1" || tok == "1" || tok == "+")
      s.push_back(1.0f);
    else if (tok == "-1" || tok == "-")
      s.push_back(-1.0f);
    else
      usage_error("--rht-signs: sign " + std::to_string(s.size() + 1) + " is '" + tok + "', not +1 or -1");
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (d != 0 && int(s.size()) != d)
    usage_error("--rht-signs gives " + std::to_string(s.size()) + " signs but the RHT size is " + std::to_string(d));
  return s;
}

std::string signs_string(const std::vector<float>& s) {
  std::string r;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ',';
    r += s[i] < 0 ? "-1" : "+1";
  }
  return r;
}

// ---- recipe knobs -----------------------------------------------------------------------------------
void add_recipe_options(po::options_description& desc, bool with_role) {
  std::string recipes;
  for (const auto& n : Recipe::preset_names()) recipes.append(recipes.empty() ? "" : "|").append(n);
  desc.add_options()
      ("recipe", po::value<std::string>()->value_name("R"),
       ("named preset " + recipes + "; explicit knobs below override it").c_str())
      ("pass", po::value<std::string>()->value_name("P"),
       "GEMM whose recipe config applies: fwd_y|bwd_dx|bwd_dw (default fwd_y)");
  if (with_role)
    desc.add_options()("role", po::value<std::string>()->value_name("ROLE"),
                       "operand of the pass: fwd_x|fwd_w|bwd_dy (default operand A; without --pass, bwd_dy "
                       "takes bwd_dx, the others fwd_y)");
  desc.add_options()
      ("format", po::value<std::string>()->value_name("F"), "element grid e2m1|e1m2|int4|e2m1_max2 (default e1m2)")
      ("block", po::value<int>()->value_name("B"), "elements per block scale, 16|32 (default 16)")
      ("scale", po::value<std::string>()->value_name("S"), "block scale fp32|ue4m3|ue8m0|ue8m0-ceil (default fp32)")
      ("tile2d", po::value<bool>()->implicit_value(true)->value_name("BOOL"),
       "16x16 scale tiles (NVFP4 weights); --tile2d=false turns a recipe's off")
      ("rht", po::value<int>()->value_name("D"), "random Hadamard transform size 16..128, 0 = off")
      ("rht-signs", po::value<std::string>()->value_name("S1,..,SD|te"),
       "RHT sign vector of +1/-1 entries, or te (Transformer Engine's, d = 16; the default for d = 16)")
      ("rht-seed", po::value<std::string>()->value_name("S"), "derive the RHT signs from seed S (rht_signs_from_seed)")
      ("rht-bf16", po::value<bool>()->implicit_value(true)->value_name("BOOL"),
       "round rotated values to BF16 before the amax (Transformer Engine)")
      ("rounding", po::value<std::string>()->value_name("R"), "rtne|sr (default rtne)")
      ("seed", po::value<std::string>()->value_name("S"), "stochastic-rounding seed (default 0)")
      ("stream", po::value<std::string>()->value_name("N"),
       "GEMM id in the SR counter; an operand's stream is N*8 + pass*2 + operand (default 0)");
}

Pass selected_pass(const po::variables_map& vm) {
  if (vm.count("pass")) return parse_pass(vm["pass"].as<std::string>());
  if (vm.count("role") && vm["role"].as<std::string>() == "bwd_dy") return Pass::bwd_dx;
  return Pass::fwd_y;
}

Operand selected_operand(const po::variables_map& vm, Pass pass) {
  if (!vm.count("role")) return Operand::a;
  const std::string role = vm["role"].as<std::string>();
  if (role != "fwd_x" && role != "fwd_w" && role != "bwd_dy")
    usage_error("unknown role '" + role + "' (known: fwd_x, fwd_w, bwd_dy)");
  for (Operand o : {Operand::a, Operand::b})
    if (role == operand_role(pass, o)) return o;
  usage_error("role " + role + " is not an operand of pass " + pass_name(pass) + " (A = " +
              operand_role(pass, Operand::a) + ", B = " + operand_role(pass, Operand::b) + ")");
}

QuantConfig operand_config(const po::variables_map& vm, Pass pass, Operand operand) {
  Recipe base;  // "custom": e1m2, block 16, fp32, no RHT, RTNE
  if (vm.count("recipe")) {
    try {
      base = Recipe::preset(vm["recipe"].as<std::string>());
    } catch (const std::invalid_argument& e) {
      usage_error(e.what());
    }
  }
  if (vm.count("seed")) base.seed = uint_option(vm, "seed", UINT64_MAX);
  const uint32_t stream = vm.count("stream") ? uint32_t(uint_option(vm, "stream", UINT32_MAX)) : 0u;
  QuantConfig c = base.operand(pass, operand, stream);

  if (vm.count("format")) c.format = parse_format(vm["format"].as<std::string>());
  if (vm.count("block")) c.block = vm["block"].as<int>();
  if (vm.count("scale")) c.scale = parse_scale(vm["scale"].as<std::string>());
  if (vm.count("tile2d")) c.tile2d = vm["tile2d"].as<bool>();
  if (vm.count("rounding")) c.rounding = parse_rounding(vm["rounding"].as<std::string>());

  // RHT: --rht D sets the size (0 turns it off); signs come from --rht-signs, --rht-seed, the recipe (when
  // the size matches) or, for d = 16, Transformer Engine's vector.
  if (vm.count("rht")) {
    c.rht = vm["rht"].as<int>();
    if (c.rht < 0) usage_error("--rht must be 0 or a power of two from 16 to 128, not " + std::to_string(c.rht));
    if (int(c.rht_signs.size()) != c.rht) c.rht_signs.clear();
  }
  if (vm.count("rht-signs") && vm.count("rht-seed")) usage_error("give --rht-signs or --rht-seed, not both");
  if (vm.count("rht-signs")) {
    const std::string text = vm["rht-signs"].as<std::string>();
    if (c.rht == 0 && vm.count("rht")) usage_error("--rht-signs given with --rht 0");
    if (c.rht == 0 && text != "te") {
      c.rht_signs = parse_rht_signs(text, 0);  // the count gives the size
      c.rht = int(c.rht_signs.size());
    } else {
      if (c.rht == 0) c.rht = 16;
      c.rht_signs = parse_rht_signs(text, c.rht);
    }
  } else if (vm.count("rht-seed")) {
    if (c.rht == 0) usage_error("--rht-seed needs an RHT size (--rht D)");
    if (!rht_size_ok(c.rht)) usage_error("RHT size must be a power of two from 16 to 128, not " + std::to_string(c.rht));
    c.rht_signs = rht_signs_from_seed(c.rht, uint_option(vm, "rht-seed", UINT64_MAX));
  }
  if (c.rht != 0 && int(c.rht_signs.size()) != c.rht) {
    if (c.rht != 16)
      usage_error("--rht " + std::to_string(c.rht) +
                  " needs --rht-signs or --rht-seed (Transformer Engine's vector is defined for d = 16 only)");
    c.rht_signs = rht_signs_te(16);
  }
  if (c.rht == 0) {
    c.rht_signs.clear();
    c.rht_bf16 = false;
  }
  if (vm.count("rht-bf16")) {
    c.rht_bf16 = vm["rht-bf16"].as<bool>();
    if (c.rht_bf16 && c.rht == 0) usage_error("--rht-bf16 needs an RHT (--rht D)");
  }

  if (c.tile2d && c.block != 16) usage_error("--tile2d (16x16 scale tiles) needs block 16, not " + std::to_string(c.block));
  // The knob checks of the model's own validate(), on a shape every valid knob accepts (16 rows for 2-D
  // tiles, 128 columns for every block and RHT size): what fails here is the options, not the data.
  try {
    validate(c, 16, 128);
  } catch (const std::invalid_argument& e) {
    usage_error(e.what());
  }
  return c;
}

Json config_json(const QuantConfig& c) {
  return {{"label", c.label()},
          {"format", c.format.name},
          {"block", c.block},
          {"tile2d", c.tile2d},
          {"scale", scale_name(c.scale)},
          {"rht", c.rht},
          {"rht_signs", signs_string(c.rht_signs)},
          {"rht_bf16", c.rht_bf16},
          {"rounding", c.rounding == Rounding::rtne ? "rtne" : "sr"},
          {"seed", c.seed},
          {"stream", c.stream}};
}

void put_metadata(std::map<std::string, std::string>& m, const std::string& prefix, const Json& obj) {
  for (const auto& [k, v] : obj.items()) m[prefix + k] = v.is_string() ? v.get<std::string>() : v.dump();
}

// ---- tensors -----------------------------------------------------------------------------------------
namespace {
Tensor load(const std::string& file, const std::string& name, int rank) {
  const io::SafetensorsFile f(file);  // io::Error names the file and the fault
  Tensor t;
  t.file = file;
  t.name = name;
  t.shape = f.info(name).shape;
  // The shape is checked before the data is read, so a wrong-rank tensor is reported as such.
  if (rank >= 0 && int(t.shape.size()) != rank)
    data_error(file, "tensor '" + name + "': expected a " + std::to_string(rank) + "-D tensor, got shape " +
                         shape_string(t.shape) + " (rank " + std::to_string(t.shape.size()) + ")");
  t.v = f.read_f32(name, /*check_finite=*/true);
  return t;
}
}  // namespace

Tensor load_tensor(const std::string& file, const std::string& name) { return load(file, name, -1); }
Tensor load_matrix(const std::string& file, const std::string& name) { return load(file, name, 2); }

std::pair<std::string, std::string> split_file_tensor(const std::string& spec, const char* option) {
  const size_t colon = spec.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == spec.size())
    usage_error(std::string(option) + " wants FILE:NAME, got '" + spec + "'");
  return {spec.substr(0, colon), spec.substr(colon + 1)};
}

}  // namespace fp4lab::cli
