// check.cpp: the error paths of check.h. Every one of them ends the whole job, never one rank alone:
// a rank that exits by itself leaves its peers blocked forever inside the next collective, and the
// job hangs instead of failing. MPI_Abort tells the process manager (mpiexec) to kill every rank;
// where every rank is known to end at once (a refusal of the configuration), each finalizes MPI and
// exits instead, which ends the job as cleanly as a successful run does.
#include "base/check.h"

#include <mpi.h>
#include <unistd.h>  // gethostname

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <new>
#include <thread>

namespace {

// Written once by set_error_context, before the communication thread starts; read by any thread
// that fails. Atomic so that a failure racing with start-up is still well defined.
std::atomic<int> g_rank{-1};
char g_host[256] = "";  // filled in before g_rank is published (release/acquire below)
std::mutex g_phase_mutex;  // the phase is set by the training thread, read by the comm thread
std::string g_phase;
std::function<void(const std::string&)> g_fatal_hook;
std::atomic<bool> g_fatal_hook_ran{false};

void run_fatal_hook(const std::string& msg) {
  if (g_fatal_hook && !g_fatal_hook_ran.exchange(true)) g_fatal_hook(msg);
}

// Not through MPI_CHECK: this is the error path itself, and must not recurse into it.
bool mpi_running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

// "[rank 3@node7]", or "[rank ?@node7]" before the communicator knows its rank.
std::string where() {
  int rank = g_rank.load(std::memory_order_acquire);
  char host[256] = "";
  if (rank >= 0) {
    std::snprintf(host, sizeof host, "%s", g_host);
  } else if (gethostname(host, sizeof host - 1) != 0) {
    std::snprintf(host, sizeof host, "?");
  }
  return "[rank " + (rank >= 0 ? std::to_string(rank) : std::string("?")) + "@" + host + "]";
}

// One fprintf per message, so that lines of different threads or ranks do not interleave mid-line.
void print_error(const std::string& text) {
  std::fflush(stdout);  // whatever the rank printed before the error comes first
  std::fprintf(stderr, "%s\n", text.c_str());
  std::fflush(stderr);
}

[[noreturn]] void abort_job() {
  if (mpi_running()) {
    // mpiexec forwards our stderr through a pipe; an abort right after the write sometimes tears
    // the job down before the message is forwarded. A moment's pause lets it out.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  // Without MPI there are no peers to take down. MPI_Abort does not return either, but it is not
  // declared [[noreturn]], so the fall-through must end the process too.
  std::exit(1);
}

// Every rank of the job is ending here for the same reason: MPI_Finalize waits for all of them, then
// each exits with `code`. If a rank came here alone (a bug: the error was not collective), its
// peers never join; rather than hang, a timer ends the job the old way.
[[noreturn]] void end_every_rank(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (mpi_running()) {
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::duration<double>(kCollectiveExitWaitS));
      print_error(where() + " error: the other ranks did not end with this one; aborting the job");
      MPI_Abort(MPI_COMM_WORLD, 1);
    }).detach();
    MPI_Finalize();
  }
  // _Exit: the communicators and their progress thread live on in main()'s frame; running the
  // static destructors under them would race with that thread. What must reach a file is flushed.
  std::fflush(nullptr);
  std::_Exit(code);
}

// No input may end a run with an uncaught exception (the bare "terminate called after throwing ..."
// of one rank, then mpiexec's "BAD TERMINATION"): whatever escapes, from any thread, ends the job
// through fatal(), with the exception's message, on every rank. Installed when the program starts.
[[noreturn]] void on_terminate() {
  std::string what = "std::terminate was called without an exception";
  if (std::exception_ptr current = std::current_exception()) {
    try {
      std::rethrow_exception(current);
    } catch (const std::bad_alloc&) {
      what = "out of memory (std::bad_alloc)";
    } catch (const std::exception& e) {
      what = std::string("uncaught exception: ") + e.what();
    } catch (...) {
      what = "an uncaught exception of an unknown type";
    }
  }
  std::set_terminate(std::abort);  // should the error path itself throw
  fatal(what + " (an unforeseen error: please report it with the command line)");
}

[[maybe_unused]] const bool g_terminate_installed = (std::set_terminate(on_terminate), true);

}  // namespace

void set_error_context(int rank, int /*world_size*/) {
  if (gethostname(g_host, sizeof g_host - 1) != 0) std::snprintf(g_host, sizeof g_host, "?");
  g_rank.store(rank, std::memory_order_release);
}

void set_error_phase(const std::string& phase) {
  std::lock_guard<std::mutex> lock(g_phase_mutex);
  g_phase = phase;
}

std::string error_phase() {
  std::lock_guard<std::mutex> lock(g_phase_mutex);
  return g_phase;
}

void set_fatal_hook(std::function<void(const std::string&)> hook) { g_fatal_hook = std::move(hook); }

void fatal(const std::string& msg) {
  print_error(where() + " error: " + msg);
  run_fatal_hook(msg);
  abort_job();
}

void config_error(const std::string& msg) {
  // Every rank found the same error; one message is enough: rank 0's, or this process's before MPI
  // knows its rank (then every process prints it, as before MPI every process is alone).
  if (g_rank.load(std::memory_order_acquire) <= 0) print_error("error: " + msg);
  end_every_rank(1);
}

void agreed_error(const std::string& msg, bool print_here) {
  if (print_here) {
    print_error(where() + " error: " + msg);
    run_fatal_hook(msg);
  }
  end_every_rank(1);
}

void end_job(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (mpi_running()) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

void library_error(const char* library, const std::string& what, const char* call, const char* file, int line) {
  print_error(where() + " error: " + library + " error at " + file + ":" + std::to_string(line) + ": " + what +
              "\n    in: " + call);
  run_fatal_hook(std::string(library) + " error: " + what);
  abort_job();
}

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "unknown MPI error code " + std::to_string(code);
  return std::string(text, length);
}
