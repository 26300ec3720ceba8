// fileio.h: file helpers that check and explain. Nothing is ever half-written: writes go to a
// temporary file next to the target, are flushed to disk, then renamed over it (rename is atomic
// on POSIX file systems), so a crash leaves either the old file or the new one.
#pragma once
#include <cstddef>
#include <string>

// Returns false and fills *error (naming the path and the reason) instead of throwing, so callers
// can agree collectively on failure before anyone aborts.
bool read_whole_file(const std::string& path, std::string* contents, std::string* error);
void write_file_atomically(const std::string& path, const void* data, size_t bytes);
