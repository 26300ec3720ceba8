// precision_state.h: the state of a mixed-precision recipe that outlives a step (fp16's loss scale with
// its count of clean steps, delayed fp8's amax histories), saved beside a checkpoint and read back on
// resume. Shared by MixedPrecision (chapters 01-12) and chapter 13's own loop. Defines
// precision_state_path, save_precision_state, load_precision_state and loss_scale_text.
#pragma once
#include <string>

#include "comm/comm.h"
#include "model/param_layout.h"
#include "training/precision_recipe.h"  // PrecisionRecipe, LowPrecisionMatmuls

// A loss scale as a reader compares it with fp16's range: "1048576 = 2^20" (a power of two, as the
// dynamic scale always is), else the number.
std::string loss_scale_text(double scale);

// "ckpt.bin" -> "ckpt.bin.precision", a sharded folder "dir/" -> "dir.precision".
std::string precision_state_path(const std::string& checkpoint);

// Collective, every rank: every rank's histories (a pipeline stage holds its own weights') are
// gathered to rank 0, which writes one text file (hex floats: exact) beside `checkpoint`, keyed by
// the weights' names so that a resume on another grid finds its own.
void save_precision_state(const std::string& checkpoint, const PrecisionRecipe& recipe, float loss_scale,
                          int clean_steps, const LowPrecisionMatmuls& products, const ParamLayout& layout,
                          Communicator& world);
// Collective, every rank: reads the file beside `checkpoint` and restores the loss scale, its clean
// steps and this rank's histories. A file that is absent, or of another recipe, leaves the fresh state
// and says so (rank 0, one line); returns whether the state was restored.
bool load_precision_state(const std::string& checkpoint, const PrecisionRecipe& recipe, float* loss_scale,
                          int* clean_steps, LowPrecisionMatmuls& products, const ParamLayout& layout,
                          Communicator& world);
