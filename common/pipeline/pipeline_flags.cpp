// pipeline_flags.cpp: the checks of pipeline_flags.h, in the order a reader meets the flags:
// model, schedule, stages, chunks, micro-batches, the model's depth, ZeRO, partition, batch; then the
// message tags.
#include "pipeline/pipeline_flags.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "base/check.h"  // config_error
#include "pipeline/pipeline.h"  // balanced_partition, largest_tag
#include "comm/process_grid.h"  // grid_shape_problem

namespace {

std::string str(long long x) { return std::to_string(x); }

// "3,4,5": a block count per virtual stage, each >= 1; false on anything else.
bool parse_partition(const std::string& text, std::vector<int>* blocks) {
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const long n = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || n < 1 || n > 1000000) return false;
    blocks->push_back(int(n));
  }
  return !blocks->empty() && text.back() != ',';
}

// What to try when the model has fewer blocks than the virtual stages: the other presets of the same
// kind (dense or a mixture of experts) deep enough, or, when none is, fewer stages.
std::string deeper_model_hint(const GPT2Config& model, int p, int v) {
  std::vector<std::string> deep_enough;
  std::stringstream names(preset_names());
  std::string name;
  while (std::getline(names >> std::ws, name, ',')) {
    GPT2Config other;
    if (name != model.preset && find_preset(name, &other) && other.moe() == model.moe() &&
        other.L >= (long long)p * v)
      deep_enough.push_back(name);
  }
  std::string presets;
  for (size_t i = 0; i < deep_enough.size(); i++)
    presets += (i == 0 ? "" : i + 1 == deep_enough.size() ? " or " : ", ") + deep_enough[i];
  const long long most_stages = model.L / v;
  const std::string fewer = most_stages > 1    ? "--pp " + str(most_stages) + " or fewer"
                            : most_stages == 1 ? "--pp 1"
                                               : "fewer --virtual-stages";
  return presets.empty() ? "try " + fewer : "try --preset " + presets + ", or " + fewer;
}

// An example of a --partition that fits: the balanced one, as "3,3,2".
std::string partition_example(const GPT2Config& model, int stages) {
  std::string text;
  for (int b : balanced_partition(model, stages)) text += (text.empty() ? "" : ",") + str(b);
  return text;
}

}  // namespace

