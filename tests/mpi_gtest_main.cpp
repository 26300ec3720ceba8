// mpi_gtest_main.cpp: the GoogleTest main of tests that run under mpiexec (mpiexec -n 4 ./test_comm).
// Defines main() and test_comm() of mpi_test_env.h.
//
// Every rank runs every test, in the same order. What this main adds to gtest is honest, readable
// output: only rank 0 prints, in gtest's usual format, but a test counts as failed when it failed on
// ANY rank. After each test the ranks agree on the result (one small collective; collective-safe
// because all ranks end the same tests in the same order). Failure messages of other ranks go to
// stderr, each line prefixed with "[rank r]". The exit code is non-zero on every rank if any test
// failed anywhere, so mpiexec and CI see the failure.
//
// The agreement uses MPI_COMM_WORLD directly, not the Communicator: the harness must not add calls,
// bytes or emulated link time to the communicator whose statistics the tests check. (The communicator
// works on its own duplicate of MPI_COMM_WORLD, so the two never mix.)
//
// --gtest_shuffle needs an explicit --gtest_random_seed=N, or each rank picks its own order.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdarg>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "base/check.h"
#include "comm/comm.h"
#include "mpi_test_env.h"

namespace {

Communicator* g_comm = nullptr;

std::string count_of(int n, const char* noun) {  // "1 test", "3 tests", as gtest writes counts
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

std::string test_name(const testing::TestInfo& t) { return std::string(t.test_suite_name()) + "." + t.name(); }

// gtest's text for a failure or skip: "file:line: Failure\n<message>".
std::string part_text(const testing::TestPartResult& r) {
  std::string where = r.file_name() ? r.file_name() : "unknown file";
  if (r.line_number() >= 0) where += ":" + std::to_string(r.line_number());
  return where + ": " + (r.skipped() ? "Skipped" : "Failure") + "\n" + r.message();
}

class MpiResultPrinter : public testing::EmptyTestEventListener {
 public:
  MpiResultPrinter(int rank, int size) : rank_(rank), size_(size) {}

  bool any_failed() const { return any_failed_; }

  void OnTestIterationStart(const testing::UnitTest& u, int /*iteration*/) override {
    passed_ = 0;  // counts per iteration, as gtest's with --gtest_repeat
    skipped_.clear();
    failed_.clear();
    const std::string filter = GTEST_FLAG_GET(filter);
    if (filter != "*") print("Note: Google Test filter = %s\n", filter.c_str());
    print("[==========] Running %s from %s.\n", count_of(u.test_to_run_count(), "test").c_str(),
          count_of(u.test_suite_to_run_count(), "test suite").c_str());
    print("[==========] On %s; a test fails if it fails on any rank.\n", count_of(size_, "rank").c_str());
  }
  void OnEnvironmentsSetUpStart(const testing::UnitTest&) override {
    print("[----------] Global test environment set-up.\n");
  }
  void OnTestSuiteStart(const testing::TestSuite& s) override {
    print("[----------] %s from %s\n", count_of(s.test_to_run_count(), "test").c_str(), s.name());
  }
  void OnTestStart(const testing::TestInfo& t) override { print("[ RUN      ] %s\n", test_name(t).c_str()); }

  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.type() == testing::TestPartResult::kSuccess) return;
    const std::string text = part_text(r);
    if (rank_ == 0) {
      print("%s\n", text.c_str());
    } else if (r.failed()) {  // a skip looks the same on every rank; rank 0 reports it
      std::string prefixed;
      size_t begin = 0;
      while (begin <= text.size()) {
        size_t end = text.find('\n', begin);
        if (end == std::string::npos) end = text.size();
        prefixed += "[rank " + std::to_string(rank_) + "] " + text.substr(begin, end - begin) + "\n";
        begin = end + 1;
      }
      std::fprintf(stderr, "%s", prefixed.c_str());
      std::fflush(stderr);
    }
  }

