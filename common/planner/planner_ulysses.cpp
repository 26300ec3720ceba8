// planner_ulysses.cpp: the planner's Ulysses formulas (planner_ulysses.h; docs/theory.md, section 13b).
// Written from the derivation, not from the chapters' code, so that plan-check compares two accounts.
#include "planner/planner_ulysses.h"

#include <initializer_list>

namespace {
// One all-to-all of `parts` tensors' worth a position: its bytes sent and its modelled seconds.
double sent(const UlyssesExchange& x, double parts) {
  return x.u <= 1 ? 0.0 : double(x.u - 1) / x.u * x.rows * parts * x.width * x.element;
}
double seconds(const UlyssesExchange& x, const LinkModel& link, std::initializer_list<double> exchanges) {
  double s = 0;
  for (double parts : exchanges)
    s += modelled_ms(link, CollectiveKind::AllToAll, int64_t(x.rows * parts * x.width * x.element), x.u) / 1e3;
  return s;
}
}  // namespace

std::string ulysses_split_problem(int u, int NH, int tp, int T, int cp) {
  if (u < 1) return "--ulysses " + std::to_string(u) + ": at least 1";
  if (u == 1) return "";
  if (NH % tp || (NH / tp) % u)
    return "--ulysses " + std::to_string(u) + ": the " + std::to_string(NH) + " heads over tp " + std::to_string(tp) +
           " do not split into " + std::to_string(u) + " whole groups (NH/(t u))";
  if (T % cp || (T / cp) % u)
    return "--ulysses " + std::to_string(u) + ": a CP place's " + std::to_string(T / cp) + " positions (T/cp) do not "
           "split into " + std::to_string(u) + " equal slices";
  return "";
}

double UlyssesExchange::forward_bytes(int passes) const { return passes * sent(*this, forward_parts()); }

double UlyssesExchange::backward_bytes(bool keeps_heads) const { return sent(*this, backward_parts(keeps_heads)); }

double UlyssesExchange::forward_seconds(const LinkModel& link, int passes) const {
  return passes * seconds(*this, link, {3, 1});
}

double UlyssesExchange::backward_seconds(const LinkModel& link, bool keeps_heads) const {
  return keeps_heads ? seconds(*this, link, {1, 3}) : seconds(*this, link, {3, 1, 1, 3});
}

double ulysses_exchange_buffer_bytes(double rows, double width, double element) { return 14 * rows * width * element; }
