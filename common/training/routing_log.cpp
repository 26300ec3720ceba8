// routing_log.cpp: chapter 12's routing per micro-batch and block (routing_log.h).
#include "training/routing_log.h"

#include <algorithm>
#include <string>

#include "ops/memory.h"   // Buffer
#include "base/metrics.h"  // JsonObject
#include "model/moe.h"      // MoELayer::capacity_of

RoutingLog::RoutingLog(int micro_batches, int L, int E, int k, double capacity_factor, int ranks, int64_t record)
    : m_(micro_batches), L_(L), E_(E), k_(k), factor_(capacity_factor), ranks_(ranks), record_(record),
      data_(size_t(int64_t(micro_batches) * L * ranks * record), 0), held_(size_t(micro_batches * L), 0) {}

void RoutingLog::keep(int micro, int layer, const int32_t* gathered) {
  std::copy(gathered, gathered + ranks_ * record_, &data_[size_t((micro * L_ + layer) * ranks_ * record_)]);
  held_[size_t(micro * L_ + layer)] = 1;
}

void RoutingLog::clear() { std::fill(held_.begin(), held_.end(), 0); }

int64_t RoutingLog::capacity(const int32_t* gathered) const {
  int64_t tokens = 0;  // the global micro-batch's: every run's length
  for (int q = 0; q < ranks_; q++) {
    const int32_t* r = gathered + q * record_;
    for (int j = 0; j < r[0]; j++) tokens += r[2 + j * (2 + E_)];
  }
  return MoELayer::capacity_of(factor_, tokens, k_, E_);
}

std::vector<int64_t> RoutingLog::kept(const int32_t* gathered) const {
  const int64_t cap = capacity(gathered);
  std::vector<int64_t> kept(size_t(ranks_ * E_), 0);
  for (int q = 0; q < ranks_; q++) {
    const int32_t* r = gathered + q * record_;
    for (int j = 0; j < r[0]; j++) {
      const int32_t* run = r + 1 + j * (2 + E_);
      std::vector<int64_t> earlier(size_t(E_), 0);  // the places claimed by the runs before this one
      for (int s = 0; s < ranks_; s++) {
        const int32_t* other = gathered + s * record_;
        for (int i = 0; i < other[0]; i++)
          if (other[1 + i * (2 + E_)] < run[0])
            for (int e = 0; e < E_; e++) earlier[size_t(e)] += other[1 + i * (2 + E_) + 2 + e];
      }
      for (int e = 0; e < E_; e++)
        kept[size_t(q * E_ + e)] += cap < 0 ? run[2 + e] : std::min<int64_t>(run[2 + e], std::max<int64_t>(0, cap - earlier[size_t(e)]));
    }
  }
  return kept;
}

double RoutingLog::a2a_sent_bytes(int rank, int ep, int C, double activation_bytes, double gradient_bytes) const {
  if (ep == 1) return 0;
  const int local = E_ / ep, first = rank - rank % ep, mine = rank % ep;
  double bytes = 0;
  for (int micro = 0; micro < m_; micro++)
    for (int l = 0; l < L_; l++) {
      if (!held_[size_t(micro * L_ + l)]) continue;
      const std::vector<int64_t> k = kept(at(micro, l));
      double sent = 0, received = 0;
      for (int e = 0; e < E_; e++)
        if (e / local != mine) sent += double(k[size_t(rank * E_ + e)]);
      for (int q = first; q < first + ep; q++) {
        if (q == rank) continue;  // its own rows stay
        for (int e = mine * local; e < (mine + 1) * local; e++) received += double(k[size_t(q * E_ + e)]);
      }
      bytes += 4.0 * E_ * (ep - 1) / ep + C * (activation_bytes + gradient_bytes) * (sent + received);
    }
  return bytes;
}

void RoutingLog::write_records(TrainingRun& run, Communicator& world, int step, int stage, bool speaks) const {
  // Per micro-batch and block: the stage + 1 (0: no stage routed it), then the records (exact in fp32
  // below 2^24).
  const int64_t entry = 1 + ranks_ * record_;
  Buffer all(int64_t(m_) * L_ * entry, MemCategory::Other);
  for (int micro = 0; micro < m_ && speaks; micro++)
    for (int l = 0; l < L_; l++) {
      if (!held_[size_t(micro * L_ + l)]) continue;
      float* e = all.f32() + (micro * L_ + l) * entry;
      e[0] = float(stage + 1);
      for (int64_t i = 0; i < ranks_ * record_; i++) e[1 + i] = float(at(micro, l)[i]);
    }
  world.all_reduce(all.view(), ReduceOp::Sum);
  if (!run.is_root()) return;
  std::vector<int32_t> gathered(size_t(ranks_ * record_));
  for (int micro = 0; micro < m_; micro++)
    for (int l = 0; l < L_; l++) {
      const float* e = all.f32() + (micro * L_ + l) * entry;
      if (e[0] == 0) continue;
      for (size_t i = 0; i < gathered.size(); i++) gathered[i] = int32_t(e[1 + i]);
      JsonObject record;
      record.add("type", "routing").add("step", step).add("micro_batch", micro).add("layer", l)
          .add("stage", int(e[0]) - 1).add("ranks", ranks_).add("capacity", capacity(gathered.data()));
      for (int q = 0; q < ranks_; q++) {
        const int32_t* r = gathered.data() + q * record_;
        const std::string R = "_R" + std::to_string(q);
        std::vector<int64_t> routed(size_t(E_), 0);
        record.add("runs" + R, r[0]);
        for (int j = 0; j < r[0]; j++) {
          const int32_t* one = r + 1 + j * (2 + E_);
          const std::string J = R + "_J" + std::to_string(j);
          record.add("start" + J, one[0]).add("length" + J, one[1]);
          for (int x = 0; x < E_; x++) record.add("routed" + J + "_E" + std::to_string(x), one[2 + x]), routed[size_t(x)] += one[2 + x];
        }
        for (int x = 0; x < E_; x++) record.add("routed" + R + "_E" + std::to_string(x), routed[size_t(x)]);
      }
      run.write_record(record);
    }
}
