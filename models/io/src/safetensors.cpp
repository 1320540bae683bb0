// safetensors reader/writer and trace v1 (docs/spec.md §7). Layout of a safetensors file:
//   [8 bytes: little-endian u64 N][N bytes: JSON header][data section]
// The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end)} (offsets relative to
// the data section) plus an optional "__metadata__" string->string map. Every check below throws
// fp4lab::io::Error("<file>: <fault>") on a single line.
#include "fp4lab/io/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <nlohmann/json.hpp>

#include "fp4lab/io/files.hpp"
#include "fp4lab/scale.hpp"  // f32_to_bf16 (RTNE), bf16_to_f32, f32_from_bits: the project's one BF16

namespace fp4lab::io {

static_assert(std::endian::native == std::endian::little, "safetensors is little-endian; so is this reader");

namespace {

// A std::map-backed JSON: ordered_json looks keys up linearly, which made a header of n tensors parse (and
// write) in O(n^2). Header order, which defines tensor and record order, is kept separately.
using ojson = nlohmann::json;

// The safetensors reference implementation refuses headers above 100 MB; so do we, before allocating.
constexpr uint64_t kMaxHeader = 100u << 20;
// JSON nesting deeper than this cannot be a safetensors header; the limit bounds parser memory.
constexpr int kMaxDepth = 64;

[[noreturn]] void fail(const std::string& file, const std::string& fault) { throw Error(file + ": " + fault); }

// Names come from the file: escape anything that could break the one-line message, and cap the length.
std::string q(const std::string& s) {
  std::string r = "'";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i == 120) {
      r += "...";
      break;
    }
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7F || c == '\'' || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      r += buf;
    } else {
      r += char(c);
    }
  }
  return r + "'";
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}
std::string range_str(uint64_t b, uint64_t e) {
  std::string r = "[";  // appended piecewise: GCC 12 warns falsely (-Wrestrict) on the chained operator+
  r += std::to_string(b);
  r += ", ";
  r += std::to_string(e);
  return r + ")";
}

struct DTypeRow {
  DType d;
  const char* name;
  size_t size;
};
constexpr DTypeRow kDTypes[] = {
    {DType::F32, "F32", 4},   {DType::BF16, "BF16", 2}, {DType::F16, "F16", 2},
    {DType::U8, "U8", 1},     {DType::I32, "I32", 4},   {DType::F64, "F64", 8},
    {DType::BOOL, "BOOL", 1}, {DType::I8, "I8", 1},     {DType::I16, "I16", 2},
    {DType::U16, "U16", 2},   {DType::U32, "U32", 4},   {DType::I64, "I64", 8},
    {DType::U64, "U64", 8},   {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
};

const DTypeRow* find_dtype(const std::string& name) {
  for (const auto& r : kDTypes)
    if (name == r.name) return &r;
  return nullptr;
}

// IEEE binary16 -> binary32, exact for every code: normals re-bias the exponent, subnormals are
// m * 2^-24 (exact in FP32), Inf stays Inf and NaN keeps its payload in the top mantissa bits.
float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1F) return f32_from_bits(sign | 0x7F800000u | (m << 13));
  if (e == 0) {
    const float mag = std::ldexp(float(m), -24);
    return sign ? -mag : mag;
  }
  return f32_from_bits(sign | ((e + 127 - 15) << 23) | (m << 13));
}

uint64_t load_u64_le(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// A non-negative JSON integer that fits int64, or nothing (floats, negatives, huge, non-numbers).
enum class IntKind { ok, not_number, non_integer, negative, too_large };
IntKind as_index(const ojson& j, int64_t& out) {
  if (!j.is_number()) return IntKind::not_number;
  if (j.is_number_float()) return IntKind::non_integer;
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    if (u > uint64_t(INT64_MAX)) return IntKind::too_large;
    out = int64_t(u);
    return IntKind::ok;
  }
  out = j.get<int64_t>();
  return out < 0 ? IntKind::negative : IntKind::ok;
}

