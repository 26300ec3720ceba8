// test_outputs.cpp: what the run's writers do with what is at, and what happens to, their paths.
// run_paths_problem() refuses an output that would replace a device, socket or folder, and two flags
// that name one file (output_paths.h), and writes the null device and a FIFO directly; lock_outputs()
// refuses an output another process writes, naming it; write_file_atomically() and JsonLinesWriter check every
// write, end the process naming the file and the reason when one fails (a full disk, simulated by a
// file-size limit), and keep what was there or was written before; an exception that nobody catches
// becomes a message and exit status 1, not an abort.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "base/fileio.h"
#include "base/metrics.h"
#include "base/output_paths.h"
#include "training_harness.h"  // make_socket

namespace {

// The folder's files other than `kept`: what a writer left behind.
std::vector<std::string> files_besides(const std::string& folder, const std::string& kept) {
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(folder))
    if (entry.path().filename() != kept) left.push_back(entry.path().filename());
  return left;
}

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
  ASSERT_EQ(mkdir((s / "folder").c_str(), 0755), 0);
  ASSERT_TRUE(make_socket(s / "socket"));
  std::vector<std::pair<std::string, std::string>> cases = {{s / "folder", "a folder"}, {s / "socket", "a socket"}};
  // A character device other than the null device, like /dev/zero (1, 5), made here: the test never
  // names a real one.
  if (mknod((s / "zero").c_str(), S_IFCHR | 0666, makedev(1, 5)) == 0) cases.push_back({s / "zero", "a character device"});
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
  ASSERT_EQ(mkdir((s / "ck_40.bin").c_str(), 0755), 0);
  EXPECT_NE(run_paths_problem(pattern).find("'" + s / "ck_40.bin" + "', which it names, is a folder"), std::string::npos)
      << run_paths_problem(pattern);
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
  const std::string socket = s / "ck.bin";
  ASSERT_TRUE(make_socket(socket));
  EXPECT_EXIT(write_file_atomically(socket, "checkpoint", 10), testing::ExitedWithCode(1),
              "cannot write '.*ck.bin': '.*ck.bin' is a socket, not a regular file");
  struct stat info;
  EXPECT_TRUE(lstat(socket.c_str(), &info) == 0 && S_ISSOCK(info.st_mode)) << "the socket was replaced";
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
  EXPECT_EQ(files_besides(s / "", "run.jsonl"), std::vector<std::string>()) << "a temporary was left behind";
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
  const std::string socket = s / "run.jsonl";
  ASSERT_TRUE(make_socket(socket));
  EXPECT_EXIT(
      {
        JsonLinesWriter json;
        json.open(socket);
        json.close();
        std::exit(0);
      },
      testing::ExitedWithCode(1), "cannot write '.*run.jsonl': '.*run.jsonl' is a socket");
  // Made a FIFO while the run writes: the records stay in the writer's temporary, the FIFO stays.
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
      testing::ExitedWithCode(1), "is a FIFO .*the records stay in '.*later.jsonl.tmp.[^']*'");
  EXPECT_TRUE(is_fifo(later));
  std::vector<std::string> left = files_besides(s / "", "later.jsonl");
  left.erase(std::remove(left.begin(), left.end(), "run.jsonl"), left.end());
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].rfind("later.jsonl.tmp.", 0), 0u) << left[0];
  EXPECT_EQ(read_file(s / left[0]), "{\"type\":\"run\"}\n");
}

// `--json /dev/null` is how a Unix user says "discard this", and a FIFO is how one pipes records to
// a reader: both are written to directly, never through a temporary renamed over them.
TEST(JsonLinesWriter, WritesTheNullDeviceAndAFifoInPlace) {
  RunPaths discard;
  discard.json = discard.trace = "/dev/null";
  EXPECT_EQ(run_paths_problem(discard), "");
  JsonLinesWriter json;
  json.open("/dev/null");
  json.write(JsonObject().add("type", "run"));
  json.close();
  write_file_atomically("/dev/null", "checkpoint", 10);
  struct stat info;
  ASSERT_EQ(stat("/dev/null", &info), 0);
  EXPECT_TRUE(S_ISCHR(info.st_mode)) << "/dev/null was replaced";

  Scratch s;
  const std::string fifo = s / "records";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  RunPaths piped;
  piped.json = fifo;
  EXPECT_EQ(run_paths_problem(piped), "");
  std::string received;
  std::thread reader([&] { received = read_file(fifo); });
  {
    JsonLinesWriter writer;
    writer.open(fifo);
    writer.write(JsonObject().add("type", "run"));
    writer.write(JsonObject().add("type", "summary"));
    writer.close();
  }
  reader.join();
  EXPECT_EQ(received, "{\"type\":\"run\"}\n{\"type\":\"summary\"}\n");
  EXPECT_TRUE(is_fifo(fifo));
  EXPECT_EQ(files_besides(s / "", "records"), std::vector<std::string>()) << "a temporary beside a FIFO";
}

