// fileio.cpp: see fileio.h.
#include "fileio.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

bool read_whole_file(const std::string& path, std::string* contents, std::string* error) {
  struct stat info;
  if (stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
    *error = "cannot open '" + path + "': not a regular file";
    return false;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = "cannot open '" + path + "': " + std::strerror(errno) + " (does the file exist?)";
    return false;
  }
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

void write_file_atomically(const std::string& path, const void* data, size_t bytes) {
  std::string tmp = path + ".tmp." + std::to_string(getpid());
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
