// p2p_collectives.cpp: the collectives of p2p_collectives.h, each a loop of paired sends and
// receives (Communicator::send_recv_async) and local reductions. Read it as chapter 00's lesson:
// the ring first, then recursive halving and doubling, then the binomial tree, then the costs.
#include "comm/p2p_collectives.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/bf16.h"
#include "ops/float_formats.h"  // encode_float, decode_code: fp16 codes
#include "ops/memory.h"
#include "ops/ops.h"

namespace {

// A tag of its own, so that these messages never meet a pipeline's or a ring attention's that are in
// flight on the same communicator (MPI guarantees tags up to 32767).
constexpr int kTag = 30000;

// ---------------------------------------------------------------------------------------------
// Local pieces: copy, reduce, scale, on either device and dtype.

void copy_into(Tensor dst, Tensor src) {
  if (src.numel() == 0 || dst.data == src.data) return;
  if (dst.device == Device::CPU) std::memcpy(dst.data, src.data, src.bytes());
  else copy_tensor(dst, src);
}

template <typename Combine>
void combine_cpu(Tensor acc, Tensor incoming, Combine f) {
  const int64_t n = acc.numel();
  if (acc.dtype == DType::F32) {
    float* a = acc.f32();
    const float* b = incoming.f32();
    for (int64_t i = 0; i < n; i++) a[i] = f(b[i], a[i]);
  } else if (acc.dtype == DType::F16) {  // fp16 codes (a recipe's collectives, wire_format.h)
    uint16_t* a = static_cast<uint16_t*>(acc.data);
    const uint16_t* b = static_cast<const uint16_t*>(incoming.data);
    for (int64_t i = 0; i < n; i++)
      a[i] = encode_float(NumberFormat::FP16, f(decode_code(NumberFormat::FP16, b[i]), decode_code(NumberFormat::FP16, a[i])));
  } else {
    ENSURE(acc.dtype == DType::BF16, "collectives built from send and receive reduce fp32, bf16 and fp16 only");
    bf16_bits* a = static_cast<bf16_bits*>(acc.data);
    const bf16_bits* b = static_cast<const bf16_bits*>(incoming.data);
    // As NCCL and comm_mpi.cpp's bf16 ops do: widen the pair, combine in fp32, round once.
    for (int64_t i = 0; i < n; i++) a[i] = float_to_bf16(f(bf16_to_float(b[i]), bf16_to_float(a[i])));
  }
}

// acc = incoming (op) acc. Every op here is commutative in IEEE arithmetic (a + b == b + a exactly),
// so two ranks that combine the same pair get the same bits whichever of them holds which side.
void reduce_into(Tensor acc, Tensor incoming, ReduceOp op) {
  if (acc.numel() == 0) return;
  if (acc.device == Device::CUDA) {
    ENSURE(op == ReduceOp::Sum || op == ReduceOp::Avg, "collectives of GPU tensors built from send and receive "
                                                       "reduce by Sum or Avg only");
    return add_inplace(acc, incoming);
  }
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return combine_cpu(acc, incoming, [](float a, float b) { return a + b; });
    case ReduceOp::Max: return combine_cpu(acc, incoming, [](float a, float b) { return std::max(a, b); });
    case ReduceOp::Min: return combine_cpu(acc, incoming, [](float a, float b) { return std::min(a, b); });
  }
}

// Avg is a Sum, scaled once at the end by 1/N (a multiply, as comm_mpi.cpp does: the same bits).
void finish_average(Tensor t, ReduceOp op, int ranks) {
  if (op != ReduceOp::Avg || t.numel() == 0 || ranks == 1) return;
  const float factor = 1.0f / float(ranks);
  if (t.device == Device::CUDA) return scale_inplace(t, factor);
  if (t.dtype == DType::F32) {
    float* p = t.f32();
    for (int64_t i = 0; i < t.numel(); i++) p[i] *= factor;
  } else if (t.dtype == DType::F16) {
    uint16_t* p = static_cast<uint16_t*>(t.data);
    for (int64_t i = 0; i < t.numel(); i++)
      p[i] = encode_float(NumberFormat::FP16, decode_code(NumberFormat::FP16, p[i]) * factor);
  } else {
    bf16_bits* p = static_cast<bf16_bits*>(t.data);
    for (int64_t i = 0; i < t.numel(); i++) p[i] = float_to_bf16(bf16_to_float(p[i]) * factor);
  }
}

