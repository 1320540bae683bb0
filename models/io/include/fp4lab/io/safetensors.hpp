// safetensors files and fp4lab trace v1 folders (docs/spec.md §7). Kept apart from the numerics: the format
// headers never include this. Every failure throws fp4lab::io::Error whose what() is one line naming the
// file and the fault, e.g. "trace/layer1.safetensors: tensor 'x.fwd_x': data offsets [0, 4096) run past
// the end of the file (3000 bytes of data)".
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace fp4lab::io {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The first six are the ones fp4lab writes; the rest complete the safetensors dtype set so that a file
// carrying other tensors (token ids, step counters) still opens. Appended, so old values keep their numbers.
enum class DType : uint8_t { F32, BF16, F16, U8, I32, F64, BOOL, I8, I16, U16, U32, I64, U64, F8_E4M3, F8_E5M2 };
const char* dtype_name(DType d);
size_t dtype_size(DType d);

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets inside the data section
  int64_t numel() const;
};

// A safetensors file, read-only. The header is fully validated on open: its length, JSON syntax, dtypes, shapes
// against byte ranges, ranges inside the file and not overlapping. tensors() keeps the header's order.
// Tensor data is read on demand, with pread into memory the caller owns; nothing is mapped. Each read opens the file
// again (a trace of thousands of files holds no descriptor between reads) and requires the file whose header was
// read (same device and inode) still holding the tensor's bytes: a file truncated, replaced or removed while in use
// is an Error naming it and the tensor, never a signal (a mapping would end the process by SIGBUS on a truncated
// file; docs/spec.md §11.1).
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  // The same validation on bytes already in memory (kept in an exact-size copy); `name` stands for the
  // file in messages and in path(). Used by the fuzzer and by callers that receive files over a pipe.
  SafetensorsFile(std::string name, std::vector<uint8_t> bytes);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;  // throws Error naming file and tensor

  // A tensor's bytes as stored.
  std::vector<uint8_t> read_bytes(const std::string& name) const;
  // The tensor converted to FP32 (F32, BF16, F16 accepted). With check_finite, NaN/Inf is an Error naming
  // file, tensor and flat element index.
  std::vector<float> read_f32(const std::string& name, bool check_finite = true) const;
  // A BF16 tensor's bit patterns (half the memory of its FP32 copy), NaN/Inf an Error as read_f32 gives it; another
  // dtype is an Error.
  std::vector<uint16_t> read_bf16(const std::string& name) const;

 private:
  friend class Trace;  // reads a record's three tensors through one opening of the file
  struct Source;       // where reads take tensor bytes from: the file opened again, or the bytes in memory
  std::vector<float> read_f32(const Source& src, const std::string& name, bool check_finite) const;
  std::vector<uint16_t> read_bf16(const Source& src, const std::string& name) const;
  std::string path_;
  std::string reopen_;                   // path_ made absolute when opened: reads find the file after a chdir
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, size_t> index_;  // name -> position in tensors_
  std::vector<uint8_t> owned_;           // the bytes, for the in-memory constructor
  bool in_memory_ = false;
  uint64_t dev_ = 0, ino_ = 0;           // the file opened (reads require the same one)
  uint64_t data_offset_ = 0;

  // `head` holds the file's first min(size, 8 + header length) bytes.
  void parse(const uint8_t* head, uint64_t size);
};

// Writing: tensors are added in order and written with a header padded to 8 bytes.
struct OutTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
OutTensor make_f32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v);
OutTensor make_u8(const std::string& name, std::vector<int64_t> shape, const std::vector<uint8_t>& v);
OutTensor make_bf16(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v);  // RTNE
// Writes through an AtomicFile (files.hpp): the file appears under `path` only when complete.
void write_safetensors(const std::string& path, const std::vector<OutTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// Writes and closes `f` without committing it, so a caller can commit several outputs together.
class AtomicFile;
void write_safetensors(AtomicFile& f, const std::vector<OutTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// ---- trace v1 ------------------------------------------------------------------------------------
// A trace is a folder of .safetensors files (or one such file). Each linear-layer capture `<gemm>` holds
// `<gemm>.fwd_x` [tokens, in], `<gemm>.fwd_w` [out, in], `<gemm>.bwd_dy` [tokens, out], BF16 or F32, and
// each file's __metadata__ carries "fp4lab.trace.version": "1".
struct TraceRecord {
  std::string gemm;   // dotted name, e.g. "layer1.linear_fc2"
  std::string file;   // the file holding it
  int64_t tokens = 0, in = 0, out = 0;
};

class Trace {
 public:
  // Opens and validates every file's header and every record's shapes: the three tensors present,
  // 2-D, BF16/F32, consistent (tokens, in, out), and tokens/in/out multiples of `block` (the reduction
  // dimension of some pass). Tensor data is not read yet, so opening a large trace is cheap.
  // Records come in file order (a folder's files sorted by name), then each gemm's first appearance in
  // its file's header. A gemm captured in two files, an empty trace or a file without version "1" is an
  // Error; other tensors in a file are ignored.
  explicit Trace(const std::string& path, int block = 16);
  // The same validation over files already open, in the given order (each file's path() is its key).
  explicit Trace(std::vector<std::shared_ptr<SafetensorsFile>> files, int block = 16);
  const std::vector<TraceRecord>& records() const { return records_; }
  const std::map<std::string, std::string>& metadata(const std::string& file) const;
  // One file of the trace (a record's `file`), for what a record does not carry, such as its tensors' dtypes.
  const SafetensorsFile& file(const std::string& file) const;

  struct Layer {
    std::vector<float> x, w, dy;  // row-major FP32 copies of fwd_x, fwd_w, bwd_dy
    // A BF16 tensor of more than `in_place` elements is kept as its BF16 bits instead (read_bf16), its FP32 copy
    // left empty: the copy would be twice its size. x16, w16, dy16 point into bits[0..2] (null for an FP32 copy).
    const uint16_t *x16 = nullptr, *w16 = nullptr, *dy16 = nullptr;
    std::vector<uint16_t> bits[3];
    Layer() = default;
    Layer(Layer&&) = default;  // moves keep the pointers valid (a vector's buffer moves with it); copies would not
    Layer& operator=(Layer&&) = default;
    Layer(const Layer&) = delete;
    Layer& operator=(const Layer&) = delete;
  };
  // Reads one record's tensors (NaN/Inf rejected with file, tensor and index). Memory stays near one layer.
  Layer load(const TraceRecord& r, uint64_t in_place = UINT64_MAX) const;

 private:
  std::vector<TraceRecord> records_;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::string> gemm_file_;  // gemm -> the file that captured it

  void add(std::shared_ptr<SafetensorsFile> f, int block);
};

}  // namespace fp4lab::io
