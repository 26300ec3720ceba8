// ulysses_attention.cpp: see ulysses_attention.h.
#include "parallel/ulysses_attention.h"

#include <cstring>

#include "base/check.h"
#include "ops/ops.h"  // fill_zero

std::vector<int> ulysses_positions(const std::vector<int>& chunk, int u, int rank) {
  ENSURE(u >= 1 && chunk.size() % size_t(u) == 0 && rank >= 0 && rank < u, "ulysses_positions: bad split");
  const size_t n = chunk.size() / size_t(u);
  return std::vector<int>(chunk.begin() + long(rank * n), chunk.begin() + long((rank + 1) * n));
}

std::string ulysses_problem(int u, int NH, int tp, int T, int cp, ContextSplit split, int ranks) {
  if (u < 1) return "--ulysses must be >= 1";
  if (u == 1) return "";
  const std::string U = "--ulysses " + std::to_string(u);
  // The three rules a Ulysses group size must keep; a refusal suggests only sizes that keep all three.
  // (A slice may cut across zigzag's two chunks: each row's position embedding and causal mask go by
  // its absolute position, wherever it sits.)
  const int parts = split == ContextSplit::Zigzag ? 2 * cp : cp;
  auto heads_fit = [&](int x) { return NH % tp == 0 && (NH / tp) % x == 0; };
  auto positions_fit = [&](int x) { return T % parts == 0 && (T / cp) % x == 0; };
  auto ranks_fit = [&](int x) { return ranks % (tp * cp * x) == 0; };
  auto works = [&]() {
    std::string list;
    for (int other = 1; other <= ranks; other++)
      if (other != u && heads_fit(other) && positions_fit(other) && ranks_fit(other))
        list += (list.empty() ? "" : ", ") + std::to_string(other);
    return list.empty() ? std::string("--ulysses 1") : "--ulysses " + list;
  };
  if (!heads_fit(u))
    return U + ": the " + std::to_string(NH) + " heads" + (tp > 1 ? ", " + std::to_string(NH / tp) + " per TP rank," : "") +
           " do not split into " + std::to_string(u) + " groups of whole heads (each rank of a Ulysses group computes "
           "NH/(tp x u) heads): use " + works();
  if (!positions_fit(u))
    return U + ": a ring chunk's " + std::to_string(T / cp) + " positions (T = " + std::to_string(T) + " over --cp " +
           std::to_string(cp) + ") do not split into " + std::to_string(u) + " equal slices: use " + works() +
           ", or another --preset";
  if (!ranks_fit(u))
    return U + ": the " + std::to_string(ranks) + " ranks do not divide into groups of " +
           (tp > 1 ? "--tp x " : "") + "--cp x --ulysses = " + std::to_string(tp * cp * u) + ": use " + works();
  return "";
}

UlyssesAttention::UlyssesAttention(Communicator& group, int max_B, int T, int C, Forward attend,
                                   Backward attend_backward)
    : group_(group), u_(group.size()), C_(C), attend_(std::move(attend)), attend_backward_(std::move(attend_backward)) {
  ENSURE(C % u_ == 0, "UlyssesAttention: the channels do not split over the group");
  const int64_t qkv = int64_t(max_B) * T * 3 * C, one = int64_t(max_B) * T * C;
  qkv_heads_ = Buffer(qkv, MemCategory::Activations);
  out_heads_ = Buffer(one, MemCategory::Activations);
  dout_heads_ = Buffer(one, MemCategory::Activations);
  dqkv_heads_ = Buffer(qkv, MemCategory::Activations);
  send_ = Buffer(qkv, MemCategory::Activations);
  recv_ = Buffer(qkv, MemCategory::Activations);
}

// One all-to-all of the group, its bytes and blocked time counted apart from the caller's.
void UlyssesAttention::exchange(int64_t count) {
  group_.all_to_all(send_.view().slice1d(0, count), recv_.view().slice1d(0, count));
}

void UlyssesAttention::to_heads(Tensor x, int parts, float* xh) {
  ENSURE(x.device == Device::CPU, "UlyssesAttention runs on the CPU");
  const int64_t B = x.shape[0], T = x.shape[1], c = C_ / u_, row = parts * c;
  ENSURE(B * T * parts * C_ <= send_.count(), "UlyssesAttention: more positions than the buffers hold");
  const float* in = x.f32();
  float* send = send_.f32();
  // Chunk j, for group rank j: its heads of each part, at this rank's positions.
  for (int j = 0; j < u_; j++)
    for (int64_t bt = 0; bt < B * T; bt++)
      for (int p = 0; p < parts; p++)
        std::memcpy(send + (j * B * T + bt) * row + p * c, in + bt * parts * C_ + p * C_ + j * c, size_t(c) * sizeof(float));
  exchange(u_ * B * T * row);
  // Chunk i, from group rank i: this rank's heads at rank i's positions, rows [iT, (i+1)T) of each sequence.
  const float* recv = recv_.f32();
  for (int i = 0; i < u_; i++)
    for (int64_t b = 0; b < B; b++)
      std::memcpy(xh + (b * u_ * T + i * T) * row, recv + (i * B + b) * T * row, size_t(T * row) * sizeof(float));
}

