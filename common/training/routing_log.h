// routing_log.h: chapter 12's routing, kept per micro-batch and block as its stage gathered it (every
// routing rank's runs of the global token order and their counts per expert, before the capacity;
// moe.h, ExpertHooks::gather_counts), for two uses: the "routing" records, and the bytes the EP
// group should send, predicted from those counts and the formula (docs/theory.md, sections 14 and
// 17), independently of the counts the exchange hands to its all-to-alls. Defines RoutingLog.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/comm.h"          // Communicator
#include "training/training_run.h"  // TrainingRun: the JSON records

class RoutingLog {
 public:
  // `record`: one routing rank's record in int32s (ExpertHooks::record_size), `ranks` of them a stage.
  RoutingLog(int micro_batches, int L, int E, int k, double capacity_factor, int ranks, int64_t record);
  // Micro-batch `micro`'s block `layer`: the stage's gathered records (ranks x record).
  void keep(int micro, int layer, const int32_t* gathered);
  void clear();
  // What routing rank `rank` sends over its EP group (the `ep` consecutive routing ranks around it)
  // in the step's all-to-alls, per block and micro-batch kept: the counts' (ep-1)/ep x 4E, and the
  // rows it keeps for the others' experts plus the rows it receives for its own, each twice (dispatch
  // and combine), forward and backward: C x (a + g) x (sent + received), a and g the bytes of an
  // activation and of a gradient on the wire (4 in fp32; a recipe's bf16 or fp16: 2). Each run claims
  // the capacity after every run that starts before it in the global order.
  double a2a_sent_bytes(int rank, int ep, int C, double activation_bytes = 4, double gradient_bytes = 4) const;
  // On the world's rank 0, one "routing" record per micro-batch and block of every stage, as the
  // stage's first rank (`speaks`) kept them: collective over the world.
  void write_records(TrainingRun& run, Communicator& world, int step, int stage, bool speaks) const;

 private:
  int64_t capacity(const int32_t* gathered) const;  // -1: unlimited
  // (ranks x E) the assignments each rank keeps, after the capacity
  std::vector<int64_t> kept(const int32_t* gathered) const;
  const int32_t* at(int micro, int layer) const { return &data_[size_t((micro * L_ + layer) * ranks_ * record_)]; }

  int m_, L_, E_, k_;
  double factor_;
  int ranks_;
  int64_t record_;
  std::vector<int32_t> data_;  // (m x L x ranks x record)
  std::vector<char> held_;     // (m x L) kept this step
};
