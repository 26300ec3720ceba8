// param_layout.cpp: the GPT-2 parameter table of param_layout.h.
#include "param_layout.h"

namespace {

constexpr int64_t kAlignElements = 16;  // 64 bytes of fp32: every per-rank piece starts aligned

int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

class LayoutBuilder {
 public:
  explicit LayoutBuilder(int ranks) { layout_.ranks = ranks; }

  void begin_unit() { layout_.unit_begin.push_back(next_offset_); unit_++; }
  void end_unit() { next_offset_ = round_up(next_offset_, kAlignElements * layout_.ranks); }

  void add(const std::string& name, int64_t rows, int64_t cols = 0) {
    ParamInfo p;
    p.name = name;
    p.ndim = cols ? 2 : 1;
    p.shape[0] = rows;
    p.shape[1] = cols;
    p.size = cols ? rows * cols : rows;
    p.offset = next_offset_;
    p.unit = unit_;
    p.weight_decay = p.ndim == 2;
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
};

}  // namespace

int ParamLayout::find(const std::string& name) const {
  for (size_t i = 0; i < params.size(); i++)
    if (params[i].name == name) return int(i);
  return -1;
}

ParamLayout build_gpt2_layout(const GPT2Config& cfg, int ranks) {
  const int64_t C = cfg.C;
  LayoutBuilder b(ranks);
  b.begin_unit();  // unit 0: embeddings
  b.add("wte", cfg.V, C);
  b.add("wpe", cfg.T, C);
  b.end_unit();
  for (int l = 0; l < cfg.L; l++) {  // units 1..L: blocks, parameters in forward order
    std::string h = "h" + std::to_string(l) + ".";
    b.begin_unit();
    b.add(h + "ln1.weight", C);
    b.add(h + "ln1.bias", C);
    b.add(h + "attn.qkv.weight", 3 * C, C);
    b.add(h + "attn.qkv.bias", 3 * C);
    b.add(h + "attn.proj.weight", C, C);
    b.add(h + "attn.proj.bias", C);
    b.add(h + "ln2.weight", C);
    b.add(h + "ln2.bias", C);
    b.add(h + "mlp.fc.weight", 4 * C, C);
    b.add(h + "mlp.fc.bias", 4 * C);
    b.add(h + "mlp.proj.weight", C, 4 * C);
    b.add(h + "mlp.proj.bias", C);
    b.end_unit();
  }
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
