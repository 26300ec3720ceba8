// flags.cpp: the command-line parser of flags.h and the flags every chapter shares.
// A flag is a name, a pointer to where its value goes, a help line and a default taken from the
// value before parsing, so usage() never disagrees with the code.
#include "training/flags.h"

#include <mpi.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "base/check.h"         // config_error, ENSURE
#include "comm/comm_p2p.h"      // parse_collectives
#include "model/model_config.h"  // preset_names, for the help of --preset

namespace {

// strtoll and strtod skip leading spaces and stop at the first character they do not understand;
// a flag value must be a number and nothing else, so "12x", " 12" and "" are refused.
bool parse_whole_int(const std::string& text, long long* out) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return false;
  errno = 0;
  char* end = nullptr;
  *out = std::strtoll(text.c_str(), &end, 10);
  return errno == 0 && *end == '\0';
}

// "" when `text` is a whole finite number, else why not ("inf" is a number, but not one a flag takes).
std::string parse_whole_double(const std::string& text, double* out) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return "is not a number";
  errno = 0;
  char* end = nullptr;
  const double parsed = std::strtod(text.c_str(), &end);
  if (*end != '\0' || std::isnan(parsed)) return "is not a number";
  if (std::isinf(parsed) && errno == 0) return "is infinite: pass a finite number";
  if (errno != 0) return "is out of range";
  *out = parsed;
  return "";
}

template <typename Int>
std::string set_integer(const std::string& text, Int* value) {
  long long parsed = 0;
  if (!parse_whole_int(text, &parsed)) return "is not an integer";
  if (parsed < static_cast<long long>(std::numeric_limits<Int>::min()) ||
      parsed > static_cast<long long>(std::numeric_limits<Int>::max()))
    return "is out of range";
  *value = Int(parsed);
  return "";
}

std::string number_text(double x) {
  std::ostringstream s;
  s << x;  // six significant digits without trailing zeros: 0.1, 0.0003, 1e-06
  return s.str();
}

// Only rank 0 prints --help, so that "mpiexec -n 4 ... --help" prints the list once. Flags may be
// parsed before MPI starts; then every process is "rank 0".
bool is_rank_zero() {
  int initialized = 0;
  MPI_CHECK(MPI_Initialized(&initialized));
  if (!initialized) return true;
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  return rank == 0;
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// The emulated link's bounds (flags.h), refused with the range and what 0 means.
void link_bandwidth_check(const std::string& flag, double gbps) {
  if (gbps == 0 || (gbps >= kMinLinkGbps && gbps <= kMaxLinkGbps)) return;
  config_error(flag + " " + number_text(gbps) + ": an emulated link carries " + number_text(kMinLinkGbps) + " to " +
               number_text(kMaxLinkGbps) + " Gbit/s (1 Mbit/s to 100 Tbit/s), or 0 for unlimited bandwidth");
}

void link_latency_check(const std::string& flag, double us) {
  if (us >= 0 && us <= kMaxLinkLatencyUs) return;
  config_error(flag + " " + number_text(us) + ": an emulated link's latency is 0 to " + number_text(kMaxLinkLatencyUs) +
               " microseconds (1 s, longer than a geostationary satellite's round trip)");
}

// Levenshtein distance: insertions, deletions and substitutions.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); j++) row[j] = j;
  for (size_t i = 1; i <= a.size(); i++) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); j++) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

void FlagParser::add_flag(Flag flag) {
  ENSURE(starts_with(flag.name, "--"), "flag names start with --: " + flag.name);
  ENSURE(find(flag.name) == nullptr && flag.name != "--help", "flag registered twice: " + flag.name);
  flags_.push_back(std::move(flag));
}

const FlagParser::Flag* FlagParser::find(const std::string& name) const {
  for (const Flag& f : flags_)
    if (f.name == name) return &f;
  return nullptr;
}

// A typo is a few edits away; a flag of another chapter usually is not, and no suggestion beats a
// wrong one: at most 2 edits, or a third of the name for long names.
std::string FlagParser::nearest(const std::string& name) const {
  std::string best;
  size_t best_distance = std::max<size_t>(2, name.size() / 3) + 1;
  for (const Flag& f : flags_) {
    const size_t d = edit_distance(name, f.name);
    if (d < best_distance) best = f.name, best_distance = d;
  }
  return best;
}

bool FlagParser::knows(const std::string& name) const {
  for (const auto& r : refused_)
    if (r.first == name) return true;
  return find(name) != nullptr;
}

