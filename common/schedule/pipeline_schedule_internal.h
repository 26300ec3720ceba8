// pipeline_schedule_internal.h: what the files of chapter 08's schedules share and nothing else
// includes. Defines kOps, is_pass(), Message and message_of() (the two ends of a send or receive),
// CallOrder and call_order() (the pairs NCCL matches), and interleaved_warmup() (the interleaved
// builder's warm-up, which the theory of its activation slots reads too). Which file holds what:
// pipeline_schedule.h.
#pragma once
#include <vector>

#include "schedule/pipeline_schedule.h"

namespace pipeline_internal {

constexpr int kOps = 7;  // the members of Op

inline bool is_pass(Op op) { return op == Op::F || op == Op::B || op == Op::W; }

// A send or receive of `rank`: the rank at the other end, and the message named by the action that
// receives it (a send of virtual stage s's output is recvA on s+1; of its input's gradient, recvG on
// s-1), so that both ends of one message have the same name.
struct Message {
  int peer;
  Action as_received;
};
Message message_of(const PipelineShape& shape, int rank, const Action& a);

// The sends and receives of every pair of ranks in call order, as positions in the lists:
// sends[a][b][k] is the k-th send from rank a to rank b, receives[b][a][k] the k-th receive at b from
// a. NCCL pairs exactly these two.
struct CallOrder {
  std::vector<std::vector<std::vector<int>>> sends, receives;
};
CallOrder call_order(const PipelineShape& shape, const std::vector<std::vector<Action>>& per_rank);

// Megatron-LM's warm-up count for rank r of the interleaved schedule (pipeline_schedule.cpp says
// why): the builder's, and theory_in_flight's window.
int interleaved_warmup(const PipelineShape& shape, int rank);

}  // namespace pipeline_internal