// A scratch tensor like `like`, n elements, freed with the Buffer (counted as a communication buffer).
// An owner that already holds at least n of that dtype on that device is reused, so that the steps of
// one collective (each a call of exchange_reducing) allocate once, at their largest.
Tensor scratch(Buffer& owner, const Tensor& like, int64_t n) {
  const Tensor held = owner.view();
  if (held.data == nullptr || held.numel() < n || held.dtype != like.dtype || held.device != like.device)
    owner = Buffer(std::max<int64_t>(n, 1), MemCategory::CommBuffers, like.dtype, like.device);
  return owner.view().slice1d(0, n);
}

// One step of every algorithm: send `out` to one peer while receiving `in` from another (maybe the
// same), both at once, so that neither waits for the other (and, on NCCL, in one group call).
// Nothing travels for an empty side. The blocking form: both are posted at once on this thread,
// which then drives them itself, so a small step costs what MPI's own send and receive cost.
void exchange(Communicator& comm, Tensor out, int to, Tensor in, int from) {
  std::vector<Communicator::PointToPoint> ops;
  if (out.numel() > 0) ops.push_back({true, out, to, kTag});
  if (in.numel() > 0) ops.push_back({false, in, from, kTag});
  if (!ops.empty()) comm.send_recv(ops);
}
void send_to(Communicator& comm, Tensor out, int to) { exchange(comm, out, to, Tensor(), -1); }
void receive_from(Communicator& comm, Tensor in, int from) { exchange(comm, Tensor(), -1, in, from); }

// The largest piece of a reducing step (exchange_reducing): small enough that the piece that arrived
// and the one it is added into are still in the last-level cache (32 MB here) when it is added, and
// the scratch is one piece; large enough that a piece's rendezvous, both ranks meeting once per piece,
// costs little where the ranks wait for a core (at 256 KB, 4 and 16 MB took 1.5-1.7x MPICH's time on
// the busy 2-core machine; at 2 MB 0.68-0.95x; docs/collectives.md).
constexpr int64_t kPieceBytes = 2 * 1024 * 1024;
constexpr int64_t kSmallPieceBytes = 4096;  // at most this, a piece arrives on the stack

// The reducing step of every algorithm: send `out` to `to` while the partner `from` sends its copy
// of `acc`'s elements, and add them into `acc` (acc = arriving op acc). Both travel in pieces of at
// most kPieceBytes, each added as soon as it has arrived: a whole segment received and then added
// would write it to memory and read it back (on 2 ranks, 64 MB: a 32 MB scratch, allocated, filled
// and read once more per call), where a piece stays in the cache. The partner cuts `out` at the
// same places, since its `out` is as long as this rank's `acc`; the bytes sent are the same, in
// more messages (one alpha each; over shared memory a few microseconds against a piece's milliseconds).
// Only there: a GPU's buffers are not the CPU's cache, and on the emulated link each message is
// held for its modelled alpha, which is the cost the model counts (section 15 of docs/theory.md),
// so there a step stays one message. A rank that only sends to a reducing partner (the tree,
// folding in) calls it with `acc` empty, so that its pieces are the receiver's. `incoming_owner` holds
// the scratch, kept by the caller across a collective's steps.
void exchange_reducing(Communicator& comm, Tensor out, int to, Tensor acc, int from, ReduceOp op,
                       Buffer& incoming_owner) {
  const Tensor& any = acc.numel() > 0 ? acc : out;
  const bool in_pieces = any.device == Device::CPU && !comm.link_model().on();
  const int64_t whole = std::max<int64_t>({1, out.numel(), acc.numel()});
  const int64_t piece = in_pieces ? kPieceBytes / int64_t(dtype_size(any.dtype)) : whole;
  // Where the pieces arrive: a latency-bound step's few bytes on the stack, allocating nothing
  // (MPICH's own all-reduce allocates nothing for them either); a larger piece in a scratch.
  alignas(64) unsigned char small[kSmallPieceBytes];
  const int64_t arriving_at_most = std::min(acc.numel(), piece);
  const Tensor incoming =
      acc.numel() == 0 ? Tensor()
      : acc.device == Device::CPU && arriving_at_most * int64_t(dtype_size(acc.dtype)) <= kSmallPieceBytes
          ? make_view(small, {arriving_at_most}, acc.dtype)
          : scratch(incoming_owner, acc, arriving_at_most);
  const auto part = [piece](const Tensor& t, int64_t at) {
    return at < t.numel() ? t.slice1d(at, std::min(piece, t.numel() - at)) : Tensor();
  };
  for (int64_t at = 0; at < std::max(out.numel(), acc.numel()); at += piece) {
    const Tensor mine = part(acc, at);
    const Tensor arriving = mine.numel() > 0 ? incoming.slice1d(0, mine.numel()) : Tensor();
    exchange(comm, part(out, at), to, arriving, from);
    if (mine.numel() > 0) reduce_into(mine, arriving, op);
  }
}

