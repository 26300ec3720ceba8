// peer_state.cpp: see peer_state.h.
#include "base/peer_state.h"

#include <fstream>
#include <mutex>

namespace {

// Written once at start-up, read by a watchdog thread afterwards.
std::mutex g_mutex;
std::vector<int> g_pids, g_nodes;
int g_me = -1;

}  // namespace

void set_world_processes(const std::vector<int>& pids, const std::vector<int>& nodes, int me) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_pids = pids;
  g_nodes = nodes;
  g_me = me;
}

std::string stopped_or_ended_ranks(const std::vector<int>& world_ranks) {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::string text;
  if (g_me < 0 || size_t(g_me) >= g_nodes.size()) return text;
  for (int r : world_ranks) {
    if (r == g_me || r < 0 || size_t(r) >= g_pids.size() || g_nodes[size_t(r)] != g_nodes[size_t(g_me)]) continue;
    const std::string pid = std::to_string(g_pids[size_t(r)]);
    std::ifstream in("/proc/" + pid + "/stat");
    std::string stat;
    std::getline(in, stat);
    const size_t after_name = stat.rfind(')');  // "pid (name) S ...": the name may hold spaces
    const char state = after_name != std::string::npos && after_name + 2 < stat.size() ? stat[after_name + 2] : '?';
    std::string said;
    if (!in && stat.empty()) said = "has ended";
    else if (state == 'T' || state == 't') said = "is stopped (SIGSTOP, Ctrl-Z or a debugger)";
    else if (state == 'Z') said = "has ended";
    if (!said.empty()) text += (text.empty() ? "" : "; ") + ("world rank " + std::to_string(r) + " (pid " + pid + ") " + said);
  }
  return text;
}

std::string stopped_or_ended_ranks() {
  std::vector<int> everyone;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (size_t r = 0; r < g_pids.size(); r++) everyone.push_back(int(r));
  }
  return stopped_or_ended_ranks(everyone);
}
