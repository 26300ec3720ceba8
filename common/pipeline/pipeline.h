// pipeline.h: chapter 08's mechanics: how the model's blocks are partitioned over the virtual
// stages, and an executor that runs a pipeline schedule (pipeline_schedule.h: a list of actions per
// rank) on this rank's model chunks. Defines unit_costs(), balanced_partition(), parts_of_rank() and
// PipelineExecutor.
//
// What each action does here:
//   RecvActivation / RecvGradient  post a non-blocking receive into one of the chunk's buffers for
//                                  that kind of message (by tag: every schedule lists them all at the
//                                  start of the step, so none can wait on a receive that nobody
//                                  posted; by call order: where both ends of the pair call in the
//                                  same order, in one group call with the sends and receives
//                                  between the same two passes, pipeline_schedule.h);
//   F   wait for the input (unless this is the embedding's chunk), run the chunk's forward in a free
//       activation slot; on the loss's chunk, add the micro-batch's loss;
//   SendActivation                 send the chunk's output to the next virtual stage (the rank the
//                                  schedule's placement puts it on);
//   B   wait for the output's gradient (unless this is the loss's chunk), run the chunk's backward
//       (zero-bubble: the inputs' gradients only), free the slot unless a W is to come;
//   SendGradient                   send the input's gradient to the previous virtual stage;
//   W   the weights' gradients (zero-bubble), then free the slot.
// A wait for a receive, with nothing else to compute, is the bubble: measured per action, as are the
// forward, backward and weight passes' own times, which a simulation of the schedule then uses.
//
// F&B pairs (dualpipev, overlap_pairs): an F followed by the other chunk's B and its W
// (pipeline_schedule.h, fb_pairs) runs as two lanes at once, as DualPipe runs them: first both
// passes' receives are waited for (the bubble, as for any pass), then the forward computes on this
// thread while the backward lane's thread (lanes.h) runs B and then W, and the sends listed between
// them go out once both lanes are done. The two passes share no arithmetic, so the result is the
// sequence's bit for bit; what changes is that the messages inside one pass (experts' all-to-alls,
// TP's collectives, CP's ring) travel while the other computes. Every pass then runs in its lane, F
// in the forward, B and W in the backward, paired or not, and a chapter's hooks reach each group
// through the lane's own communicator (LaneCommunicator). Measured per pair: its wall time beside its
// passes' own; the difference is the time the two lanes ran at once, which the pair would take longer
// in sequence (the step gains it where nothing else then waits: the next stage, busy cores, the link).
// Under a mixed-precision recipe a message travels in the layer's format (wire_p2p.h), decoded into
// the receiving buffer when its receive is waited.
// Messages carry a tag, (activation or gradient, the receiving virtual stage, micro-batch), which MPI
// matches them by; NCCL matches by call order, which the lists are built for. Between two chunks of
// one rank (one stage; the point of a V) a message is a copy.
//
// Buffers: a chunk keeps, for each kind of message it receives or sends a copy of (its input, its
// output's gradient, its input's gradient sent), as many (B,T,C) buffers as it has activation slots,
// the schedule's micro-batches in flight, not one per micro-batch of the step: otherwise they would
// grow with m while the activations do not. A buffer is lent to a micro-batch from its receive (or
// copy) until the pass that reads it; a receive listed by tag while all are lent waits, in list
// order, for the next one to come back (the lists order each kind's receives as the passes consume
// them, so the one a pass waits for is always posted before it). By call order a receive cannot
// wait (its place among the calls is its match): the lists post each where a buffer is free, which
// check_pipeline proves before the first step. A gradient copy reuses the buffer of the oldest send
// once that send is done.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "comm/comm.h"
#include "comm/lanes.h"  // LaneThread
#include "ops/memory.h"
#include "model/model.h"
#include "schedule/pipeline_schedule.h"
#include "schedule/pipeline_simulate.h"  // ActionCosts
#include "training/training_run.h"  // MicroBatch

// Forward FLOPs per token of each unit (0 the embedding, 1..L the blocks, L+1 the head): a block
// 24C^2 for its four products plus 4TC for attention's two; the head 2CV for the LM head over the
// whole vocabulary, which on GPT-2 124M is 4.5 blocks' worth; the embedding, a lookup, none.
std::vector<double> unit_costs(const GPT2Config& cfg);
// Of a block's forward FLOPs per token, attention's two products (scores and values): 4TC.
double attention_flops_per_token(const GPT2Config& cfg);
// Blocks per virtual stage (p x v of them, each at least 1), contiguous, with the embedding before
// the first and the head after the last, that make the costliest stage as cheap as possible: equal
// block counts would leave the head's stage the slowest, and every other stage waiting for it.
std::vector<int> balanced_partition(const GPT2Config& cfg, int virtual_stages);
// This rank's model parts (chunk c: virtual stage c x p + rank, or in a V rank and 2p-1-rank) for a
// partition of blocks.
std::vector<ModelPart> parts_of_rank(const GPT2Config& cfg, const std::vector<int>& blocks, int stages, int rank,
                                     Placement placement = Placement::Loop);

// The largest tag of a step's messages matched by tag, 2 x p x v x m - 1: a tag names the kind
// (activation or gradient), the receiving virtual stage and the micro-batch (pipeline_tag_problem()
// checks it against the communicator's bound before any work).
int64_t largest_pipeline_tag(const PipelineShape& shape);