std::string json_text(const ojson& j) {
  // Short, one-line, ASCII rendering of a value for messages (strings from the file are escaped by dump).
  std::string s = j.dump(-1, ' ', /*ensure_ascii=*/true, ojson::error_handler_t::replace);
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

}  // namespace

const char* dtype_name(DType d) {
  for (const auto& r : kDTypes)
    if (r.d == d) return r.name;
  return "?";
}
size_t dtype_size(DType d) {
  for (const auto& r : kDTypes)
    if (r.d == d) return r.size;
  return 0;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;  // validated on open: fits int64
  return n;
}

// ---- reader ----------------------------------------------------------------------------------------

// One read's access to the tensor bytes: the file opened again and checked to be the file whose header was read, or
// the bytes in memory. pread needs no shared offset, so reads of one file may run on several threads at once.
struct SafetensorsFile::Source {
  const SafetensorsFile& f;
  int fd = -1;

  explicit Source(const SafetensorsFile& file, const std::string& tensor) : f(file) {
    if (f.in_memory_) return;
    const int d = ::open(f.reopen_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (d < 0)
      fail(f.path_, "cannot open again to read tensor " + q(tensor) + ": " + std::strerror(errno) +
                        " (removed or moved while in use?)");
    struct stat st;
    if (::fstat(d, &st) != 0 || uint64_t(st.st_dev) != f.dev_ || uint64_t(st.st_ino) != f.ino_) {
      ::close(d);
      fail(f.path_, "replaced by another file while in use (tensor " + q(tensor) +
                        " would be read from a file whose header was not validated)");
    }
    fd = d;
  }
  ~Source() {
    if (fd >= 0) ::close(fd);
  }
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;

  // Bytes [from, from + n) of tensor t into dst: all of them, or an Error naming the file and the tensor.
  void read(const TensorInfo& t, uint64_t from, size_t n, void* dst) const {
    const uint64_t at = f.data_offset_ + t.begin + from;
    if (f.in_memory_) {
      if (n) std::memcpy(dst, f.owned_.data() + at, n);
      return;
    }
    auto* p = static_cast<uint8_t*>(dst);
    for (size_t done = 0; done < n;) {
      const ssize_t r = ::pread(fd, p + done, n - done, off_t(at + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) fail(f.path_, "cannot read tensor " + q(t.name) + ": " + std::strerror(errno));
      if (r == 0) {
        struct stat st;
        const std::string now = ::fstat(fd, &st) == 0 ? std::to_string(st.st_size) + " bytes" : "fewer bytes";
        fail(f.path_, "truncated to " + now + " while in use: tensor " + q(t.name) + " needs bytes " +
                          range_str(f.data_offset_ + t.begin, f.data_offset_ + t.end));
      }
      done += size_t(r);
    }
  }
};

namespace {
// Exactly n bytes at `at` of a file being opened, or an Error: it was truncated between its fstat and this read.
void read_head(int fd, const std::string& path, uint64_t at, uint8_t* dst, size_t n, uint64_t size) {
  for (size_t done = 0; done < n;) {
    const ssize_t r = ::pread(fd, dst + done, n - done, off_t(at + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int err = r < 0 ? errno : 0;
      ::close(fd);
      fail(path, err ? std::string("cannot read: ") + std::strerror(err)
                     : "truncated while being opened (" + std::to_string(size) + " bytes, then fewer)");
    }
    done += size_t(r);
  }
}
}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  // Non-blocking open + regular-file check: a FIFO or device named as an input is refused, not waited on.
  size_t size = 0;
  const int fd = open_regular(path, size);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(path_, std::string("cannot stat file: ") + std::strerror(err));
  }
  dev_ = uint64_t(st.st_dev);
  ino_ = uint64_t(st.st_ino);
  std::error_code ec;
  const std::filesystem::path abs = std::filesystem::absolute(path, ec);
  reopen_ = ec ? path : abs.string();
  // The length and the header, bounded as parse() checks them, before anything else is read.
  std::vector<uint8_t> head(std::min<uint64_t>(size, 8));
  read_head(fd, path_, 0, head.data(), head.size(), size);
  if (head.size() == 8) {
    const uint64_t n = load_u64_le(head.data());
    if (n <= kMaxHeader && n <= size - 8) {
      head.resize(size_t(8 + n));
      read_head(fd, path_, 8, head.data() + 8, size_t(n), size);
    }
  }
  ::close(fd);
  parse(head.data(), size);
}

SafetensorsFile::SafetensorsFile(std::string name, std::vector<uint8_t> bytes)
    : path_(std::move(name)), owned_(std::move(bytes)), in_memory_(true) {
  parse(owned_.data(), owned_.size());
}

SafetensorsFile::~SafetensorsFile() = default;

void SafetensorsFile::parse(const uint8_t* head, const uint64_t size) {
  // 1. The 8-byte header length, bounded before anything is allocated.
  if (size < 8)
    fail(path_, "file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  const uint64_t n = load_u64_le(head);
  if (n > kMaxHeader)
    fail(path_, "header length " + std::to_string(n) + " is absurd (limit " + std::to_string(kMaxHeader) +
                    " bytes)");
  if (n > size - 8)
    fail(path_, "header length " + std::to_string(n) + " runs past the end of the file (" +
                    std::to_string(size) + " bytes)");
  data_offset_ = 8 + n;
  const uint64_t data_size = size - data_offset_;

  // 2. JSON syntax, in two linear passes. A SAX pass first rejects duplicate keys (nlohmann would silently
  //    keep one), bounds the nesting depth before any DOM is built, and records the top-level keys in header
  //    order; then the DOM parse. (nlohmann's callback parser rescans the parent object at every object end,
  //    which made a header of n tensors cost O(n^2): minutes for 100k tensors.)
  struct Sax : nlohmann::json_sax<ojson> {
    const std::string& path;
    std::vector<std::set<std::string>> keys;  // per open object or array: its keys so far
    std::vector<std::string> order;           // top-level keys in header order
    size_t error_at = 0;
    bool syntax_error = false, out_of_range = false;
    explicit Sax(const std::string& p) : path(p) {}
    bool open() {
      if (keys.size() >= size_t(kMaxDepth)) fail(path, "header nests deeper than " + std::to_string(kMaxDepth) + " levels");
      keys.emplace_back();
      return true;
    }
    bool null() override { return true; }
    bool boolean(bool) override { return true; }
    bool number_integer(number_integer_t) override { return true; }
    bool number_unsigned(number_unsigned_t) override { return true; }
    bool number_float(number_float_t, const string_t&) override { return true; }
    bool string(string_t&) override { return true; }
    bool binary(binary_t&) override { return true; }
    bool start_object(std::size_t) override { return open(); }
    bool start_array(std::size_t) override { return open(); }
    bool end_object() override { keys.pop_back(); return true; }
    bool end_array() override { keys.pop_back(); return true; }
    bool key(string_t& k) override {
      if (!keys.back().insert(k).second) fail(path, "header has duplicate key " + q(k));
      if (keys.size() == 1) order.push_back(k);
      return true;
    }
    bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
      syntax_error = true;
      out_of_range = dynamic_cast<const ojson::out_of_range*>(&e) != nullptr;  // 1e999 (found by the fuzzer)
      error_at = position;
      return false;
    }
  } sax(path_);
  if (!ojson::sax_parse(head + 8, head + 8 + n, &sax) || sax.syntax_error) {
    if (sax.out_of_range) fail(path_, "header is not valid JSON (a number is out of range)");
    fail(path_, "header is not valid JSON (syntax error near byte " + std::to_string(sax.error_at) + " of " +
                    std::to_string(n) + ")");
  }
  const std::vector<std::string> header_order = std::move(sax.order);
  ojson h;
  try {
    h = ojson::parse(head + 8, head + 8 + n);
  } catch (const ojson::parse_error& e) {
    fail(path_, "header is not valid JSON (syntax error near byte " + std::to_string(e.byte) + " of " +
                    std::to_string(n) + ")");
  } catch (const ojson::out_of_range&) {  // found by the fuzzer: 1e999 is thrown as out_of_range, not a parse error
    fail(path_, "header is not valid JSON (a number is out of range)");
  }
  if (!h.is_object()) fail(path_, std::string("header is not a JSON object (it is a ") + h.type_name() + ")");

  // 3. Each entry: __metadata__ or a tensor with dtype, shape and data_offsets that agree.
  for (const std::string& name : header_order) {
    const ojson& v = h.at(name);
    if (name == "__metadata__") {
      if (!v.is_object())
        fail(path_, std::string("__metadata__ is not a map of strings to strings (it is a ") + v.type_name() + ")");
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string())
          fail(path_, "__metadata__ is not a map of strings to strings: key " + q(k) + " holds a " + s.type_name());
        metadata_[k] = s.get<std::string>();
      }
      continue;
    }
    const std::string t = "tensor " + q(name) + ": ";
    if (!v.is_object()) fail(path_, t + "entry is not a JSON object (it is a " + v.type_name() + ")");
    for (const char* field : {"dtype", "shape", "data_offsets"})
      if (!v.contains(field)) fail(path_, t + "entry lacks \"" + field + "\"");

