#include "tests/state/fault_injection.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>

namespace tessel::testing::fault {
namespace {

std::atomic<bool> armed{false};
Plan plan;  // written only while disarmed
std::atomic<int64_t> points{0};

template <typename Fn>
Fn next_definition(const char* name) {
  void* symbol = dlsym(RTLD_NEXT, name);
  if (symbol == nullptr) {
    std::fprintf(stderr, "fault_injection: libc has no '%s'\n", name);
    std::abort();
  }
  return reinterpret_cast<Fn>(symbol);
}

std::string fd_path(int fd) {
  char link[64];
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  char target[PATH_MAX];
  const ssize_t length = readlink(link, target, sizeof(target) - 1);
  return length > 0 ? std::string(target, static_cast<size_t>(length)) : std::string();
}

std::string at_path(int dirfd, const char* path) {
  if (path[0] == '/' || dirfd == AT_FDCWD) return path;
  return fd_path(dirfd) + "/" + path;
}

bool inside_folder(const std::string& path) {
  const std::string& folder = plan.folder;
  return path.compare(0, folder.size(), folder) == 0 &&
         (path.size() == folder.size() || path[folder.size()] == '/');
}

// Whether this call must fail (errno set); a kill never returns.
bool fault_point(const std::string& path, bool data_call) {
  if (!armed.load(std::memory_order_acquire) || !inside_folder(path)) return false;
  if (plan.action == Action::kFail && !data_call) return false;
  const int64_t point = points.fetch_add(1) + 1;
  if (point != plan.at) return false;
  if (plan.action == Action::kKill) {
    kill(getpid(), SIGKILL);
    for (;;) pause();
  }
  if (plan.action == Action::kFail) {
    errno = plan.error;
    return true;
  }
  return false;
}

}  // namespace

void arm(const Plan& new_plan) {
  armed.store(false, std::memory_order_release);
  plan = new_plan;
  points.store(0);
  armed.store(true, std::memory_order_release);
}

void disarm() { armed.store(false, std::memory_order_release); }

int64_t points_seen() { return points.load(); }

}  // namespace tessel::testing::fault

using tessel::testing::fault::at_path;
using tessel::testing::fault::fault_point;
using tessel::testing::fault::fd_path;
using tessel::testing::fault::next_definition;

// The interposed calls. Each asks fault_point first, then forwards to libc's definition.
extern "C" {

ssize_t write(int fd, const void* buffer, size_t bytes) {
  static auto real = next_definition<ssize_t (*)(int, const void*, size_t)>("write");
  if (fault_point(fd_path(fd), /*data_call=*/true)) return -1;
  return real(fd, buffer, bytes);
}

ssize_t writev(int fd, const struct iovec* vectors, int count) {
  static auto real = next_definition<ssize_t (*)(int, const struct iovec*, int)>("writev");
  if (fault_point(fd_path(fd), /*data_call=*/true)) return -1;
  return real(fd, vectors, count);
}

int fsync(int fd) {
  static auto real = next_definition<int (*)(int)>("fsync");
  if (fault_point(fd_path(fd), /*data_call=*/true)) return -1;
  return real(fd);
}

int rename(const char* from, const char* to) {
  static auto real = next_definition<int (*)(const char*, const char*)>("rename");
  if (fault_point(from, /*data_call=*/false)) return -1;
  return real(from, to);
}

int remove(const char* path) {
  static auto real = next_definition<int (*)(const char*)>("remove");
  if (fault_point(path, /*data_call=*/false)) return -1;
  return real(path);
}

int unlink(const char* path) {
  static auto real = next_definition<int (*)(const char*)>("unlink");
  if (fault_point(path, /*data_call=*/false)) return -1;
  return real(path);
}

int unlinkat(int dirfd, const char* path, int flags) {
  static auto real = next_definition<int (*)(int, const char*, int)>("unlinkat");
  if (fault_point(at_path(dirfd, path), /*data_call=*/false)) return -1;
  return real(dirfd, path, flags);
}

int rmdir(const char* path) {
  static auto real = next_definition<int (*)(const char*)>("rmdir");
  if (fault_point(path, /*data_call=*/false)) return -1;
  return real(path);
}

}  // extern "C"
