// param_layout.cpp: the GPT-2 parameter table of param_layout.h.
#include "model/param_layout.h"

#include <cstring>
#include <numeric>  // std::lcm

#include "base/check.h"

namespace {

constexpr int64_t kAlignElements = 16;  // 64 bytes of fp32: every per-rank piece starts aligned

int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

class LayoutBuilder {
 public:
  LayoutBuilder(int ranks, TensorParallelism tp) {
    layout_.ranks = ranks;
    layout_.tp = tp;
  }

  // The next parameters added are on another pipeline stage (false) or on this one (true).
  void set_held(bool held) { held_ = held; }
  void set_ep(ExpertParallelism ep) { layout_.ep = ep; }
  void set_expert(int expert) { expert_ = expert; }
  void set_tied_wte_end(int64_t end) { layout_.tied_wte_end = end; }  // the next tensors are this expert's (-1: none)

  void begin_unit() { layout_.unit_begin.push_back(next_offset_); unit_++; }
  void end_unit() { pad(); }
  // The next parameter starts on a shard boundary: a multiple of ranks x 16.
  void pad() { next_offset_ = round_up(next_offset_, kAlignElements * layout_.ranks); }
  int64_t offset() const { return next_offset_; }
  // A block's experts: a range on a shard boundary whose length splits over the data-parallel group
  // and over the experts' replicas alike (param_layout.h).
  void begin_experts() {
    pad();
    experts_begin_ = next_offset_;
    expert_params_before_ = layout_.num_params;
  }
  void end_experts() {
    const int64_t multiple = kAlignElements * std::lcm(int64_t(layout_.ranks), int64_t(layout_.ep.replicas));
    next_offset_ = experts_begin_ + round_up(next_offset_ - experts_begin_, multiple);
    layout_.expert_range_size += next_offset_ - experts_begin_;
    layout_.expert_params += layout_.num_params - expert_params_before_;
  }

  // A tensor of global shape (rows, cols) (cols 0: a vector), cut by `cut` (dim, blocks) into the
  // layout's tensor-parallel parts, of which this rank holds its own.
  void add(const std::string& name, int64_t rows, int64_t cols = 0, TensorShard cut = {}) {
    ParamInfo p;
    p.name = name;
    p.ndim = cols ? 2 : 1;
    p.global_shape[0] = rows;
    p.global_shape[1] = cols;
    p.shape[0] = rows;
    p.shape[1] = cols;
    if (cut.dim >= 0 && layout_.tp.size > 1) {
      p.shard = cut;
      p.shard.parts = layout_.tp.size;
      p.shard.index = layout_.tp.rank;
      ENSURE(p.global_shape[cut.dim] % (int64_t(cut.blocks) * p.shard.parts) == 0,
             name + ": dimension " + std::to_string(cut.dim) + " does not split into the tensor-parallel parts");
      p.shape[cut.dim] /= p.shard.parts;
    }
    if (!held_) p.shape[0] = p.shape[1] = 0;
    p.size = cols ? p.shape[0] * p.shape[1] : p.shape[0];
    p.offset = next_offset_;
    p.unit = unit_;
    p.expert = expert_;
    p.weight_decay = p.ndim == 2;
    p.copies = p.expert >= 0 ? kAxisEDP
                             : kAxisDP | kContextAxes | (p.shard.whole() ? kAxisTP : 0u) | (name == "wte" ? kAxisPP : 0u);
    next_offset_ += p.size;
    layout_.num_params += p.size;
    layout_.params.push_back(p);
  }

  ParamLayout finish() {
    layout_.unit_begin.push_back(next_offset_);
    layout_.padded_size = next_offset_;
    return layout_;
  }

 private:
  ParamLayout layout_;
  int64_t next_offset_ = 0;
  int unit_ = -1;
  bool held_ = true;
  int expert_ = -1;
  int64_t experts_begin_ = 0, expert_params_before_ = 0;  // the block's experts being added
};

}  // namespace