std::string pipeline_flags_problem(const PipelineFlags& flags, int world, const GPT2Config& model, int batch,
                                   PipelinePlan* plan) {
  if (model.moe() && !flags.splits_experts)
    return "--preset " + model.preset + " is a mixture of experts, whose blocks neither a pipeline nor a "
           "tensor-parallel group splits here: train it with 12_5d_parallel or 11_expert_parallel (or a data-parallel "
           "chapter on one rank)";
  Schedule schedule;
  if (!parse_schedule(flags.schedule, &schedule))
    return "--schedule " + flags.schedule + ": choose afab, 1f1b, interleaved, zb-h1, zb-v or dualpipev";
  if (flags.pp < 0) return "--pp must be >= 1";
  if (flags.micro_batches < 0) return "--micro-batches must be >= 1";
  if (flags.virtual_stages < 0) return "--virtual-stages must be >= 1";
  const bool interleaved = schedule == Schedule::Interleaved, v_shaped = placement_of(schedule) == Placement::V;
  if (flags.tp < 1) return "--tp must be >= 1";
  const int p = flags.pp ? flags.pp : world / (flags.tp * flags.cp);
  const std::string grid = grid_shape_problem(world, flags.tp, p, flags.cp, flags.ep);
  if (!grid.empty()) return grid;
  const int v = flags.virtual_stages ? flags.virtual_stages : interleaved || v_shaped ? 2 : 1;
  if (v_shaped && v != 2)
    return "--schedule " + flags.schedule + " runs 2 chunks a rank, the two arms of its V: --virtual-stages 2 (or leave it out), not " +
           str(v);
  if (v > 1 && !interleaved && !v_shaped)
    return "--virtual-stages " + str(v) + " needs --schedule interleaved (or 2 with zb-v)";
  if (interleaved && v < 2)
    return "--schedule interleaved needs --virtual-stages 2 or more (with one chunk a rank, it is 1f1b: use "
           "--schedule 1f1b)";
  // In 64 bits: --micro-batches 2000000000 on many ranks must not wrap around.
  const long long m = flags.micro_batches ? flags.micro_batches : 2LL * p;
  if (m > 1000000000) return "--micro-batches " + str(m) + " is more than a step can take";
  if (model.L < (long long)p * v)
    return "--pp " + str(p) + " x --virtual-stages " + str(v) + " = " + str((long long)p * v) +
           " virtual stages, but --preset " + model.preset + " has " + str(model.L) +
           " blocks: every stage needs one (" + deeper_model_hint(model, p, v) + ")";
  if (flags.zero1 && flags.zero2) return "--zero1 and --zero2: choose one";
  if (flags.zero2 && (interleaved || splits_backward(schedule)))
    return "--zero2 reduce-scatters each micro-batch's gradients as its backward ends: with --schedule " +
           flags.schedule + " a layer's gradients are not final there (use afab or 1f1b)";
  if (!flags.fb_overlap.empty() && flags.fb_overlap != "on" && flags.fb_overlap != "off")
    return "--fb-overlap " + flags.fb_overlap + ": choose on or off";
  if (!flags.fb_overlap.empty() && schedule != Schedule::DualPipeV)
    return "--fb-overlap runs dualpipev's forward-backward pairs at once: --schedule " + flags.schedule +
           " has none (pass --schedule dualpipev, or leave --fb-overlap out)";
  if (schedule == Schedule::DualPipeV && m < 2LL * p)
    return "--schedule dualpipev fills its V with 2 x --pp " + str(p) + " micro-batches before its steady state: "
           "--micro-batches " + str(m) + " must be at least " + str(2LL * p);
  if (interleaved && m % p)
    return "--schedule interleaved sends micro-batches round the ranks in groups of --pp " + str(p) +
           ": --micro-batches " + str(m) + " must be a multiple of it";
  const int dp = world / (flags.tp * p * flags.cp);
  if (batch > 0 && batch % (dp * m)) {
    const long long per_step = dp * m, suggestion = (batch / per_step + 1) * per_step;
    return "--batch " + str(batch) + " is not divisible by data-parallel ranks x micro-batches = " + str(dp) + " x " +
           str(m) + " = " + str(per_step) + "; try --batch " + str(suggestion) +
           (per_step > batch ? " or fewer --micro-batches" : "");
  }

  std::vector<int> blocks;
  if (flags.partition.empty()) {
    blocks = balanced_partition(model, p * v);
  } else {
    int total = 0;
    const bool parsed = parse_partition(flags.partition, &blocks);
    for (int b : blocks) total += b;
    if (!parsed || int(blocks.size()) != p * v || total != model.L)
      return "--partition " + flags.partition + ": " + str(p * v) + " block counts that add up to L = " + str(model.L) +
             " (each >= 1, e.g. " + partition_example(model, p * v) + ")";
  }
  const PipelineShape shape{p, int(m), v, placement_of(schedule)};
  // Every case above is what makes a schedule's shape wrong; this one would be a missed case.
  const std::string shape_problem = schedule_shape_error(schedule, shape);
  if (!shape_problem.empty()) return "the " + flags.schedule + " schedule cannot run this shape: " + shape_problem;
  *plan = {schedule, shape, blocks, dp, schedule == Schedule::DualPipeV && flags.fb_overlap != "off"};
  return "";
}