    TensorInfo ti;
    ti.name = name;
    const ojson& dt = v.at("dtype");
    if (!dt.is_string()) fail(path_, t + "dtype " + json_text(dt) + " is not a string");
    const DTypeRow* row = find_dtype(dt.get<std::string>());
    if (!row) fail(path_, t + "unknown dtype " + json_text(dt));
    ti.dtype = row->d;

    const ojson& sh = v.at("shape");
    if (!sh.is_array()) fail(path_, t + "shape " + json_text(sh) + " is not an array");
    uint64_t numel = 1;
    bool overflow = false;
    for (size_t i = 0; i < sh.size(); ++i) {
      int64_t d = 0;
      switch (as_index(sh[i], d)) {
        case IntKind::ok: break;
        case IntKind::not_number: fail(path_, t + "shape dimension " + std::to_string(i) + " is " + json_text(sh[i]) + ", not a number");
        case IntKind::non_integer: fail(path_, t + "shape dimension " + std::to_string(i) + " is " + json_text(sh[i]) + ", not an integer");
        case IntKind::negative: fail(path_, t + "shape dimension " + std::to_string(i) + " is negative (" + json_text(sh[i]) + ")");
        case IntKind::too_large: fail(path_, t + "shape dimension " + std::to_string(i) + " is too large (" + json_text(sh[i]) + ")");
      }
      ti.shape.push_back(d);
      overflow |= __builtin_mul_overflow(numel, uint64_t(d), &numel);
    }
    uint64_t need = 0;
    overflow |= __builtin_mul_overflow(numel, uint64_t(row->size), &need) || numel > uint64_t(INT64_MAX);
    if (overflow) fail(path_, t + "shape " + shape_str(ti.shape) + " has more bytes than fit in 64 bits");

