// precision_flags.h: the flags of a mixed-precision recipe (--precision and its fp8 and fp16
// settings), shared by every chapter through TrainConfig (flags.h) and by chapter 13, which
// registers them itself. Defines PrecisionFlags and add_precision_flags (precision_report.cpp).
#pragma once
#include <string>

class FlagParser;

struct PrecisionFlags {
  std::string precision = "fp32";
  std::string fp8_scaling = "delayed";
  std::string fp8_grad = "e5m2";
  std::string fp8_accumulate = "fp32";
  int amax_history = 16;
  double loss_scale = 0;  // 0: dynamic
  double loss_scale_init = 65536;
  int loss_scale_window = 50;
  // Set by add_precision_flags: these flags are on the parser, so these values are the ones given.
  bool registered = false;
};
void add_precision_flags(FlagParser& flags, PrecisionFlags* pf);