// Where each segment starts: offsets[r] = counts[0] + ... + counts[r-1]; offsets[N] = the total.
std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts) {
  std::vector<int64_t> at(counts.size() + 1, 0);
  for (size_t r = 0; r < counts.size(); r++) at[r + 1] = at[r] + counts[r];
  return at;
}

int mod(int a, int n) { return ((a % n) + n) % n; }

// The segments of a whole of n elements: the caller's, checked to cover it, or segment_counts'.
std::vector<int64_t> counts_of(const std::vector<int64_t>& segments, int64_t n, int ranks, const std::string& what) {
  if (segments.empty()) return segment_counts(n, ranks);
  int64_t total = 0;
  for (int64_t c : segments) total += c;
  ENSURE(int(segments.size()) == ranks && total == n, what + ": the counts must cover the whole vector");
  return segments;
}

// ---------------------------------------------------------------------------------------------
// The ring. Rank r sends only to r + 1 and receives only from r - 1, N - 1 steps, one segment a step:
// every link carries (N-1)/N of the vector, whatever N is. That is why it is the bandwidth-optimal
// algorithm, and why its latency term grows with N.

// Reduce-scatter in place over `work` (all N segments): at step s rank r sends its partial sum of
// segment r - s - 1 and adds the partial sum of segment r - s - 2 arriving from r - 1 into its own.
// Segment j starts at rank j + 1 and travels the ring, one rank's share added per step, to arrive
// complete at rank j after N - 1 steps.
void ring_reduce_scatter(Communicator& comm, Tensor work, const std::vector<int64_t>& counts, ReduceOp op) {
  const int N = comm.size(), r = comm.rank();
  const std::vector<int64_t> at = offsets_of(counts);
  Buffer incoming;
  for (int s = 0; s < N - 1; s++) {
    const int out = mod(r - s - 1, N), in = mod(r - s - 2, N);
    exchange_reducing(comm, work.slice1d(at[size_t(out)], counts[size_t(out)]), mod(r + 1, N),
                      work.slice1d(at[size_t(in)], counts[size_t(in)]), mod(r - 1, N), op, incoming);
  }
}

// All-gather in place over `whole`, where segment r already holds this rank's: at step s rank r
// passes on segment r - s (its own at step 0, then what it just received), and receives r - s - 1.
void ring_all_gather(Communicator& comm, Tensor whole, const std::vector<int64_t>& counts) {
  const int N = comm.size(), r = comm.rank();
  const std::vector<int64_t> at = offsets_of(counts);
  for (int s = 0; s < N - 1; s++) {
    const int out = mod(r - s, N), in = mod(r - s - 1, N);
    exchange(comm, whole.slice1d(at[size_t(out)], counts[size_t(out)]), mod(r + 1, N),
             whole.slice1d(at[size_t(in)], counts[size_t(in)]), mod(r - 1, N));
  }
}

// ---------------------------------------------------------------------------------------------
// Powers of two. Recursive halving and doubling pair rank x with x ^ 2^k; when N is not a power of
// two, MPICH first folds it to the largest power of two p <= N: of the first 2(N - p) ranks, each
// even one hands its data to the odd one after it and sits out until the end.
struct Fold {
  int p = 1;          // the power of two that runs the algorithm
  int extra = 0;      // N - p: the pairs folded into one
  int folded = -1;    // this rank's place among the p, or -1 if it sits out
  int rank_of(int folded_rank) const {  // the rank that plays folded rank f
    return folded_rank < extra ? 2 * folded_rank + 1 : folded_rank + extra;
  }
};
Fold fold_of(int N, int r) {
  Fold f;
  while (f.p * 2 <= N) f.p *= 2;
  f.extra = N - f.p;
  if (r < 2 * f.extra) f.folded = r % 2 == 1 ? r / 2 : -1;
  else f.folded = r - f.extra;
  return f;
}
// The segments of the folded ranks: a pair's two segments become its odd rank's one.
std::vector<int64_t> folded_counts(const Fold& f, const std::vector<int64_t>& counts) {
  std::vector<int64_t> out(size_t(f.p));
  for (int x = 0; x < f.p; x++)
    out[size_t(x)] = x < f.extra ? counts[size_t(2 * x)] + counts[size_t(2 * x + 1)] : counts[size_t(x + f.extra)];
  return out;
}

