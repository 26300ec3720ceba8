// metrics.cpp: see metrics.h.
#include "metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>

#include "check.h"

void JsonObject::key(const std::string& k) {
  if (!body_.empty()) body_ += ",";
  body_ += "\"" + k + "\":";
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
  std::string partial = path + ".partial";
  file_ = std::fopen(partial.c_str(), "w");
  if (!file_) fatal("cannot write '" + partial + "': " + std::strerror(errno) + " (does the folder exist?)");
}

bool JsonLinesWriter::is_open() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return file_ != nullptr;
}

void JsonLinesWriter::write(const JsonObject& object) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!file_) return;
  std::fprintf(file_, "%s\n", object.str().c_str());
  std::fflush(file_);
}

void JsonLinesWriter::abort(const std::string& error) {
  write(JsonObject().add("type", "summary").add("ended", "aborted").add("error", error));
  close();
}

void JsonLinesWriter::close() {
  const std::string partial = path_ + ".partial";
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!file_) return;
    std::fclose(file_);
    file_ = nullptr;
    if (std::rename(partial.c_str(), path_.c_str()) == 0) return;
  }
  // Outside the lock: fatal() runs the fatal hook, which may come back here.
  fatal("cannot rename '" + partial + "' to '" + path_ + "': " + std::strerror(errno));
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
