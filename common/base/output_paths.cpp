// output_paths.cpp: see output_paths.h.
#include "base/output_paths.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "base/fileio.h"  // writable_problem, file_kind, written_in_place, read_whole_file

namespace {

const char kStep[] = "{step}";
constexpr size_t kStepLength = sizeof kStep - 1;

bool has_step(const std::string& path) { return path.find(kStep) != std::string::npos; }

// `path` made absolute, its folder resolved (links, ".", ".."), its last name kept as written: a
// file that does not exist yet still gets one spelling per place.
std::string normalised(const std::string& path) {
  std::string absolute = path;
  char cwd[PATH_MAX];
  if (!absolute.empty() && absolute[0] != '/' && getcwd(cwd, sizeof cwd)) absolute = std::string(cwd) + "/" + absolute;
  const size_t slash = absolute.rfind('/');
  if (slash == std::string::npos) return absolute;
  std::string folder = slash == 0 ? "/" : absolute.substr(0, slash);
  const std::string name = absolute.substr(slash + 1);
  if (char* real = realpath(folder.c_str(), nullptr)) {
    folder = real;
    std::free(real);
  }
  return (folder == "/" ? "" : folder) + "/" + name;
}

// Whether `name` is `pattern` with each "{step}" replaced by a number.
bool matches_step_pattern(const char* pattern, const char* name) {
  if (*pattern == '\0') return *name == '\0';
  if (std::strncmp(pattern, kStep, kStepLength) == 0) {
    for (const char* end = name; std::isdigit(static_cast<unsigned char>(*end)); end++)
      if (matches_step_pattern(pattern + kStepLength, end + 1)) return true;
    return false;
  }
  return *pattern == *name && matches_step_pattern(pattern + 1, name + 1);
}

// Whether `a` and `b` name one file (either may be a --save pattern with {step}; the other never is).
bool same_file(const std::string& a, const std::string& b) {
  if (has_step(a) || has_step(b)) {
    const std::string& pattern = has_step(a) ? a : b;
    const std::string& other = has_step(a) ? b : a;
    std::vector<std::string> spellings = {normalised(other)};
    if (char* real = realpath(other.c_str(), nullptr)) {
      spellings.push_back(real);
      std::free(real);
    }
    const std::string p = normalised(pattern);
    for (const std::string& s : spellings)
      if (matches_step_pattern(p.c_str(), s.c_str())) return true;
    return false;
  }
  struct stat sa, sb;
  const bool a_exists = stat(a.c_str(), &sa) == 0, b_exists = stat(b.c_str(), &sb) == 0;
  if (a_exists && b_exists) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  if (a_exists != b_exists) return false;
  return normalised(a) == normalised(b);
}

// The files a --save pattern names that exist already and are not regular files (they would be
// replaced by the save of their step): the first one's problem, or "".
std::string pattern_problem(const std::string& pattern) {
  const std::string p = normalised(pattern);
  const size_t slash = p.rfind('/');
  const std::string folder = slash == 0 ? "/" : p.substr(0, slash), name = p.substr(slash + 1);
  if (!has_step(name)) return "";  // {step} in a folder's name: the folders are checked when written
  DIR* dir = opendir(folder.c_str());
  if (!dir) return "";
  std::string problem;
  while (dirent* entry = readdir(dir)) {
    if (!matches_step_pattern(name.c_str(), entry->d_name)) continue;
    const std::string path = folder + "/" + entry->d_name;
    struct stat info;
    if (stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode) && !written_in_place(path)) {
      problem = "--save " + pattern + ": '" + path + "', which it names, is " + file_kind(info.st_mode) +
                ", not a regular file; a checkpoint is written as a new file that would replace it: name a file";
      break;
    }
  }
  closedir(dir);
  return problem;
}

// A path ending in '/' is a sharded checkpoint's folder (checkpoint_sharded.h): rank 0 creates it when
// it saves, so its parent must be writable now, or, where it exists, the folder itself.
std::string folder_output_problem(const char* flag, const std::string& path) {
  if (path.empty() || path.back() != '/') return writable_problem(flag, path);
  std::string folder = path;
  while (folder.size() > 1 && folder.back() == '/') folder.pop_back();
  struct stat info;
  if (stat(folder.c_str(), &info) != 0) return writable_problem(flag, folder);
  if (!S_ISDIR(info.st_mode)) return std::string(flag) + " " + path + ": '" + folder + "' is not a folder";
  return writable_problem(flag, folder + "/checkpoint.meta");
}

struct Named {
  const char* flag;
  const std::string& path;
  bool output;
};

std::string both(const Named& a, const Named& b) {
  return std::string(a.flag) + " " + a.path + " and " + b.flag + " " + b.path;
}

}  // namespace

