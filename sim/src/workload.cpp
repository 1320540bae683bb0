#include "fp4lab/sim/workload.hpp"

#include "fp4lab/io/files.hpp"
#include "fp4lab/io/safetensors.hpp"  // io::Error

#include <charconv>
#include <cmath>
#include <fstream>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "fp4lab/text.hpp"  // shown()

namespace fp4lab::sim {

const char* job_kind_name(JobKind k) {
  switch (k) {
    case JobKind::step: return "step";
    case JobKind::quantize: return "quantize";
    case JobKind::unpack: return "unpack";
    case JobKind::mma: return "mma";
    case JobKind::gemm: return "gemm";
  }
  return "?";
}
JobKind parse_job_kind(const std::string& s) {
  for (JobKind k : {JobKind::step, JobKind::quantize, JobKind::unpack, JobKind::mma, JobKind::gemm})
    if (s == job_kind_name(k)) return k;
  throw std::invalid_argument("kernel '" + s + "' is not one of step, quantize, unpack, mma, gemm");
}

std::vector<GemmJob> training_gemms(const LayerShape& l, const OperandConfigFn& quant, uint32_t gemm) {
  std::vector<GemmJob> jobs;
  for (Pass p : kPasses) {
    GemmJob j;
    j.layer = l.gemm;
    j.pass = p;
    const PassGeometry g = pass_geometry(p, l.tokens, l.in, l.out);
    j.M = g.M;
    j.N = g.N;
    j.K = g.K;
    j.a = quant(p, Operand::a, gemm);
    j.b = quant(p, Operand::b, gemm);
    j.count = l.count;
    jobs.push_back(std::move(j));
  }
  return jobs;
}

namespace {
std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}
std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> f;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ',')) f.push_back(trim(x));
  if (!s.empty() && s.back() == ',') f.push_back("");
  return f;
}
}  // namespace

std::vector<LayerShape> read_shapes(const std::string& path) {
  std::istringstream in;
  try {
    in.str(io::read_regular_file(path, "shape list"));  // a FIFO or device is refused, not waited on
  } catch (const io::Error& e) {
    throw std::invalid_argument(e.what());
  }
  std::vector<LayerShape> out;
  std::string line;
  int lineno = 0;
  bool header = false;
  while (std::getline(in, line)) {
    ++lineno;
    const std::string t = trim(line);
    if (t.empty() || t[0] == '#') continue;
    const auto f = split(t);
    const std::string where = path + ":" + std::to_string(lineno) + ": ";
    if (!header) {
      if (f.size() < 4 || f[0] != "gemm" || f[1] != "tokens" || f[2] != "in" || f[3] != "out" ||
          (f.size() == 5 && f[4] != "count") || f.size() > 5)
        throw std::invalid_argument(where + "expected the header 'gemm,tokens,in,out[,count]', got '" + t + "'");
      header = true;
      continue;
    }
    if (f.size() < 4 || f.size() > 5)
      throw std::invalid_argument(where + "expected 4 or 5 comma-separated fields, got " + std::to_string(f.size()));
    LayerShape s;
    s.gemm = f[0];
    if (s.gemm.empty()) throw std::invalid_argument(where + "empty gemm name");
    const char* names[] = {"tokens", "in", "out"};
    int64_t* dst[] = {&s.tokens, &s.in, &s.out};
    for (int i = 0; i < 3; ++i) {
      size_t used = 0;
      long long v = 0;
      try {
        v = std::stoll(f[1 + i], &used);
      } catch (const std::exception&) {
        used = 0;
      }
      // Bounded so that products of two dimensions (M*N outputs, M*K operands) stay far inside int64.
      if (used != f[1 + i].size() || v <= 0 || v > kMaxShapeDim)
        throw std::invalid_argument(where + names[i] + " = '" + f[1 + i] + "' is not a positive integer (at most " +
                                    std::to_string(kMaxShapeDim) + ")");
      *dst[i] = v;
    }
    if (f.size() == 5) {
      // A whole number of occurrences, bounded so that every total it weights stays finite (1e300 made them inf).
      int64_t c = 0;
      const auto r = std::from_chars(f[4].data(), f[4].data() + f[4].size(), c);
      if (f[4].empty() || r.ec != std::errc() || r.ptr != f[4].data() + f[4].size() || c < 1 || c > kMaxShapeCount)
        throw std::invalid_argument(where + "count = '" + f[4] + "' is not a whole number from 1 to " +
                                    std::to_string(kMaxShapeCount));
      s.count = double(c);
    }
    out.push_back(s);
  }
  if (!header) throw std::invalid_argument(path + ": no header line 'gemm,tokens,in,out[,count]'");
  if (out.empty()) throw std::invalid_argument(path + ": no layers listed");
  return out;
}

namespace {
// A count as a shape list spells it: an integer as one, anything else in the shortest text that reads back.
std::string count_text(double c) {
  if (c == std::floor(c) && c < 9007199254740992.0) return std::to_string(static_cast<long long>(c));
  char b[32];
  const auto r = std::to_chars(b, b + sizeof b, c);
  return std::string(b, r.ptr);
}
}  // namespace

std::string shapes_csv(const std::vector<LayerShape>& layers, const std::vector<std::string>& comments) {
  std::string out;
  for (const std::string& c : comments) {
    if (c.find_first_of("\n\r") != std::string::npos)
      throw std::invalid_argument("a shape list comment holds a line break: '" + shown(c) + "'");
    out += "# " + c + "\n";
  }
  out += "gemm,tokens,in,out,count\n";
  for (const LayerShape& l : layers) {
    const std::string& g = l.gemm;
    bool control = false;
    for (unsigned char ch : g) control = control || ch < 0x20 || ch == 0x7F;
    if (g.empty() || control || g.find(',') != std::string::npos || g[0] == '#' || trim(g) != g)
      throw std::invalid_argument("gemm name '" + shown(g) + "' cannot be written to a shape list (empty, a ',' or a "
                                  "control byte in it, '#' first, or blanks around it)");
    out += g + "," + std::to_string(l.tokens) + "," + std::to_string(l.in) + "," + std::to_string(l.out) + "," +
           count_text(l.count) + "\n";
  }
  return out;
}

