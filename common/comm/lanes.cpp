// lanes.cpp: see lanes.h.
#include "comm/lanes.h"

#include <utility>
#include <vector>

namespace {
thread_local Lane t_lane = Lane::Forward;
thread_local bool t_in_pair = false;
std::mutex g_pair_buffers_mutex;  // both lanes hand buffers over at once
std::vector<Buffer> g_pair_buffers;
}  // namespace

Lane current_lane() { return t_lane; }
int lane_index() { return int(t_lane); }
const char* lane_name(Lane lane) { return lane == Lane::Forward ? "forward" : "backward"; }

LaneScope::LaneScope(Lane lane) : previous_(t_lane) { t_lane = lane; }
LaneScope::~LaneScope() { t_lane = previous_; }

LaneThread::LaneThread() : thread_([this] { main(); }) {}

LaneThread::~LaneThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void LaneThread::start(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mutex_);
  task_ = std::move(task);
  busy_ = true;
  cv_.notify_all();
}

void LaneThread::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return !busy_; });
}

void LaneThread::main() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return busy_ || stopping_; });
    if (busy_) {
      std::function<void()> task = std::move(task_);
      lock.unlock();
      task();
      lock.lock();
      busy_ = false;
      cv_.notify_all();
      continue;
    }
    return;  // stopping, nothing to run
  }
}

LaneCommunicator::LaneCommunicator(Communicator& group)
    : group_comm_(group), copy_(group.duplicate(group.group() + " (backward lane)")) {
  rank_ = group.rank();
  size_ = group.size();
  device_ = group.device();
  name_ = group.name();
  group_ = group.group();
  link_ = group.link_model();
  share_formats_of(group);
}

LaneCommunicator::LaneCommunicator(std::unique_ptr<Communicator> group) : LaneCommunicator(*group) {
  owned_ = std::move(group);
}

Communicator& lane_of(Communicator& group, Lane lane) {
  auto* lanes = dynamic_cast<LaneCommunicator*>(&group);
  return lanes ? lanes->of(lane) : group;
}

const CommStats& LaneCommunicator::stats() const {
  both_ = group_comm_.stats();
  both_ += copy_->stats();
  return both_;
}

void LaneCommunicator::collect_stats() {
  group_comm_.collect_stats();
  copy_->collect_stats();
}

void LaneCommunicator::set_link_model(LinkModel link) {
  link_ = link;
  group_comm_.set_link_model(link);
  copy_->set_link_model(link);
}

PairScope::PairScope() : previous_(t_in_pair) { t_in_pair = true; }
PairScope::~PairScope() { t_in_pair = previous_; }

void free_when_pair_ends(Buffer& buffer) {
  if (!t_in_pair) {
    buffer = Buffer();
    return;
  }
  std::lock_guard<std::mutex> lock(g_pair_buffers_mutex);
  g_pair_buffers.push_back(std::move(buffer));
  buffer = Buffer();
}

void free_pair_buffers() {
  std::vector<Buffer> held;
  {
    std::lock_guard<std::mutex> lock(g_pair_buffers_mutex);
    held.swap(g_pair_buffers);
  }
}