void FlagParser::add_refused(const std::string& name, const std::string& why) {
  ENSURE(starts_with(name, "--") && find(name) == nullptr, "add_refused: " + name);
  refused_.emplace_back(name, why);
}

void FlagParser::add(const std::string& name, int* value, const std::string& help) {
  add_flag({name, help, std::to_string(*value), "N", false,
            [value](const std::string& text) { return set_integer(text, value); }});
}

void FlagParser::add(const std::string& name, int64_t* value, const std::string& help) {
  add_flag({name, help, std::to_string(*value), "N", false,
            [value](const std::string& text) { return set_integer(text, value); }});
}

void FlagParser::add(const std::string& name, uint64_t* value, const std::string& help) {
  add_flag({name, help, std::to_string(*value), "N", false, [value](const std::string& text) {
              // strtoull would quietly turn "-1" into 18446744073709551615.
              if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0])))
                return std::string("is not a non-negative integer");
              errno = 0;
              char* end = nullptr;
              unsigned long long parsed = std::strtoull(text.c_str(), &end, 10);
              if (*end != '\0') return std::string("is not a non-negative integer");
              if (errno == ERANGE) return std::string("is out of range");
              *value = uint64_t(parsed);
              return std::string();
            }});
}

void FlagParser::add(const std::string& name, float* value, const std::string& help) {
  add_flag({name, help, number_text(*value), "X", false, [value](const std::string& text) {
              double parsed = 0;
              const std::string problem = parse_whole_double(text, &parsed);
              if (!problem.empty()) return problem;
              if (std::fabs(parsed) > std::numeric_limits<float>::max()) return std::string("is out of range");
              // 1e-50 would silently become 0: refuse what fp32 cannot hold.
              if (parsed != 0 && std::fabs(parsed) < std::numeric_limits<float>::denorm_min())
                return std::string("is too small for fp32 (it would round to 0)");
              *value = float(parsed);
              return std::string();
            }});
}

void FlagParser::add(const std::string& name, double* value, const std::string& help) {
  add_flag({name, help, number_text(*value), "X", false, [value](const std::string& text) {
              return parse_whole_double(text, value);
            }});
}

void FlagParser::add(const std::string& name, std::string* value, const std::string& help,
                     const std::string& value_name) {
  add_flag({name, help, *value, value_name, false, [value](const std::string& text) {
              *value = text;
              return std::string();
            }});
}

void FlagParser::add_switch(const std::string& name, bool* value, const std::string& help) {
  add_flag({name, help, "", "", true, [value](const std::string&) {
              *value = true;
              return std::string();
            }});
}

bool FlagParser::parse(int argc, char** argv, const std::string& usage_header) {
  // --help wins over everything else on the line, so it works even next to a mistake.
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      if (is_rank_zero()) std::printf("%s%s", usage_header.c_str(), usage().c_str());
      return false;
    }
  }
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    if (!starts_with(arg, "--"))
      config_error("unexpected argument '" + arg + "': flags look like --name value (see --help)");
    std::string name = arg, value;
    const size_t equals = arg.find('=');
    const bool inline_value = equals != std::string::npos;
    if (inline_value) {
      name = arg.substr(0, equals);
      value = arg.substr(equals + 1);
    }
    for (const auto& [refused, why] : refused_)
      if (name == refused) config_error(name + ": " + why);
    const Flag* flag = find(name);
    if (!flag) {
      const std::string guess = nearest(name);
      config_error("unknown flag '" + name + "'" + (guess.empty() ? "" : "; did you mean " + guess + "?") +
                   " (see --help)");
    }
    // The later value would win silently; which one the user meant, only the user knows.
    if (given_.count(name)) config_error(name + " is given twice: give it once");
    given_.insert(name);
    if (flag->is_switch) {
      if (inline_value) config_error(name + " takes no value");
      flag->set("");
      continue;
    }
    if (!inline_value) {
      // "--data --steps 5" forgot the path; taking "--steps" as the path would hide that.
      if (i + 1 >= argc || starts_with(argv[i + 1], "--")) config_error(name + " needs a value");
      value = argv[++i];
    }
    const std::string problem = flag->set(value);
    if (!problem.empty()) config_error(name + ": '" + value + "' " + problem);
  }
  return true;
}