// Recursive halving over the p folded ranks, in place over `work` (segments `counts`, p of them):
// each step splits the rank's window of segments in two, keeps the half its side of the pair owns,
// sends the other half to the partner and adds the partner's copy of the kept half. After lg p steps
// the window is the rank's own segment, reduced over all p.
void halving_reduce_scatter(Communicator& comm, const Fold& f, Tensor work, const std::vector<int64_t>& counts,
                            ReduceOp op) {
  const std::vector<int64_t> at = offsets_of(counts);
  int lo = 0, hi = f.p;  // the window, in folded ranks (= segments)
  Buffer incoming;
  for (int half = f.p / 2; half >= 1; half /= 2) {
    const int partner = f.folded ^ half, mid = lo + half;
    const bool lower = f.folded < partner;
    const int keep_lo = lower ? lo : mid, keep_hi = lower ? mid : hi;
    const int give_lo = lower ? mid : lo, give_hi = lower ? hi : mid;
    const Tensor keep = work.slice1d(at[size_t(keep_lo)], at[size_t(keep_hi)] - at[size_t(keep_lo)]);
    exchange_reducing(comm, work.slice1d(at[size_t(give_lo)], at[size_t(give_hi)] - at[size_t(give_lo)]),
                      f.rank_of(partner), keep, f.rank_of(partner), op, incoming);
    lo = keep_lo, hi = keep_hi;
  }
}

// Recursive doubling over the p folded ranks, in place over `whole`: at distance 2^k each rank holds
// a window of 2^k segments and swaps it for the partner's, so the window doubles every step.
void doubling_all_gather(Communicator& comm, const Fold& f, Tensor whole, const std::vector<int64_t>& counts) {
  const std::vector<int64_t> at = offsets_of(counts);
  for (int width = 1; width < f.p; width *= 2) {
    const int partner = f.folded ^ width;
    const int mine = f.folded & ~(width - 1), theirs = partner & ~(width - 1);
    exchange(comm, whole.slice1d(at[size_t(mine)], at[size_t(mine + width)] - at[size_t(mine)]), f.rank_of(partner),
             whole.slice1d(at[size_t(theirs)], at[size_t(theirs + width)] - at[size_t(theirs)]), f.rank_of(partner));
  }
}

// Folding in: each even rank among the first 2(N - p) hands its whole vector to the odd rank after
// it, which adds it into its own.
void fold_in(Communicator& comm, const Fold& f, Tensor work, ReduceOp op) {
  const int r = comm.rank();
  if (r >= 2 * f.extra) return;
  Buffer incoming;
  if (r % 2 == 0) return exchange_reducing(comm, work, r + 1, Tensor(), -1, op, incoming);
  exchange_reducing(comm, Tensor(), -1, work, r - 1, op, incoming);
}
// Folding out: each odd rank among the first 2(N - p) hands the even rank before it its result.
void fold_out(Communicator& comm, const Fold& f, Tensor from_odd, Tensor into_even) {
  const int r = comm.rank();
  if (r >= 2 * f.extra) return;
  if (r % 2 == 1) send_to(comm, from_odd, r - 1);
  else receive_from(comm, into_even, r + 1);
}