std::string tensor_parallel_size_problem(const GPT2Config& cfg, const TensorParallelism& tp, int micro_batch,
                                         const std::string& micro_batches_flag) {
  if (tp.size == 1) return "";
  const int t = tp.size;
  auto refusal = [&](const std::string& what, int64_t value) {
    return "--tp " + std::to_string(t) + " must divide " + what + " " + std::to_string(value) + " of --preset " +
           cfg.preset + " (every tensor-parallel rank takes an equal part of it)";
  };
  if (cfg.NH % t) return refusal("the number of heads NH =", cfg.NH);
  if (cfg.V % t) return refusal("the vocabulary V =", cfg.V);
  if ((4 * int64_t(cfg.C)) % t) return refusal("the MLP's width 4C =", 4 * int64_t(cfg.C));
  if (tp.sequence_parallel && (int64_t(micro_batch) * cfg.T) % t)
    return "--sequence-parallel splits the B*T = " + std::to_string(micro_batch) + " x " + std::to_string(cfg.T) +
           " positions of a micro-batch over --tp " + std::to_string(t) +
           " ranks, which does not divide; choose a --batch (or " + micro_batches_flag + ") that makes B*T a multiple of " +
           std::to_string(t);
  return "";
}

int ParamLayout::find(const std::string& name) const {
  for (size_t i = 0; i < params.size(); i++)
    if (params[i].name == name) return int(i);
  return -1;
}

ParamLayout build_gpt2_layout(const GPT2Config& cfg, int ranks, TensorParallelism tp,
                              const std::vector<ModelPart>& parts, ExpertParallelism ep) {
  ENSURE(ep.size == 1 || (cfg.moe() && cfg.experts % ep.size == 0), "expert parallelism needs E divisible by ep");
  ENSURE(ep.replicas >= 1, "expert parallelism: replicas must be >= 1");
  const int64_t C = cfg.C;
  auto holds = [&](int unit) {
    if (parts.empty()) return true;
    for (const ModelPart& part : parts)
      if (part.holds(cfg, unit)) return true;
    return false;
  };
  // Megatron-LM's cuts (param_layout.h): rows of the output (column-parallel), columns of the input
  // (row-parallel); qkv's rows are three blocks (q, k, v), each cut by heads.
  const TensorShard column{0, 1, 0, 1}, row{1, 1, 0, 1}, qkv{0, 1, 0, 3};
  LayoutBuilder b(ranks, tp);
  b.set_ep(ep);
  b.begin_unit();  // unit 0: embeddings
  b.set_held(holds(0) || holds(cfg.L + 1));  // wte: the embedding's, and the tied LM head's
  b.add("wte", cfg.V, C, column);            // by vocabulary
  if (!parts.empty()) {  // a pipeline: wte's two copies in buckets of one shape (ParamLayout::tied_wte_end)
    b.pad();
    b.set_tied_wte_end(b.offset());
  }
  b.set_held(holds(0));
  b.add("wpe", cfg.T, C);
  b.end_unit();
  for (int l = 0; l < cfg.L; l++) {  // units 1..L: blocks, parameters in forward order
    std::string h = "h" + std::to_string(l) + ".";
    b.set_held(holds(l + 1));
    b.begin_unit();
    b.add(h + "ln1.weight", C);
    b.add(h + "ln1.bias", C);
    b.add(h + "attn.qkv.weight", 3 * C, C, qkv);
    b.add(h + "attn.qkv.bias", 3 * C, 0, qkv);
    b.add(h + "attn.proj.weight", C, C, row);
    b.add(h + "attn.proj.bias", C);
    b.add(h + "ln2.weight", C);
    b.add(h + "ln2.bias", C);
    if (cfg.moe()) {
      b.add(h + "moe.router.weight", cfg.experts, C);
      b.begin_experts();
      for (int e = 0; e < cfg.experts; e++) {
        const std::string x = h + "moe.expert" + std::to_string(e) + ".mlp.";
        b.set_held(holds(l + 1) && ep.holds(e, cfg.experts));
        b.set_expert(e);  // (whole: tensor parallelism never splits an expert; expert parallelism spreads them)
        b.add(x + "fc.weight", 4 * C, C);
        b.add(x + "fc.bias", 4 * C);
        b.add(x + "proj.weight", C, 4 * C);
        b.add(x + "proj.bias", C);
        b.set_expert(-1);
        b.set_held(holds(l + 1));
      }
      b.end_experts();
      b.end_unit();
      continue;
    }
    b.add(h + "mlp.fc.weight", 4 * C, C, column);
    b.add(h + "mlp.fc.bias", 4 * C, 0, column);
    b.add(h + "mlp.proj.weight", C, 4 * C, row);
    b.add(h + "mlp.proj.bias", C);
    b.end_unit();
  }
  b.set_held(holds(cfg.L + 1));
  b.begin_unit();  // unit L+1: final layernorm; the LM head is wte (tied)
  b.add("lnf.weight", C);
  b.add("lnf.bias", C);
  b.end_unit();
  return b.finish();
}

