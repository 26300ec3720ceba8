// fileio.cpp: see fileio.h.
#include "fileio.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "check.h"

namespace {

// Opens `path` for reading, or fills *error (naming the path and the reason) and returns false.
bool open_regular_file(const std::string& path, std::ifstream* in, std::string* error) {
  struct stat info;
  if (stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
    *error = "cannot open '" + path + "': not a regular file";
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
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  contents->resize(size_t(size));
  if (size > 0 && !in.read(&(*contents)[0], size)) {
    *error = "cannot read '" + path + "': read failed after " + std::to_string(in.gcount()) + " bytes";
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

// This process's temporary for `path`: PATH.tmp.<host>.<pid>. The host is in the name because a
// folder may be shared by the nodes of a cluster, where only the writer's own node can tell whether
// that process still lives.
std::string this_host() {
  char host[256] = "";
  if (gethostname(host, sizeof host - 1) != 0) return "unknown";
  return host;
}

std::string temporary_for(const std::string& path) {
  return path + ".tmp." + this_host() + "." + std::to_string(getpid());
}

// Removes the PATH.tmp.<host>.<pid> files that writers on this host left when they died (a kill during
// a save): their process no longer exists. A live writer's file (another run saving to the same path)
// and other hosts' files are left alone.
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

}  // namespace

std::string writable_problem(const std::string& flag, const std::string& path) {
  const std::string folder = folder_of(path);
  struct stat info;
  if (stat(folder.c_str(), &info) != 0)
    return flag + " " + path + ": the folder '" + folder + "' does not exist (create it first)";
  if (!S_ISDIR(info.st_mode)) return flag + " " + path + ": '" + folder + "' is not a folder";
  if (stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) return flag + " " + path + ": that is a folder, not a file";
  const std::string probe = temporary_for(path);
  FILE* f = std::fopen(probe.c_str(), "wb");
  if (!f) return flag + " " + path + ": cannot write in '" + folder + "': " + std::strerror(errno);
  std::fclose(f);
  std::remove(probe.c_str());
  return "";
}

void write_file_atomically(const std::string& path, const void* data, size_t bytes) {
  remove_stale_temporaries(path);
  const std::string tmp = temporary_for(path);
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fatal("cannot write '" + tmp + "': " + std::strerror(errno) + " (does the folder exist?)");
  bool ok = std::fwrite(data, 1, bytes, f) == bytes;
  ok = (std::fflush(f) == 0) && ok;
  ok = (fsync(fileno(f)) == 0) && ok;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    fatal("cannot write '" + path + "': " + std::strerror(errno) + " (disk full?)");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fatal("cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(errno));
  }
}

uint64_t fnv1a(const char* data, size_t n, uint64_t hash) {
  for (size_t i = 0; i < n; i++) {
    hash ^= uint8_t(data[i]);
    hash *= 1099511628211ULL;
  }
  return hash;
}
