// flags.h: the flags every chapter shares, parsed by one piece of code. Defines TrainConfig,
// FlagParser and parse_train_flags().
// An unknown flag (with the nearest known one), a flag given twice or a bad value is an error that
// names the flag; --help prints every flag. The chapter's flags travel in its TrainConfig
// (chapter_takes), so that a message names only flags the chapter has.
#pragma once
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "training/precision_flags.h"  // PrecisionFlags: --precision in every chapter

// The run's settings. Where a flag was not given, the value here is a default that TrainingRun
// replaces (training_run.h): by the checkpoint's value when resuming, else by the preset's (batch,
// lr) or by one derived from the others (warmup = steps/10). Only an absent flag means that: a
// given value is always the value.
struct TrainConfig {
  std::string chapter;       // e.g. "01_vanilla_dp"
  std::string preset = "tiny";
  int steps = 20;            // steps 0..steps-1; step 0 is warm-up (left out of averages)
  int batch = 0;             // global batch in sequences
  int grad_accum = 1;        // micro-batches per step on each rank
  float lr = 0;              // peak learning rate
  int warmup = 0;            // warm-up steps of the learning rate
  float weight_decay = 0.1f;
  float grad_clip = 1.0f;    // clip gradients to this global norm
  uint64_t seed = 1337;
  std::string data;          // text file; empty = built-in corpus
  std::string save;          // checkpoint path written at the end (and every save_every steps)
  int save_every = 0;
  bool async_save = false;   // a folder's save written by a background thread while training goes on
  std::string resume;        // checkpoint to resume from
  std::string init_from;     // checkpoint whose weights start a new schedule (not with resume)
  std::string trace;         // Chrome trace output path
  std::string json;          // JSON-lines output path
  double link_gbps = 0;      // emulated interconnect (0 = off)
  double link_latency_us = 0;
  // The tensor-parallel group's own link (07's --tp-link-gbps, --tp-link-latency-us: TP runs inside a
  // node, on faster links than the data-parallel groups'); below 0: the same as --link-*.
  double tp_link_gbps = -1, tp_link_latency_us = -1;
  bool quiet = false;        // no step lines (tests)
  std::string device = "auto";  // auto | cpu | cuda (device.h, pick_device)
  std::string dtype = "auto";   // auto | fp32 | bf16 (device.h, pick_dtype)
  std::string attention = "materialized";  // materialized | flash (GPT2Config::flash_attention)
  std::string recompute = "none";  // none | selective | full (GPT2Config::recompute)
  double timeout_s = 300;    // the communicator's watchdog (comm.h, set_comm_timeout); 0 = off
  // --precision and its recipe's flags (precision_flags.h), applied by TrainingRun (mixed_precision.h);
  // chapter 13 registers its own instead, and this stays fp32 and unregistered there.
  PrecisionFlags precision;
  std::string collectives = "library";  // library | ours | an algorithm's name (comm_p2p.h, chapter 00)
  std::set<std::string> given;  // the flags on the command line ("--lr", ...)
  bool was_given(const std::string& flag) const { return given.count(flag) > 0; }
  // Every flag the chapter takes (parse_train_flags), so that what the run prints names the chapter's
  // own: its grid's dimensions, its flag for the micro-batches.
  std::set<std::string> chapter_flags;
  bool chapter_takes(const std::string& flag) const { return chapter_flags.count(flag) > 0; }
  // --micro-batches where the chapter takes it (08, 09, 12: a pipeline's), else --grad-accum.
  std::string accumulation_flag() const { return chapter_takes("--micro-batches") ? "--micro-batches" : "--grad-accum"; }
};

// The emulated link's physical range (--link-gbps, --link-latency-us, and 07's --tp-link-*): from a
// 1 Mbit/s line to 100 Tbit/s, beyond any GPU's links; a latency of at most 1 s. 0 Gbit/s: no
// bandwidth term (unlimited).
constexpr double kMinLinkGbps = 1e-3, kMaxLinkGbps = 1e5, kMaxLinkLatencyUs = 1e6;

class FlagParser {
 public:
  void add(const std::string& name, int* value, const std::string& help);
  void add(const std::string& name, int64_t* value, const std::string& help);
  void add(const std::string& name, uint64_t* value, const std::string& help);
  void add(const std::string& name, float* value, const std::string& help);
  void add(const std::string& name, double* value, const std::string& help);
  // value_name is what usage shows after the flag: "--data PATH".
  void add(const std::string& name, std::string* value, const std::string& help,
           const std::string& value_name = "TEXT");
  void add_switch(const std::string& name, bool* value, const std::string& help);  // no value
  // A flag the chapter does not take although others do (08's --grad-accum): left out of usage();
  // given, it is refused with `why`, which says what to use instead.
  void add_refused(const std::string& name, const std::string& why);
  // Accepts "--name value" and "--name=value". Returns false after printing usage_header and
  // usage() (to stdout, on rank 0 only) when --help or -h is given; calls config_error() on an
  // unknown flag (naming the nearest known one), a flag given twice, a missing value or a value that
  // does not parse in full ("12x" is refused).
  bool parse(int argc, char** argv, const std::string& usage_header);
  // One line per flag: name, value, help and default (unless the help states its own); --help last.
  std::string usage() const;
  // Whether `name` is registered, as a flag or as a refused one.
  bool knows(const std::string& name) const;
  // The flags parse() found on the command line.
  const std::set<std::string>& given() const { return given_; }
  std::set<std::string> names() const;  // every flag it takes (not the refused ones), and --help

 private:
  struct Flag {
    std::string name, help, default_text;
    std::string value_name;  // "N", "X", "PATH", ...; empty for a switch
    bool is_switch = false;
    // Stores the value parsed from the text; returns "" or what is wrong ("is not an integer").
    std::function<std::string(const std::string&)> set;
  };
  void add_flag(Flag flag);
  const Flag* find(const std::string& name) const;
  std::string nearest(const std::string& name) const;  // the known flag closest in spelling, or ""
  std::vector<Flag> flags_;
  std::vector<std::pair<std::string, std::string>> refused_;  // add_refused: name, why
  std::set<std::string> given_;
};


// --save's PATH for the checkpoint before step `next_step`: every "{step}" replaced by it.
std::string checkpoint_path(const std::string& save_pattern, int next_step);

// Registers the shared flags on `parser`, parses argv and validates what needs no model (positive
// steps, grad_accum >= 1, ...). Chapters add their own flags to `parser` before calling this. The
// values already in *cfg are the defaults (a chapter may change one before the call); sets
// cfg->chapter. Returns false when --help was given (the caller exits 0).
bool parse_train_flags(int argc, char** argv, const std::string& chapter, const std::string& about,
                       FlagParser& parser, TrainConfig* cfg);
