// An LD_PRELOAD hook for the tests of a trace file truncated while fp4lab reads it (tests/cli/cli_test.cpp and
// tests/python/package/test_hostile_native.py): with FP4LAB_TEST_TRUNCATE=PATH:LENGTH (PATH absolute and canonical), the
// first close() of a descriptor of PATH truncates the file to LENGTH bytes. fp4lab closes a trace file once its header
// is read, and reads its tensors later: the truncation lands between the two in every run, on any machine.
#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" int close(int fd) {
  using Close = int (*)(int);
  static const Close real_close = reinterpret_cast<Close>(dlsym(RTLD_NEXT, "close"));
  static bool done = false;
  const char* spec = done ? nullptr : std::getenv("FP4LAB_TEST_TRUNCATE");
  char link[64], target[PATH_MAX];
  ssize_t n = -1;
  if (spec) {
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    n = readlink(link, target, sizeof target - 1);
  }
  const int r = real_close(fd);
  const char* colon = spec ? std::strrchr(spec, ':') : nullptr;
  if (n > 0 && colon && colon - spec == n && std::strncmp(spec, target, size_t(n)) == 0) {
    done = true;
    target[n] = '\0';
    if (truncate(target, std::strtoll(colon + 1, nullptr, 10)) != 0) std::perror("truncate_hook");
  }
  return r;
}
