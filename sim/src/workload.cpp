#include "fp4lab/sim/workload.hpp"

#include "fp4lab/io/files.hpp"
#include "fp4lab/io/safetensors.hpp"  // io::Error

#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>

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

constexpr long long kMaxShapeDim = 1LL << 31;

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
      size_t used = 0;
      double c = 0;
      try {
        c = std::stod(f[4], &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != f[4].size() || !(c > 0) || !std::isfinite(c))
        throw std::invalid_argument(where + "count = '" + f[4] + "' is not a positive number");
      s.count = c;
    }
    out.push_back(s);
  }
  if (!header) throw std::invalid_argument(path + ": no header line 'gemm,tokens,in,out[,count]'");
  if (out.empty()) throw std::invalid_argument(path + ": no layers listed");
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
