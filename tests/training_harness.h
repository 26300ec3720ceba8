// training_harness.h: runs the real trainer binaries under mpiexec, as a user would, and reads what
// they wrote: JSON-lines records and checkpoints. The checkpoint reader here is independent of
// common/training/checkpoint.cpp and follows the format as documented (docs/checkpoint.md), so it also
// checks the documentation.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

struct RunResult {
  int exit_code = -1;
  double seconds = 0;
  std::string output;  // stdout and stderr together
};

// Runs a shell command from the repository root with a time limit (`timeout`: exit code 124), stdin
// from /dev/null, and collects its output.
RunResult run_command(const std::string& command, int timeout_s);

// Runs `mpiexec -n ranks ./<chapter>/train --quiet <args>` from the repository root with a time
// limit. Unless args name a --device, the run is on the CPU (--device cpu), so that the CPU tests
// test the CPU on a machine with a GPU too; the GPU tests ask for --device cuda. The default limit
// only catches a hang: it is far above any test's run, even on a machine whose cores are all busy.
RunResult run_trainer(const std::string& chapter, int ranks, const std::string& args, int timeout_s = 300);

// A trainer started in the background, for tests that signal it while it runs (Ctrl-C, a stopped
// rank). `marker` is a string of its command line that no other process has (a path in a fresh
// temporary folder), by which rank_pids() finds its ranks.
struct BackgroundRun {
  int pid = -1;  // mpiexec's
  std::string output_path;
};
BackgroundRun start_trainer(const std::string& chapter, int ranks, const std::string& args);
// Waits up to timeout_s for it to end (then terminates it: exit code 124).
RunResult wait_for(BackgroundRun& run, int timeout_s);
// The rank processes (./<chapter>/train) whose command line contains `marker`.
std::vector<int> rank_pids(const std::string& marker);
bool file_exists(const std::string& path);
// A listening-less Unix socket file at `path`: a file no output may replace, nor any run read.
bool make_socket(const std::string& path);
// The file a run writes its JSON lines `path` to while it runs (its writer's own temporary,
// PATH.tmp.<host>.<pid>, metrics.h), or `path` + ".tmp" when there is none yet: what a test reads to
// see how far a run has got.
std::string json_being_written(const std::string& path);

// Waiting for another process: what it does (end, write a file, reach a step) takes as long as the
// machine lets it, seconds more when every core is busy. So a test never looks once: it polls
// `condition` (every 50 ms) until it holds or `timeout_s` have passed, and returns whether it held.
// The bounds are generous (tens of seconds): a process that behaves ends the wait at once, so only a
// failing test pays for them.
bool wait_until(const std::function<bool()>& condition, double timeout_s);
// Until no rank of the job with this marker is left (rank_pids() is empty).
bool wait_until_ranks_gone(const std::string& marker, double timeout_s);
// Until the file exists.
bool wait_until_file_exists(const std::string& path, double timeout_s);

// A fresh temporary folder for one test's files, under $TMPDIR (else /tmp), removed with everything in
// it when the test binary exits (set GPT_TEST_KEEP=1 to keep them for a look after a failure). A
// binary that crashes or times out cannot remove them: tests/run_tests.sh sets TMPDIR to a folder of
// its own and removes that.
std::string temp_dir();

// The "loss" of every "step" record, in order, and the records' steps.
struct LossCurve {
  std::vector<int> steps;
  std::vector<double> losses;
};
LossCurve read_losses(const std::string& jsonl_path);
// The first record of the given "type" as raw text ("" if none); number_field() reads one number.
std::string read_record(const std::string& jsonl_path, const std::string& type);
double number_field(const std::string& record, const std::string& key);
// Every "precision" record's field, by (step, rank); "applied" reads as 1 or 0.
std::map<std::pair<int, int>, double> precision_field(const std::string& jsonl_path, const std::string& key);

// Parameters stored in a checkpoint, in table order (unpadded).
std::vector<float> checkpoint_params(const std::string& path);

