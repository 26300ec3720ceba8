// output_paths.h: the files a run reads and writes, checked before the work against what is at their
// paths and against each other, so that no output replaces an input, another output or something
// that is not a file. Defines RunPaths and run_paths_problem().
//
// Refused (each with a message naming the flags and the path):
// - an output (--save, --json, --trace) whose folder is missing or read-only, or at whose path there
//   is a folder, a device or a socket (a write renames a new file over the path); the null device
//   and a FIFO are written to directly, so nothing is replaced (fileio.h, written_in_place);
// - any two of --data, --save, --json, --trace naming the same file;
// - --resume or --init-from naming the same file as --data, --json or --trace.
// "The same file": the same device and inode where the file exists, else the same absolute path
// once its folder's links and "." and ".." are resolved. A --save with {step} names every path
// with a number there. --resume R --save R is allowed: the new checkpoint replaces R only once it
// is complete (fileio.h).
// Also defines lock_outputs(): a run refuses an output that another live run is writing.
#pragma once
#include <string>

struct RunPaths {
  std::string data, resume, init_from;  // inputs ("" when not given)
  std::string save, json, trace;        // outputs ("" when not given); save may hold "{step}"
};

// "" when the run may go on, else the message.
std::string run_paths_problem(const RunPaths& paths);

// Takes an advisory lock (flock) on PATH.lock beside each output this process writes through a
// temporary (--json, --trace, and --save without {step}), and writes into it who holds it. The lock
// goes with the process however it ends; a lock file left by a process that died holds no lock, and
// the next run takes it over. "" when every lock was taken, else the message: the flag, the path and
// the holder (its pid, host and command line).
std::string lock_outputs(const RunPaths& paths);
// Removes the lock files and lets the locks go, once every output is written.
void release_output_locks();