  void OnTestEnd(const testing::TestInfo& t) override {
    // Every rank learns which ranks failed this test.
    int failed_here = t.result()->Failed() ? 1 : 0;
    std::vector<int> failed_on(size_);
    MPI_CHECK(MPI_Allgather(&failed_here, 1, MPI_INT, failed_on.data(), 1, MPI_INT, MPI_COMM_WORLD));
    std::string ranks;
    for (int r = 0; r < size_; r++)
      if (failed_on[r]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);

    const long long ms = (long long)t.result()->elapsed_time();
    if (!ranks.empty()) {
      failed_.push_back(test_name(t));
      any_failed_ = true;
      print("failed on rank %s of %d%s\n", ranks.c_str(), size_,
            ranks == "0" ? "" : " (messages of ranks other than 0 are on stderr)");
      print("[  FAILED  ] %s (%lld ms)\n", test_name(t).c_str(), ms);
    } else if (t.result()->Skipped()) {
      skipped_.push_back(test_name(t));
      print("[  SKIPPED ] %s (%lld ms)\n", test_name(t).c_str(), ms);
    } else {
      passed_++;
      print("[       OK ] %s (%lld ms)\n", test_name(t).c_str(), ms);
    }
  }

  void OnTestSuiteEnd(const testing::TestSuite& s) override {
    print("[----------] %s from %s (%lld ms total)\n\n", count_of(s.test_to_run_count(), "test").c_str(), s.name(),
          (long long)s.elapsed_time());
  }
  void OnEnvironmentsTearDownStart(const testing::UnitTest&) override {
    print("[----------] Global test environment tear-down\n");
  }

  // The summary, in gtest's words, from the counts every rank agreed on.
  void OnTestIterationEnd(const testing::UnitTest& u, int /*iteration*/) override {
    print("[==========] %s from %s ran. (%lld ms total)\n", count_of(u.test_to_run_count(), "test").c_str(),
          count_of(u.test_suite_to_run_count(), "test suite").c_str(), (long long)u.elapsed_time());
    print("[  PASSED  ] %s.\n", count_of(passed_, "test").c_str());
    if (!skipped_.empty()) {
      print("[  SKIPPED ] %s, listed below:\n", count_of(int(skipped_.size()), "test").c_str());
      for (const std::string& name : skipped_) print("[  SKIPPED ] %s\n", name.c_str());
    }
    if (!failed_.empty()) {
      const int n = int(failed_.size());
      print("[  FAILED  ] %s, listed below:\n", count_of(n, "test").c_str());
      for (const std::string& name : failed_) print("[  FAILED  ] %s\n", name.c_str());
      print("\n%2d FAILED %s\n", n, n == 1 ? "TEST" : "TESTS");
    }
    const int disabled = u.reportable_disabled_test_count();
    if (disabled > 0 && !GTEST_FLAG_GET(also_run_disabled_tests)) {
      if (failed_.empty()) print("\n");
      print("  YOU HAVE %d DISABLED %s\n\n", disabled, disabled == 1 ? "TEST" : "TESTS");
    }
  }

 private:
  // Rank 0 speaks for the job. Flushed at once, so that its lines and other ranks' stderr arrive
  // through mpiexec in roughly the order they happened.
  __attribute__((format(printf, 2, 3))) void print(const char* format, ...) {
    if (rank_ != 0) return;
    va_list args;
    va_start(args, format);
    std::vprintf(format, args);
    va_end(args);
    std::fflush(stdout);
  }

  int rank_, size_;
  int passed_ = 0;
  std::vector<std::string> skipped_, failed_;
  bool any_failed_ = false;  // in any iteration
};

}  // namespace

Communicator& test_comm() {
  ENSURE(g_comm != nullptr, "test_comm() used outside the tests' run");
  return *g_comm;
}

int main(int argc, char** argv) {
  std::unique_ptr<Communicator> comm = init_mpi_communicator(&argc, &argv);
  g_comm = comm.get();
  testing::InitGoogleTest(&argc, argv);

  // Replace gtest's printer on every rank: rank 0 prints through ours, the others print only their
  // failures.
  testing::TestEventListeners& listeners = testing::UnitTest::GetInstance()->listeners();
  delete listeners.Release(listeners.default_result_printer());
  auto* printer = new MpiResultPrinter(comm->rank(), comm->size());
  listeners.Append(printer);  // gtest owns it from here on

  const int local_result = RUN_ALL_TESTS();
  // The printer's verdict is already the same on every rank; the local result also covers failures
  // outside any test (a global environment), which one rank may see alone.
  int failed = (printer->any_failed() || local_result != 0) ? 1 : 0;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));

  g_comm = nullptr;
  shutdown_mpi(std::move(comm));
  return failed;
}
