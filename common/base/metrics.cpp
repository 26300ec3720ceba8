// metrics.cpp: see metrics.h.
#include "base/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "base/fileio.h"  // write_all, not_regular_problem, temporary_for, written_in_place

void JsonObject::key(const std::string& k) {
  if (!body_.empty()) body_ += ",";
  body_ += "\"" + k + "\":";
}

JsonObject& JsonObject::add(const JsonObject& fields) {
  if (fields.body_.empty()) return *this;
  if (!body_.empty()) body_ += ",";
  body_ += fields.body_;
  return *this;
}

JsonObject& JsonObject::add(const std::string& k, const std::string& value) {
  key(k);
  body_ += "\"";
  for (char c : value) {
    if (c == '"' || c == '\\') body_ += '\\';
    body_ += (c == '\n') ? ' ' : c;
  }
  body_ += "\"";
  return *this;
}

JsonObject& JsonObject::add(const std::string& k, double value) {
  key(k);
  char buf[64];
  if (std::isfinite(value)) std::snprintf(buf, sizeof buf, "%.9g", value);
  else std::snprintf(buf, sizeof buf, "null");  // JSON has no NaN or inf
  body_ += buf;
  return *this;
}

JsonObject& JsonObject::add(const std::string& k, int64_t value) {
  key(k);
  body_ += std::to_string(value);
  return *this;
}

JsonObject& JsonObject::add(const std::string& k, bool value) {
  key(k);
  body_ += value ? "true" : "false";
  return *this;
}

JsonLinesWriter::~JsonLinesWriter() { close(); }

void JsonLinesWriter::open(const std::string& path) {
  path_ = path;
  const std::string problem = not_regular_problem(path);
  if (written_in_place(path)) {
    std::string error;
    const int fd = open_in_place(path, &error);
    if (fd < 0) fatal("cannot write '" + path + "': " + error);
    std::lock_guard<std::mutex> lock(mutex_);
    temporary_.clear();
    fd_ = fd;
    written_ = 0;
    return;
  }
  if (!problem.empty()) fatal("cannot write '" + path + "': " + problem + "; it is left as it is");
  remove_stale_temporaries(path);
  const std::string temporary = temporary_for(path);
  // Never through a link, and never blocking on a FIFO that someone left at the temporary's path:
  // then the open fails, or the check below refuses what was opened.
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd < 0) fatal("cannot write '" + temporary + "': " + std::strerror(errno) + " (does the folder exist?)");
  struct stat info;
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    fatal("cannot write '" + temporary + "': it is not a regular file; it is left as it is");
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  std::lock_guard<std::mutex> lock(mutex_);
  temporary_ = temporary;
  fd_ = fd;
  written_ = 0;
}

bool JsonLinesWriter::is_open() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return fd_ >= 0;
}

void JsonLinesWriter::write(const JsonObject& object) {
  const std::string line = object.str() + "\n";
  std::string error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (fd_ < 0) return;
    error = write_all(fd_, line.data(), line.size());
    if (error.empty()) {
      written_ += int64_t(line.size());
      return;
    }
    // Whatever part of the record reached the file goes: the file ends at its last whole record,
    // and is renamed into place with those (no summary: the run did not end by itself).
    if (ftruncate(fd_, off_t(written_)) != 0) error += "; and cutting it back failed: " + std::string(std::strerror(errno));
    const std::string closing = close_locked();
    if (!closing.empty()) error += "; " + closing;
  }
  // Outside the lock: fatal() runs the fatal hook, which comes back here (the file is closed now).
  fatal("cannot write '" + path_ + "': " + error + "; the file ends at its last whole record (" +
        std::to_string(written_) + " bytes)");
}

void JsonLinesWriter::abort(const std::string& error) {
  write(JsonObject().add("type", "summary").add("ended", "aborted").add("error", error));
  close();
}

std::string JsonLinesWriter::close_locked() {
  if (fd_ < 0) return "";
  std::string error;
  const std::string written_to = temporary_.empty() ? path_ : temporary_;
  if (::close(fd_) != 0) error = "closing '" + written_to + "': " + std::strerror(errno);
  fd_ = -1;
  if (temporary_.empty()) return error;
  const std::string problem = not_regular_problem(path_);  // it may have changed since open()
  if (!problem.empty()) return error + (error.empty() ? "" : "; ") + problem + "; the records stay in '" + temporary_ + "'";
  if (std::rename(temporary_.c_str(), path_.c_str()) != 0)
    error += (error.empty() ? "" : "; ") + std::string("cannot rename '") + temporary_ + "' to '" + path_ + "': " + std::strerror(errno);
  return error;
}

void JsonLinesWriter::close() {
  std::string error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error = close_locked();
  }
  // Outside the lock: fatal() runs the fatal hook, which may come back here.
  if (!error.empty()) fatal(error);
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (std::fabs(bytes) >= 1000 && u < 4) {
    bytes /= 1000;
    u++;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

std::string format_count(double value) {
  char buf[32];
  if (value >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", value / 1e6);
  else if (value >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", value / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", value);
  return buf;
}

std::string format_rate(double value) {
  // 1.9e-3 rather than printf's 1.9e-03: the step line stays short.
  if (value == 0) return "0";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1e", value);
  std::string s = buf;
  const size_t e = s.find('e');
  if (e == std::string::npos) return s;
  std::string mantissa = s.substr(0, e), exponent = s.substr(e + 1);
  const char sign = exponent[0] == '-' ? '-' : 0;
  if (exponent[0] == '-' || exponent[0] == '+') exponent.erase(0, 1);
  while (exponent.size() > 1 && exponent[0] == '0') exponent.erase(0, 1);
  return mantissa + "e" + (sign ? std::string(1, sign) : std::string()) + exponent;
}

std::string step_line(const StepLine& s) {
  char norm[32];
  std::snprintf(norm, sizeof norm, std::fabs(s.grad_norm) < 100 ? "%.2f" : "%.0f", s.grad_norm);
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "step %d/%d | loss %.4f | lr %s | grad norm %s | %.1f ms | %s tok/s | exposed comm %.1f ms | mem %s",
                s.step, s.steps, s.loss, format_rate(s.lr).c_str(), norm, s.step_ms, format_count(s.tokens_per_s).c_str(),
                s.exposed_comm_ms, format_bytes(s.mem_bytes).c_str());
  return buf;
}
