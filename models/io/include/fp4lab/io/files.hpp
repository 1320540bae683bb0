// How every layer of fp4lab opens its inputs and writes its outputs, so hostile paths are handled once:
//  - an input must be a regular file; it is opened without blocking (open() on a FIFO would otherwise wait
//    for a writer forever) and checked with fstat before anything is read;
//  - an output is written to a temporary name in its own folder and renamed over the final name only when
//    every byte is written and the file closed without error, so a full disk, a failed later output or a
//    killed process never leaves a truncated file under the final name.
// Every fault throws fp4lab::io::Error("<path>: <fault>").
#pragma once

#include <cstddef>
#include <string>

namespace fp4lab::io {

// Opens `path` read-only (O_NONBLOCK, O_CLOEXEC) and checks it is a regular file; returns the descriptor and
// its size. `what` names the input in messages ("config file", "shape list", ...).
int open_regular(const std::string& path, size_t& size, const char* what = "file");
// The whole content of a regular file.
std::string read_regular_file(const std::string& path, const char* what = "file");

class AtomicFile {
 public:
  // Creates "<dir>/.<name>.tmp-XXXXXX" beside `path` ("<dir>/.fp4lab.tmp-XXXXXX" when that would pass the
  // file system's name limit, so any name the folder takes can be written).
  explicit AtomicFile(std::string path);
  ~AtomicFile();                           // removes the temporary file unless commit() ran
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* p, size_t n);
  void close();   // flushes and closes; a write or close error throws (the temporary is then removed)
  void commit();  // close() if still open, then renames the temporary over the final path
  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

// For programs (the command line): on SIGINT, SIGTERM, SIGHUP or SIGPIPE, removes every AtomicFile temporary
// still open, then ends the process by the same signal, so the shell sees the conventional status (128 + signal)
// and no temporary is left behind. A library (the Python module) leaves signals to its host and does not call it.
// SIGKILL cannot be caught: a temporary can then remain (its name starts with '.' and ends in .tmp-XXXXXX).
// SIGXFSZ is ignored, so that a write past a file-size limit (ulimit -f) is a failed write (EFBIG), reported as one.
void remove_temporaries_on_signals();

// `text` to `path` through an AtomicFile.
void write_file_atomic(const std::string& path, const std::string& text);

}  // namespace fp4lab::io
