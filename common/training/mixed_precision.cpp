// mixed_precision.cpp: MixedPrecision (mixed_precision.h).
//
// Why the loss scale may sit at the products. Scaling the loss by S (a power of two) multiplies every
// gradient of backward by S. On the CPU only the products' operands are rounded to fp16: every other
// op of backward computes in fp32 and is linear in the gradient it receives (layernorm, GELU,
// attention, the residual adds, the cross-entropy's dlogits), and fp32 rounds S*x to exactly S times
// the rounding of x. So multiplying a product's gradient operand by S before it is rounded to fp16,
// and its result by 1/S after, gives bit for bit the values that scaling the loss and unscaling the
// gradients at the end gives, fp16's overflows and underflows included (test_mixed_precision checks
// chapter 03 under fp16 against chapter 13, which scales the loss).
#include "training/mixed_precision.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <utility>

#include "base/fileio.h"  // write_file_atomically, read_whole_file
#include "training/training_run.h"

MixedPrecision::MixedPrecision(const PrecisionRecipe& recipe, const PrecisionFlags& flags, TrainingRun& run,
                               Communicator& world, std::vector<Communicator*> amax_groups, int64_t lm_head_offset)
    : recipe_(recipe),
      products_(recipe, nullptr, nullptr,
                [groups = std::move(amax_groups)](std::vector<float>& amaxes) {
                  for (Communicator* group : groups)
                    for (float& amax : amaxes) amax = float(group->all_reduce_scalar(amax, ReduceOp::Max));
                }),
      log_(recipe, run, world) {
  if (lm_head_offset >= 0) products_.keep_in_output_format(lm_head_offset);  // the LM head stays in bf16 (fp8)
  if (recipe_.precision == Precision::FP16) {
    dynamic_ = flags.loss_scale == 0;
    loss_scale_ = float(dynamic_ ? flags.loss_scale_init : flags.loss_scale);
    window_ = flags.loss_scale_window;
  }
  products_.set_gradient_scale(loss_scale_);
  set_cpu_matmul_emulation(&products_);
  installed_ = true;
  if (run.is_root()) std::printf("precision: %s\n", recipe_.describe().c_str());
}

MixedPrecision::~MixedPrecision() {
  if (installed_) set_cpu_matmul_emulation(nullptr);
}

double MixedPrecision::after_step(int step, double grad_norm) {
  bool applied = true;
  if (recipe_.precision == Precision::FP16) {
    applied = std::isfinite(grad_norm);
    if (!applied) {
      if (dynamic_) loss_scale_ = std::max(loss_scale_ / 2, 1.0f);
      clean_steps_ = 0;
    } else if (dynamic_ && ++clean_steps_ == window_) {
      loss_scale_ *= 2, clean_steps_ = 0;
    }
    products_.set_gradient_scale(loss_scale_);
  }
  products_.end_step();  // the amax histories (delayed fp8), reduced over the groups
  log_.after_step(step, applied, loss_scale_, products_);
  return applied ? grad_norm : 0.0;
}

void MixedPrecision::finish(int64_t params, int L, int C, int V, int64_t tokens_per_step, int micro_batches,
                            bool operands_formula, bool model_state_formula) {
  if (installed_) set_cpu_matmul_emulation(nullptr), installed_ = false;
  log_.summary(products_, params, L, C, V, tokens_per_step, micro_batches, operands_formula,
               operands_formula && model_state_formula);
}

std::string precision_state_path(const std::string& checkpoint) {
  std::string base = checkpoint;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  return base + ".precision";
}

namespace {

// The recipe line: a file of another recipe is not this run's state.
std::string recipe_line(const PrecisionRecipe& r) {
  return std::string("recipe ") + precision_name(r.precision) + " " + fp8_scaling_name(r.scaling) + " " +
         format_name(r.fp8_gradient) + " " + std::to_string(r.amax_history);
}

// Every rank's text, on rank 0 (a few hundred bytes each: scalars, not training traffic).
std::vector<std::string> gather_text(Communicator& world, const std::string& mine) {
  std::vector<std::string> all;
  for (int r = 0; r < world.size(); r++) {
    const bool me = world.rank() == r;
    const size_t n = size_t(world.all_reduce_scalar(me ? double(mine.size()) : 0.0, ReduceOp::Sum));
    std::string text = me ? mine : std::string(n, '\0');
    if (n) world.broadcast_bytes(&text[0], n, r);
    all.push_back(text);
  }
  return all;
}

}  // namespace

