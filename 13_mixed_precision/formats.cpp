// formats.cpp: 13_mixed_precision/formats, a check of our number formats from outside. It reads fp32
// bit patterns on standard input, one a line, in hex with a 0x prefix (0x3f800000 is 1.0), and prints
// one line per input with each format's code (float_formats.h: round to nearest, ties to even;
// E4M3 saturating at 448 is --saturate, else its NaN):
//   $ printf '0x3f800000\n0x43e80000\n' | 13_mixed_precision/formats
//   bf16=0x3f80 fp16=0x3c00 e4m3=0x38 e5m2=0x3c
//   bf16=0x43e8 fp16=0x5f40 e4m3=0x7e e5m2=0x5f
// Compare with any other implementation (ml_dtypes in Python, NVIDIA's intrinsics) line by line.
// A line that is not a 0x hex number of at most 32 bits gets an error naming its line number, and the
// program exits 1 after the other lines.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "ops/float_formats.h"

int main(int argc, char** argv) {
  Overflow overflow = Overflow::Ieee;
  const char* usage = "usage: %s [--saturate] < fp32 bit patterns (0x hex, one a line)\n"
                      "  prints each pattern's bf16, fp16, E4M3 and E5M2 codes, one line per input;\n"
                      "  --saturate: +-max where a value overflows (else infinity, or E4M3's NaN)\n";
  for (int i = 1; i < argc; i++) {
    if (std::strcmp(argv[i], "--saturate") == 0) {
      overflow = Overflow::Saturate;
    } else if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf(usage, argv[0]);
      return 0;
    } else {
      std::fprintf(stderr, usage, argv[0]);
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  std::string line;
  int line_number = 0, errors = 0;
  while (std::getline(std::cin, line)) {
    line_number++;
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;  // blank lines are skipped
    const size_t last = line.find_last_not_of(" \t\r");
    const std::string word = line.substr(first, last - first + 1);
    char* end = nullptr;
    const unsigned long long bits = std::strtoull(word.c_str(), &end, 16);
    if (word.size() < 3 || word.compare(0, 2, "0x") != 0 || *end != '\0' || word.size() > 10 || bits > 0xFFFFFFFFull) {
      std::fprintf(stderr, "line %d: '%s' is not an fp32 bit pattern (0x followed by up to 8 hex digits)\n",
                   line_number, word.c_str());
      errors++;
      continue;
    }
    const uint32_t pattern = uint32_t(bits);
    float x;
    std::memcpy(&x, &pattern, sizeof x);
    std::printf("bf16=0x%04x fp16=0x%04x e4m3=0x%02x e5m2=0x%02x\n", encode_float(NumberFormat::BF16, x, overflow),
                encode_float(NumberFormat::FP16, x, overflow), encode_float(NumberFormat::E4M3, x, overflow),
                encode_float(NumberFormat::E5M2, x, overflow));
  }
  return errors ? 1 : 0;
}
