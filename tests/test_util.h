// test_util.h: what every test of the project shares.
// Defines allclose(), THE comparison of computed values with a reference (|a - b| <= atol + rtol*|ref|,
// used as EXPECT_TRUE(allclose(...)) so a failure prints the first mismatches and the largest
// difference), Rng / random_vector(), deterministic pseudo-random inputs from a seed, and
// vocabulary_slices() / rows_of() / columns_of(), the pieces of a vocabulary that tensor parallelism
// gives each rank.
//
// Tolerances are chosen per test and stated there. As a guide, fp32 results against a float64
// reference of small sizes: atol 1e-5, rtol 1e-4; fp32 gradients against float64 finite differences:
// atol 1e-4, rtol 1e-3; bf16 (8 bits of mantissa): rtol around 1e-2.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <iomanip>
#include <sstream>
#include <utility>
#include <vector>

namespace test_util_detail {

template <typename Reference>
::testing::AssertionResult allclose(const float* actual, const Reference* reference, size_t n, double atol,
                                    double rtol) {
  constexpr size_t kMismatchesShown = 5;
  size_t mismatches = 0;
  size_t worst_index = 0;
  double worst_difference = 0.0;
  std::ostringstream shown;
  shown << std::setprecision(9);
  for (size_t i = 0; i < n; i++) {
    double a = actual[i], ref = double(reference[i]);
    double difference = std::fabs(a - ref);
    // Written so that a NaN on either side fails, and the first NaN is reported as the worst difference.
    bool close = difference <= atol + rtol * std::fabs(ref);
    bool worse = std::isnan(difference) ? !std::isnan(worst_difference) : difference > worst_difference;
    if (worse) {
      worst_difference = difference;
      worst_index = i;
    }
    if (close) continue;
    if (mismatches < kMismatchesShown) {
      shown << "\n  [" << i << "] actual " << a << ", expected " << ref << ", difference " << difference;
    }
    mismatches++;
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  std::ostringstream message;
  message << mismatches << " of " << n << " values differ (atol " << atol << ", rtol " << rtol
          << "); first ones:" << shown.str() << std::setprecision(9) << "\n  largest difference "
          << worst_difference << " at [" << worst_index << "]: actual " << actual[worst_index] << ", expected "
          << double(reference[worst_index]);
  return ::testing::AssertionFailure() << message.str();
}

}  // namespace test_util_detail

// True when |actual[i] - reference[i]| <= atol + rtol * |reference[i]| for every i < n.
inline ::testing::AssertionResult allclose(const float* actual, const double* reference, size_t n, double atol,
                                           double rtol) {
  return test_util_detail::allclose(actual, reference, n, atol, rtol);
}
inline ::testing::AssertionResult allclose(const float* actual, const float* reference, size_t n, double atol,
                                           double rtol) {
  return test_util_detail::allclose(actual, reference, n, atol, rtol);
}
// The same on whole vectors, which must have equal lengths.
template <typename Reference>
::testing::AssertionResult allclose(const std::vector<float>& actual, const std::vector<Reference>& reference,
                                    double atol, double rtol) {
  if (actual.size() != reference.size()) {
    return ::testing::AssertionFailure() << "sizes differ: actual " << actual.size() << ", expected "
                                         << reference.size();
  }
  return allclose(actual.data(), reference.data(), actual.size(), atol, rtol);
}

// xorshift64*: tiny, fast and identical on every platform, unlike std:: distributions whose output
// the standard leaves to the library.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    // splitmix64 of the seed: nearby seeds give unrelated streams, and the state is never 0
    uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    state_ = (z ^ (z >> 31)) | 1;
  }
  uint64_t next_u64() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545F4914F6CDD1Dull;
  }
  // Uniform in [0, 1), from the top 24 bits so that every value is exact in a float.
  float uniform() { return float(next_u64() >> 40) * (1.0f / 16777216.0f); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [0, n).
  int below(int n) { return int(next_u64() % uint64_t(n)); }

 private:
  uint64_t state_;
};

// n values uniform in [lo, hi), the same for the same seed on every machine.
inline std::vector<float> random_vector(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Rng rng(seed);
  std::vector<float> values(n);
  for (float& x : values) x = rng.uniform(lo, hi);
  return values;
}

// n integers uniform in [0, upper), e.g. token ids.
inline std::vector<int> random_ints(size_t n, int upper, uint64_t seed) {
  Rng rng(seed);
  std::vector<int> values(n);
  for (int& x : values) x = rng.below(upper);
  return values;
}

// The float values as doubles, for float64 references computed on exactly the inputs the op saw.
inline std::vector<double> to_double(const std::vector<float>& values) {
  return std::vector<double>(values.begin(), values.end());
}

// [begin, end) of `slices` contiguous slices of `vocabulary` ids, as tensor parallelism cuts the
// vocabulary over ranks; uneven where it does not divide (11 ids in 4 slices: 2, 3, 3 and 3).
inline std::vector<std::pair<int, int>> vocabulary_slices(int vocabulary, int slices) {
  std::vector<std::pair<int, int>> ranges;
  for (int s = 0; s < slices; s++) ranges.push_back({vocabulary * s / slices, vocabulary * (s + 1) / slices});
  return ranges;
}

// Rows [begin, end) of a row-major matrix of `columns` columns: a slice's rows of an embedding table.
inline std::vector<float> rows_of(const std::vector<float>& matrix, int columns, int begin, int end) {
  return std::vector<float>(matrix.begin() + size_t(begin) * columns, matrix.begin() + size_t(end) * columns);
}

// Columns [begin, end) of every row of a row-major matrix of `columns` columns: a slice's logits.
inline std::vector<float> columns_of(const std::vector<float>& matrix, int columns, int begin, int end) {
  std::vector<float> part;
  for (size_t row = 0; row < matrix.size() / columns; row++)
    part.insert(part.end(), matrix.begin() + row * columns + begin, matrix.begin() + row * columns + end);
  return part;
}