std::string run_paths_problem(const RunPaths& paths) {
  const Named named[] = {{"--data", paths.data, false},     {"--resume", paths.resume, false},
                         {"--init-from", paths.init_from, false}, {"--save", paths.save, true},
                         {"--json", paths.json, true},      {"--trace", paths.trace, true}};
  for (const Named& n : named) {
    if (!n.output || n.path.empty()) continue;
    std::string path = n.path;  // a pattern's folder is its first save's
    for (size_t at; (at = path.find(kStep)) != std::string::npos;) path.replace(at, kStepLength, "0");
    std::string problem = folder_output_problem(n.flag, path);
    if (problem.empty() && has_step(n.path)) problem = pattern_problem(n.path);
    if (!problem.empty()) return problem;
  }
  for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
    for (size_t j = i + 1; j < sizeof named / sizeof named[0]; j++) {
      const Named &a = named[i], &b = named[j];
      if (a.path.empty() || b.path.empty()) continue;
      // Reading a checkpoint and then saving over it is how a run continues (the save replaces it
      // only once complete); reading two checkpoints at once is refused with the flags.
      if (!a.output && !b.output && std::strcmp(a.flag, "--data") != 0) continue;
      if (!a.output && b.output && std::strcmp(a.flag, "--data") != 0 && std::strcmp(b.flag, "--save") == 0) continue;
      if (!same_file(a.path, b.path)) continue;
      struct stat info;  // the null device takes any number of outputs: nothing is kept there
      if (a.output && b.output && written_in_place(a.path) && stat(a.path.c_str(), &info) == 0 && S_ISCHR(info.st_mode))
        continue;
      const std::string what = has_step(a.path) || has_step(b.path) ? " can name the same file" : " name the same file";
      if (a.output && b.output)
        return both(a, b) + what + ": one output would replace the other; give each its own path";
      if (!a.output && !b.output)
        return both(a, b) + what + ": a checkpoint is not training text; pass the text file as --data";
      return both(a, b) + what + ": the output " + b.flag + " would overwrite the input " + a.flag +
             "; give the output another path";
    }
  }
  return "";
}

namespace {

struct HeldLock {
  std::string path;
  int fd;
};
std::vector<HeldLock> g_held_locks;

// "pid 1234 on node7: ./01_vanilla_dp/train --steps 30 --json run.jsonl", what a lock file holds.
std::string this_process() {
  std::string command, error;
  read_whole_file("/proc/self/cmdline", &command, &error);
  for (char& c : command)
    if (c == '\0') c = ' ';
  while (!command.empty() && command.back() == ' ') command.pop_back();
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  return "pid " + std::to_string(getpid()) + " on " + host + (command.empty() ? "" : ": " + command);
}

// The lock of one output, beside the file itself (a link's target), so that two spellings of one
// file share it.
std::string lock_problem(const char* flag, const std::string& output) {
  std::string file = normalised(output);
  if (char* real = realpath(output.c_str(), nullptr)) {
    file = real;
    std::free(real);
  }
  const std::string lock_path = file + ".lock";
  // The holder removes its lock file when done: a lock taken on a file that is no longer at the path
  // (removed between the open and the lock) is no lock, and is taken again.
  for (int attempt = 0; attempt < 100; attempt++) {
    const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0) return std::string(flag) + " " + output + ": cannot create its lock file '" + lock_path + "': " + std::strerror(errno);
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const std::string reason = errno == EWOULDBLOCK ? "" : std::strerror(errno);
      // The holder writes who it is just after it locks: give it a moment.
      std::string holder;
      for (int wait = 0; reason.empty() && holder.empty() && wait < 20; wait++) {
        char text[4096];
        const ssize_t n = pread(fd, text, sizeof text, 0);
        if (n > 0) holder.assign(text, size_t(n));
        else std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      ::close(fd);
      if (!reason.empty()) return std::string(flag) + " " + output + ": cannot lock '" + lock_path + "': " + reason;
      return std::string(flag) + " " + output + ": another run is writing it (" + (holder.empty() ? "a process" : holder) +
             "); wait for it to end, or give this run another path";
    }
    struct stat locked, there;
    if (fstat(fd, &locked) == 0 && stat(lock_path.c_str(), &there) == 0 && locked.st_dev == there.st_dev &&
        locked.st_ino == there.st_ino) {
      const std::string me = this_process();
      // Held either way: a run that asks is told then only that a process holds it.
      const bool told = ftruncate(fd, 0) == 0 && pwrite(fd, me.data(), me.size(), 0) == ssize_t(me.size());
      (void)told;
      g_held_locks.push_back({lock_path, fd});
      return "";
    }
    ::close(fd);
  }
  return std::string(flag) + " " + output + ": cannot lock '" + lock_path + "': it keeps being replaced";
}

}  // namespace

std::string lock_outputs(const RunPaths& paths) {
  const std::pair<const char*, const std::string&> outputs[] = {{"--json", paths.json}, {"--trace", paths.trace},
                                                                 {"--save", paths.save}};
  for (const auto& [flag, path] : outputs) {
    // (A folder's files are each written under a name of their own save: nothing there to lock.)
    if (path.empty() || has_step(path) || written_in_place(path) || path.back() == '/') continue;
    const std::string problem = lock_problem(flag, path);
    if (!problem.empty()) {
      release_output_locks();
      return problem;
    }
  }
  return "";
}

void release_output_locks() {
  // Removed first, then unlocked: a run that opens the file meanwhile finds it gone once it has the
  // lock, and makes a new one (lock_problem).
  for (const HeldLock& held : g_held_locks) {
    unlink(held.path.c_str());
    ::close(held.fd);
  }
  g_held_locks.clear();
}
