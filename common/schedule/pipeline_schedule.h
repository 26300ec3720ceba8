// pipeline_schedule.h: chapter 08's pipeline schedules as data. Defines Schedule (afab, 1f1b,
// interleaved, zb-h1, zb-v, dualpipev), Placement, Op and Action (one entry of a rank's list),
// PipelineShape (p, m, v and the placement), virtual_stage(), rank_of_stage() and chunk_of_stage(),
// build_schedule() (the list of one rank), message_groups() and fb_pairs(), check_pipeline() (are all
// ranks' lists sound together), max_in_flight() and max_awaiting_backward() (activation slots);
// Matching, how receives find their messages (MPI's tags, NCCL's call order). The simulator that
// times the lists and the theory it is checked against: pipeline_simulate.h.
//
// Where each part lives: pipeline_schedule.cpp (names, shapes, the placement and the builders),
// pipeline_check.cpp (the lists' messages, groups and F&B pairs, check_pipeline and the activation
// slots), pipeline_simulate.cpp (simulate() and the theory).
//
// p pipeline ranks (stages), m micro-batches per step, v model chunks per rank (v > 1 only for the
// interleaved schedule and the V-shaped zb-v). Where the virtual stages live is the placement:
//   Loop  chunk c of rank r is virtual stage c*p + r (Megatron-LM's round-robin assignment):
//         virtual stage 0 (rank 0, chunk 0) holds the embedding, virtual stage v*p-1 (rank p-1,
//         chunk v-1) the head and the loss. Activations flow from virtual stage s to s+1, which is
//         the next rank, wrapping from rank p-1 chunk c to rank 0 chunk c+1 (to rank 0 itself when
//         p = 1).
//   V     (zb-v, v = 2) chunk 0 of rank r is virtual stage r, chunk 1 virtual stage 2p-1-r:
//         activations go down the ranks through chunk 0 and come back up through chunk 1, so the
//         first and the last virtual stage, the embedding and the loss, are both on rank 0, and the
//         hand-over at the bottom (rank p-1, chunk 0 to chunk 1) is a copy within one rank.
// Gradients flow from s+1 back to s.
//
// A schedule is, for every rank, a list of actions in execution order. The executor runs the list
// as it is: Recv* posts a non-blocking receive; F and B wait for their posted receive, then compute;
// Send* starts a non-blocking send. Each send comes right after the F or B that produced its data.
// Where the receives go depends on how a receive finds its message (Matching, below): all at the
// start of the list (MPI's tags), or among the sends, where both ends of every pair call in the
// same order (NCCL's call order). Nothing here runs the model or talks to another rank: a test
// checks the lists, and the simulator times them, before any executor exists.
#pragma once
#include <string>
#include <utility>
#include <vector>

enum class Schedule {
  AFAB,         // "afab": all forwards, then all backwards (GPipe)
  OneFOneB,     // "1f1b": PipeDream-Flush, Megatron-LM's default
  Interleaved,  // "interleaved": Megatron-LM's interleaved 1F1B over v chunks per rank
  ZBH1,         // "zb-h1": zero-bubble's handcrafted ZB-H1, backward split into B and W
  ZBV,          // "zb-v": zero-bubble's ZB-V, two chunks a rank in a V, backward split into B and W
  DualPipeV,    // "dualpipev": DeepSeek's DualPipe cut in half: a V, forward of one micro-batch
                // paired with backward of another
};

// Where a schedule puts its virtual stages (above): round-robin, or the V of zb-v and dualpipev.
enum class Placement { Loop, V };
Placement placement_of(Schedule schedule);
// Whether the schedule splits the backward into B (input gradient) and W (weight gradient).
bool splits_backward(Schedule schedule);

// "afab", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipev". parse_schedule returns false on any other name and leaves
// *out as it was.
bool parse_schedule(const std::string& name, Schedule* out);
const char* schedule_name(Schedule schedule);
// "afab, 1f1b, interleaved, zb-h1, zb-v, dualpipev", for a flag's help and its error message.
std::string schedule_names();

enum class Op {
  F,               // forward of one micro-batch through one chunk
  B,               // backward; under zb-h1 and zb-v only the input gradient, on the critical path
  W,               // zb-h1 and zb-v only: the weight gradient, which nothing downstream waits for
  SendActivation,  // after F of a chunk that is not the last virtual stage: its output to the next
  RecvActivation,  // the receive of a chunk's input, for F of a chunk that is not virtual stage 0
  SendGradient,    // after B of a chunk that is not virtual stage 0: its input's gradient to the previous
  RecvGradient,    // the receive of a chunk's output gradient, for B of a chunk that is not the last
};

struct Action {
  Op op;
  int micro;  // micro-batch, 0 .. m-1
  int chunk;  // this rank's chunk, 0 .. v-1
  bool operator==(const Action& other) const {
    return op == other.op && micro == other.micro && chunk == other.chunk;
  }
};