std::string FlagParser::usage() const {
  auto signature = [](const Flag& f) { return f.is_switch ? f.name : f.name + " " + f.value_name; };
  const std::string help_name = "--help";
  size_t width = help_name.size();
  for (const Flag& f : flags_) width = std::max(width, signature(f).size());

  std::string text;
  auto line = [&](const std::string& left, const std::string& right) {
    text += "  " + left + std::string(width + 2 - left.size(), ' ') + right + "\n";
  };
  for (const Flag& f : flags_) {
    // A help text that says what the default is ("default: the preset's") gets no number appended.
    const bool show_default = !f.is_switch && !f.default_text.empty() && f.help.find("default") == std::string::npos;
    line(signature(f), f.help + (show_default ? " (default " + f.default_text + ")" : ""));
  }
  line(help_name, "print this list and exit");
  return text;
}

std::set<std::string> FlagParser::names() const {
  std::set<std::string> names = {"--help"};
  for (const Flag& f : flags_) names.insert(f.name);
  return names;
}

std::string checkpoint_path(const std::string& save_pattern, int next_step) {
  const std::string key = "{step}", value = std::to_string(next_step);
  std::string path = save_pattern;
  for (size_t at = path.find(key); at != std::string::npos; at = path.find(key, at + value.size()))
    path.replace(at, key.size(), value);
  return path;
}

