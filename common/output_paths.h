// output_paths.h: the files a run reads and writes, checked before the work against what is at their
// paths and against each other, so that no output replaces an input, another output or something
// that is not a file. Defines RunPaths and run_paths_problem().
//
// Refused (each with a message naming the flags and the path):
// - an output (--save, --json, --trace) whose folder is missing or read-only, or at whose path there
//   is a folder, a device, a FIFO or a socket (a write renames a new file over the path);
// - any two of --data, --save, --json, --trace naming the same file;
// - --resume or --init-from naming the same file as --data, --json or --trace.
// "The same file": the same device and inode where the file exists, else the same absolute path
// once its folder's links and "." and ".." are resolved. A --save with {step} names every path
// with a number there. --resume R --save R is allowed: the new checkpoint replaces R only once it
// is complete (fileio.h).
#pragma once
#include <string>

struct RunPaths {
  std::string data, resume, init_from;  // inputs ("" when not given)
  std::string save, json, trace;        // outputs ("" when not given); save may hold "{step}"
};

// "" when the run may go on, else the message.
std::string run_paths_problem(const RunPaths& paths);
