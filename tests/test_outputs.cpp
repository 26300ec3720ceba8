// test_outputs.cpp: what the run's writers do with what is at, and what happens to, their paths.
// run_paths_problem() refuses an output that would replace a device, FIFO, socket or folder, and two
// flags that name one file (output_paths.h); write_file_atomically() and JsonLinesWriter check every
// write, end the process naming the file and the reason when one fails (a full disk, simulated by a
// file-size limit), and keep what was there or was written before; an exception that nobody catches
// becomes a message and exit status 1, not an abort.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "fileio.h"
#include "metrics.h"
#include "output_paths.h"

namespace {

// A fresh folder of this test's own. Not training_harness's temp_dir(): a death test's child ends
// through exit(), whose atexit handlers would remove that folder before the parent looks into it.
class Scratch {
 public:
  Scratch() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/gpt_outputs_XXXXXX";
    dir_ = mkdtemp(tmpl.data()) ? tmpl : "";
    EXPECT_FALSE(dir_.empty()) << "cannot create a folder in " << tmpl;
  }
  ~Scratch() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  std::string operator/(const std::string& name) const { return dir_ + "/" + name; }

 private:
  std::string dir_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

bool is_fifo(const std::string& path) {
  struct stat info;
  return lstat(path.c_str(), &info) == 0 && S_ISFIFO(info.st_mode);
}

// A listening-less socket file at `path`.
bool make_socket(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address = {};
  address.sun_family = AF_UNIX;
  if (fd < 0 || path.size() >= sizeof address.sun_path) return false;
  std::snprintf(address.sun_path, sizeof address.sun_path, "%s", path.c_str());
  const bool made = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  close(fd);
  return made;
}

// The process limits the size of the files it writes to `bytes`: a write past it fails with EFBIG,
// as on a full disk (SIGXFSZ ignored, as the trainers do, else it would kill the process).
void limit_file_size(rlim_t bytes) {
  std::signal(SIGXFSZ, SIG_IGN);
  const rlimit limit = {bytes, bytes};
  setrlimit(RLIMIT_FSIZE, &limit);
}

// ---------------------------------------------------------------------------------------------
// Output paths, checked before the work.

TEST(OutputPaths, AnOutputAtANonRegularFileIsRefusedNamingWhatItIs) {
  Scratch s;
  ASSERT_EQ(mkfifo((s / "fifo").c_str(), 0644), 0);
  ASSERT_EQ(mkdir((s / "folder").c_str(), 0755), 0);
  ASSERT_TRUE(make_socket(s / "socket"));
  std::vector<std::pair<std::string, std::string>> cases = {
      {s / "fifo", "a FIFO (named pipe)"}, {s / "folder", "a folder"}, {s / "socket", "a socket"}};
  // A character device like /dev/null (1, 3), made here: the test never names a real one.
  if (mknod((s / "null").c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0) cases.push_back({s / "null", "a character device"});
  for (const auto& [path, kind] : cases) {
    RunPaths json, save, trace;
    json.json = save.save = trace.trace = path;
    for (const auto& [paths, flag] : {std::pair<RunPaths, std::string>{json, "--json"}, {save, "--save"}, {trace, "--trace"}}) {
      const std::string problem = run_paths_problem(paths);
      EXPECT_NE(problem.find(flag + " " + path + ": that is " + kind + ", not a regular file"), std::string::npos)
          << problem;
    }
  }
  // A --save pattern refuses the non-regular files it names, whatever the step.
  RunPaths pattern;
  pattern.save = s / "ck_{step}.bin";
  EXPECT_EQ(run_paths_problem(pattern), "");
  ASSERT_EQ(mkfifo((s / "ck_40.bin").c_str(), 0644), 0);
  EXPECT_NE(run_paths_problem(pattern).find("'" + s / "ck_40.bin" + "', which it names, is a FIFO"), std::string::npos)
      << run_paths_problem(pattern);
  EXPECT_TRUE(is_fifo(s / "fifo"));
}

TEST(OutputPaths, TwoFlagsThatNameOneFileAreRefused) {
  Scratch s;
  const std::string data = s / "data.txt", ckpt = s / "run.ckpt";
  write_text(data, "some training text");
  write_text(ckpt, "a checkpoint");
  ASSERT_EQ(link(data.c_str(), (s / "hardlink.txt").c_str()), 0);
  ASSERT_EQ(symlink(data.c_str(), (s / "symlink.txt").c_str()), 0);
  ASSERT_EQ(mkdir((s / "sub").c_str(), 0755), 0);
  struct Case {
    RunPaths paths;
    std::string message;
  };
  auto paths = [](std::string data, std::string resume, std::string save, std::string json, std::string trace) {
    RunPaths p;
    p.data = data, p.resume = resume, p.save = save, p.json = json, p.trace = trace;
    return p;
  };
  const Case cases[] = {
      {paths(data, "", data, "", ""), "--data " + data + " and --save " + data + " name the same file: the output --save "
                                                                                 "would overwrite the input --data"},
      {paths(data, "", "", data, ""), "--data " + data + " and --json " + data + " name the same file"},
      {paths(data, "", "", "", data), "--data " + data + " and --trace " + data + " name the same file"},
      // By inode: another name of the same file, a link to it.
      {paths(data, "", s / "hardlink.txt", "", ""), "name the same file: the output --save would overwrite the input --data"},
      {paths(data, "", "", s / "symlink.txt", ""), "name the same file"},
      // By path where no file is yet: the same place spelled two ways.
      {paths("", "", s / "x", s / "sub/../x", ""), "--save " + s / "x" + " and --json " + s / "sub/../x" +
                                                       " name the same file: one output would replace the other"},
      {paths("", "", "", s / "y", s / "./y"), "--json " + s / "y" + " and --trace " + s / "./y" + " name the same file"},
      {paths("", ckpt, "", ckpt, ""), "--resume " + ckpt + " and --json " + ckpt + " name the same file: the output "
                                                                                  "--json would overwrite the input --resume"},
      {paths("", ckpt, "", "", ckpt), "--resume " + ckpt + " and --trace " + ckpt + " name the same file"},
      {paths(ckpt, ckpt, "", "", ""), "a checkpoint is not training text"},
      // A --save pattern names every step's file.
      {paths("", "", s / "ck_{step}.bin", s / "ck_12.bin", ""), "--save " + s / "ck_{step}.bin" + " and --json " +
                                                                    s / "ck_12.bin" + " can name the same file"},
      {paths(s / "step_7", "", s / "step_{step}", "", ""), "can name the same file"},
  };
  for (const Case& c : cases) {
    const std::string problem = run_paths_problem(c.paths);
    EXPECT_NE(problem.find(c.message), std::string::npos) << "expected '" << c.message << "' in '" << problem << "'";
  }
  // Allowed: a run that saves over the checkpoint it resumes (the save replaces it once complete),
  // a new schedule saved over the checkpoint it started from, distinct files, a pattern that names
  // none of the others.
  RunPaths resume_save = paths(data, ckpt, ckpt, s / "run.jsonl", s / "trace.json");
  EXPECT_EQ(run_paths_problem(resume_save), "");
  RunPaths init_save;
  init_save.init_from = init_save.save = ckpt;
  EXPECT_EQ(run_paths_problem(init_save), "");
  RunPaths init_json;
  init_json.init_from = init_json.json = ckpt;
  EXPECT_NE(run_paths_problem(init_json).find("--init-from " + ckpt + " and --json " + ckpt), std::string::npos);
  EXPECT_EQ(run_paths_problem(paths(data, "", s / "ck_{step}.bin", s / "ck_x.bin", s / "ck_12.json")), "");
  EXPECT_EQ(read_file(data), "some training text");
}

// ---------------------------------------------------------------------------------------------
// Writers, at write time.

// The path may have changed since the check before the work: the writer looks again, and never
// renames its file over something that is not a regular file.
TEST(WriteFileAtomically, NeverReplacesANonRegularFile) {
  Scratch s;
  const std::string fifo = s / "ck.bin";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_EXIT(write_file_atomically(fifo, "checkpoint", 10), testing::ExitedWithCode(1),
              "cannot write '.*ck.bin': '.*ck.bin' is a FIFO \\(named pipe\\), not a regular file");
  EXPECT_TRUE(is_fifo(fifo)) << "the FIFO was replaced";
}

// A link is followed: its file is replaced, the link stays.
TEST(WriteFileAtomically, ReplacesTheFileALinkNames) {
  Scratch s;
  write_text(s / "target", "old");
  ASSERT_EQ(symlink((s / "target").c_str(), (s / "link").c_str()), 0);
  write_file_atomically(s / "link", "new", 3);
  struct stat info;
  ASSERT_EQ(lstat((s / "link").c_str(), &info), 0);
  EXPECT_TRUE(S_ISLNK(info.st_mode)) << "the link was replaced by a file";
  EXPECT_EQ(read_file(s / "target"), "new");
}

TEST(WriteFileAtomically, AFullDiskEndsTheProcessAndKeepsTheOldFile) {
  Scratch s;
  const std::string path = s / "ck.bin";
  write_text(path, "the previous checkpoint");
  const std::string big(64 * 1024, 'x');
  EXPECT_EXIT((limit_file_size(4096), write_file_atomically(path, big.data(), big.size())), testing::ExitedWithCode(1),
              "cannot write '.*ck.bin': File too large");
  EXPECT_EQ(read_file(path), "the previous checkpoint");
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(s / ""))
    if (entry.path().filename() != "ck.bin") left.push_back(entry.path().filename());
  EXPECT_TRUE(left.empty()) << "left behind: " << left.front();
}

// The JSON-lines writer on a full disk: the process ends with the file and the reason, and the file
// ends at its last whole record (each record is one write; a partial one is cut off), in place.
TEST(JsonLinesWriter, AFullDiskEndsTheProcessAndKeepsTheWholeRecords) {
  Scratch s;
  const std::string path = s / "run.jsonl";
  auto write_until_full = [&] {
    limit_file_size(3000);
    JsonLinesWriter json;
    json.open(path);
    for (int step = 0; step < 1000; step++)
      json.write(JsonObject().add("type", "step").add("step", step).add("padding", std::string(50 + step % 7, 'p')));
    json.close();
    std::exit(0);
  };
  EXPECT_EXIT(write_until_full(), testing::ExitedWithCode(1),
              "cannot write '.*run.jsonl': File too large; the file ends at its last whole record");
  const std::string text = read_file(path);
  ASSERT_FALSE(text.empty()) << "the records written before the failure were lost";
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));
  EXPECT_LE(text.size(), 3000u);
  EXPECT_EQ(text.back(), '\n') << "cut mid-record: ..." << text.substr(text.size() - 40);
  size_t records = 0;
  for (size_t start = 0, end; (end = text.find('\n', start)) != std::string::npos; start = end + 1, records++) {
    const std::string line = text.substr(start, end - start);
    EXPECT_EQ(line.front(), '{') << line;
    EXPECT_EQ(line.back(), '}') << line;
    EXPECT_NE(line.find("\"step\":" + std::to_string(records) + ","), std::string::npos) << line;
  }
  EXPECT_GT(records, 10u);
}

