// training_harness.cpp: see training_harness.h.
#include "training_harness.h"

#include <dirent.h>
#include <ftw.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include <array>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "test_util.h"

RunResult run_trainer(const std::string& chapter, int ranks, const std::string& args, int timeout_s) {
  const std::string device = args.find("--device") == std::string::npos ? "--device cpu " : "";
  return run_command("mpiexec -n " + std::to_string(ranks) + " ./" + chapter + "/train --quiet " + device + args,
                     timeout_s);
}

RunResult run_command(const std::string& command, int timeout_s) {
  const std::string cmd = "timeout " + std::to_string(timeout_s) + " " + command + " </dev/null 2>&1";
  RunResult r;
  auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

BackgroundRun start_trainer(const std::string& chapter, int ranks, const std::string& args) {
  const std::string device = args.find("--device") == std::string::npos ? "--device cpu " : "";
  BackgroundRun run;
  run.output_path = temp_dir() + "/output.txt";
  const std::string cmd = "exec mpiexec -n " + std::to_string(ranks) + " ./" + chapter + "/train --quiet " + device + args;
  const pid_t pid = fork();
  if (pid == 0) {
    const int out = open(run.output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int in = open("/dev/null", O_RDONLY);
    dup2(in, 0);
    dup2(out, 1);
    dup2(out, 2);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), (char*)nullptr);
    _exit(127);
  }
  run.pid = pid;
  return run;
}

RunResult wait_for(BackgroundRun& run, int timeout_s) {
  RunResult r;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  int status = 0;
  while (waitpid(run.pid, &status, WNOHANG) == 0) {
    if (elapsed() > timeout_s) {
      kill(run.pid, SIGTERM);  // mpiexec passes it on to the ranks
      std::this_thread::sleep_for(std::chrono::seconds(2));
      kill(run.pid, SIGKILL);
      waitpid(run.pid, &status, 0);
      status = 124 << 8;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.seconds = elapsed();
  std::ifstream in(run.output_path);
  r.output.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return r;
}

// A file under /proc/PID, read with plain read(2): the process may exit while we read, and then
// read fails with ESRCH, which an ifstream turns into an exception. Gives what was read before.
static std::string read_proc_file(const std::string& path) {
  std::string text;
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return text;
  char chunk[4096];
  for (;;) {
    const ssize_t got = read(fd, chunk, sizeof chunk);
    if (got <= 0) break;
    text.append(chunk, size_t(got));
  }
  close(fd);
  return text;
}

std::vector<int> rank_pids(const std::string& marker) {
  std::vector<int> pids;
  DIR* proc = opendir("/proc");
  while (dirent* entry = proc ? readdir(proc) : nullptr) {
    const int pid = std::atoi(entry->d_name);
    if (pid <= 0) continue;
    const std::string cmdline = read_proc_file("/proc/" + std::string(entry->d_name) + "/cmdline");
    const std::string program = cmdline.substr(0, cmdline.find('\0'));  // argv[0]
    if (program.size() >= 6 && program.compare(program.size() - 6, 6, "/train") == 0 &&
        cmdline.find(marker) != std::string::npos)
      pids.push_back(pid);
  }
  if (proc) closedir(proc);
  return pids;
}

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

bool file_exists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0;
}

std::string json_being_written(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string folder = slash == std::string::npos ? "." : path.substr(0, slash);
  const std::string prefix = path.substr(slash == std::string::npos ? 0 : slash + 1) + ".tmp.";
  std::string found = path + ".tmp";
  if (DIR* dir = opendir(folder.c_str())) {
    while (dirent* entry = readdir(dir))
      if (std::strncmp(entry->d_name, prefix.c_str(), prefix.size()) == 0) found = folder + "/" + entry->d_name;
    closedir(dir);
  }
  return found;
}

bool wait_until(const std::function<bool()>& condition, double timeout_s) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    if (condition()) return true;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s) return condition();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

bool wait_until_ranks_gone(const std::string& marker, double timeout_s) {
  return wait_until([&] { return rank_pids(marker).empty(); }, timeout_s);
}

bool wait_until_file_exists(const std::string& path, double timeout_s) {
  return wait_until([&] { return file_exists(path); }, timeout_s);
}

