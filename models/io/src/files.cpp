#include "fp4lab/io/files.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "fp4lab/io/safetensors.hpp"  // Error

namespace fp4lab::io {

namespace {
[[noreturn]] void fail(const std::string& path, const std::string& fault) { throw Error(path + ": " + fault); }

const char* kind_of(mode_t m) {
  return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device"
         : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}
}  // namespace

int open_regular(const std::string& path, size_t& size, const char* what) {
  if (path.empty()) throw Error(std::string("empty ") + what + " name");
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const std::string kind = std::strcmp(what, "file") == 0 ? "" : std::string(" ") + what;
    fail(path, "cannot open" + kind + ": " + std::strerror(errno));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(path, std::string("cannot stat ") + what + ": " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, std::string(what) + " is " + kind_of(st.st_mode) + ", not a regular file");
  }
  size = size_t(st.st_size);
  return fd;
}

std::string read_regular_file(const std::string& path, const char* what) {
  size_t size = 0;
  const int fd = open_regular(path, size, what);
  std::string s;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      fail(path, std::string("cannot read ") + what + ": " + std::strerror(err));
    }
    if (n == 0) break;
    s.append(buf, size_t(n));
  }
  ::close(fd);
  return s;
}

namespace {
// The temporaries of live AtomicFiles, for the signal handler: lock-free slots it can read and unlink from
// (unlink is async-signal-safe). A slot points into its AtomicFile's tmp_, which is not changed while registered.
constexpr int kSlots = 64;
std::atomic<const char*> g_live[kSlots];

void register_temp(const char* p) {
  for (auto& s : g_live) {
    const char* none = nullptr;
    if (s.compare_exchange_strong(none, p)) return;
  }  // more than 64 open at once: this one is not removed on a signal (destructors still remove it)
}
void unregister_temp(const char* p) {
  for (auto& s : g_live) {
    const char* mine = p;
    if (s.compare_exchange_strong(mine, nullptr)) return;
  }
}

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};

extern "C" void remove_temporaries_and_reraise(int sig) {
  for (auto& s : g_live)
    if (const char* p = s.load()) ::unlink(p);
  // SA_RESETHAND restored the default action: the process ends by this signal, as the shell expects.
  ::raise(sig);
}
}  // namespace

void remove_temporaries_on_signals() {
  struct sigaction sa {};
  sa.sa_handler = remove_temporaries_and_reraise;
  sa.sa_flags = SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  for (int sig : kSignals) sigaddset(&sa.sa_mask, sig);  // one handler at a time
  for (int sig : kSignals) {
    struct sigaction old {};
    ::sigaction(sig, nullptr, &old);
    if (old.sa_handler == SIG_IGN) continue;  // ignored by whoever started us (nohup, a shell's trap): stay so
    ::sigaction(sig, &sa, nullptr);
  }
  // Past a file-size limit (ulimit -f) a write fails with EFBIG, which AtomicFile reports (its temporary removed),
  // instead of the default SIGXFSZ ending the process mid-write with the temporary left behind.
  ::signal(SIGXFSZ, SIG_IGN);
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  namespace fs = std::filesystem;
  if (path_.empty()) throw Error("empty output file name");
  const fs::path p(path_);
  if (!p.has_filename()) fail(path_, "output names a folder, not a file");
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::string name = ".";  // appended piecewise: GCC 12 warns falsely (-Wrestrict) on the chained operator+
  name += p.filename().string();
  name += ".tmp-XXXXXX";
  const long name_max = ::pathconf(dir.c_str(), _PC_NAME_MAX);
  if (name.size() > size_t(name_max > 0 ? name_max : 255)) name = ".fp4lab.tmp-XXXXXX";
  tmp_ = (dir / name).string();
  fd_ = ::mkstemp(tmp_.data());
  if (fd_ < 0) {
    const int err = errno;
    tmp_.clear();
    fail(path_, std::string("cannot create: ") + std::strerror(err));
  }
  register_temp(tmp_.c_str());
  // mkstemp creates 0600; give the output the mode a plain open() would (0666 less the umask).
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::fchmod(fd_, 0666 & ~mask);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) unregister_temp(tmp_.c_str());
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* p, size_t n) {
  if (fd_ < 0) fail(path_, "write after close");
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd_, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail(path_, std::string("write failed: ") + std::strerror(w < 0 ? errno : EIO));
    c += w;
    n -= size_t(w);
  }
}

void AtomicFile::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail(path_, std::string("write failed on close: ") + std::strerror(errno));
}

void AtomicFile::commit() {
  close();
  if (committed_) return;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail(path_, std::string("cannot rename the finished output into place: ") + std::strerror(errno));
  committed_ = true;
  unregister_temp(tmp_.c_str());
}

void write_file_atomic(const std::string& path, const std::string& text) {
  AtomicFile f(path);
  f.write(text.data(), text.size());
  f.commit();
}

}  // namespace fp4lab::io
