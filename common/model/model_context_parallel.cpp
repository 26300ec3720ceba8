// model_context_parallel.cpp: the two places where GPT2 depends on positions, and so on context
// parallelism (chapter 10), under which a rank holds T/cp positions of each sequence. Attention, the
// one op that mixes positions: on one rank the op itself (FlashAttention, or the (B,NH,T,T) scores
// and softmax), under context parallelism the chapter's ring (AttentionHooks), which keeps, as
// FlashAttention does, only the output and a log-sum-exp per query. And the position embeddings, at
// each row's absolute position.
#include "model/model_internal.h"
#include "ops/ops.h"

using namespace model_internal;

void GPT2::self_attention_forward(Slot& s, const Layer& x) {
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  if (cp_.on()) {  // the ring: this rank's queries meet every rank's keys and values
    attention_hooks.attention_forward(v.btc(x.atty, v.d.Cl), v.lse(x.lse), v.btc(x.qkv, 3 * v.d.Cl), int(v.d.NHl));
  } else if (flash_) {
    attention_forward_flash(v.btc(x.atty, v.d.Cl), v.lse(x.lse), v.btc(x.qkv, 3 * v.d.Cl), int(v.d.NHl));
  } else {
    attention_forward(v.btc(x.atty, v.d.Cl), v.scores(x.preatt), v.bhtt(x.att), v.btc(x.qkv, 3 * v.d.Cl), int(v.d.NHl));
  }
}

void GPT2::self_attention_backward(Slot& s, const Layer& x, void* dqkv, void* att) {
  Activations& a = *acts_;
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  if (cp_.on()) {
    fill_zero(v.full(dqkv, 3 * v.d.Cl));
    attention_hooks.attention_backward(v.btc(dqkv, 3 * v.d.Cl), v.btc(a.datty, v.d.Cl), v.btc(x.qkv, 3 * v.d.Cl),
                                v.btc(x.atty, v.d.Cl), v.lse(x.lse), int(v.d.NHl));
  } else if (flash_) {
    fill_zero(v.full(dqkv, 3 * v.d.Cl));
    attention_backward_flash(v.btc(dqkv, 3 * v.d.Cl), v.btc(a.datty, v.d.Cl), v.btc(x.qkv, 3 * v.d.Cl),
                             v.btc(x.atty, v.d.Cl), v.lse(x.lse), int(v.d.NHl));
  } else {  // (dpreatt and datt are the op's scratch, their contents meaningless on exit)
    attention_backward(v.btc(dqkv, 3 * v.d.Cl), v.bhtt(a.dpreatt), v.bhtt(a.datt), v.btc(a.datty, v.d.Cl),
                       v.btc(x.qkv, 3 * v.d.Cl), v.bhtt(att), int(v.d.NHl), GradWrite::Overwrite);
  }
}

namespace {
// Calls f(rows, position) for each run of `local`'s rows that holds consecutive positions of one
// sequence. The rank's stream is B sequences x `held` positions each (`positions`: their absolute
// positions under context parallelism, else none: 0..held-1), of which it keeps the rows from
// `first_row` on (under sequence parallelism its slice of them, else all). Under CP x SP a rank's
// rows can begin or end inside a run: only the position of each row decides.
template <typename F>
void for_position_runs_of(Tensor local, int64_t first_row, int64_t held, const std::vector<int>& positions, F f) {
  const int64_t n = local.shape[0], C = local.shape[1];
  const size_t row_bytes = size_t(C) * dtype_size(local.dtype);
  auto position_of = [&](int64_t row) {
    const int64_t j = (first_row + row) % held;
    return positions.empty() ? int(j) : positions[size_t(j)];
  };
  for (int64_t begin = 0; begin < n;) {
    int64_t end = begin + 1;
    while (end < n && (first_row + end) % held != 0 && position_of(end) == position_of(end - 1) + 1) end++;
    char* first = static_cast<char*>(local.data) + size_t(begin) * row_bytes;
    f(make_view(first, {end - begin, C}, local.dtype, local.device), position_of(begin));
    begin = end;
  }
}
}  // namespace

// The position embeddings, added to the rows this rank keeps, at their absolute positions (whole
// on every rank, wpe is not split).
void GPT2::position_embedding_forward(Slot& s) {
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  for_position_runs_of(v.local(s.encoded), tp_.rank * v.d.r * int64_t(v.d.sp), cfg_.T, cp_.positions,
                       [&](Tensor rows, int position) {
                         position_forward(rows, param(kWpe), position, int(layout_.params[kWpe].shape[0]));
                       });
}

void GPT2::position_embedding_backward(Slot& s) {
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  for_position_runs_of(v.local(acts_->dresidual), tp_.rank * v.d.r * int64_t(v.d.sp), cfg_.T, cp_.positions,
                       [&](Tensor rows, int position) {
                         position_backward(grad(kWpe), rows, position, int(layout_.params[kWpe].shape[0]));
                       });
}