// How a receive finds its message, which decides where a list posts its receives.
//   ByTag        MPI: every message carries (kind, virtual stage, micro-batch) in its tag, so every
//                receive of the step is listed at the start of the list, in the order the data is
//                consumed; the executor posts each as soon as the chunk has a free buffer for it
//                (it keeps one per micro-batch in flight, pipeline.h), which, in that order, is
//                always before the pass that needs it. MPI holds a send until its receive comes.
//   ByCallOrder  NCCL: there are no tags. The k-th send from rank a to rank b meets the k-th receive
//                that b posts from a, and a send finishes only while its receive runs. A rank's
//                messages run one after the other on its communicator's stream, so receives posted at
//                the start would hold every later send behind them, and the ranks would wait for each
//                other forever. Instead every run of sends and receives between two passes is one
//                group call (ncclGroupStart/End; Megatron-LM's batch_isend_irecv), in which a rank's
//                send and its receive from the same neighbour progress together, and the receives
//                go where each pair's calls come in the same order on both ends. Round-robin
//                schedules: each receive right before the pass that needs it (interleaved's steady
//                pairs with their four messages in one group). V schedules, where two neighbours
//                exchange both ways in one phase: every message gets one place in one global
//                order, its send's time in the schedule's simulated timeline, and each rank calls
//                its sends and receives in that order, a receive as soon as its sender's pass is
//                under way (pipeline_schedule.cpp, call_order_from_timeline). A receive posted here
//                must find a free buffer: its place is its match, it cannot wait for one. A message
//                between two chunks of one rank (a V's point) is a copy, in no group.
//                check_pipeline proves, for the shape at hand, that the k-th send and the k-th
//                receive are the same message, that no group waits forever, and that every receive
//                finds a buffer.
enum class Matching { ByTag, ByCallOrder };
// "tag", "call-order"; parse_matching returns false on any other name and leaves *out as it was.
const char* matching_name(Matching matching);
bool parse_matching(const std::string& name, Matching* out);

struct PipelineShape {
  int stages = 1;         // p, the pipeline ranks
  int micro_batches = 1;  // m, per step
  int chunks = 1;         // v, model chunks per rank (virtual stages per rank)
  Placement placement = Placement::Loop;  // the schedule's: placement_of(schedule)
  int virtual_stages() const { return stages * chunks; }
};

// "" when `schedule` can run on `shape`, else what is wrong and what would be right, for the caller
// to report before the first collective: interleaved needs v >= 2 and m a multiple of p; zb-v v = 2;
// dualpipev v = 2 and m >= 2p;
// the others v = 1; and the shape's placement must be the schedule's. build_schedule and simulate
// ENSURE it is "".
std::string schedule_shape_error(Schedule schedule, const PipelineShape& shape);

// The placement: chunk `chunk` of `rank` is virtual stage chunk * p + rank (Loop), or rank for chunk
// 0 and 2p-1-rank for chunk 1 (V). rank_of_stage and chunk_of_stage invert it.
int virtual_stage(const PipelineShape& shape, int rank, int chunk);
int rank_of_stage(const PipelineShape& shape, int stage);
int chunk_of_stage(const PipelineShape& shape, int stage);

// The list of actions `rank` runs in one step, its receives placed for `matching`.
std::vector<Action> build_schedule(Schedule schedule, const PipelineShape& shape, int rank,
                                   Matching matching = Matching::ByTag);
// A list's sends and receives in groups: each run of them between two passes (F, B or W), as
// [first, last] positions in the list. Under ByCallOrder each group is one group call.
std::vector<std::pair<int, int>> message_groups(const std::vector<Action>& actions);

// DualPipe's F&B pairs in a rank's list, as positions: an F, then (only sends between) a B of the
// other chunk, then (only sends between) that B's W. dualpipev's steady state is made of them (its
// steps 4 and 5); no other schedule has one (the others follow an F with a B of the same chunk, or
// have no W). With --fb-overlap the executor runs each pair's two passes at once, the forward and the
// backward (B, then W) on two lanes (pipeline.h, lanes.h), and the simulator times a pair as one
// action (ActionCosts::pair). Both only under ByTag: a list built for call order groups a pass's
// receive with the sends before it, which a pair would hold back; there pairs run in sequence.
struct FBPair {
  int forward, backward, weight;
};
std::vector<FBPair> fb_pairs(const std::vector<Action>& actions);

// "F3.c1", "B3.c1", "W3.c1", "sendA3.c1", "recvA3.c1", "sendG3.c1", "recvG3.c0". F, B and W names are
// the executor's trace span names.
std::string describe(const Action& action);
// The actions separated by spaces: printing the plan is free.
std::string describe(const std::vector<Action>& actions);

// Checks all ranks' lists together (per_rank[r] is rank r's): every micro-batch gets exactly one F and
// one B per chunk on its rank (and one W under zb-h1 and zb-v, none otherwise); each B after its F, each W
// after its B; each send after the pass that produces its data, each receive before the pass that
// consumes it; every send has exactly one matching receive on the neighbouring virtual stage and
// every receive one send; under ByCallOrder, the k-th send from a rank to another and the k-th
// receive there from it are the same message; a simulation with unit costs under `matching`
// completes (no deadlock: under ByCallOrder with the group calls' blocking, simulate()'s model);
// and every receive posted under ByCallOrder, and every copy between two chunks of a rank, finds
// one of its chunk's message buffers free (the executor keeps one per activation slot,
// max_in_flight, pipeline.h). Returns "" when sound, else the first problem in words.
std::string check_pipeline(Schedule schedule, const PipelineShape& shape,
                           const std::vector<std::vector<Action>>& per_rank, Matching matching = Matching::ByTag);

// The most micro-batches that `chunk` of a rank holds activations for at once: its F is done and the
// pass that frees them not yet, which is W where the list has one (zb-h1: W still reads each
// linear's saved input) and B otherwise. The executor sizes its activation slots with it.
int max_in_flight(const std::vector<Action>& actions, int chunk);
// The same counted until B, not W: the micro-batches that hold their whole activations (under zb-h1
// a micro-batch between B and W holds only what W reads). Equals max_in_flight without W.
int max_awaiting_backward(const std::vector<Action>& actions, int chunk);
