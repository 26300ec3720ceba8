// test_data.cpp: the data order of data.h, the built-in corpus and the errors of load_token_data(),
// which reads files to their end (a /proc file too) and refuses FIFOs and folders.
// The expected windows are computed here from the formula as data.h writes it, not from
// TokenData, so the test checks the documented contract rather than the code against itself.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "training/data.h"

namespace {

// Bytes 0, 1, ..., 255, 0, 1, ... plus every byte value, so a window's content tells its offset
// and tokens >= 128 appear (they must come out as 128..255, never negative).
std::string counting_bytes(size_t n) {
  std::string bytes(n, '\0');
  for (size_t i = 0; i < n; i++) bytes[i] = char(uint8_t(i * 7 + i / 256));
  return bytes;
}

// data.h: sample i of step s reads the T+1 bytes at ((s*B + i) * T) mod (len - T - 1).
int64_t documented_offset(int64_t step, int64_t B, int64_t sample, int64_t T, int64_t len) {
  return ((step * B + sample) * T) % (len - T - 1);
}

struct Batch {
  std::vector<int> inputs, targets;
};

Batch fill(const TokenData& data, int64_t step, int B, int first, int count, int T) {
  Batch b{std::vector<int>(size_t(count) * T), std::vector<int>(size_t(count) * T)};
  data.fill(step, B, first, count, T, b.inputs.data(), b.targets.data());
  return b;
}

TEST(TokenData, FillFollowsTheDocumentedFormula) {
  constexpr int B = 4, T = 8;
  const std::string bytes = counting_bytes(1000);
  const TokenData data(bytes, "test");
  const int64_t len = int64_t(bytes.size());
  // Steps far enough that the offsets wrap around len - T - 1 several times.
  for (int64_t step : {0, 1, 2, 7, 30, 31, 100, 12345}) {
    const Batch batch = fill(data, step, B, 0, B, T);
    for (int i = 0; i < B; i++) {
      const int64_t offset = documented_offset(step, B, i, T, len);
      for (int t = 0; t < T; t++) {
        ASSERT_EQ(batch.inputs[i * T + t], int(uint8_t(bytes[offset + t])))
            << "step " << step << " sample " << i << " t " << t;
        ASSERT_EQ(batch.targets[i * T + t], int(uint8_t(bytes[offset + t + 1])))
            << "step " << step << " sample " << i << " t " << t;
      }
    }
  }
}

TEST(TokenData, OffsetsWrapAroundTheEnd) {
  // len - T - 1 = 10 offsets: step 1, B = 2 gives samples at (2*4) % 10 = 8 and (3*4) % 10 = 2.
  constexpr int B = 2, T = 4;
  const std::string bytes = counting_bytes(15);
  const TokenData data(bytes, "test");
  const Batch batch = fill(data, 1, B, 0, B, T);
  EXPECT_EQ(documented_offset(1, B, 0, T, 15), 8);
  EXPECT_EQ(documented_offset(1, B, 1, T, 15), 2);
  for (int t = 0; t < T; t++) {
    EXPECT_EQ(batch.inputs[t], int(uint8_t(bytes[8 + t])));
    EXPECT_EQ(batch.targets[t], int(uint8_t(bytes[9 + t])));
    EXPECT_EQ(batch.inputs[T + t], int(uint8_t(bytes[2 + t])));
  }
}

TEST(TokenData, TokensAreUnsignedBytes) {
  const std::string bytes = {char(0), char(127), char(128), char(200), char(255), char(1)};
  const TokenData data(bytes, "test");
  constexpr int T = 4;  // len - T - 1 = 1: the only window starts at 0
  const Batch batch = fill(data, 0, 1, 0, 1, T);
  EXPECT_EQ(batch.inputs, (std::vector<int>{0, 127, 128, 200}));
  EXPECT_EQ(batch.targets, (std::vector<int>{127, 128, 200, 255}));
}

TEST(TokenData, RanksTogetherReadTheFullBatch) {
  constexpr int B = 12, T = 16;
  const TokenData data(counting_bytes(5000), "test");
  for (int64_t step : {0, 3, 50}) {
    const Batch full = fill(data, step, B, 0, B, T);
    for (int ranks : {1, 2, 3, 4, 6, 12}) {
      Batch joined;
      for (int r = 0; r < ranks; r++) {
        const int first = r * B / ranks, last = (r + 1) * B / ranks;  // data.h: [r*B/N, (r+1)*B/N)
        const Batch part = fill(data, step, B, first, last - first, T);
        joined.inputs.insert(joined.inputs.end(), part.inputs.begin(), part.inputs.end());
        joined.targets.insert(joined.targets.end(), part.targets.begin(), part.targets.end());
      }
      EXPECT_EQ(joined.inputs, full.inputs) << ranks << " ranks, step " << step;
      EXPECT_EQ(joined.targets, full.targets) << ranks << " ranks, step " << step;
    }
  }
}

TEST(DefaultCorpus, IsDeterministicLargeAndReadable) {
  const std::string a = default_corpus();
  const std::string b = default_corpus();
  EXPECT_EQ(a, b);
  EXPECT_GE(a.size(), size_t(500 * 1000));
  EXPECT_LE(a.size(), size_t(2 * 1000 * 1000));

  // English-like text: printable ASCII and newlines only, but a good part of the alphabet.
  bool used[256] = {};
  for (unsigned char c : a) used[c] = true;
  int distinct = 0;
  for (int c = 0; c < 256; c++) {
    if (!used[c]) continue;
    distinct++;
    EXPECT_TRUE(c == '\n' || (c >= 32 && c < 127)) << "byte " << c;
  }
  EXPECT_GE(distinct, 30);
  EXPECT_TRUE(used[int(' ')] && used[int('.')] && used[int('\n')]);
  EXPECT_NE(a.find("The "), std::string::npos);
}

// The corpus is part of every reproducible run: loss curves in the docs and comparisons between
// machines assume these exact bytes. A change to the grammar must be deliberate, and then this
// length and hash are updated with it.
TEST(DefaultCorpus, IsPinned) {
  const std::string corpus = default_corpus();
  uint64_t hash = 14695981039346656037ULL;  // FNV-1a, 64-bit
  for (unsigned char c : corpus) {
    hash ^= c;
    hash *= 1099511628211ULL;
  }
  EXPECT_EQ(corpus.size(), size_t(1048714));
  EXPECT_EQ(hash, 0xc201799856248260ULL);
}

TEST(LoadTokenData, EmptyPathGivesTheBuiltInCorpus) {
  TokenData data;
  std::string error;
  ASSERT_TRUE(load_token_data("", 64, &data, &error)) << error;
  EXPECT_EQ(data.length(), int64_t(default_corpus().size()));
  EXPECT_NE(data.description().find("built-in"), std::string::npos) << data.description();
}

std::string temp_file(const std::string& name, const std::string& contents) {
  const std::string path = ::testing::TempDir() + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr) << path;
  if (f) {
    std::fwrite(contents.data(), 1, contents.size(), f);
    std::fclose(f);
  }
  return path;
}