std::vector<std::string> read_records(const std::string& path, const std::string& type) {
  std::vector<std::string> records;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (line.find("\"type\":\"" + type + "\"") != std::string::npos) records.push_back(line);
  return records;
}

namespace {
std::vector<std::string>& temp_dirs() {
  static std::vector<std::string> dirs;
  return dirs;
}

int remove_entry(const char* path, const struct stat*, int, struct FTW*) { return std::remove(path); }

void remove_temp_dirs() {
  if (std::getenv("GPT_TEST_KEEP")) return;
  for (const std::string& dir : temp_dirs()) nftw(dir.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}
}  // namespace

std::string temp_dir() {
  // Under $TMPDIR when set: tests/run_tests.sh points it at a folder of its own, which it removes
  // even when a binary crashes or times out and so never reaches the atexit handler below.
  const char* base = std::getenv("TMPDIR");
  const std::string root = base && *base ? base : "/tmp";
  std::string tmpl = root + "/gpt_test_XXXXXX";
  const char* dir = mkdtemp(tmpl.data());
  if (!dir) {
    ADD_FAILURE() << "cannot create a temporary folder in " << root << ": " << std::strerror(errno);
    return root;
  }
  // Only the test process removes them: a forked child leaves with _exit(), which skips atexit.
  if (temp_dirs().empty()) std::atexit(remove_temp_dirs);
  temp_dirs().push_back(dir);
  return dir;
}

double number_field(const std::string& record, const std::string& key) {
  std::string needle = "\"" + key + "\":";
  size_t at = record.find(needle);
  if (at == std::string::npos) return NAN;
  return std::strtod(record.c_str() + at + needle.size(), nullptr);
}

std::map<std::pair<int, int>, double> precision_field(const std::string& path, const std::string& key) {
  std::map<std::pair<int, int>, double> values;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("\"type\":\"precision\"") == std::string::npos) continue;
    const double value = key == "applied" ? double(line.find("\"applied\":true") != std::string::npos) : number_field(line, key);
    values[{int(number_field(line, "step")), int(number_field(line, "rank"))}] = value;
  }
  return values;
}

std::string read_record(const std::string& path, const std::string& type) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (line.find("\"type\":\"" + type + "\"") != std::string::npos) return line;
  return "";
}

LossCurve read_losses(const std::string& path) {
  LossCurve curve;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("\"type\":\"step\"") == std::string::npos) continue;
    curve.steps.push_back(int(number_field(line, "step")));
    curve.losses.push_back(number_field(line, "loss"));
  }
  return curve;
}

double max_relative_difference(const LossCurve& a, const LossCurve& b) {
  EXPECT_EQ(a.steps, b.steps);
  double worst = 0;
  for (size_t i = 0; i < a.losses.size() && i < b.losses.size(); i++)
    worst = std::max(worst, std::fabs(a.losses[i] - b.losses[i]) / std::max(std::fabs(b.losses[i]), 1e-12));
  return a.losses.empty() ? INFINITY : worst;
}

double relative_l2_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); i++) {
    diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    norm += double(b[i]) * b[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : INFINITY;
}

namespace {
template <typename T>
bool take(std::istream& in, T* value) {
  return bool(in.read(reinterpret_cast<char*>(value), sizeof(T)));
}
}  // namespace

std::vector<float> checkpoint_params(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, "GPT2CKPT", 8) != 0) return {};
  uint32_t version, dims[5], tensors;
  uint64_t step, batch, position, seed;
  take(in, &version);
  for (uint32_t& d : dims) take(in, &d);
  take(in, &step); take(in, &batch); take(in, &position); take(in, &seed);
  if (version >= 2) in.ignore(7 * 8);          // the training settings
  if (version >= 3) in.ignore(2 * 4 + 3 * 8);  // the mixture of experts
  take(in, &tensors);
  uint64_t total = 0;
  for (uint32_t t = 0; t < tensors; t++) {
    uint32_t name_length, ndim;
    take(in, &name_length);
    in.ignore(name_length);
    take(in, &ndim);
    uint64_t count = 1, d;
    for (uint32_t i = 0; i < ndim; i++) { take(in, &d); count *= d; }
    total += count;
  }
  std::vector<float> params(total);
  if (!in.read(reinterpret_cast<char*>(params.data()), std::streamsize(total * sizeof(float)))) return {};
  return params;
}