int64_t flops_params(const ParamLayout& layout) {
  int wpe = layout.find("wpe");
  return layout.num_params - (wpe >= 0 ? layout.params[wpe].size : 0);
}

namespace {

// Visits the runs of contiguous elements that a rank's slice of `p` shares with the global tensor:
// visit(local offset, global offset, count), offsets within the tensors.
template <typename Visit>
void for_each_run(const ParamInfo& p, Visit visit) {
  const int64_t rows = p.shape[0], cols = p.ndim == 2 ? p.shape[1] : 1;
  const int64_t global_cols = p.ndim == 2 ? p.global_shape[1] : 1;
  if (p.shard.whole()) return visit(0, 0, p.size);
  if (p.shard.dim == 1) {  // each row: this rank's columns
    for (int64_t r = 0; r < rows; r++) visit(r * cols, r * global_cols + p.shard.index * cols, cols);
    return;
  }
  // dim 0: in each of the blocks, this rank's rows
  const int64_t block_rows = p.global_shape[0] / p.shard.blocks, local_block_rows = rows / p.shard.blocks;
  for (int k = 0; k < p.shard.blocks; k++) {
    const int64_t global_row = k * block_rows + p.shard.index * local_block_rows;
    visit(k * local_block_rows * cols, global_row * global_cols, local_block_rows * cols);
  }
}

void check_same_model(const ParamLayout& a, const ParamLayout& b) {
  ENSURE(a.params.size() == b.params.size(), "layouts of different models");
  for (size_t i = 0; i < a.params.size(); i++)
    ENSURE(a.params[i].name == b.params[i].name, "layouts list their parameters differently");
}

}  // namespace

void slice_from_global(const ParamLayout& global, const float* global_flat, const ParamLayout& local, float* local_flat) {
  check_same_model(global, local);
  for (size_t i = 0; i < local.params.size(); i++) {
    const ParamInfo& p = local.params[i];
    const float* from = global_flat + global.params[i].offset;
    float* to = local_flat + p.offset;
    for_each_run(p, [&](int64_t at_local, int64_t at_global, int64_t n) {
      std::memcpy(to + at_local, from + at_global, size_t(n) * sizeof(float));
    });
  }
}

void place_into_global(const ParamLayout& local, const float* local_flat, const ParamLayout& global, float* global_flat) {
  check_same_model(global, local);
  for (size_t i = 0; i < local.params.size(); i++) {
    const ParamInfo& p = local.params[i];
    const float* from = local_flat + p.offset;
    float* to = global_flat + global.params[i].offset;
    for_each_run(p, [&](int64_t at_local, int64_t at_global, int64_t n) {
      std::memcpy(to + at_global, from + at_local, size_t(n) * sizeof(float));
    });
  }
}
