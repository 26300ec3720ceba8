// precision_report.h: what chapter 13 needs around its recipe, kept out of the lesson: the flags and
// their checks (PrecisionFlags, add_precision_flags, precision_recipe_from_flags), and PrecisionLog: the skipped steps, the per-rank JSON records of
// the scales, and the closing summary (underflows and overflows per tensor kind; the bytes each
// category holds, by formula and as allocated).
#pragma once
#include <cstdint>
#include <string>

#include "comm/comm.h"
#include "training/flags.h"
#include "training/precision_flags.h"  // PrecisionFlags, add_precision_flags
#include "training/precision_recipe.h"
#include "ops/tensor.h"

class TrainingRun;

// The recipe the flags ask for. Refuses (config_error, naming the flag) a value it does not know, a
// flag of another precision (--fp8-scaling without --precision fp8), and a recipe that cannot run:
// a --dtype other than fp32; on a GPU, fp8 without fp8 tensor cores, per-row or block fp8 scaling
// (cuBLASLt's fp8 scales are per tensor), fp8 with a width or micro-batch not in multiples of 16.
// cfg is left as given: under a recipe the model's tensors stay fp32 on either device, which the
// run's dtype rule knows (pick_dtype with `recipe`), so --dtype auto means fp32 there.
PrecisionRecipe precision_recipe_from_flags(const PrecisionFlags& pf, const TrainConfig& cfg);

// The values one rank's products read in a step, by kind, from the shapes: every linear layer of
// GPT-2 (per block qkv C->3C, attention projection C->C, fc C->4C, fc projection 4C->C; the LM head
// C->V) reads its input and weight in the forward, dout and weight for the input gradient, dout and
// input for the weight gradient. With N tokens per step: activations 2N(7LC + C), weights
// 2(12LC^2 + VC) per micro-batch, gradients 2N(9LC + V).
struct OperandValues {
  double activations, weights, gradients;
};
OperandValues operand_values_per_step(int L, int C, int V, int64_t tokens, int micro_batches);
// Their bytes in the recipe's formats: each kind's values in format_of(kind), but the LM head's (2VC
// weight values per micro-batch, 2NC activations, 2NV gradients) in the output format (bf16) under
// fp8, which keeps that product out of fp8.
OperandValues operand_bytes_per_step(const PrecisionRecipe& recipe, int L, int C, int V, int64_t tokens,
                                     int micro_batches);

class PrecisionLog {
 public:
  PrecisionLog(const PrecisionRecipe& recipe, TrainingRun& run, Communicator& comm);
  // After each step, on every rank: prints a skipped step and the dynamic loss scale's growth after
  // a window of clean steps (rank 0), gathers every rank's loss scale and
  // scales (a collective of scalars) and writes one "precision" record per rank.
  void after_step(int step, bool applied, float loss_scale, const LowPrecisionMatmuls& products);
  // Rank 0: the underflow and overflow counts per tensor kind; the values the products read per
  // step and their bytes in the recipe's formats, each against its formula (operand_values_per_step,
  // operand_bytes_per_step);
  // the model state per category, as allocated and by formula.
  // Chapters 01-12 under --precision (mixed_precision.h) pass false for a formula that is not their
  // grid's: operands_formula where the model is split (TP, PP, CP) or has experts, model_state_formula where the
  // state is sharded (ZeRO); the counts are printed and recorded all the same.
  void summary(const LowPrecisionMatmuls& products, int64_t params, int L, int C, int V, int64_t tokens_per_step,
               int micro_batches, bool operands_formula = true, bool model_state_formula = true);
  int skipped() const { return skipped_; }

 private:
  PrecisionRecipe recipe_;
  TrainingRun& run_;
  Communicator& comm_;
  int skipped_ = 0, steps_ = 0;
  double last_loss_scale_ = 0;  // the scale after the previous step (0: none yet)
};