void expect_theory_matches(const std::string& jsonl_path, double param_bytes) {
  const std::string t = read_record(jsonl_path, "theory");
  ASSERT_FALSE(t.empty()) << "no theory record in " << jsonl_path;
  const double psi = number_field(t, "params"), padded = number_field(t, "padded_params");
  const double padding = padded - psi;
  // Padding elements per category: one copy of parameters and gradients; the optimizer state holds
  // m and v (fp32, 4 bytes each), and in mixed precision also the fp32 master weights.
  const double optim_padding_bytes = param_bytes == 4 ? 8 * padding : 12 * padding;
  for (auto [what, slack] : std::map<std::string, double>{
           {"params", param_bytes * padding}, {"grads", param_bytes * padding}, {"optim", optim_padding_bytes}}) {
    const double measured = number_field(t, "measured_" + what + "_bytes");
    const double theory = number_field(t, "theory_" + what + "_bytes");
    EXPECT_GE(measured, theory) << what;
    EXPECT_LE(measured - theory, slack) << what;
  }
  // The counters round each collective's share down to whole bytes, hence the small slack. A theory
  // over Ψ is stretched by the padding the collectives carry; one counted call by call (under
  // --collectives: docs/theory.md, section 15; ZeRO-2's rule down a pipeline) is the calls' own bytes.
  const double measured_comm = number_field(t, "measured_comm_bytes");
  const bool per_call = t.find("\"theory_comm_per_call\"") != std::string::npos;
  EXPECT_NEAR(measured_comm, number_field(t, "theory_comm_bytes") * (per_call ? 1 : padded / psi), 64.0);
  // The activation arena is the formula, term by term (docs/theory.md); transient buffers stay
  // within their bound.
  EXPECT_EQ(number_field(t, "measured_activations_bytes"), number_field(t, "theory_activations_bytes"));
  EXPECT_LE(number_field(t, "measured_transient_bytes"), number_field(t, "theory_transient_bytes_at_most"));
  // Tensor parallelism: every collective the theory counts, and no other; its bytes, each call's
  // share rounded down to whole bytes.
  if (t.find("\"measured_tp_comm_bytes\"") == std::string::npos) return;
  double calls = 0;
  for (const char* kind : {"all_reduces", "all_gathers", "reduce_scatters"}) {
    EXPECT_EQ(number_field(t, std::string("measured_tp_") + kind), number_field(t, std::string("theory_tp_") + kind))
        << kind;
    calls += number_field(t, std::string("measured_tp_") + kind);
  }
  EXPECT_NEAR(number_field(t, "measured_tp_comm_bytes"), number_field(t, "theory_tp_comm_bytes"), 2 * calls);
}

const Baseline& one_rank_of_01(const std::string& preset, const std::string& batch, int steps) {
  static std::map<std::string, Baseline> cache;
  const std::string key = preset + "/" + batch + "/" + std::to_string(steps);
  auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  const std::string dir = temp_dir();
  RunResult r = run_trainer("01_vanilla_dp", 1,
                            "--preset " + preset + (batch.empty() ? "" : " --batch " + batch) + " --steps " +
                                std::to_string(steps) + " --json " + dir + "/base.jsonl --save " + dir + "/base.ckpt");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  Baseline base{read_losses(dir + "/base.jsonl"), {}, checkpoint_params(dir + "/base.ckpt")};
  for (const std::string& step : read_records(dir + "/base.jsonl", "step"))
    base.grad_norms.push_back(number_field(step, "grad_norm"));
  return cache[key] = base;
}