// Two processes writing one JSON path each write their own temporary: neither's records mix with the
// other's, and the rename of each succeeds (the last to close wins the path). They used to share
// PATH.partial: the first close renamed the other's records into place and the second died.
TEST(JsonLinesWriter, TwoWritersOfOnePathEachKeepTheirOwnTemporary) {
  Scratch s;
  const std::string path = s / "run.jsonl";
  int opened[2], go[2];
  ASSERT_EQ(pipe(opened), 0);
  ASSERT_EQ(pipe(go), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    JsonLinesWriter json;
    json.open(path);
    json.write(JsonObject().add("writer", "child"));
    char byte = 1;
    if (write(opened[1], &byte, 1) != 1 || read(go[0], &byte, 1) != 1) _exit(3);
    json.write(JsonObject().add("writer", "child, second"));
    json.close();
    _exit(0);
  }
  char byte = 0;
  ASSERT_EQ(read(opened[0], &byte, 1), 1);
  JsonLinesWriter json;
  json.open(path);
  json.write(JsonObject().add("writer", "parent"));
  ASSERT_EQ(write(go[1], &byte, 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the other writer failed: status " << status;
  EXPECT_EQ(read_file(path), "{\"writer\":\"child\"}\n{\"writer\":\"child, second\"}\n");
  json.close();
  EXPECT_EQ(read_file(path), "{\"writer\":\"parent\"}\n");
  EXPECT_EQ(files_besides(s / "", "run.jsonl"), std::vector<std::string>());
  for (int fd : {opened[0], opened[1], go[0], go[1]}) close(fd);
}

// A run takes a lock on each output before its work; another process asking for the same output is
// told who holds it (pid and command line), until the holder lets go.
TEST(OutputLocks, AnOutputAnotherProcessWritesIsRefusedNamingIt) {
  Scratch s;
  RunPaths paths;
  paths.json = s / "run.jsonl";
  int locked[2], go[2];
  ASSERT_EQ(pipe(locked), 0);
  ASSERT_EQ(pipe(go), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const char taken = lock_outputs(paths).empty() ? 1 : 0;
    char byte = 0;
    if (write(locked[1], &taken, 1) != 1 || read(go[0], &byte, 1) != 1) _exit(3);
    release_output_locks();
    _exit(0);
  }
  char taken = 0;
  ASSERT_EQ(read(locked[0], &taken, 1), 1);
  EXPECT_EQ(taken, 1);
  const std::string problem = lock_outputs(paths);
  EXPECT_NE(problem.find("--json " + paths.json + ": another run is writing it (pid " + std::to_string(child) + " on "),
            std::string::npos) << problem;
  EXPECT_NE(problem.find("test_outputs"), std::string::npos) << "the holder's command line is not named: " << problem;
  const char byte = 1;
  ASSERT_EQ(write(go[1], &byte, 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(lock_outputs(paths), "") << "the lock outlived its holder";
  release_output_locks();
  EXPECT_EQ(files_besides(s / "", ""), std::vector<std::string>()) << "a lock file was left";
  for (int fd : {locked[0], locked[1], go[0], go[1]}) close(fd);
}

// ---------------------------------------------------------------------------------------------
// An exception that nobody catches, on any thread: a message and exit status 1 (through fatal(),
// which under MPI ends every rank), never a bare "terminate called ..." and an abort.
TEST(UncaughtExceptions, EndTheProcessWithTheirMessage) {
  EXPECT_EXIT(std::thread([] { throw std::length_error("cannot create std::vector larger than max_size()"); }).join(),
              testing::ExitedWithCode(1), "error: uncaught exception: cannot create std::vector larger than max_size");
}

}  // namespace