    const ojson& off = v.at("data_offsets");
    int64_t b = 0, e = 0;
    if (!off.is_array() || off.size() != 2 || as_index(off[0], b) != IntKind::ok || as_index(off[1], e) != IntKind::ok)
      fail(path_, t + "data_offsets " + json_text(off) + " is not a pair of non-negative integers");
    if (e < b) fail(path_, t + "data_offsets " + range_str(b, e) + " end before they begin");
    ti.begin = uint64_t(b);
    ti.end = uint64_t(e);
    if (need != ti.end - ti.begin)
      fail(path_, t + "shape " + shape_str(ti.shape) + " of " + row->name + " needs " + std::to_string(need) +
                      " bytes but data_offsets " + range_str(ti.begin, ti.end) + " hold " +
                      std::to_string(ti.end - ti.begin));
    if (ti.end > data_size)
      fail(path_, t + "data_offsets " + range_str(ti.begin, ti.end) + " run past the end of the data section (" +
                      std::to_string(data_size) + " bytes of data)");
    index_[name] = tensors_.size();
    tensors_.push_back(std::move(ti));
  }

  // 4. No two tensors share a byte (empty tensors occupy none).
  std::vector<size_t> order(tensors_.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::erase_if(order, [&](size_t i) { return tensors_[i].begin == tensors_[i].end; });
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors_[a].begin < tensors_[b].begin; });
  for (size_t k = 1; k < order.size(); ++k) {
    const TensorInfo &p = tensors_[order[k - 1]], &c = tensors_[order[k]];
    if (c.begin < p.end)
      fail(path_, "tensors " + q(p.name) + " " + range_str(p.begin, p.end) + " and " + q(c.name) + " " +
                      range_str(c.begin, c.end) + " overlap");
  }
}