// The whole vector to the partner at distance 2^k and back, lg p times: few messages, each of it all.
void doubling_all_reduce(Communicator& comm, const Fold& f, Tensor buf, ReduceOp op) {
  Buffer incoming;
  for (int distance = 1; distance < f.p; distance *= 2) {
    const int partner = f.rank_of(f.folded ^ distance);
    exchange_reducing(comm, buf, partner, buf, partner, op, incoming);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The binomial tree (rank numbers relative to the root). Reduce: at distance 2^k every rank whose
// bit k is set sends its partial sum to the rank 2^k below and drops out; the others add what
// arrives. Broadcast: the same tree walked down, each rank passing the vector to the ranks 2^k above.

void p2p_reduce(Communicator& comm, Tensor buf, ReduceOp op, int root) {
  const int N = comm.size(), r = mod(comm.rank() - root, N);
  Buffer incoming;
  for (int mask = 1; mask < N; mask *= 2) {
    if (r & mask) {
      exchange_reducing(comm, buf, mod(r - mask + root, N), Tensor(), -1, op, incoming);
      break;
    }
    if (r + mask < N) exchange_reducing(comm, Tensor(), -1, buf, mod(r + mask + root, N), op, incoming);
  }
  if (comm.rank() == root) finish_average(buf, op, N);
}

void p2p_broadcast(Communicator& comm, Tensor buf, int root) {
  const int N = comm.size(), r = mod(comm.rank() - root, N);
  int mask = 1;
  for (; mask < N; mask *= 2)
    if (r & mask) {
      receive_from(comm, buf, mod(r - mask + root, N));
      break;
    }
  for (mask /= 2; mask > 0; mask /= 2)
    if (r + mask < N) send_to(comm, buf, mod(r + mask + root, N));
}

// ---------------------------------------------------------------------------------------------
// The three collectives, by algorithm.

void p2p_all_reduce(Communicator& comm, Tensor buf, ReduceOp op, Algorithm a) {
  const int N = comm.size(), r = comm.rank();
  if (N == 1 || buf.numel() == 0) return;
  switch (a) {
    case Algorithm::Ring: {
      const std::vector<int64_t> counts = segment_counts(buf.numel(), N);
      ring_reduce_scatter(comm, buf, counts, op);
      const std::vector<int64_t> at = offsets_of(counts);
      finish_average(buf.slice1d(at[size_t(r)], counts[size_t(r)]), op, N);
      ring_all_gather(comm, buf, counts);
      return;
    }
    case Algorithm::HalvingDoubling: {
      const Fold f = fold_of(N, r);
      fold_in(comm, f, buf, op);
      if (f.folded >= 0) {
        const std::vector<int64_t> counts = segment_counts(buf.numel(), f.p), at = offsets_of(counts);
        halving_reduce_scatter(comm, f, buf, counts, op);
        finish_average(buf.slice1d(at[size_t(f.folded)], counts[size_t(f.folded)]), op, N);
        doubling_all_gather(comm, f, buf, counts);
      }
      fold_out(comm, f, buf, buf);
      return;
    }
    case Algorithm::RecursiveDoubling: {
      const Fold f = fold_of(N, r);
      fold_in(comm, f, buf, op);
      if (f.folded >= 0) {
        doubling_all_reduce(comm, f, buf, op);
        finish_average(buf, op, N);
      }
      fold_out(comm, f, buf, buf);
      return;
    }
    case Algorithm::BinomialTree:
      p2p_reduce(comm, buf, op, 0);
      p2p_broadcast(comm, buf, 0);
      return;
  }
}

void p2p_reduce_scatter(Communicator& comm, Tensor send, Tensor recv, ReduceOp op, Algorithm a,
                        const std::vector<int64_t>& segments) {
  ENSURE(algorithm_has(a, CollectiveKind::ReduceScatter),
         std::string(algorithm_name(a)) + " has no reduce-scatter here (ring, halving-doubling)");
  const int N = comm.size(), r = comm.rank();
  const std::vector<int64_t> counts = counts_of(segments, send.numel(), N, "reduce-scatter"), at = offsets_of(counts);
  ENSURE(recv.numel() == counts[size_t(r)], "reduce-scatter: recv must hold this rank's segment of send");
  if (send.numel() == 0) return;
  // The input stays as the caller gave it (comm.h's contract): the partial sums build up in a copy.
  Buffer work_owner;
  const Tensor work = scratch(work_owner, send, send.numel());
  copy_into(work, send);
  if (a == Algorithm::Ring) {
    if (N > 1) ring_reduce_scatter(comm, work, counts, op);
  } else {
    const Fold f = fold_of(N, r);
    fold_in(comm, f, work, op);
    if (f.folded >= 0) halving_reduce_scatter(comm, f, work, folded_counts(f, counts), op);
    // The odd rank of a folded pair now holds both segments of the pair: the even rank's goes home.
    if (r < 2 * f.extra) {
      if (r % 2 == 1) send_to(comm, work.slice1d(at[size_t(r - 1)], counts[size_t(r - 1)]), r - 1);
      else receive_from(comm, work.slice1d(at[size_t(r)], counts[size_t(r)]), r + 1);
    }
  }
  const Tensor mine = work.slice1d(at[size_t(r)], counts[size_t(r)]);
  finish_average(mine, op, N);
  copy_into(recv, mine);
}

void p2p_all_gather(Communicator& comm, Tensor send, Tensor recv, Algorithm a, const std::vector<int64_t>& segments) {
  ENSURE(algorithm_has(a, CollectiveKind::AllGather),
         std::string(algorithm_name(a)) + " has no all-gather here (ring, recursive-doubling)");
  const int N = comm.size(), r = comm.rank();
  const std::vector<int64_t> counts = counts_of(segments, recv.numel(), N, "all-gather"), at = offsets_of(counts);
  ENSURE(send.numel() == counts[size_t(r)], "all-gather: send must hold this rank's segment of recv");
  if (recv.numel() == 0) return;
  copy_into(recv.slice1d(at[size_t(r)], counts[size_t(r)]), send);
  if (N == 1) return;
  if (a == Algorithm::Ring) return ring_all_gather(comm, recv, counts);
  const Fold f = fold_of(N, r);
  // The even rank of a folded pair hands its segment to the odd one, which then plays both.
  if (r < 2 * f.extra) {
    if (r % 2 == 0) send_to(comm, recv.slice1d(at[size_t(r)], counts[size_t(r)]), r + 1);
    else receive_from(comm, recv.slice1d(at[size_t(r - 1)], counts[size_t(r - 1)]), r - 1);
  }
  if (f.folded >= 0) doubling_all_gather(comm, f, recv, folded_counts(f, counts));
  fold_out(comm, f, recv, recv);
}

// ---------------------------------------------------------------------------------------------
// Names, segments and costs.

const char* algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::Ring: return "ring";
    case Algorithm::HalvingDoubling: return "halving-doubling";
    case Algorithm::RecursiveDoubling: return "recursive-doubling";
    case Algorithm::BinomialTree: return "binomial-tree";
  }
  return "?";
}

