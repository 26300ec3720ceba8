// training_harness.cpp: see training_harness.h.
#include "training_harness.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

RunResult run_trainer(const std::string& chapter, int ranks, const std::string& args, int timeout_s) {
  const std::string device = args.find("--device") == std::string::npos ? "--device cpu " : "";
  std::string cmd = "timeout " + std::to_string(timeout_s) + " mpiexec -n " + std::to_string(ranks) + " ./" +
                    chapter + "/train --quiet " + device + args + " </dev/null 2>&1";
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

std::string temp_dir() {
  char tmpl[] = "/tmp/gpt_test_XXXXXX";
  const char* dir = mkdtemp(tmpl);
  return dir ? dir : "/tmp";
}

double number_field(const std::string& record, const std::string& key) {
  std::string needle = "\"" + key + "\":";
  size_t at = record.find(needle);
  if (at == std::string::npos) return NAN;
  return std::strtod(record.c_str() + at + needle.size(), nullptr);
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
  if (version >= 2) in.ignore(7 * 8);  // the training settings
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
  // The counters round each collective's share down to whole bytes, hence the small slack.
  const double measured_comm = number_field(t, "measured_comm_bytes");
  EXPECT_NEAR(measured_comm, number_field(t, "theory_comm_bytes") * padded / psi, 64.0);
}
