// fileio.cpp: see fileio.h.
#include "base/fileio.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "base/check.h"

namespace {

// Opens `path` for reading, or fills *error (naming the path and the reason) and returns false. A
// FIFO, device or folder is refused rather than opened: a FIFO would block until someone writes.
bool open_regular_file(const std::string& path, std::ifstream* in, std::string* error) {
  struct stat info;
  if (stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
    *error = "cannot open '" + path + "': it is " + file_kind(info.st_mode) + ", not a regular file";
    return false;
  }
  in->open(path, std::ios::binary);
  if (!*in) {
    *error = "cannot open '" + path + "': " + std::strerror(errno) + " (does the file exist?)";
    return false;
  }
  return true;
}

}  // namespace

bool read_whole_file(const std::string& path, std::string* contents, std::string* error) {
  std::ifstream in;
  if (!open_regular_file(path, &in, error)) return false;
  // Read until the end rather than trust the size: a /proc file says 0 bytes and has more, and
  // seeking to the end of an unseekable file reports -1. The size only reserves the memory (and a
  // piece more, for the read that finds the end, so that a large file is never copied to grow).
  constexpr size_t kPiece = size_t(1) << 20;
  struct stat info;
  contents->clear();
  if (stat(path.c_str(), &info) == 0 && info.st_size > 0) contents->reserve(size_t(info.st_size) + kPiece);
  for (;;) {
    const size_t have = contents->size();
    contents->resize(have + kPiece);
    in.read(&(*contents)[have], std::streamsize(kPiece));
    contents->resize(have + size_t(in.gcount()));
    if (!in) break;
  }
  if (in.bad()) {
    *error = "cannot read '" + path + "': read failed after " + std::to_string(contents->size()) + " bytes";
    return false;
  }
  return true;
}

bool read_file_prefix(const std::string& path, size_t max_bytes, std::string* contents, std::string* error) {
  std::ifstream in;
  if (!open_regular_file(path, &in, error)) return false;
  contents->resize(max_bytes);
  in.read(&(*contents)[0], std::streamsize(max_bytes));
  contents->resize(size_t(in.gcount()));
  return true;
}

namespace {

std::string folder_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// The host is in a temporary's name because a folder may be shared by the nodes of a cluster, where
// only the writer's own node can tell whether that process still lives.
std::string this_host() {
  char host[256] = "";
  if (gethostname(host, sizeof host - 1) != 0) return "unknown";
  return host;
}

// The file that a write of `path` replaces: the target of a symbolic link, so that the link stays
// and its file is replaced; `path` itself otherwise (or when the link leads nowhere).
std::string resolved_target(const std::string& path) {
  struct stat info;
  if (lstat(path.c_str(), &info) != 0 || !S_ISLNK(info.st_mode)) return path;
  char* real = realpath(path.c_str(), nullptr);
  if (!real) return path;
  const std::string target = real;
  std::free(real);
  return target;
}

}  // namespace

std::string temporary_for(const std::string& path) {
  return path + ".tmp." + this_host() + "." + std::to_string(getpid());
}

// Only files whose process no longer exists go: a live writer's file (another run saving to the same
// path) and other hosts' files are left alone.
void remove_stale_temporaries(const std::string& path) {
  const std::string folder = folder_of(path);
  const std::string prefix =
      path.substr(path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1) + ".tmp." + this_host() + ".";
  DIR* dir = opendir(folder.c_str());
  if (!dir) return;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + prefix.size(), &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    if (kill(pid_t(pid), 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    std::remove((folder + "/" + name).c_str());
  }
  closedir(dir);
}

bool written_in_place(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) return false;
  if (S_ISFIFO(info.st_mode)) return true;
  // The null device is (1, 3) on Linux; compared with /dev/null's own numbers where it exists.
  struct stat null_device;
  const dev_t null_rdev = stat("/dev/null", &null_device) == 0 ? null_device.st_rdev : makedev(1, 3);
  return S_ISCHR(info.st_mode) && info.st_rdev == null_rdev;
}