std::string expect_trains_like_one_rank_of_01(const std::string& chapter, int ranks, const std::string& args,
                                              const std::string& preset, const std::string& batch, int steps,
                                              double tolerance) {
  const Baseline& base = one_rank_of_01(preset, batch, steps);
  const std::string dir = temp_dir();
  RunResult r = run_trainer(chapter, ranks,
                            "--preset " + preset + (batch.empty() ? "" : " --batch " + batch) + " --steps " +
                                std::to_string(steps) + " --json " + dir + "/run.jsonl --save " + dir + "/run.ckpt " +
                                args);
  const std::string jsonl = dir + "/run.jsonl";
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0) return jsonl;
  LossCurve curve = read_losses(jsonl);
  EXPECT_EQ(int(curve.losses.size()), steps);
  EXPECT_LE(max_relative_difference(curve, base.losses), tolerance);
  // With the default --grad-clip 1 these runs clip every step, so a norm that counted a tensor twice
  // (a replicated or tied one) would change the update: checked on its own, every step.
  std::vector<double> norms;
  for (const std::string& step : read_records(jsonl, "step")) norms.push_back(number_field(step, "grad_norm"));
  EXPECT_EQ(norms.size(), base.grad_norms.size());
  for (size_t i = 0; i < norms.size() && i < base.grad_norms.size(); i++)
    EXPECT_NEAR(norms[i], base.grad_norms[i], tolerance * base.grad_norms[i]) << "gradient norm, step " << i;
  const std::vector<float> params = checkpoint_params(dir + "/run.ckpt");
  EXPECT_EQ(params.size(), base.params.size());
  if (params.size() != base.params.size()) return jsonl;
  // The parameters as a whole agree to fp32 summation noise. Elementwise, AdamW divides each
  // gradient by its own running RMS, so a parameter whose gradient is ~0 (a rounding-noise-sized
  // value) moves by up to ~lr per step in a direction set by that noise: such elements may differ by
  // a small fraction of one step, hence the absolute tolerance.
  EXPECT_LE(relative_l2_difference(params, base.params), tolerance);
  EXPECT_TRUE(allclose(params.data(), base.params.data(), params.size(), 1e-4, 1e-4));
  // The loss must actually fall, or equality would prove little.
  if (!curve.losses.empty()) {
    EXPECT_LT(curve.losses.back(), curve.losses.front() - 0.5);
  }
  return jsonl;
}

namespace {

// `grid` trains `common` (with --steps) saving half-way into at_{step}.bin: *reference gets the
// losses of the steps after that checkpoint, which a resumed run must continue.
void train_saving_half_way(const Grid& grid, const std::string& common, int steps, const std::string& at,
                           LossCurve* reference) {
  const RunResult full = run_trainer(grid.chapter, grid.ranks, common + " " + grid.flags + " --json " + at +
                                                                   ".jsonl --save " + at + "_{step}.bin --save-every " +
                                                                   std::to_string(steps / 2));
  ASSERT_EQ(full.exit_code, 0) << full.output;
  *reference = read_losses(at + ".jsonl");
  ASSERT_EQ(int(reference->losses.size()), steps);
  reference->steps.erase(reference->steps.begin(), reference->steps.begin() + steps / 2);
  reference->losses.erase(reference->losses.begin(), reference->losses.begin() + steps / 2);
}

void expect_resume_continues(const Grid& into, const std::string& common, const std::string& checkpoint,
                             const LossCurve& reference, double tolerance, const std::string& saved_by) {
  const std::string jsonl = checkpoint + ".resumed.jsonl";
  const RunResult resumed =
      run_trainer(into.chapter, into.ranks, common + " --resume " + checkpoint + " --json " + jsonl + " " + into.flags);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_LE(max_relative_difference(read_losses(jsonl), reference), tolerance)
      << "resumed in " << into.chapter << " on " << into.ranks << " ranks " << into.flags << " from " << saved_by;
}

std::string describe_grid(const Grid& grid) {
  return grid.chapter + " on " + std::to_string(grid.ranks) + " ranks " + grid.flags;
}

}  // namespace

void expect_checkpoints_cross_grids(const Grid& from, const std::vector<Grid>& into, const Grid& takes_01s,
                                    const std::string& common_flags, int steps, double tolerance) {
  const std::string at = temp_dir() + "/from", common = common_flags + " --steps " + std::to_string(steps);
  LossCurve reference;
  train_saving_half_way(from, common, steps, at, &reference);
  for (const Grid& grid : into)
    expect_resume_continues(grid, common, at + "_" + std::to_string(steps / 2) + ".bin", reference, tolerance,
                            describe_grid(from));
  expect_resumes_checkpoints_of(takes_01s, {{"01_vanilla_dp", 1, ""}}, common_flags, steps, tolerance);
}

