// test_flags.cpp: the shared command line of flags.h: values, both spellings, defaults, --help, and
// that every mistake stops the program with a message naming the flag; and the pipeline chapters'
// shared block (grid_flags.h).
// config_error() ends the process (exit code 1 here, where MPI is not initialised), so error paths
// are death tests: each runs in a child process and the test checks its exit code and stderr.
#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "pipeline/grid_flags.h"  // GridFlags: the block 08, 09 and 12 share
#include "training/flags.h"

namespace {

// argv as main() gets it, from string literals: {"prog", "--steps", "5"}.
class Argv {
 public:
  Argv(std::initializer_list<const char*> args) : strings_(args.begin(), args.end()) {
    strings_.insert(strings_.begin(), "train");
    for (std::string& s : strings_) pointers_.push_back(&s[0]);
    pointers_.push_back(nullptr);
  }
  Argv(const Argv&) = delete;  // pointers_ points into strings_
  Argv& operator=(const Argv&) = delete;
  int argc() const { return int(strings_.size()); }
  char** argv() { return pointers_.data(); }

 private:
  std::vector<std::string> strings_;
  std::vector<char*> pointers_;
};

// parse_train_flags on a fresh parser and config; aborts the process on a bad flag.
TrainConfig parse_train(std::initializer_list<const char*> arguments) {
  Argv args(arguments);
  FlagParser parser;
  TrainConfig cfg;
  EXPECT_TRUE(parse_train_flags(args.argc(), args.argv(), "00_test", "a test", parser, &cfg));
  return cfg;
}

TEST(TrainFlags, DefaultsWhenNothingIsGiven) {
  const TrainConfig cfg = parse_train({});
  const TrainConfig defaults;
  EXPECT_EQ(cfg.chapter, "00_test");
  EXPECT_EQ(cfg.preset, defaults.preset);
  EXPECT_EQ(cfg.steps, defaults.steps);
  EXPECT_EQ(cfg.batch, defaults.batch);
  EXPECT_EQ(cfg.grad_accum, defaults.grad_accum);
  EXPECT_EQ(cfg.lr, defaults.lr);
  EXPECT_EQ(cfg.warmup, defaults.warmup);
  EXPECT_EQ(cfg.seed, defaults.seed);
  EXPECT_EQ(cfg.data, "");
  EXPECT_FALSE(cfg.quiet);
}

TEST(TrainFlags, ParsesEveryFlag) {
  const TrainConfig cfg = parse_train(
      {"--preset", "small", "--steps", "50", "--batch", "16", "--grad-accum", "2", "--lr", "1e-3",
       "--warmup", "5", "--weight-decay", "0", "--grad-clip", "0.5", "--seed", "18446744073709551615",
       "--data", "corpus.txt", "--save", "a.ckpt", "--save-every", "10", "--resume", "b.ckpt",
       "--trace", "t.json", "--json", "log.jsonl", "--link-gbps", "12.5", "--link-latency-us", "3",
       "--quiet"});
  EXPECT_EQ(cfg.preset, "small");
  EXPECT_EQ(cfg.steps, 50);
  EXPECT_EQ(cfg.batch, 16);
  EXPECT_EQ(cfg.grad_accum, 2);
  EXPECT_FLOAT_EQ(cfg.lr, 1e-3f);
  EXPECT_EQ(cfg.warmup, 5);
  EXPECT_EQ(cfg.weight_decay, 0.0f);
  EXPECT_FLOAT_EQ(cfg.grad_clip, 0.5f);
  EXPECT_EQ(cfg.seed, UINT64_MAX);
  EXPECT_EQ(cfg.data, "corpus.txt");
  EXPECT_EQ(cfg.save, "a.ckpt");
  EXPECT_EQ(cfg.save_every, 10);
  EXPECT_EQ(cfg.resume, "b.ckpt");
  EXPECT_EQ(cfg.trace, "t.json");
  EXPECT_EQ(cfg.json, "log.jsonl");
  EXPECT_DOUBLE_EQ(cfg.link_gbps, 12.5);
  EXPECT_DOUBLE_EQ(cfg.link_latency_us, 3.0);
  EXPECT_TRUE(cfg.quiet);
}

TEST(TrainFlags, AcceptsNameEqualsValue) {
  const TrainConfig cfg = parse_train({"--steps=7", "--lr=0.25", "--data=x=y.txt", "--warmup=3"});
  EXPECT_EQ(cfg.steps, 7);
  EXPECT_FLOAT_EQ(cfg.lr, 0.25f);
  EXPECT_EQ(cfg.data, "x=y.txt");  // only the first '=' separates
  EXPECT_EQ(cfg.warmup, 3);
}

TEST(TrainFlags, ChapterFlagsAndChapterDefaults) {
  FlagParser parser;
  TrainConfig cfg;
  cfg.steps = 40;  // a chapter may change a default before parsing; usage shows it
  int bucket_mb = 25;
  parser.add("--bucket-mb", &bucket_mb, "gradient bucket size in MB");
  Argv args{"--bucket-mb", "4"};
  ASSERT_TRUE(parse_train_flags(args.argc(), args.argv(), "03_buckets", "buckets", parser, &cfg));
  EXPECT_EQ(bucket_mb, 4);
  EXPECT_EQ(cfg.steps, 40);
  EXPECT_NE(parser.usage().find("(default 40)"), std::string::npos) << parser.usage();
}

TEST(FlagParser, EveryValueType) {
  FlagParser parser;
  int i = 0;
  int64_t i64 = 0;
  uint64_t u64 = 0;
  float f = 0;
  double d = 0;
  std::string s;
  bool on = false;
  parser.add("--i", &i, "int");
  parser.add("--i64", &i64, "int64");
  parser.add("--u64", &u64, "uint64");
  parser.add("--f", &f, "float");
  parser.add("--d", &d, "double");
  parser.add("--s", &s, "string");
  parser.add_switch("--on", &on, "switch");
  Argv args{"--i", "-12", "--i64", "-9000000000", "--u64", "9000000000", "--f", "2.5e-4",
            "--d", "-0.125", "--s", "", "--on"};
  ASSERT_TRUE(parser.parse(args.argc(), args.argv(), "header\n"));
  EXPECT_EQ(i, -12);
  EXPECT_EQ(i64, -9000000000LL);
  EXPECT_EQ(u64, 9000000000ULL);
  EXPECT_FLOAT_EQ(f, 2.5e-4f);
  EXPECT_EQ(d, -0.125);
  EXPECT_EQ(s, "");
  EXPECT_TRUE(on);
}

TEST(FlagParser, UsageListsEveryFlagWithHelpAndDefault) {
  FlagParser parser;
  TrainConfig cfg;
  Argv args{};
  ASSERT_TRUE(parse_train_flags(args.argc(), args.argv(), "00_test", "a test", parser, &cfg));
  const std::string usage = parser.usage();
  for (const char* flag : {"--preset NAME", "--steps N", "--batch N", "--grad-accum N", "--lr X", "--warmup N",
                           "--weight-decay X", "--grad-clip X", "--seed N", "--data PATH", "--save PATH",
                           "--save-every N", "--resume PATH", "--trace PATH", "--json PATH", "--link-gbps X",
                           "--link-latency-us X", "--timeout X", "--quiet", "--help"}) {
    EXPECT_NE(usage.find(std::string("  ") + flag + " "), std::string::npos) << flag << " missing in\n" << usage;
  }
  EXPECT_NE(usage.find("(default 20)"), std::string::npos) << usage;     // --steps
  // A default that the run resolves later (the preset's) is stated in words, never as a number.
  for (const char* flag : {"  --batch N", "  --lr X", "  --warmup N"}) {
    const size_t line = usage.find(flag);
    const std::string text = usage.substr(line, usage.find('\n', line) - line);
    EXPECT_EQ(text.find("(default 0)"), std::string::npos) << text;
    EXPECT_NE(text.find("default: "), std::string::npos) << text;
  }
  EXPECT_NE(usage.find("(default 0.1)"), std::string::npos) << usage;    // --weight-decay
  EXPECT_NE(usage.find("(default 1337)"), std::string::npos) << usage;   // --seed
  EXPECT_NE(usage.find("(default tiny)"), std::string::npos) << usage;   // --preset
  EXPECT_NE(usage.find("tiny, small, deep, gpt2, odd"), std::string::npos) << usage;
}

TEST(FlagParser, HelpPrintsUsageAndReturnsFalse) {
  FlagParser parser;
  TrainConfig cfg;
  // --help wins even next to a flag that would be an error.
  Argv args{"--no-such-flag", "--help"};
  ::testing::internal::CaptureStdout();
  const bool go_on = parse_train_flags(args.argc(), args.argv(), "00_test", "what it teaches", parser, &cfg);
  const std::string printed = ::testing::internal::GetCapturedStdout();
  EXPECT_FALSE(go_on);
  EXPECT_NE(printed.find("00_test: what it teaches"), std::string::npos) << printed;
  EXPECT_NE(printed.find("--grad-accum N"), std::string::npos) << printed;
}

// ---- Mistakes: each ends the process with exit code 1 and a message naming the flag. ----

void expect_config_error(std::initializer_list<const char*> args, const std::string& message_regex) {
  EXPECT_EXIT(parse_train(args), ::testing::ExitedWithCode(1), message_regex);
}

TEST(FlagErrorsDeathTest, UnknownFlag) {
  expect_config_error({"--foo", "1"}, "unknown flag '--foo' \\(see --help\\)");
  expect_config_error({"--foo=1"}, "unknown flag '--foo'");
  expect_config_error({"-steps", "1"}, "unexpected argument '-steps'");
  expect_config_error({"extra"}, "unexpected argument 'extra'");
}

TEST(FlagErrorsDeathTest, MissingValue) {
  expect_config_error({"--steps"}, "--steps needs a value");
  expect_config_error({"--data", "--steps", "5"}, "--data needs a value");
}

TEST(FlagErrorsDeathTest, ValuesMustParseInFull) {
  expect_config_error({"--steps", "abc"}, "--steps: 'abc' is not an integer");
  expect_config_error({"--steps", "12x"}, "--steps: '12x' is not an integer");
  expect_config_error({"--steps", "1.5"}, "--steps: '1.5' is not an integer");
  expect_config_error({"--steps="}, "--steps: '' is not an integer");
  expect_config_error({"--steps", "99999999999"}, "--steps: '99999999999' is out of range");
  expect_config_error({"--lr", "fast"}, "--lr: 'fast' is not a number");
  expect_config_error({"--lr", "1e-3x"}, "--lr: '1e-3x' is not a number");
  expect_config_error({"--link-gbps", "nan"}, "--link-gbps: 'nan' is not a number");
  // inf is a number, just not one a flag takes; 1e400 is past a double.
  expect_config_error({"--link-gbps", "inf"}, "--link-gbps: 'inf' is infinite: pass a finite number");
  expect_config_error({"--link-gbps", "1e400"}, "--link-gbps: '1e400' is out of range");
  expect_config_error({"--lr", "-inf"}, "--lr: '-inf' is infinite: pass a finite number");
  expect_config_error({"--seed", "-1"}, "--seed: '-1' is not a non-negative integer");
  expect_config_error({"--quiet=yes"}, "--quiet takes no value");
}

TEST(FlagErrorsDeathTest, ValuesOutsideTheirRange) {
  expect_config_error({"--grad-accum", "0"}, "--grad-accum must be >= 1");
  expect_config_error({"--steps", "0"}, "--steps must be >= 1");
  expect_config_error({"--batch", "-8"}, "--batch must be >= 1");
  expect_config_error({"--lr", "-1"}, "--lr must be > 0");
  expect_config_error({"--warmup", "-2"}, "--warmup must be >= 0");
  expect_config_error({"--grad-clip", "0"}, "--grad-clip must be > 0");
  expect_config_error({"--save-every", "5"}, "--save-every needs --save PATH");
  expect_config_error({"--link-latency-us", "-3"}, "--link-latency-us -3: an emulated link's latency is 0 to 1e\\+06");
  expect_config_error({"--timeout", "-1"}, "--timeout must be >= 0");
}

// Only an absent flag means "the preset's" (or the checkpoint's): a given value that is 0, or that
// fp32 would round to 0, is an error, never a silent switch to the default.
TEST(FlagErrorsDeathTest, ZeroNeverMeansTheDefault) {
  // (expect_config_error takes a regular expression: no parentheses)
  expect_config_error({"--lr", "0"}, "--lr must be > 0 .leave it out for the preset's");
  expect_config_error({"--lr", "1e-50"}, "--lr: '1e-50' is too small for fp32 .it would round to 0");
  expect_config_error({"--batch", "0"}, "--batch must be >= 1 .leave it out for the preset's");
}

// A typo gets the nearest flag; a word that is no typo of any gets no guess (a wrong guess misleads).
TEST(FlagErrorsDeathTest, UnknownFlagNamesTheNearestKnownOne) {
  expect_config_error({"--step", "5"}, "unknown flag '--step'; did you mean --steps\\?");
  expect_config_error({"--graad-accum=2"}, "unknown flag '--graad-accum'; did you mean --grad-accum\\?");
  expect_config_error({"--lnk-gbps", "1"}, "did you mean --link-gbps\\?");
  expect_config_error({"--tensor-parallel", "2"}, "unknown flag '--tensor-parallel' .see --help");
}

// The later value would silently win; the user meant one of them, and only the user knows which.
TEST(FlagErrorsDeathTest, AFlagGivenTwiceIsRefused) {
  expect_config_error({"--steps", "2", "--steps", "1"}, "--steps is given twice: give it once");
  expect_config_error({"--steps=2", "--lr", "1e-3", "--steps", "2"}, "--steps is given twice");
  expect_config_error({"--quiet", "--quiet"}, "--quiet is given twice");
  expect_config_error({"--steps", "3", "--steps=4"}, "--steps is given twice");  // once, the last one won
}

// The emulated link's physical range: 1e-300 Gbit/s overflowed the clock and was not emulated at all,
// 1e12 us made a wait of 31 years; both are refused with the range, before MPI is touched.
TEST(FlagErrorsDeathTest, TheEmulatedLinkIsBoundToPhysicalValues) {
  expect_config_error({"--link-gbps", "1e-300"}, "--link-gbps 1e-300: an emulated link carries 0.001 to 100000 Gbit/s");
  expect_config_error({"--link-gbps", "1e-9"}, "--link-gbps 1e-09: an emulated link carries");
  expect_config_error({"--link-gbps", "1e9"}, "--link-gbps 1e\\+09: an emulated link carries");
  expect_config_error({"--link-latency-us", "1e12"}, "--link-latency-us 1e\\+12: an emulated link's latency is 0 to");
  const TrainConfig edges = parse_train({"--link-gbps", "0.001", "--link-latency-us", "1000000"});
  EXPECT_EQ(edges.link_gbps, 0.001);
  EXPECT_EQ(edges.link_latency_us, 1e6);
  EXPECT_EQ(parse_train({"--link-gbps", "0"}).link_gbps, 0.0);  // off
}

TEST(FlagErrorsDeathTest, ARefusedFlagSaysWhatToUse) {
  auto parse = [] {
    Argv args({"--grad-accum", "2"});
    FlagParser parser;
    TrainConfig cfg;
    int micro_batches = 0;
    parser.add("--micro-batches", &micro_batches, "micro-batches");
    parser.add_refused("--grad-accum", "use --micro-batches");
    parse_train_flags(args.argc(), args.argv(), "00_test", "a test", parser, &cfg);
  };
  EXPECT_EXIT(parse(), ::testing::ExitedWithCode(1), "--grad-accum: use --micro-batches");
}

// The flags parsed are the chapter's (TrainConfig::chapter_flags): messages of shared code ask for them.
TEST(TrainFlags, TheChaptersFlagsAreKnownAndNamedInItsHelp) {
  {
    Argv args({});
    FlagParser parser;
    TrainConfig cfg;
    int micro_batches = 0;
    parser.add("--micro-batches", &micro_batches, "micro-batches");
    parser.add_refused("--grad-accum", "use --micro-batches");
    ASSERT_TRUE(parse_train_flags(args.argc(), args.argv(), "00_test", "a test", parser, &cfg));
    EXPECT_TRUE(cfg.chapter_takes("--micro-batches"));
    EXPECT_FALSE(cfg.chapter_takes("--grad-accum"));
    EXPECT_EQ(cfg.accumulation_flag(), "--micro-batches");
    EXPECT_EQ(parser.usage().find("--grad-accum"), std::string::npos) << parser.usage();
  }
  const TrainConfig cfg = parse_train({});
  EXPECT_TRUE(cfg.chapter_takes("--grad-accum"));
  EXPECT_FALSE(cfg.chapter_takes("--micro-batches"));
  EXPECT_EQ(cfg.accumulation_flag(), "--grad-accum");
}

// Every {step} of --save is the step, not only the first.
TEST(TrainFlags, EveryStepInTheSavePathIsFilled) {
  EXPECT_EQ(checkpoint_path("a_{step}_{step}.ckpt", 12), "a_12_12.ckpt");
  EXPECT_EQ(checkpoint_path("{step}/{step}{step}", 3), "3/33");
  EXPECT_EQ(checkpoint_path("plain.ckpt", 3), "plain.ckpt");
  EXPECT_EQ(checkpoint_path("{step", 3), "{step");
}

TEST(TrainFlags, RecordsWhichFlagsWereGiven) {
  const TrainConfig cfg = parse_train({"--lr", "1e-3", "--steps=4", "--quiet"});
  EXPECT_TRUE(cfg.was_given("--lr"));
  EXPECT_TRUE(cfg.was_given("--steps"));
  EXPECT_TRUE(cfg.was_given("--quiet"));
  EXPECT_FALSE(cfg.was_given("--batch"));
  EXPECT_FALSE(cfg.was_given("--warmup"));
  EXPECT_FLOAT_EQ(parse_train({"--lr", "1e-30"}).lr, 1e-30f);  // small, but a float
}

// ---- The pipeline chapters' shared block (grid_flags.h): 09's and 12's --help list it in one order. ----

// The block declared as 12 declares it (a chapter's own flags after --tp and after --pp), or as 08
// does (no tp text: no tensor-parallel flags), then parsed; `usage` gets --help's list.
GridFlags parse_grid(std::initializer_list<const char*> arguments, bool tensor_parallel, std::string* usage) {
  Argv args(arguments);
  FlagParser parser;
  TrainConfig cfg;
  GridFlags grid(1);
  int cp = 1, ep = 1;
  GridFlagHelp help;
  help.tp = tensor_parallel ? "tensor-parallel ranks (default 1)" : nullptr;
  help.pp = "pipeline stages (default 1)";
  help.sequence_parallel = "split the rows too";
  grid.declare_grid(parser, cfg, help, [&] { parser.add("--cp", &cp, "ring ranks (default 1)"); },
                    [&] { parser.add("--ep", &ep, "expert ranks (default 1)"); });
  EXPECT_TRUE(parse_train_flags(args.argc(), args.argv(), "00_test", "a test", parser, &cfg));
  grid.check_grid(cfg);
  *usage = parser.usage();
  return grid;
}

TEST(GridFlags, OneBlockInOneOrderWithTheChaptersOwnBetween) {
  std::string usage;
  const GridFlags grid = parse_grid({"--tp", "2", "--pp", "4", "--sequence-parallel", "--bucket-mb", "0.5",
                                     "--schedule", "zb-h1", "--zero1"},
                                    true, &usage);
  EXPECT_EQ(grid.tp, 2);
  EXPECT_EQ(grid.pipeline.pp, 4);
  EXPECT_TRUE(grid.sequence_parallel);
  EXPECT_FALSE(grid.overlap);
  EXPECT_EQ(grid.bucket_mb, 0.5);
  EXPECT_EQ(grid.pipeline.schedule, "zb-h1");
  EXPECT_TRUE(grid.pipeline.zero1);
  EXPECT_EQ(grid.matching, "auto");
  long previous = -1;  // usage() opens with the chapter's own flags: --tp at 0
  for (const char* flag : {"--tp N", "--cp N", "--pp N", "--ep N", "--sequence-parallel", "--tp-overlap",
                           "--micro-batches N", "--schedule", "--bucket-mb X", "--tp-link-gbps X",
                           "--tp-link-latency-us X"}) {
    const size_t at = usage.find(std::string("  ") + flag);
    ASSERT_NE(at, std::string::npos) << flag << " missing in\n" << usage;
    EXPECT_GT(long(at), previous) << flag << " out of order in\n" << usage;
    previous = long(at);
  }
}

TEST(GridFlags, WithoutTensorParallelismNoneOfItsFlags) {
  std::string usage;
  const GridFlags grid = parse_grid({"--pp", "2"}, false, &usage);
  EXPECT_EQ(grid.tp, 1);
  EXPECT_EQ(grid.pipeline.pp, 2);
  for (const char* flag : {"--tp ", "--sequence-parallel", "--tp-overlap", "--tp-link-gbps", "--tp-link-latency-us"})
    EXPECT_EQ(usage.find(flag), std::string::npos) << flag << " listed in\n" << usage;
  EXPECT_NE(usage.find("--bucket-mb X"), std::string::npos) << usage;
}

TEST(GridFlagsDeathTest, EachRefusalNamesItsFlag) {
  std::string usage;
  EXPECT_EXIT(parse_grid({"--tp", "0"}, true, &usage), ::testing::ExitedWithCode(1), "--tp must be >= 1");
  EXPECT_EXIT(parse_grid({"--bucket-mb", "-1"}, true, &usage), ::testing::ExitedWithCode(1),
              "--bucket-mb must be > 0");
  EXPECT_EXIT(parse_grid({"--pp", "0"}, false, &usage), ::testing::ExitedWithCode(1), "--pp must be >= 1");
  EXPECT_EXIT(parse_grid({"--tp", "2"}, false, &usage), ::testing::ExitedWithCode(1), "unknown flag '--tp'");
}

}  // namespace