bool SafetensorsFile::has(const std::string& name) const { return index_.count(name) != 0; }

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) fail(path_, "no tensor " + q(name));
  return tensors_[it->second];
}

std::vector<uint8_t> SafetensorsFile::read_bytes(const std::string& name) const {
  const TensorInfo& ti = info(name);
  std::vector<uint8_t> out(size_t(ti.end - ti.begin));
  Source(*this, name).read(ti, 0, out.size(), out.data());
  return out;
}

namespace {
// The first non-finite value of v as an Error naming file, tensor and element.
void check_all_finite(const std::string& file, const std::string& name, const float* v, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(v[i]))
      fail(file, "tensor " + q(name) + " element " + std::to_string(i) + " is " +
                     (std::isnan(v[i]) ? "NaN" : v[i] > 0 ? "+Inf" : "-Inf"));
}
}  // namespace

std::vector<float> SafetensorsFile::read_f32(const std::string& name, bool check_finite) const {
  return read_f32(Source(*this, name), name, check_finite);
}

std::vector<uint16_t> SafetensorsFile::read_bf16(const std::string& name) const {
  return read_bf16(Source(*this, name), name);
}

std::vector<float> SafetensorsFile::read_f32(const Source& src, const std::string& name, bool check_finite) const {
  const TensorInfo& ti = info(name);
  if (ti.dtype != DType::F32 && ti.dtype != DType::BF16 && ti.dtype != DType::F16)
    fail(path_, "tensor " + q(name) + " has dtype " + dtype_name(ti.dtype) + "; only F32, BF16 and F16 read as FP32");
  const size_t n = size_t(ti.numel());
  std::vector<float> out(n);
  if (ti.dtype == DType::F32) {
    src.read(ti, 0, n * 4, out.data());
  } else {
    // 16-bit codes a chunk at a time, converted into the output: memory is the FP32 copy and one chunk.
    constexpr size_t kChunk = size_t(1) << 15;
    std::vector<uint16_t> buf(std::min(n, kChunk));
    for (size_t i0 = 0; i0 < n; i0 += kChunk) {
      const size_t m = std::min(kChunk, n - i0);
      src.read(ti, 2 * uint64_t(i0), 2 * m, buf.data());
      if (ti.dtype == DType::BF16)
        for (size_t i = 0; i < m; ++i) out[i0 + i] = bf16_to_f32(buf[i]);
      else
        for (size_t i = 0; i < m; ++i) out[i0 + i] = f16_to_f32(buf[i]);
    }
  }
  if (check_finite) check_all_finite(path_, name, out.data(), n);
  return out;
}

std::vector<uint16_t> SafetensorsFile::read_bf16(const Source& src, const std::string& name) const {
  const TensorInfo& ti = info(name);
  if (ti.dtype != DType::BF16) fail(path_, "tensor " + q(name) + " has dtype " + dtype_name(ti.dtype) + ", not BF16");
  const size_t n = size_t(ti.numel());
  std::vector<uint16_t> b(n);
  src.read(ti, 0, 2 * n, b.data());
  uint32_t all_ones = 0;  // a branch-free scan of the exponent bits (it vectorises); located only on a fault
  for (size_t i = 0; i < n; ++i) all_ones |= uint32_t((b[i] & 0x7F80u) == 0x7F80u);
  if (all_ones)
    for (size_t i = 0; i < n; ++i)
      if (const float v = bf16_to_f32(b[i]); !std::isfinite(v))
        fail(path_, "tensor " + q(name) + " element " + std::to_string(i) + " is " +
                        (std::isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf"));
  return b;
}

// ---- writer --------------------------------------------------------------------------------------

namespace {
// The element count of `shape`, which must equal `given`; `who` (a function or the file) leads the message.
size_t checked_numel(const std::string& who, const std::string& name, const std::vector<int64_t>& shape, size_t given,
                     const char* unit = "values were given") {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) fail(who, "tensor " + q(name) + ": negative dimension in shape " + shape_str(shape));
    if (__builtin_mul_overflow(n, uint64_t(d), &n)) fail(who, "tensor " + q(name) + ": shape " + shape_str(shape) + " overflows");
  }
  if (n != given)
    fail(who, "tensor " + q(name) + ": shape " + shape_str(shape) + " holds " + std::to_string(n) + " elements but " +
                  std::to_string(given) + " " + unit);
  return size_t(n);
}
}  // namespace