void expect_resumes_checkpoints_of(const Grid& into, const std::vector<Grid>& sources, const std::string& common_flags,
                                   int steps, double tolerance) {
  const std::string dir = temp_dir(), common = common_flags + " --steps " + std::to_string(steps);
  for (size_t i = 0; i < sources.size(); i++) {
    const std::string at = dir + "/source" + std::to_string(i);
    LossCurve reference;
    train_saving_half_way(sources[i], common, steps, at, &reference);
    expect_resume_continues(into, common, at + "_" + std::to_string(steps / 2) + ".bin", reference, tolerance,
                            describe_grid(sources[i]));
  }
}

// Every "experts" record's per-layer, per-expert counts of one kind ("routed" or "dropped"), step by
// step (11's and 12's records name their layers and experts).
std::vector<double> expert_counts(const std::string& jsonl, const std::string& kind) {
  std::vector<double> counts;
  for (const std::string& record : read_records(jsonl, "experts"))
    for (int l = 0; l < int(number_field(record, "layers")); l++)
      for (int e = 0; e < int(number_field(record, "experts")); e++)
        counts.push_back(number_field(record, kind + "_L" + std::to_string(l) + "_E" + std::to_string(e)));
  return counts;
}

std::vector<RoutedRun> routed_runs(const std::string& record) {
  const int ranks = int(number_field(record, "ranks"));
  std::vector<RoutedRun> runs;
  for (int q = 0; q < ranks; q++) {
    const std::string R = "_R" + std::to_string(q);
    const bool placed = !std::isnan(number_field(record, "runs" + R));  // 12's records place each run
    for (int j = 0; j < (placed ? int(number_field(record, "runs" + R)) : 1); j++) {
      const std::string at = placed ? R + "_J" + std::to_string(j) : R;
      RoutedRun run{q, placed ? int64_t(number_field(record, "start" + at)) : q,
                    placed ? int64_t(number_field(record, "length" + at)) : 0, {}};
      for (int e = 0; !std::isnan(number_field(record, "routed" + at + "_E" + std::to_string(e))); e++)
        run.counts.push_back(number_field(record, "routed" + at + "_E" + std::to_string(e)));
      runs.push_back(run);
    }
  }
  return runs;
}

// Each run keeps, of expert e, what the capacity leaves after the runs that start before it (the
// capacity claims places in the global token order, docs/theory.md); without one, all it routed.
double a2a_bytes_from_routing(const std::string& jsonl, int step, int rank, int ep, int E, int C, int stage,
                              double element_bytes) {
  double bytes = 0;
  for (const std::string& record : read_records(jsonl, "routing")) {
    if (number_field(record, "step") != step) continue;
    if (stage >= 0 && number_field(record, "stage") != stage) continue;
    const int ranks = int(number_field(record, "ranks"));
    const double capacity = number_field(record, "capacity");
    const std::vector<RoutedRun> runs = routed_runs(record);
    std::vector<double> kept(size_t(ranks * E), 0);
    for (const RoutedRun& run : runs) {
      EXPECT_EQ(int(run.counts.size()), E) << record;
      for (int e = 0; e < E && e < int(run.counts.size()); e++) {
        double before = 0;
        for (const RoutedRun& other : runs)
          if (other.start < run.start) before += other.counts[size_t(e)];
        const double routed = run.counts[size_t(e)];
        kept[size_t(run.rank * E + e)] += capacity < 0 ? routed : std::min(routed, std::max(0.0, capacity - before));
      }
    }
    // The routing rank's EP group: the ep consecutive routing ranks around it; it holds experts
    // [j E/ep, (j+1) E/ep) for its place j in the group.
    const int first = rank - rank % ep, j = rank % ep, local = E / ep;
    double sent_rows = 0, received_rows = 0;
    for (int e = 0; e < E; e++)
      if (e / local != j) sent_rows += kept[size_t(rank * E + e)];
    for (int q = first; q < first + ep; q++)
      for (int e = j * local; e < (j + 1) * local; e++)
        if (q != rank) received_rows += kept[size_t(q * E + e)];
    bytes += 4.0 * E * (ep - 1) / ep + element_bytes * C * 2 * (sent_rows + received_rows);
  }
  return bytes;
}