bool parse_algorithm(const std::string& name, Algorithm* out) {
  for (Algorithm a : kAllAlgorithms)
    if (name == algorithm_name(a)) return *out = a, true;
  return false;
}

bool algorithm_has(Algorithm a, CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::AllReduce: return true;
    case CollectiveKind::ReduceScatter: return a == Algorithm::Ring || a == Algorithm::HalvingDoubling;
    case CollectiveKind::AllGather: return a == Algorithm::Ring || a == Algorithm::RecursiveDoubling;
    default: return false;
  }
}

std::vector<int64_t> segment_counts(int64_t n, int ranks) {
  std::vector<int64_t> counts(size_t(ranks), n / ranks);
  for (int r = 0; r < int(n % ranks); r++) counts[size_t(r)]++;
  return counts;
}

namespace {
int log2_floor(int n) {
  int k = 0;
  while ((2 << k) <= n) k++;
  return k;
}
int log2_ceil(int n) {
  int k = 0;
  while ((1 << k) < n) k++;
  return k;
}
}  // namespace

// Even segments (n/N each); a folded N pays one more step each way with the whole vector (a
// reduce-scatter brings back only the even rank's segment, an all-gather takes in only its segment).
double predicted_seconds(const CostModel& m, Algorithm a, CollectiveKind kind, int64_t bytes, int N) {
  if (N <= 1 || bytes == 0) return 0;
  const double n = double(bytes), al = m.alpha_s, be = m.beta_s_per_byte, ga = m.gamma_s_per_byte;
  const double share = double(N - 1) / N;
  const int p = 1 << log2_floor(N), lg = log2_floor(N);
  const bool folded = p != N;
  const double p_share = double(p - 1) / p;
  const double fold_reduce = folded ? al + n * be + n * ga : 0, fold_back = folded ? al + n * be : 0;
  switch (a) {
    case Algorithm::Ring:
      if (kind == CollectiveKind::AllReduce) return 2 * (N - 1) * al + 2 * share * n * be + share * n * ga;
      if (kind == CollectiveKind::ReduceScatter) return (N - 1) * al + share * n * (be + ga);
      return (N - 1) * al + share * n * be;
    case Algorithm::HalvingDoubling:
      if (kind == CollectiveKind::AllReduce)
        return fold_reduce + 2 * lg * al + 2 * p_share * n * be + p_share * n * ga + fold_back;
      return fold_reduce + lg * al + p_share * n * (be + ga) + (folded ? al + n / N * be : 0);
    case Algorithm::RecursiveDoubling:
      if (kind == CollectiveKind::AllReduce) return fold_reduce + lg * (al + n * be + n * ga) + fold_back;
      return (folded ? al + n / N * be : 0) + lg * al + p_share * n * be + fold_back;
    case Algorithm::BinomialTree: {
      const int depth = log2_ceil(N);
      return depth * (al + n * be + n * ga) + depth * (al + n * be);
    }
  }
  return 0;
}