int open_in_place(const std::string& path, std::string* error) {
  // A FIFO opened for writing without a reader fails at once (ENXIO) when non-blocking, rather than
  // blocking the run forever: a reader that starts a moment later is waited for, up to 10 s.
  constexpr int kTries = 200;
  for (int attempt = 0;; attempt++) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      return fd;
    }
    if (errno != ENXIO || attempt == kTries) {
      *error = errno == ENXIO ? "it is a FIFO (named pipe) that no process reads (waited 10 s); start its reader first"
                              : std::strerror(errno);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string file_kind(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

std::string not_regular_problem(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0 || S_ISREG(info.st_mode)) return "";  // nothing there, or a file
  return "'" + path + "' is " + file_kind(info.st_mode) + ", not a regular file";
}

std::string write_all(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::strerror(errno);
    if (n == 0) return "no bytes written";
    p += n;
    bytes -= size_t(n);
  }
  return "";
}

std::string writable_problem(const std::string& flag, const std::string& path) {
  const std::string target = resolved_target(path);
  const std::string folder = folder_of(target);
  struct stat info;
  if (stat(folder.c_str(), &info) != 0)
    return flag + " " + path + ": the folder '" + folder + "' does not exist (create it first)";
  if (!S_ISDIR(info.st_mode)) return flag + " " + path + ": '" + folder + "' is not a folder";
  // The null device and a FIFO are written to directly (and a FIFO is not opened now: its reader
  // would see the end of its input).
  if (written_in_place(path)) return "";
  // Anything else is written as a temporary renamed over the path: whatever is there is replaced,
  // which must never be a device, a socket or a folder.
  if (stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode))
    return flag + " " + path + ": that is " + file_kind(info.st_mode) +
           ", not a regular file; an output is written as a new file that would replace it: name a file "
           "(or /dev/null, or a FIFO, which are written to directly)";
  const std::string probe = temporary_for(target);
  FILE* f = std::fopen(probe.c_str(), "wb");
  if (!f) return flag + " " + path + ": cannot write in '" + folder + "': " + std::strerror(errno);
  std::fclose(f);
  std::remove(probe.c_str());
  return "";
}

void write_file_atomically(const std::string& path, const void* data, size_t bytes) {
  const std::string target = resolved_target(path);
  if (written_in_place(target)) {
    std::string error;
    const int fd = open_in_place(target, &error);
    if (fd >= 0) {
      error = write_all(fd, data, bytes);
      close(fd);
    }
    if (!error.empty()) fatal("cannot write '" + path + "': " + error);
    return;
  }
  // Checked before the work (writable_problem) and again now: the path may have changed since.
  std::string problem = not_regular_problem(target);
  if (!problem.empty()) fatal("cannot write '" + path + "': " + problem + "; it is left as it is");
  remove_stale_temporaries(target);
  const std::string tmp = temporary_for(target);
  std::remove(tmp.c_str());  // this process's own, from a failed earlier write
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) fatal("cannot write '" + tmp + "': " + std::strerror(errno) + " (does the folder exist?)");
  std::string error = write_all(fd, data, bytes);
  if (error.empty() && fsync(fd) != 0) error = std::strerror(errno);
  if (close(fd) != 0 && error.empty()) error = std::strerror(errno);
  if (error.empty()) {
    problem = not_regular_problem(target);
    if (!problem.empty()) error = problem;
  }
  if (!error.empty()) {
    std::remove(tmp.c_str());
    fatal("cannot write '" + path + "': " + error + " (what was at the path is unchanged)");
  }
  if (std::rename(tmp.c_str(), target.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(tmp.c_str());
    fatal("cannot rename '" + tmp + "' to '" + target + "': " + reason);
  }
}

uint64_t fnv1a(const char* data, size_t n, uint64_t hash) {
  for (size_t i = 0; i < n; i++) {
    hash ^= uint8_t(data[i]);
    hash *= 1099511628211ULL;
  }
  return hash;
}