TEST(LoadTokenData, ReadsAFile) {
  const std::string path = temp_file("test_data_ok.txt", "hello world, hello tokens");
  TokenData data;
  std::string error;
  ASSERT_TRUE(load_token_data(path, 4, &data, &error)) << error;
  EXPECT_EQ(data.length(), 25);
  EXPECT_NE(data.description().find(path), std::string::npos) << data.description();
  std::remove(path.c_str());
}

TEST(LoadTokenData, MissingFileSaysWhatToDo) {
  TokenData data;
  std::string error;
  EXPECT_FALSE(load_token_data("/nonexistent/corpus.txt", 8, &data, &error));
  EXPECT_NE(error.find("cannot open '/nonexistent/corpus.txt'"), std::string::npos) << error;
  EXPECT_NE(error.find("No such file or directory"), std::string::npos) << error;
  EXPECT_NE(error.find("--data PATH"), std::string::npos) << error;
}

TEST(LoadTokenData, TooShortFileNamesItsLengthAndTheNeed) {
  constexpr int T = 8;  // needs T + 2 = 10 bytes
  const std::string path = temp_file("test_data_short.txt", "123456789");
  TokenData data;
  std::string error;
  EXPECT_FALSE(load_token_data(path, T, &data, &error));
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_NE(error.find("9 bytes"), std::string::npos) << error;
  EXPECT_NE(error.find("T+2 = 10"), std::string::npos) << error;

  // One byte more is enough.
  const std::string exact = temp_file("test_data_exact.txt", "1234567890");
  EXPECT_TRUE(load_token_data(exact, T, &data, &error)) << error;
  std::remove(path.c_str());
  std::remove(exact.c_str());
}

// A /proc file says it has 0 bytes and cannot seek: it is read to its end all the same.
TEST(LoadTokenData, ReadsAFileWhoseSizeIsKnownOnlyAtItsEnd) {
  struct stat info;
  if (stat("/proc/cpuinfo", &info) != 0) GTEST_SKIP() << "no /proc/cpuinfo here";
  TokenData data;
  std::string error;
  ASSERT_TRUE(load_token_data("/proc/cpuinfo", 8, &data, &error)) << error;
  EXPECT_GT(data.length(), 10);
  EXPECT_NE(data.description().find("/proc/cpuinfo (" + std::to_string(data.length()) + " bytes)"), std::string::npos)
      << data.description();
}

// A FIFO (which would block until someone writes to it) and a folder are refused, saying what they
// are; an empty file names its 0 bytes.
TEST(LoadTokenData, RefusesWhatIsNotARegularFileSayingWhatItIs) {
  const std::string fifo = ::testing::TempDir() + "test_data_fifo", folder = ::testing::TempDir() + "test_data_folder";
  std::remove(fifo.c_str());
  rmdir(folder.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  ASSERT_EQ(mkdir(folder.c_str(), 0755), 0);
  TokenData data;
  std::string error;
  EXPECT_FALSE(load_token_data(fifo, 8, &data, &error));
  EXPECT_NE(error.find("cannot open '" + fifo + "': it is a FIFO (named pipe), not a regular file"), std::string::npos)
      << error;
  EXPECT_FALSE(load_token_data(folder, 8, &data, &error));
  EXPECT_NE(error.find("cannot open '" + folder + "': it is a folder, not a regular file"), std::string::npos) << error;
  const std::string empty = temp_file("test_data_empty.txt", "");
  EXPECT_FALSE(load_token_data(empty, 8, &data, &error));
  EXPECT_NE(error.find("has 0 bytes"), std::string::npos) << error;
  std::remove(fifo.c_str());
  rmdir(folder.c_str());
  std::remove(empty.c_str());
}

}  // namespace
