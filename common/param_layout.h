// param_layout.h: where every parameter lives in the flat buffers.
// All parameters sit in one contiguous buffer and all gradients in a second with the same offsets;
// this table (name, shape, offset, size, unit) describes both. A bucket, a ZeRO shard and a pipeline
// stage are then offset ranges, and distribution becomes arithmetic.
//
// A "unit" is what the hooks and later chapters call a layer: unit 0 holds the embeddings (wte, wpe),
// units 1..L the transformer blocks, unit L+1 the final layernorm (the LM head reuses wte: tied).
// Parameters are stored in forward order, so backward produces gradients from high offsets to low.
// Each unit is padded to a multiple of ranks x 16 elements: the whole length then divides by the
// rank count, and every unit splits into equal, 64-byte-aligned per-rank pieces (ZeRO-3 gathers per
// unit). Padding elements are zero and stay zero.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model_config.h"

struct ParamInfo {
  std::string name;        // e.g. "h1.attn.qkv.weight"
  int ndim = 0;
  int64_t shape[2] = {0, 0};
  int64_t offset = 0;      // in elements, into the flat buffers
  int64_t size = 0;        // elements
  int unit = 0;
  bool weight_decay = false;  // AdamW decays matrices (ndim 2), not biases or layernorm gains
};

struct ParamLayout {
  std::vector<ParamInfo> params;
  std::vector<int64_t> unit_begin;  // unit u spans [unit_begin[u], unit_begin[u+1]); size num_units+1
  int64_t num_params = 0;           // Ψ: real parameters, no padding
  int64_t padded_size = 0;          // the flat length, a multiple of ranks x 16
  int ranks = 1;

  int num_units() const { return int(unit_begin.size()) - 1; }
  int64_t unit_size(int u) const { return unit_begin[u + 1] - unit_begin[u]; }
  int64_t shard_size() const { return padded_size / ranks; }   // ZeRO-1/2: rank r owns
  int64_t shard_begin(int rank) const { return rank * shard_size(); }  // [begin, begin+shard_size)
  int find(const std::string& name) const;  // index into params, or -1
};

ParamLayout build_gpt2_layout(const GPT2Config& cfg, int ranks);

// Parameters of the whole model excluding position embeddings: the N of FLOPs/token = 6N + 12LCT.
int64_t flops_params(const ParamLayout& layout);