OutTensor make_f32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
  checked_numel("make_f32", name, shape, v.size());
  OutTensor t{name, DType::F32, std::move(shape), std::vector<uint8_t>(v.size() * 4)};
  if (!v.empty()) std::memcpy(t.bytes.data(), v.data(), v.size() * 4);
  return t;
}

OutTensor make_u8(const std::string& name, std::vector<int64_t> shape, const std::vector<uint8_t>& v) {
  checked_numel("make_u8", name, shape, v.size());
  return OutTensor{name, DType::U8, std::move(shape), v};
}

OutTensor make_bf16(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
  checked_numel("make_bf16", name, shape, v.size());
  OutTensor t{name, DType::BF16, std::move(shape), std::vector<uint8_t>(v.size() * 2)};
  for (size_t i = 0; i < v.size(); ++i) {
    // f32_to_bf16 assumes finite input (its carry could turn a NaN into Inf); keep NaN a quiet NaN.
    const uint16_t b = std::isnan(v[i]) ? uint16_t((f32_bits(v[i]) >> 16) | 0x0040u) : f32_to_bf16(v[i]);
    std::memcpy(t.bytes.data() + 2 * i, &b, 2);
  }
  return t;
}

void write_safetensors(AtomicFile& f, const std::vector<OutTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string& path = f.path();
  // The header is assembled entry by entry in the given order (a JSON object of n entries built with
  // ordered_json costs O(n^2)); a set finds repeated names.
  std::string js = "{";
  try {
    if (!metadata.empty()) {
      ojson m = ojson::object();
      for (const auto& [k, v] : metadata) m[k] = v;
      js += "\"__metadata__\":" + m.dump();  // strict: a string that is not UTF-8 cannot be written
    }
    std::set<std::string> names;
    uint64_t off = 0;
    for (const OutTensor& t : tensors) {
      if (t.name == "__metadata__") fail(path, "tensor name '__metadata__' is reserved");
      if (!names.insert(t.name).second) fail(path, "tensor " + q(t.name) + " given twice");
      if (dtype_size(t.dtype) == 0) fail(path, "tensor " + q(t.name) + ": invalid dtype");
      if (t.bytes.size() % dtype_size(t.dtype) != 0)
        fail(path, "tensor " + q(t.name) + ": " + std::to_string(t.bytes.size()) + " bytes is not a whole number of " +
                       dtype_name(t.dtype) + " elements");
      checked_numel(path, t.name, t.shape, t.bytes.size() / dtype_size(t.dtype), "are in its bytes");
      if (js.size() > 1) js += ',';
      js += ojson(t.name).dump() + ":{\"dtype\":\"" + dtype_name(t.dtype) + "\",\"shape\":" + ojson(t.shape).dump() +
            ",\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + t.bytes.size()) + "]}";
      off += t.bytes.size();
    }
  } catch (const ojson::exception&) {
    fail(path, "a tensor name or metadata string is not valid UTF-8");
  }
  js += '}';
  js.append((8 - js.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned, as the spec pads it
  const uint64_t n = js.size();
  f.write(&n, 8);
  f.write(js.data(), js.size());
  for (const OutTensor& t : tensors) f.write(t.bytes.data(), t.bytes.size());
  f.close();
}

void write_safetensors(const std::string& path, const std::vector<OutTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  AtomicFile f(path);
  write_safetensors(f, tensors, metadata);
  f.commit();
}

// ---- trace v1 ------------------------------------------------------------------------------------

namespace {
constexpr const char* kVersionKey = "fp4lab.trace.version";
constexpr const char* kRoles[3] = {"fwd_x", "fwd_w", "bwd_dy"};
}  // namespace

Trace::Trace(const std::string& path, int block) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) fail(path, "no such file or folder");
  std::vector<std::string> paths;
  if (fs::is_directory(st)) {
    // error_code overloads throughout: a listing problem becomes an io::Error, not a filesystem_error.
    fs::directory_iterator it(path, ec);
    for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
      if (it->path().extension() != ".safetensors") continue;
      // Every *.safetensors entry is part of the trace: a dangling or looping link, a FIFO or a folder of that name
      // is refused, naming it (the reader's open_regular names a FIFO or folder), not skipped without a word.
      std::error_code ec2, ec3;
      if (it->is_symlink(ec2) && !fs::exists(fs::status(it->path(), ec3))) {
        const std::string target = fs::read_symlink(it->path(), ec2).string();
        if (ec3.value() == ELOOP) fail(it->path().string(), "link loop (" + q(target) + " leads back to itself)");
        fail(it->path().string(), "link to a missing file " + q(target));
      }
      paths.push_back(it->path().string());
    }
    if (ec) fail(path, "cannot list folder: " + ec.message());
    if (paths.empty()) fail(path, "folder holds no .safetensors files");
    std::sort(paths.begin(), paths.end());
  } else {
    paths.push_back(path);
  }
  if (block <= 0) fail(path, "block size " + std::to_string(block) + " is not positive");
  for (const std::string& p : paths) add(std::make_shared<SafetensorsFile>(p), block);
  if (records_.empty()) fail(path, "trace holds no gemm records (no <gemm>.fwd_x/.fwd_w/.bwd_dy tensors)");
}