bool parse_train_flags(int argc, char** argv, const std::string& chapter, const std::string& about,
                       FlagParser& parser, TrainConfig* cfg) {
  cfg->chapter = chapter;
  parser.add("--preset", &cfg->preset, std::string("model shape: ") + preset_names(), "NAME");
  parser.add("--steps", &cfg->steps, "steps to run; step 0 is warm-up, left out of averages (resuming: the "
                                     "checkpoint's)");
  parser.add("--batch", &cfg->batch, "global batch in sequences, over all ranks (default: the preset's; resuming: "
                                     "the checkpoint's)");
  if (!parser.knows("--grad-accum"))  // 08 refuses it: its --micro-batches are the accumulation
    parser.add("--grad-accum", &cfg->grad_accum, "micro-batches per step on each rank");
  if (!parser.knows("--precision"))  // 13 takes them itself, to teach them in its own lines
    add_precision_flags(parser, &cfg->precision);
  parser.add("--lr", &cfg->lr, "peak learning rate (default: the preset's; resuming: the checkpoint's)");
  parser.add("--warmup", &cfg->warmup, "learning-rate warm-up steps (default: steps/10; resuming: the checkpoint's)");
  parser.add("--weight-decay", &cfg->weight_decay, "AdamW weight decay of the matrices");
  parser.add("--grad-clip", &cfg->grad_clip, "clip gradients to this global norm");
  parser.add("--seed", &cfg->seed, "random seed of the parameter initialisation");
  parser.add("--data", &cfg->data, "text file to train on, each byte a token (default: built-in corpus)",
             "PATH");
  parser.add("--save", &cfg->save, "write a checkpoint here at the end; {step} in PATH (each one) keeps one per save",
             "PATH");
  parser.add("--save-every", &cfg->save_every, "also checkpoint every N steps; 0 = only at the end");
  parser.add_switch("--async-save", &cfg->async_save,
                    "with --save DIR/ (a sharded folder): stage a copy, write it in the background while training goes on");
  parser.add("--resume", &cfg->resume, "resume from this checkpoint", "PATH");
  parser.add("--init-from", &cfg->init_from,
             "start a new schedule (step 0, fresh AdamW moments) from this checkpoint's weights", "PATH");
  parser.add("--trace", &cfg->trace, "write a Chrome trace (open in ui.perfetto.dev)", "PATH");
  parser.add("--json", &cfg->json, "write one JSON line per step", "PATH");
  parser.add("--link-gbps", &cfg->link_gbps, "emulate an interconnect of this many Gbit/s, 0.001 to 100000; 0 = off "
                                              "(default 0)");
  parser.add("--link-latency-us", &cfg->link_latency_us, "latency of the emulated link per message, in microseconds, 0 "
                                                        "to 1000000 (default 0); a collective whose modelled time "
                                                        "exceeds --timeout is refused before step 0");
  parser.add("--timeout", &cfg->timeout_s, "end the job when a collective or receive waits longer than this many "
                                          "seconds (a stuck or dead peer); 0 = never");
  parser.add("--collectives", &cfg->collectives,
             "library | ours | ring | halving-doubling | recursive-doubling | binomial-tree: who runs the "
             "all-reduces, reduce-scatters and all-gathers; ours = chapter 00's, built from send and receive, "
             "chosen by size, run asynchronously on a worker thread (docs/collectives.md)",
             "NAME");
  parser.add_switch("--quiet", &cfg->quiet, "no step lines");
  parser.add("--device", &cfg->device, "auto | cpu | cuda; auto = cuda when a GPU is visible", "NAME");
  parser.add("--dtype", &cfg->dtype,
             "auto | fp32 | bf16; bf16 = mixed precision (bf16 parameters, gradients and activations, fp32 "
             "master weights and AdamW state), GPU only; auto = bf16 on a GPU (fp32 under a --precision "
             "recipe), fp32 on the CPU",
             "NAME");

  parser.add("--attention", &cfg->attention,
             "materialized | flash; materialized = the (B,NH,T,T) score matrices; flash = FlashAttention where "
             "it applies (bf16 on a GPU, head size 16, 32, 64 or 128): far less memory, still slower than "
             "materialized (docs/gpus.md)",
             "NAME");
  parser.add("--recompute", &cfg->recompute,
             "none | selective | full: what the backward recomputes rather than keeps; selective = the attention's "
             "(B,NH,T,T) scores, full = each block but its input (docs/theory.md, \"Activation recomputation\")",
             "NAME");

  const std::string program = argc > 0 ? argv[0] : chapter;
  const std::string header = chapter + ": " + about + "\n\nusage: mpiexec -n RANKS " + program +
                             " [flags]   (flags take --name value or --name=value)\n\nflags:\n";
  if (!parser.parse(argc, argv, header)) return false;

  cfg->given = parser.given();
  cfg->chapter_flags = parser.names();
  // What can be checked without knowing the model or the rank count; the chapter checks the rest
  // (the batch must divide by ranks x grad-accum, for one) once it knows them. A value that is given
  // must be meaningful: 0 never stands for "the default" (leave the flag out for that).
  if (cfg->steps < 1) config_error("--steps must be >= 1");
  if (cfg->was_given("--batch") && cfg->batch < 1) config_error("--batch must be >= 1 (leave it out for the preset's)");
  if (cfg->grad_accum < 1) config_error("--grad-accum must be >= 1");
  if (cfg->was_given("--lr") && !(cfg->lr > 0)) config_error("--lr must be > 0 (leave it out for the preset's)");
  if (cfg->was_given("--warmup") && cfg->warmup < 0) config_error("--warmup must be >= 0 (leave it out for steps/10)");
  if (cfg->weight_decay < 0) config_error("--weight-decay must be >= 0");
  if (cfg->grad_clip <= 0) config_error("--grad-clip must be > 0");
  if (cfg->timeout_s < 0) config_error("--timeout must be >= 0 (0 = no watchdog)");
  if (cfg->save_every < 0) config_error("--save-every must be >= 0");
  if (cfg->save_every > 0 && cfg->save.empty()) config_error("--save-every needs --save PATH");
  if (cfg->async_save && (cfg->save.empty() || cfg->save.back() != '/'))
    config_error("--async-save needs --save DIR/ (a sharded checkpoint's folder, the path ending in '/'): every rank "
                 "writes its own slices from a staged copy");
  if (!cfg->resume.empty() && !cfg->init_from.empty())
    config_error("--resume and --init-from together: --resume continues a checkpoint's schedule, --init-from "
                 "starts a new one from its weights; pass one of them");
  // The emulated links: physical ranges only (flags.h, kMinLinkGbps...), so that every modelled wait
  // is one that a real link could make (1e-300 Gbit/s would overflow the clock and not be emulated).
  link_bandwidth_check("--link-gbps", cfg->link_gbps);
  link_latency_check("--link-latency-us", cfg->link_latency_us);
  if (cfg->was_given("--tp-link-gbps")) link_bandwidth_check("--tp-link-gbps", cfg->tp_link_gbps);
  if (cfg->was_given("--tp-link-latency-us")) link_latency_check("--tp-link-latency-us", cfg->tp_link_latency_us);
  if (cfg->attention != "flash" && cfg->attention != "materialized")
    config_error("--attention " + cfg->attention + ": choose materialized or flash");
  Recompute recompute;
  if (!parse_recompute(cfg->recompute, &recompute))
    config_error("--recompute " + cfg->recompute + ": choose none, selective or full");
  CollectivesChoice collectives;
  if (!parse_collectives(cfg->collectives, &collectives))
    config_error("--collectives " + cfg->collectives +
                 ": choose library, ours, ring, halving-doubling, recursive-doubling or binomial-tree");
  if (cfg->dtype != "auto" && cfg->dtype != "fp32" && cfg->dtype != "bf16")
    config_error("--dtype " + cfg->dtype + ": unknown dtype; choose auto, fp32 or bf16");
  return true;
}