// Checks a run's "theory" record (training_run.cpp): measured parameter, gradient and optimizer bytes
// equal docs/theory.md's formula up to padding, the activations equal their formula, the transient
// buffers stay within their bound, and the communicator's sent bytes equal the formula applied to
// the padded length. `param_bytes` is the size of one parameter: 4 in fp32, 2 in bf16.
void expect_theory_matches(const std::string& jsonl_path, double param_bytes);

// Every "step" record of a run, as raw text.
std::vector<std::string> read_records(const std::string& jsonl_path, const std::string& type);
// Every "experts" record's counts of one kind ("routed" or "dropped") per layer and expert, step by
// step (a MoE run of 11 or 12).
std::vector<double> expert_counts(const std::string& jsonl, const std::string& kind);

// A MoE run's "routing" records (11 and 12: one per step, micro-batch and layer) list every routing
// rank's assignments per expert before the capacity. In 11 a rank's tokens are one run of the global
// token order, in rank order; in 12 a record places each run (its first token's place and length),
// since CP's zigzag and SP cut a rank's tokens into several. The runs of one record, every rank's:
struct RoutedRun {
  int rank;                    // the routing rank (the stage's order: edp x ep + its place in EP)
  int64_t start, length;       // in the global micro-batch's token order (11: start = rank, no length)
  std::vector<double> counts;  // (E) routed to each expert, before the capacity
};
std::vector<RoutedRun> routed_runs(const std::string& routing_record);
// The bytes routing rank `rank` sends in its EP group's all-to-alls in step `step`, from the routing
// records alone (of pipeline stage `stage`'s layers; -1: every record), by docs/theory.md's formula
// (section 14): per micro-batch and layer, the E int32 counts ((ep-1)/ep of them sent), its kept rows
// for the other ranks' experts (dispatch forward, and their gradients backward) and the outputs of
// the rows it received for its own (and their gradients), C fp32 each (`element_bytes`: under a
// recipe, the rows' format's, 2 for bf16 and fp16; the counts stay int32).
double a2a_bytes_from_routing(const std::string& jsonl, int step, int rank, int ep, int E, int C, int stage = -1,
                              double element_bytes = 4);

// ||a - b|| / ||b|| over whole vectors (L2 norms), accumulated in double.
double relative_l2_difference(const std::vector<float>& a, const std::vector<float>& b);

// The largest |a-b| / max(|b|, 1e-12) over two curves of the same steps; fails the test on mismatch.
double max_relative_difference(const LossCurve& a, const LossCurve& b);

// The reference every chapter is held to: one rank of 01 with the same preset and global batch (""
// for the preset's), `steps` steps. Its losses, gradient norms and final parameters, made once per
// preset, batch and step count in each test binary.
struct Baseline {
  LossCurve losses;
  std::vector<double> grad_norms;  // every step's global norm, which clipping uses
  std::vector<float> params;
};
const Baseline& one_rank_of_01(const std::string& preset, const std::string& batch, int steps);

// The project's central truth for one run: `chapter` on `ranks` ranks with `args` (the preset,
// batch and step count are added here) trains to the baseline's losses and gradient norms (relative
// difference <= tolerance per step) and final parameters (relative L2 <= tolerance), and its loss
// falls. Returns the run's JSON-lines path, for checks of its own.
std::string expect_trains_like_one_rank_of_01(const std::string& chapter, int ranks, const std::string& args,
                                              const std::string& preset, const std::string& batch, int steps,
                                              double tolerance);

// Checkpoints stay layout-free. `from` trains `steps` steps (`common` flags: preset, ...), saving
// half-way; each grid of `into` resumes that checkpoint and continues the same losses (relative
// difference <= tolerance); then one rank of 01 saves half-way and `takes_01s` resumes its file.
struct Grid {
  std::string chapter;
  int ranks;
  std::string flags;
};
void expect_checkpoints_cross_grids(const Grid& from, const std::vector<Grid>& into, const Grid& takes_01s,
                                    const std::string& common, int steps, double tolerance);
// The other way: each grid of `sources` trains `steps` steps saving half-way, and `into` resumes each
// file and continues that source's own losses (relative difference <= tolerance).
void expect_resumes_checkpoints_of(const Grid& into, const std::vector<Grid>& sources, const std::string& common,
                                   int steps, double tolerance);