TEST(JsonLinesWriter, NeverReplacesANonRegularFile) {
  Scratch s;
  const std::string fifo = s / "run.jsonl";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_EXIT(
      {
        JsonLinesWriter json;
        json.open(fifo);
        json.close();
        std::exit(0);
      },
      testing::ExitedWithCode(1), "cannot write '.*run.jsonl': '.*run.jsonl' is a FIFO");
  EXPECT_TRUE(is_fifo(fifo));
  // Made a FIFO while the run writes: the records stay in the .partial file, the FIFO stays.
  const std::string later = s / "later.jsonl";
  EXPECT_EXIT(
      {
        JsonLinesWriter json;
        json.open(later);
        json.write(JsonObject().add("type", "run"));
        mkfifo(later.c_str(), 0644);
        json.close();
        std::exit(0);
      },
      testing::ExitedWithCode(1), "is a FIFO .*the records stay in '.*later.jsonl.partial'");
  EXPECT_TRUE(is_fifo(later));
  EXPECT_EQ(read_file(later + ".partial"), "{\"type\":\"run\"}\n");
}

// ---------------------------------------------------------------------------------------------
// An exception that nobody catches, on any thread: a message and exit status 1 (through fatal(),
// which under MPI ends every rank), never a bare "terminate called ..." and an abort.
TEST(UncaughtExceptions, EndTheProcessWithTheirMessage) {
  EXPECT_EXIT(std::thread([] { throw std::length_error("cannot create std::vector larger than max_size()"); }).join(),
              testing::ExitedWithCode(1), "error: uncaught exception: cannot create std::vector larger than max_size");
}

}  // namespace