void UlyssesAttention::to_positions(const float* xh, int parts, Tensor x) {
  const int64_t B = x.shape[0], T = x.shape[1], c = C_ / u_, row = parts * c;
  float* send = send_.f32();
  for (int i = 0; i < u_; i++)
    for (int64_t b = 0; b < B; b++)
      std::memcpy(send + (i * B + b) * T * row, xh + (b * u_ * T + i * T) * row, size_t(T * row) * sizeof(float));
  exchange(u_ * B * T * row);
  const float* recv = recv_.f32();
  float* out = x.f32();
  for (int j = 0; j < u_; j++)
    for (int64_t bt = 0; bt < B * T; bt++)
      for (int p = 0; p < parts; p++) {
        const float* from = recv + (j * B * T + bt) * row + p * c;
        float* to = out + bt * parts * C_ + p * C_ + j * c;
        for (int64_t k = 0; k < c; k++) to[k] += from[k];
      }
}

namespace {
// The group communicator's all-to-all bytes and blocked time during one pass, added to the counters.
struct Measure {
  Measure(Communicator& group, int64_t& bytes, int64_t& exchanges, double& idle)
      : group(group), bytes(bytes), exchanges(exchanges), idle(idle), before(group.stats()) {}
  ~Measure() {
    const CommStats d = group.stats().since(before);
    bytes += d.kind[int(CollectiveKind::AllToAll)].sent_bytes;
    exchanges += d.kind[int(CollectiveKind::AllToAll)].calls;
    idle += d.exposed_ms;
  }
  Communicator& group;
  int64_t& bytes;
  int64_t& exchanges;
  double& idle;
  CommStats before;
};
}  // namespace

void UlyssesAttention::forward(Tensor out, Tensor lse, Tensor qkv, int NH) {
  ENSURE(NH % u_ == 0, "UlyssesAttention: the heads do not split over the group");
  const int64_t B = out.shape[0], T = out.shape[1], uT = u_ * T, c = C_ / u_;
  const Measure measure(group_, counters.forward_bytes, counters.forward_exchanges, counters.forward_idle_ms);
  to_heads(qkv, 3, qkv_heads_.f32());
  // The log-sum-exp of NH/u heads over uT positions is as many values as the model's (B,NH,T): its
  // buffer keeps them, in the head layout, for the backward.
  attend_(make_view(out_heads_.data(), {B, uT, c}), make_view(lse.data, {B, NH / u_, uT}),
          make_view(qkv_heads_.data(), {B, uT, 3 * c}), NH / u_);
  fill_zero(out);
  to_positions(out_heads_.f32(), 1, out);
}

void UlyssesAttention::backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int NH) {
  const int64_t B = out.shape[0], T = out.shape[1], uT = u_ * T, c = C_ / u_;
  const Measure measure(group_, counters.backward_bytes, counters.backward_exchanges, counters.backward_idle_ms);
  to_heads(qkv, 3, qkv_heads_.f32());
  to_heads(out, 1, out_heads_.f32());
  to_heads(dout, 1, dout_heads_.f32());
  const Tensor dqkv_heads = make_view(dqkv_heads_.data(), {B, uT, 3 * c});
  fill_zero(dqkv_heads);
  attend_backward_(dqkv_heads, make_view(dout_heads_.data(), {B, uT, c}), make_view(qkv_heads_.data(), {B, uT, 3 * c}),
                   make_view(out_heads_.data(), {B, uT, c}), make_view(lse.data, {B, NH / u_, uT}), NH / u_);
  to_positions(dqkv_heads_.f32(), 3, dqkv);
}

double ulysses_buffer_bytes(int B, int T, int C) { return 14.0 * B * T * C * 4; }

double ulysses_forward_bytes(int u, int L, int K, int B, int T, int C, int passes) {
  return passes * 4.0 * (u - 1) * L * K * B * T * C * 4 / u;
}

double ulysses_backward_bytes(int u, int L, int K, int B, int T, int C) {
  return 8.0 * (u - 1) * L * K * B * T * C * 4 / u;
}
