// planner_cpu_rates.cpp: see planner_cpu_rates.h.
#include "planner/planner_cpu_rates.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

namespace {
int row_class(double rows) {
  int b = 0;
  while (b < 62 && std::ldexp(1.0, b + 1) <= rows) b++;
  return b;
}
}  // namespace

double ProductRates::at(double rows) const {
  if (by_class.empty()) return 0;
  const int b = row_class(rows);
  double best = 0;
  int best_distance = 1 << 30;
  for (const auto& [c, rate] : by_class)
    if (std::abs(c - b) < best_distance) best_distance = std::abs(c - b), best = rate;  // increasing: the lower wins a tie
  return best;
}

bool parse_product_rates(const std::string& text, ProductRates* out, std::string* error) {
  ProductRates rates;
  for (size_t begin = 0; begin <= text.size();) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, comma - begin);
    begin = comma + 1;
    const size_t colon = item.find(':');
    char* end = nullptr;
    const double rows = colon == std::string::npos ? 0 : std::strtod(item.c_str(), &end);
    const bool rows_ok = colon != std::string::npos && end == item.c_str() + colon && rows >= 1;
    const double rate = rows_ok ? std::strtod(item.c_str() + colon + 1, &end) : 0;
    if (!rows_ok || *end != '\0' || !(rate > 0) || !std::isfinite(rate)) {
      *error = "'" + item + "' is not ROWS:FLOPS (a row count of 1 or more, a rate above 0)";
      return false;
    }
    const int b = row_class(rows);
    for (const auto& have : rates.by_class)
      if (have.first == b) {
        *error = "two rates for the class of " + std::to_string(int64_t(std::ldexp(1.0, b))) + " rows";
        return false;
      }
    rates.by_class.push_back({b, rate});
  }
  std::sort(rates.by_class.begin(), rates.by_class.end());
  *out = rates;
  return true;
}

RingExposure ring_exposed(int cp, double hop, double forward_step, double backward_step) {
  RingExposure e;
  if (cp < 2) return e;
  e.forward = (cp - 1) * std::max(0.0, hop - forward_step);
  for (int s = 0; s < cp; s++) {
    const int messages = (s <= cp - 2) + (s >= 2);
    e.backward += std::max(0.0, messages * hop - backward_step);
  }
  e.backward += hop;
  return e;
}
