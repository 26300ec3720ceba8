// float_formats.cpp: the host-side names of the number formats of float_formats.h.
#include "ops/float_formats.h"

#include <cstring>
#include <initializer_list>

const char* format_name(NumberFormat f) {
  switch (f) {
    case NumberFormat::BF16: return "bf16";
    case NumberFormat::FP16: return "fp16";
    case NumberFormat::E4M3: return "e4m3";
    default: return "e5m2";
  }
}

bool parse_format(const char* name, NumberFormat* out) {
  for (NumberFormat f : {NumberFormat::BF16, NumberFormat::FP16, NumberFormat::E4M3, NumberFormat::E5M2}) {
    if (std::strcmp(name, format_name(f)) == 0) {
      *out = f;
      return true;
    }
  }
  return false;
}