Trace::Trace(std::vector<std::shared_ptr<SafetensorsFile>> files, int block) {
  if (files.empty()) throw Error("trace: no files given");
  if (block <= 0) fail(files.front()->path(), "block size " + std::to_string(block) + " is not positive");
  for (auto& f : files) add(std::move(f), block);
  if (records_.empty()) fail(files_.begin()->first, "trace holds no gemm records (no <gemm>.fwd_x/.fwd_w/.bwd_dy tensors)");
}

void Trace::add(std::shared_ptr<SafetensorsFile> f, int block) {
  const std::string& file = f->path();
  if (files_.count(file)) fail(file, "file given twice");
  const auto v = f->metadata().find(kVersionKey);
  if (v == f->metadata().end())
    fail(file, std::string("__metadata__ lacks \"") + kVersionKey + "\" (not an fp4lab trace v1 file)");
  if (v->second != "1")
    fail(file, std::string("\"") + kVersionKey + "\" is " + q(v->second) + "; this reader understands '1'");

  // Group by gemm in order of first appearance; tensors with other suffixes are free-form extras.
  std::vector<std::string> order;
  std::map<std::string, std::array<const TensorInfo*, 3>> groups;
  for (const TensorInfo& t : f->tensors()) {
    const size_t dot = t.name.rfind('.');
    if (dot == std::string::npos) continue;
    const std::string suffix = t.name.substr(dot + 1);
    for (int r = 0; r < 3; ++r)
      if (suffix == kRoles[r]) {
        const std::string gemm = t.name.substr(0, dot);
        if (gemm.empty()) fail(file, "tensor " + q(t.name) + " has an empty gemm name");
        auto [it, fresh] = groups.try_emplace(gemm, std::array<const TensorInfo*, 3>{});
        if (fresh) order.push_back(gemm);
        it->second[r] = &t;
      }
  }

  for (const std::string& gemm : order) {
    const std::string g = "gemm " + q(gemm) + ": ";
    const auto& ts = groups[gemm];
    for (int r = 0; r < 3; ++r) {
      if (!ts[r]) fail(file, g + "tensor " + q(gemm + "." + kRoles[r]) + " is missing");
      const TensorInfo& t = *ts[r];
      if (t.dtype != DType::BF16 && t.dtype != DType::F32)
        fail(file, g + q(t.name) + " has dtype " + dtype_name(t.dtype) + "; trace v1 takes BF16 or F32");
      if (t.shape.size() != 2)
        fail(file, g + q(t.name) + " has shape " + shape_str(t.shape) + "; trace v1 takes 2-D tensors");
    }
    const auto &x = ts[0]->shape, &w = ts[1]->shape, &dy = ts[2]->shape;
    if (x[1] != w[1])
      fail(file, g + "in mismatch: fwd_x " + shape_str(x) + " [tokens, in] vs fwd_w " + shape_str(w) + " [out, in]");
    if (x[0] != dy[0])
      fail(file, g + "tokens mismatch: fwd_x " + shape_str(x) + " [tokens, in] vs bwd_dy " + shape_str(dy) +
                     " [tokens, out]");
    if (w[0] != dy[1])
      fail(file, g + "out mismatch: fwd_w " + shape_str(w) + " [out, in] vs bwd_dy " + shape_str(dy) + " [tokens, out]");
    TraceRecord rec{gemm, file, x[0], x[1], w[0]};
    // Each of tokens, in, out is the reduction dimension of one pass (wgrad, fprop, dgrad).
    for (const auto& [dim, val] : {std::pair{"tokens", rec.tokens}, {"in", rec.in}, {"out", rec.out}}) {
      if (val == 0) fail(file, g + dim + " = 0: the gemm is empty");
      if (val % block != 0)
        fail(file, g + dim + " = " + std::to_string(val) + " is not a multiple of the block size " + std::to_string(block));
    }
    if (const auto [it, fresh] = gemm_file_.try_emplace(gemm, file); !fresh)
      fail(file, g + "already captured in " + it->second);
    records_.push_back(std::move(rec));
  }
  files_.emplace(file, std::move(f));
}