ShapeMultiples k_multiples(const OperandConfigFn& quant, const std::vector<Pass>& passes) {
  ShapeMultiples m;
  for (Pass p : passes) {
    int64_t need = 1;
    for (Operand o : {Operand::a, Operand::b}) {
      const QuantConfig q = quant(p, o, 0);
      need = std::lcm(need, int64_t(q.block));
      if (q.rht > 0) need = std::lcm(need, int64_t(q.rht));
    }
    // Which dimension the pass reduces over, as pass_geometry places them.
    const int64_t k = pass_geometry(p, 1, 2, 3).K;
    int64_t& dim = k == 1 ? m.tokens : k == 2 ? m.in : m.out;
    dim = std::lcm(dim, need);
  }
  return m;
}

std::vector<LayerShape> pad_shapes(const std::vector<LayerShape>& layers, const ShapeMultiples& m) {
  std::vector<LayerShape> out = layers;
  for (LayerShape& l : out)
    for (auto [dim, mult, name] : {std::tuple{&l.tokens, m.tokens, "tokens"}, std::tuple{&l.in, m.in, "in"},
                                   std::tuple{&l.out, m.out, "out"}}) {
      if (mult < 1) throw std::invalid_argument("pad_shapes: a multiple below 1");
      const int64_t r = (*dim + mult - 1) / mult * mult;
      if (r > kMaxShapeDim)
        throw std::invalid_argument(l.gemm + ": " + name + " = " + std::to_string(*dim) + " rounded up to a multiple of " +
                                    std::to_string(mult) + " passes " + std::to_string(kMaxShapeDim));
      *dim = r;
    }
  return out;
}

namespace {
// A decimal integer in 1..max, all of `text`; nullopt otherwise.
std::optional<int64_t> whole_number(const std::string& text, int64_t max) {
  int64_t v = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || r.ec != std::errc() || r.ptr != text.data() + text.size() || v < 1 || v > max)
    return std::nullopt;
  return v;
}
}  // namespace

std::vector<LayerShape> trace_shapes(const io::Trace& trace, bool full_size) {
  std::vector<LayerShape> out;
  for (const io::TraceRecord& rec : trace.records()) {
    LayerShape s{rec.gemm, rec.tokens, rec.in, rec.out, 1};
    if (full_size) {
      const std::map<std::string, std::string>& meta = trace.metadata(rec.file);
      const auto fault = [&](const std::string& key, const std::string& what) {
        return std::invalid_argument(rec.file + ": metadata '" + key + "' " + what + " (record " + shown(rec.gemm) +
                                     ", --full-size)");
      };
      const auto tok = meta.find("tokens_in_pass");
      if (tok == meta.end()) throw fault("tokens_in_pass", "is missing: the record's full token count is unknown");
      const auto t = whole_number(tok->second, kMaxShapeDim);
      if (!t || *t < rec.tokens)
        throw fault("tokens_in_pass", "= '" + shown(tok->second) + "' is not a whole number from the record's " +
                                          std::to_string(rec.tokens) + " tokens to " + std::to_string(kMaxShapeDim));
      s.tokens = *t;
      if (const auto kept = meta.find("out_features_kept"); kept != meta.end()) {
        // fp4lab.capture writes "all N", or "K of N, every Sth from 0" when it kept K of the layer's N outputs.
        const std::string& v = kept->second;
        std::optional<int64_t> n;
        if (v.rfind("all ", 0) == 0) {
          n = whole_number(v.substr(4), kMaxShapeDim);
          if (n && *n != rec.out) n.reset();
        } else if (const size_t of = v.find(" of "); of != std::string::npos) {
          const size_t end = v.find(',', of);
          if (whole_number(v.substr(0, of), kMaxShapeDim) == rec.out && end != std::string::npos)
            n = whole_number(v.substr(of + 4, end - of - 4), kMaxShapeDim);
          if (n && *n < rec.out) n.reset();
        }
        if (!n)
          throw fault("out_features_kept", "= '" + shown(v) + "' is neither 'all " + std::to_string(rec.out) +
                                               "' nor '" + std::to_string(rec.out) + " of N, ...' with N >= " +
                                               std::to_string(rec.out));
        s.out = *n;
      }
      if (const auto calls = meta.find("calls_in_step"); calls != meta.end()) {
        const auto c = whole_number(calls->second, kMaxShapeDim);
        if (!c) throw fault("calls_in_step", "= '" + shown(calls->second) + "' is not a positive whole number");
        s.count = double(*c);
      }
    }
    out.push_back(std::move(s));
  }
  return out;
}

double quantised_bytes_per_element(const QuantConfig& q) {
  const double scale = q.scale == ScaleKind::fp32 ? 4.0 : 1.0;
  const double per_scale = q.tile2d ? 16.0 * q.block : double(q.block);
  return 0.5 + scale / per_scale;
}

int64_t quantised_bytes(const QuantConfig& q, int64_t rows, int64_t cols) {
  const int64_t scale = q.scale == ScaleKind::fp32 ? 4 : 1;
  const int64_t codes = (rows * cols + 1) / 2;
  int64_t scales = rows * (cols / q.block);
  if (q.tile2d) scales = ((rows + 15) / 16) * (cols / q.block);
  return codes + scales * scale;
}

}  // namespace fp4lab::sim
