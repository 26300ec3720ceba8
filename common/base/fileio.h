// fileio.h: file helpers that check and explain. Nothing is ever half-written: writes go to a
// temporary file next to the target (PATH.tmp.<host>.<pid>), are flushed to disk, then renamed over it
// (rename is atomic on POSIX file systems), so a crash leaves either the old file or the new one,
// and at worst a temporary file, which the next write of PATH removes. Every write is checked: a
// failure ends the job naming the file and the system's reason, and never replaces what was there.
// Outputs are regular files: a device, FIFO, socket or folder at an output path is never replaced.
// Two exceptions are written to directly, because nothing there is replaced: the null device
// (`--json /dev/null`, a Unix user's "discard this") and a FIFO the user named (a reader waits on it).
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

// Returns false and fills *error (naming the path and the reason) instead of throwing, so callers
// can agree collectively on failure before anyone aborts. Reads until the end of the file, so files
// whose size is unknown in advance (/proc files, which report 0) are read whole too.
bool read_whole_file(const std::string& path, std::string* contents, std::string* error);
// The first `max_bytes` of a file (fewer if it is shorter), with the same errors as read_whole_file.
bool read_file_prefix(const std::string& path, size_t max_bytes, std::string* contents, std::string* error);
// Ends the job (fatal) when it cannot: the message names `path` and the system's reason. A symbolic
// link at `path` is followed (the file it names is replaced, the link kept). The null device or a
// FIFO at `path` is written to directly (written_in_place).
void write_file_atomically(const std::string& path, const void* data, size_t bytes);
// Whether an output at `path` is written to directly rather than through a temporary and a rename:
// (a link to) the null device or a FIFO. Nothing is replaced there.
bool written_in_place(const std::string& path);
// Opens such an output for writing; -1 with *error set when it cannot. A FIFO that no process reads
// is waited for (a few seconds), then refused: an open would block until a reader comes.
int open_in_place(const std::string& path, std::string* error);
// This process's temporary for `path`: PATH.tmp.<host>.<pid>, its own, so two writers of one path
// never write one temporary.
std::string temporary_for(const std::string& path);
// Removes the temporaries of `path` (temporary_for) that writers on this host left when they died.
void remove_stale_temporaries(const std::string& path);
// What a file of this mode is, for messages: "a character device", "a FIFO", "a folder", ...
std::string file_kind(mode_t mode);
// "" when nothing is at `path` or it is (a link to) a regular file; else "'PATH' is a FIFO, not a
// regular file", the reason an output must not go there.
std::string not_regular_problem(const std::string& path);
// Writes all `bytes` to the open file `fd` (retrying short writes and interruptions). "" when all
// were written, else the system's reason (strerror of errno).
std::string write_all(int fd, const void* data, size_t bytes);
// Whether `path` can be written, found out by creating (and removing) a file beside it, so that a
// run refuses a missing or read-only folder before its work rather than after. "" when it can,
// else the reason, naming `flag` ("--save") and the folder, or what non-regular file is at `path`.
std::string writable_problem(const std::string& flag, const std::string& path);

// FNV-1a, 64-bit: a few lines, no library, and any flipped or missing byte changes it. The hash of
// checkpoint files and of the training data (a resumed run checks that the data is the same).
// `hash`: the hash of the bytes before these, to hash a file piece by piece.
constexpr uint64_t kFnv1aStart = 14695981039346656037ULL;
uint64_t fnv1a(const char* data, size_t n, uint64_t hash = kFnv1aStart);