const std::map<std::string, std::string>& Trace::metadata(const std::string& file) const {
  return this->file(file).metadata();
}

const SafetensorsFile& Trace::file(const std::string& file) const {
  const auto it = files_.find(file);
  if (it == files_.end()) fail(file, "not a file of this trace");
  return *it->second;
}

Trace::Layer Trace::load(const TraceRecord& r, uint64_t in_place) const {
  const SafetensorsFile& f = file(r.file);
  Layer l;
  const SafetensorsFile::Source src(f, r.gemm + ".fwd_x");
  auto read = [&](const char* role, std::vector<float>& v, const uint16_t*& v16, std::vector<uint16_t>& bits) {
    const std::string name = r.gemm + role;
    const TensorInfo& t = f.info(name);
    if (t.dtype == DType::BF16 && uint64_t(t.numel()) > in_place) {
      bits = f.read_bf16(src, name);
      v16 = bits.data();
    } else {
      v = f.read_f32(src, name, true);
    }
  };
  read(".fwd_x", l.x, l.x16, l.bits[0]);
  read(".fwd_w", l.w, l.w16, l.bits[1]);
  read(".bwd_dy", l.dy, l.dy16, l.bits[2]);
  const auto n = [](int64_t a, int64_t b) { return uint64_t(a) * uint64_t(b); };  // unsigned: no UB on bogus records
  const auto size = [](const std::vector<float>& v, const std::vector<uint16_t>& bits, const uint16_t* v16) {
    return uint64_t(v16 ? bits.size() : v.size());
  };
  if (size(l.x, l.bits[0], l.x16) != n(r.tokens, r.in) || size(l.w, l.bits[1], l.w16) != n(r.out, r.in) ||
      size(l.dy, l.bits[2], l.dy16) != n(r.tokens, r.out))
    fail(r.file, "gemm " + q(r.gemm) + ": record shape does not match the file");
  return l;
}

}  // namespace fp4lab::io
