// precision_state.cpp: the recipe's state beside a checkpoint (precision_state.h): a small text file,
// one line for the recipe (a file of another recipe is not this run's state), one for the loss scale,
// one per delayed amax history.
#include "training/precision_state.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <vector>

#include "base/fileio.h"  // write_file_atomically, read_whole_file

std::string loss_scale_text(double scale) {
  char text[64];
  int exponent = 0;
  if (scale > 0 && std::frexp(scale, &exponent) == 0.5)
    std::snprintf(text, sizeof text, "%.0f = 2^%d", scale, exponent - 1);
  else
    std::snprintf(text, sizeof text, "%g", scale);
  return text;
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

void save_precision_state(const std::string& checkpoint, const PrecisionRecipe& recipe, float loss_scale,
                          int clean_steps, const LowPrecisionMatmuls& products, const ParamLayout& layout,
                          Communicator& world) {
  // One line per history, keyed by the weight's name and the operand's role: the same line on every
  // rank of a stage (the histories are reduced), another stage's lines for its own weights.
  std::ostringstream mine;
  for (const LowPrecisionMatmuls::SavedHistory& h : products.saved_histories()) {
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
  std::snprintf(scale, sizeof scale, "%a", double(loss_scale));
  out << recipe_line(recipe) << "\nloss_scale " << scale << " " << clean_steps << "\n";
  for (const auto& [key, line] : lines) out << line << "\n";
  const std::string text = out.str();
  write_file_atomically(precision_state_path(checkpoint), text.data(), text.size());
}

bool load_precision_state(const std::string& checkpoint, const PrecisionRecipe& recipe, float* loss_scale,
                          int* clean_steps, LowPrecisionMatmuls& products, const ParamLayout& layout,
                          Communicator& world) {
  const std::string path = precision_state_path(checkpoint);
  std::string text, error;
  const bool found = world.rank() == 0 && read_whole_file(path, &text, &error);
  const double size = world.all_reduce_scalar(found ? double(text.size()) : -1.0, ReduceOp::Max);  // rank 0's
  if (size < 0) {
    if (world.rank() == 0)
      std::printf("precision: no %s beside the checkpoint: the loss scale and amax histories start afresh\n", path.c_str());
    return false;
  }
  text.resize(size_t(size));
  if (!text.empty()) world.broadcast_bytes(&text[0], text.size(), 0);
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  if (line != recipe_line(recipe)) {
    if (world.rank() == 0)
      std::printf("precision: %s holds another recipe's state (%s): the loss scale and amax histories start afresh\n",
                  path.c_str(), line.c_str());
    return false;
  }
  std::vector<LowPrecisionMatmuls::SavedHistory> histories;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string word;
    words >> word;
    if (word == "loss_scale") {
      std::string scale;
      words >> scale >> *clean_steps;
      *loss_scale = float(std::strtod(scale.c_str(), nullptr));
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
  products.restore_histories(histories);
  if (world.rank() == 0)
    std::printf("precision: resumed the loss scale (%s) and %zu amax histories from %s\n",
                loss_scale_text(*loss_scale).c_str(), histories.size(), path.c_str());
  return true;
}