// Closed forms, rank by rank (never a run of the algorithm): what rank r sends.
int64_t predicted_sent_bytes(Algorithm a, CollectiveKind kind, int64_t bytes, int element_bytes, int N, int r) {
  if (N <= 1 || bytes == 0) return 0;
  const int64_t n = bytes / element_bytes;
  const std::vector<int64_t> seg = segment_counts(n, N);
  const int64_t e = element_bytes;
  switch (a) {
    case Algorithm::Ring:
      // Reduce-scatter: every segment but its own; all-gather: every segment but the one that
      // arrives last, r + 1's.
      if (kind == CollectiveKind::ReduceScatter) return (n - seg[size_t(r)]) * e;
      if (kind == CollectiveKind::AllGather) return (n - seg[size_t((r + 1) % N)]) * e;
      return (2 * n - seg[size_t(r)] - seg[size_t((r + 1) % N)]) * e;
    case Algorithm::BinomialTree: {
      // Reduce: one send to the parent (all but rank 0). Broadcast: one per child, the ranks r + 2^k
      // below r's lowest set bit.
      int64_t sends = r == 0 ? 0 : 1;
      const int low = r == 0 ? (1 << log2_ceil(N)) : (r & -r);
      for (int mask = 1; mask < low; mask *= 2)
        if (r + mask < N) sends++;
      return sends * n * e;
    }
    default: break;
  }
  const int p = 1 << log2_floor(N), extra = N - p, lg = log2_floor(N);
  const bool in_pair = r < 2 * extra, even_of_pair = in_pair && r % 2 == 0;
  const int f = in_pair ? (even_of_pair ? -1 : r / 2) : r - extra;
  int64_t sent = 0;
  if (a == Algorithm::RecursiveDoubling && kind == CollectiveKind::AllReduce) {
    if (even_of_pair) return n * e;          // its vector, folding in
    return (int64_t(lg) + (in_pair ? 1 : 0)) * n * e;  // lg p swaps, and the odd rank's result going back
  }
  // Halving-doubling's segments: even over p for the all-reduce, the pairs' merged for the others.
  std::vector<int64_t> counts(static_cast<size_t>(p));
  if (kind == CollectiveKind::AllReduce) counts = segment_counts(n, p);
  else
    for (int x = 0; x < p; x++) counts[size_t(x)] = x < extra ? seg[size_t(2 * x)] + seg[size_t(2 * x + 1)] : seg[size_t(x + extra)];
  std::vector<int64_t> at(size_t(p) + 1, 0);
  for (int x = 0; x < p; x++) at[size_t(x) + 1] = at[size_t(x)] + counts[size_t(x)];
  const bool reduce = kind != CollectiveKind::AllGather;
  if (even_of_pair) return (reduce ? n : seg[size_t(r)]) * e;  // folds in, then only receives
  if (reduce) sent += n - counts[size_t(f)];  // halving: every folded segment but its own, once
  if (kind != CollectiveKind::ReduceScatter)   // doubling: its window at every width
    for (int width = 1; width < p; width *= 2) {
      const int mine = f & ~(width - 1);
      sent += at[size_t(mine + width)] - at[size_t(mine)];
    }
  if (in_pair) sent += kind == CollectiveKind::ReduceScatter ? seg[size_t(r - 1)] : n;  // back to the even rank
  return sent * e;
}
