// metrics.h: what a run reports, for people and for plots. Defines JsonObject (a flat JSON object
// builder), JsonLinesWriter (one object per line, written to this process's own temporary and
// renamed into place when the run ends, so the file is never half-written; a write that fails ends
// the job and leaves the file at its last whole record; /dev/null or a FIFO is written directly), format_bytes() and the one step line every chapter prints (StepLine):
//   step 5/30 | loss 4.8356 | lr 1.9e-3 | grad norm 0.92 | 15.1 ms | 34.6k tok/s | exposed comm 0.4 ms | mem 3.8 MB
#pragma once
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

class JsonObject {
 public:
  JsonObject& add(const std::string& key, const std::string& value);
  JsonObject& add(const std::string& key, const char* value) { return add(key, std::string(value)); }
  JsonObject& add(const std::string& key, double value);
  JsonObject& add(const std::string& key, int64_t value);
  JsonObject& add(const std::string& key, int value) { return add(key, int64_t(value)); }
  JsonObject& add(const std::string& key, bool value);
  JsonObject& add(const JsonObject& fields);  // every field of `fields`, after these
  std::string str() const { return "{" + body_ + "}"; }

 private:
  void key(const std::string& k);
  std::string body_;
};

class JsonLinesWriter {
 public:
  JsonLinesWriter() = default;
  ~JsonLinesWriter();
  // Writes to temporary_for(path) (fileio.h: PATH.tmp.<host>.<pid>) until close(); to the null device
  // or a FIFO directly.
  void open(const std::string& path);
  bool is_open() const;
  // One whole line, in one write. If it fails (a full disk), the file is cut back to the records
  // before it and renamed into place, and the job ends (fatal) naming the file and the reason.
  void write(const JsonObject& object);
  void close();  // renames into place
  // From any thread, when the job is being ended by an error (check.h's fatal hook): a last record
  // {"type":"summary","ended":"aborted","error":...}, then close().
  void abort(const std::string& error);

 private:
  // Closes the file and renames it into place; "" or the reason it failed. Under mutex_.
  std::string close_locked();

  mutable std::mutex mutex_;  // the main thread writes; abort() may come from the communication thread
  std::string path_;
  std::string temporary_;  // "" when written in place
  int fd_ = -1;
  int64_t written_ = 0;  // bytes of whole records
};

std::string format_bytes(double bytes);   // "18.2 MB" (decimal units, as the step line uses)
std::string format_count(double value);   // "12.4k"

std::string format_rate(double value);   // "1.9e-3" (a learning rate: two digits, no padded exponent)

// What the step line shows: step of steps (the run's --steps; step 0 is warm-up), the loss averaged
// over ranks, the step's learning rate and gradient norm, time, throughput, exposed communication and
// this rank's peak memory.
struct StepLine {
  int step = 0, steps = 0;
  double loss = 0, lr = 0, grad_norm = 0, step_ms = 0, tokens_per_s = 0, exposed_comm_ms = 0, mem_bytes = 0;
};
std::string step_line(const StepLine& line);