void MixedPrecision::save(const std::string& checkpoint, const ParamLayout& layout, Communicator& world) const {
  // One line per history, keyed by the weight's name and the operand's role: the same line on every
  // rank of a stage (the histories are reduced), another stage's lines for its own weights.
  std::ostringstream mine;
  for (const LowPrecisionMatmuls::SavedHistory& h : products_.saved_histories()) {
    std::string name;
    for (const ParamInfo& p : layout.params)
      if (p.offset == h.site && p.size > 0) name = p.name;
    if (name.empty()) continue;  // (no weight starts there: cannot happen for a product's weight)
    mine << "history " << name << " " << h.role << " " << int(h.kind) << " " << h.amaxes.size();
    char hex[40];
    for (float a : h.amaxes) std::snprintf(hex, sizeof hex, " %a", double(a)), mine << hex;  // exact
    mine << "\n";
  }
  const std::vector<std::string> all = gather_text(world, mine.str());
  if (world.rank() != 0) return;
  std::map<std::string, std::string> lines;  // by name and role: each once
  for (const std::string& text : all) {
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream words(line);
      std::string word, name, role;
      words >> word >> name >> role;
      lines[name + " " + role] = line;
    }
  }
  std::ostringstream out;
  char scale[40];
  std::snprintf(scale, sizeof scale, "%a", double(loss_scale_));
  out << recipe_line(recipe_) << "\nloss_scale " << scale << " " << clean_steps_ << "\n";
  for (const auto& [key, line] : lines) out << line << "\n";
  const std::string text = out.str();
  write_file_atomically(precision_state_path(checkpoint), text.data(), text.size());
}

void MixedPrecision::load(const std::string& checkpoint, const ParamLayout& layout, Communicator& world) {
  const std::string path = precision_state_path(checkpoint);
  std::string text, error;
  const bool found = world.rank() == 0 && read_whole_file(path, &text, &error);
  const double size = world.all_reduce_scalar(found ? double(text.size()) : -1.0, ReduceOp::Max);  // rank 0's
  if (size < 0) {
    if (world.rank() == 0)
      std::printf("precision: no %s beside the checkpoint: the loss scale and amax histories start afresh\n", path.c_str());
    return;
  }
  text.resize(size_t(size));
  if (!text.empty()) world.broadcast_bytes(&text[0], text.size(), 0);
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  if (line != recipe_line(recipe_)) {
    if (world.rank() == 0)
      std::printf("precision: %s holds another recipe's state (%s): the loss scale and amax histories start afresh\n",
                  path.c_str(), line.c_str());
    return;
  }
  std::vector<LowPrecisionMatmuls::SavedHistory> histories;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string word;
    words >> word;
    if (word == "loss_scale") {
      std::string scale;
      words >> scale >> clean_steps_;
      loss_scale_ = float(std::strtod(scale.c_str(), nullptr));
    } else if (word == "history") {
      std::string name;
      int role = 0, kind = 0;
      size_t count = 0;
      words >> name >> role >> kind >> count;
      const int p = layout.find(name);
      if (p < 0 || layout.params[size_t(p)].size == 0) continue;  // another stage's weight
      LowPrecisionMatmuls::SavedHistory h{layout.params[size_t(p)].offset, role, TensorKind(kind), {}};
      std::string amax;
      for (size_t i = 0; i < count && (words >> amax); i++) h.amaxes.push_back(float(std::strtod(amax.c_str(), nullptr)));
      histories.push_back(h);
    }
  }
  products_.restore_histories(histories);
  products_.set_gradient_scale(loss_scale_);
  if (world.rank() == 0)
    std::printf("precision: resumed the loss scale (%g) and %zu amax histories from %s\n", double(loss_scale_),
                histories.size(), path.c_str());
}
