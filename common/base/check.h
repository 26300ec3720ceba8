// check.h: errors are loud, early and collective.
// Defines MPI_CHECK (every MPI call goes through it), fatal() for errors found by one rank, and
// config_error() for errors every rank finds identically (bad flags, sizes that do not divide), and
// agreed_error() for errors every rank has agreed on (Communicator::agree_or_die). fatal() ends the
// whole job with MPI_Abort, because one rank exiting alone leaves its peers hung inside a collective.
// The other two know that every rank is there: each rank finalizes MPI and exits non-zero, so the
// message is the last thing printed, not buried under the process manager's abort report.
// CUDA_CHECK, CUBLAS_CHECK and NCCL_CHECK live in cuda_check.h, next to the CUDA code.
#pragma once
#include <functional>
#include <string>

// Called once by the communicator after MPI_Init, so messages can name the rank and host.
void set_error_context(int rank, int world_size);
// What the rank is doing ("step 12"), for messages that need it (the communicator's watchdog).
// Thread-safe; error_phase() returns "" until it is set.
void set_error_phase(const std::string& phase);
std::string error_phase();

// Run once, with the message, when this rank ends the job through fatal() or library_error(): rank 0
// closes its JSON output there, marked aborted, so that what the run measured is not left behind as
// a .partial file. May be called from any thread; set it before the work starts.
void set_fatal_hook(std::function<void(const std::string& msg)> hook);

// Prints "[rank r@host] error: <msg>" and aborts every rank. Use for errors one rank discovers alone.
[[noreturn]] void fatal(const std::string& msg);

// For errors that every rank discovers identically, before the work: only rank 0 prints "error: msg",
// then every rank ends (MPI_Finalize, exit code 1). Call it on every rank or on none: a rank that
// calls it alone waits in MPI_Finalize for the others, and after kCollectiveExitWaitS seconds aborts
// the job, saying so.
[[noreturn]] void config_error(const std::string& msg);

// For an error that every rank has agreed on (a collective told them all): the rank whose message it
// is prints it (print_here), and every rank ends as config_error() does.
[[noreturn]] void agreed_error(const std::string& msg, bool print_here);

// How long a rank ending through config_error() or agreed_error() waits for the others in MPI_Finalize.
constexpr double kCollectiveExitWaitS = 10;

// Ends every rank of the job with exit code `code`, after the work is done and written: the
// interrupted run's ending (training_run.cpp says why it cannot simply return the code).
[[noreturn]] void end_job(int code);

// Aborts the job with the library's message, the rank, host and the call site.
[[noreturn]] void library_error(const char* library, const std::string& what, const char* call,
                                const char* file, int line);

#define MPI_CHECK(call)                                                          \
  do {                                                                           \
    int mpi_status_ = (call);                                                    \
    if (mpi_status_ != 0) library_error("MPI", mpi_error_string(mpi_status_),    \
                                        #call, __FILE__, __LINE__);              \
  } while (0)

std::string mpi_error_string(int code);

// Checks an invariant of our own code (not user input); aborts the job with the call site if false.
#define ENSURE(cond, msg)                                                        \
  do {                                                                           \
    if (!(cond)) library_error("internal", (msg), #cond, __FILE__, __LINE__);    \
  } while (0)