std::string pipeline_tag_problem(const PipelineShape& shape, int64_t largest_tag) {
  const int64_t largest = largest_pipeline_tag(shape);
  if (largest <= largest_tag) return "";
  const int64_t per_micro_batch = 2LL * shape.stages * shape.chunks;  // tags: (kind, virtual stage) x m
  const int64_t most = (largest_tag + 1) / per_micro_batch;
  return "--micro-batches " + str(shape.micro_batches) + ": matched by tag, a step's messages carry tags up to 2 x " +
         str(shape.stages) + " stages x " + str(shape.chunks) + " chunks x " + str(shape.micro_batches) +
         " micro-batches - 1 = " + str(largest) + ", past this MPI's largest tag (MPI_TAG_UB) " + str(largest_tag) +
         ": pass --micro-batches " + str(most) + " or fewer, or --p2p-matching call-order";
}

Matching pipeline_matching(const std::string& flag, const Communicator& pipeline, const PipelineShape& shape) {
  Matching matching = pipeline.matches_by_tag() ? Matching::ByTag : Matching::ByCallOrder;
  if (flag != "auto" && !parse_matching(flag, &matching))
    config_error("--p2p-matching " + flag + ": choose auto, tag or call-order");
  if (matching == Matching::ByTag && !pipeline.matches_by_tag())
    config_error("--p2p-matching tag: the " + pipeline.name() + " communicator has no tags (use call-order)");
  if (matching == Matching::ByTag) {
    const std::string problem = pipeline_tag_problem(shape, pipeline.largest_tag());
    if (!problem.empty()) config_error(problem);
  }
  return matching;
}

bool fb_overlap_runs(const PipelinePlan& plan, Matching matching, Device device, bool say) {
  if (!plan.fb_overlap) return false;
  const char* why = device != Device::CPU        ? "a GPU would need a compute stream per lane, and this executor drives one"
                    : matching != Matching::ByTag ? "under call order a pass's receive goes out with the sends before it"
                                                  : nullptr;
  if (!why) return true;
  if (say) std::printf("note: dualpipev's F&B pairs run one pass after the other here (%s)\n", why);
  return false;
}

void add_schedule_flags(FlagParser& flags, PipelineFlags* pipe, std::string* matching) {
  flags.add("--micro-batches", &pipe->micro_batches, "micro-batches per step in each pipeline (default: 2 x --pp)");
  flags.add("--schedule", &pipe->schedule, "afab, 1f1b (default), interleaved, zb-h1, zb-v or dualpipev");
  flags.add("--virtual-stages", &pipe->virtual_stages,
            "model chunks per rank, interleaved (default 2), zb-v and dualpipev (2)");
  flags.add("--p2p-matching", matching, "auto (default), tag (MPI: receives posted at the start) or "
                                        "call-order (NCCL: each pair's calls in one order on both ends)");
  flags.add("--partition", &pipe->partition, "blocks per virtual stage, e.g. 3,3,3,3 (default: balanced by FLOPs)");
  flags.add_switch("--zero1", &pipe->zero1, "shard the optimizer state over each stage's data-parallel group (04)");
  flags.add("--fb-overlap", &pipe->fb_overlap, "dualpipev: on (default) runs each forward-backward pair's two "
                                              "passes at once, on two threads; off, one after the other", "on|off");
  flags.add_switch("--zero2", &pipe->zero2, "ZeRO-2's rule: reduce-scatter every micro-batch's gradients (05), to "
                                           "measure what that costs a pipeline (afab, 1f1b)");
  flags.add_refused("--grad-accum", "a pipeline's micro-batches are its accumulation; use --micro-batches");
}

void check_schedule_flags(const TrainConfig& cfg, const PipelineFlags& pipe) {
  if (cfg.was_given("--pp") && pipe.pp < 1) config_error("--pp must be >= 1");
  if (cfg.was_given("--virtual-stages") && pipe.virtual_stages < 1) config_error("--virtual-stages must be >= 1");
  if (cfg.was_given("--micro-batches") && pipe.micro_batches < 1) config_error("--micro-batches must be >= 1");
}