// Collective over `embedding` (the first and last stage, process_grid.h; null elsewhere): whether
// the two copies of the tied wte in `params` are equal, bit for bit. True where there is no group.
bool tied_copies_equal(Communicator* embedding, Tensor params, const ParamLayout& layout);

class PipelineExecutor {
 public:
  // chunks[c]: this rank's model chunk c (virtual_stage(shape, rank, c)), built for its ModelPart with
  // at least max_in_flight(actions, c) slots. `pipeline`: the group of the p stages, ranked by stage.
  // `matching`: the one `actions` were built for (under call order, each run of sends and receives
  // between two passes goes out as one group call).
  PipelineExecutor(Communicator& pipeline, std::vector<GPT2*> chunks, const PipelineShape& shape,
                   std::vector<Action> actions, Matching matching, int micro_B, int T, int C, Device device,
                   DType dtype);

  // One step: every action in order. micro_batch(m) gives micro-batch m's tokens (the same pointers
  // for the whole step). Returns the mean loss of the m micro-batches on the loss's rank, else 0.
  float run(const std::function<MicroBatch(int micro)>& micro_batch);

  // Called before each F, B and W: the chapter learns which micro-batch (and chunk) runs, e.g. to
  // communicate gradients only on the last one. With pairs overlapped, a pair's F and B (then W) call
  // it each in its own lane, at once: what it sets for a forward must be apart from what it sets for a
  // backward (chapters 08, 09, 12 keep the two apart).
  std::function<void(const Action&)> before_compute;

  // Runs the list's F&B pairs (fb_pairs) as two lanes at once (the file comment), or, off, one pass
  // after the other. On the CPU, with messages matched by tag (under call order they run in sequence).
  // Before run(); the groups that the chapter's hooks use inside passes must then be LaneCommunicators
  // (ProcessGrid::give_each_lane_its_groups).
  void overlap_pairs(bool on);
  bool overlaps_pairs() const { return lane_thread_ != nullptr; }
  int pair_count() const { return int(pairs_.size()); }

  // The last step's times on this rank, in ms: each pass's mean per micro-batch and chunk, the time
  // spent waiting for receives (the bubble), and the whole step; and, for the report beside them,
  // the bytes its message buffers hold (buffer_bytes()).
  struct Times {
    std::vector<double> forward, backward, weight;  // per chunk
    double waiting = 0, step = 0;
    double buffer_bytes = 0;
    // F&B pairs run at once (overlap_pairs): their number in the step, their wall time, and their
    // passes' own times (F + B + W, each timed in its lane). passes - wall is the time the two lanes
    // ran beside each other, which the pairs would take longer in sequence. And per
    // chunk of a pair's forward, its pairs' mean wall time (the simulator's ActionCosts::pair).
    int pairs = 0;
    double pair_ms = 0, pair_passes_ms = 0;
    std::vector<double> pair;
  };
  const Times& times() const { return times_; }
  const std::vector<Action>& actions() const { return actions_; }
  // The bytes of this rank's message buffers (docs/theory.md, section 3: pipeline_buffer_bytes).
  double buffer_bytes() const;

 private:
  // One chunk's buffers for one kind of message, each lent to one micro-batch at a time.
  struct MessageBuffers {
    std::vector<Buffer> buffers;
    std::vector<int> free;        // indices into buffers, not lent
    std::vector<int> of_micro;    // per micro-batch: the buffer it holds, or -1
    std::vector<int> held;        // micro-batches whose receive waits for a buffer, in list order
    std::vector<int> lent;        // the buffers lent, oldest first
    std::vector<CommHandle> sent; // (sent gradients) per buffer: its send; never resized after
                                  // construction, a group's handle is stored through pointers into it
    void reset();
    // Lends a free buffer to `micro`: false if none is free.
    bool lend(int micro);
    // Returns `micro`'s buffer: -1, or the micro-batch whose held receive now gets it.
    int give_back(int micro);
  };
  // (B*T, C) view of the buffer that `micro` holds of `kind`.
  Tensor buffer_of(MessageBuffers& kind, int micro, int B) const;

  Tensor stream(Buffer& b, int B) const;  // (B*T, C) view of a micro-batch buffer (B*T/t rows under SP)
  int tag(bool gradient, int virtual_stage, int micro) const;

  Communicator& pipeline_;
  std::vector<GPT2*> chunks_;
  PipelineShape shape_;
  std::vector<Action> actions_;
  Matching matching_;
  int micro_B_, T_, C_, rank_;
  int rows_divisor_ = 1;  // t under sequence parallelism: a stage's stream is this rank's rows only
  Device device_;
  DType dtype_;
  // Per chunk: the received inputs, the received output gradients, the input gradients sent.
  std::vector<MessageBuffers> activation_in_, gradient_in_, gradient_out_;
  // Per chunk and micro-batch: the receives; the slot in use.
  std::vector<std::vector<CommHandle>> activation_recv_, gradient_recv_;
  std::vector<std::vector<int>> slot_of_;
  std::vector<std::vector<int>> free_slots_;
  Times times_;
  // The list's F&B pairs, and per position the pair an F starts (-1: none); the backward lane's
  // thread while pairs overlap.
  std::vector<FBPair> pairs_;
  std::vector<int> pair_at_;
  std::unique_ptr<LaneThread> lane_thread_;
};
