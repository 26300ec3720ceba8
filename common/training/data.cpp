// data.cpp: the token stream every chapter trains on (see data.h for the data order).
// Defines TokenData::fill(), load_token_data() and default_corpus(), a small deterministic grammar
// that writes about 1 MB of English-like text, so a first run needs no download.
#include "training/data.h"

#include <cstddef>
#include <cstring>

#include "base/check.h"   // ENSURE
#include "base/fileio.h"  // read_whole_file

void TokenData::fill(int64_t step, int B, int first, int count, int T, int* inputs,
                     int* targets) const {
  ENSURE(first >= 0 && count >= 0 && first + count <= B, "samples outside the global batch");
  ENSURE(length() >= int64_t(T) + 2, "token data shorter than T+2 (load_token_data checks this)");
  // Offsets wrap around modulo len - T - 1 (the documented order; one fewer than the len - T
  // windows of T+1 bytes that would fit, so the file's last byte is never a target). The offset
  // depends only on (step, global sample), never on the rank count: that is what lets a run on
  // N ranks see exactly the batches of a run on one rank.
  const int64_t num_offsets = length() - T - 1;
  for (int j = 0; j < count; j++) {
    const int64_t sample = first + j;
    const int64_t offset = ((step * B + sample) * T) % num_offsets;
    // Bytes are tokens 0..255: read them unsigned, or bytes >= 128 would become negative ids.
    const unsigned char* window = reinterpret_cast<const unsigned char*>(bytes_.data()) + offset;
    for (int t = 0; t < T; t++) {
      inputs[int64_t(j) * T + t] = window[t];
      targets[int64_t(j) * T + t] = window[t + 1];
    }
  }
}

TokenData::TokenData(std::string bytes, std::string description)
    : bytes_(std::move(bytes)), description_(std::move(description)), hash_(fnv1a(bytes_.data(), bytes_.size())) {}

bool load_token_data(const std::string& path, int T, TokenData* data, std::string* error) {
  std::string bytes;
  std::string description;
  if (path.empty()) {
    bytes = default_corpus();
    description = "built-in corpus (" + std::to_string(bytes.size()) + " bytes)";
  } else {
    if (!read_whole_file(path, &bytes, error)) {
      *error += "; pass --data PATH to train on another file, or leave --data out for the "
                "built-in corpus";
      return false;
    }
    description = path + " (" + std::to_string(bytes.size()) + " bytes)";
  }
  // One sample reads T+1 bytes, and the offsets wrap modulo len - T - 1, which must be >= 1.
  const int64_t needed = int64_t(T) + 2;
  if (int64_t(bytes.size()) < needed) {
    *error = (path.empty() ? std::string("the built-in corpus") : "'" + path + "'") + " has " +
             std::to_string(bytes.size()) + " bytes, but a context of T=" + std::to_string(T) +
             " needs at least T+2 = " + std::to_string(needed) + " bytes";
    return false;
  }
  *data = TokenData(std::move(bytes), std::move(description));
  return true;
}

// ---------------------------------------------------------------------------------------------
// The built-in corpus.
//
// A tiny grammar (subject, verb, object, place, time; a few sentence shapes; paragraphs) drawn
// with a fixed-seed linear congruential generator. Integer arithmetic only, and no
// std::uniform_int_distribution (whose output differs between standard libraries), so the corpus
// is byte-identical on every machine and a loss curve can be compared across machines.
// The structure is what a small byte-level model learns first: the spelling of some 180 words,
// spaces, capitals after a full stop, frequent sequences such as "the old" or "in the".
namespace {

// Knuth's MMIX LCG. Unsigned overflow wraps by definition, so every compiler gives the same
// sequence. The low bits of an LCG cycle quickly, so draws use the high 32 bits.
class Lcg {
 public:
  explicit Lcg(uint64_t seed) : state_(seed) {}
  // A number in [0, n), n >= 1. Multiply-shift instead of % keeps the high bits in charge.
  uint32_t below(uint32_t n) {
    state_ = state_ * 6364136223846793005ULL + 1442695040888963407ULL;
    return uint32_t((uint64_t(uint32_t(state_ >> 32)) * n) >> 32);
  }
  bool percent(uint32_t p) { return below(100) < p; }  // true with probability p%

 private:
  uint64_t state_;
};

template <typename Word, size_t N>
const Word& pick(Lcg& rng, const Word (&words)[N]) {
  return words[rng.below(uint32_t(N))];
}

// Singular nouns. Only creatures act and speak; things are acted upon or described. That split
// is structure a small model can discover: "the river laughed" never occurs.
const char* const kCreatures[] = {
    "farmer", "dog",    "girl",    "boy",      "teacher", "king",   "queen",  "child",
    "baker",  "sailor", "cat",     "horse",    "bird",    "doctor", "soldier", "painter",
    "fox",    "wolf",   "stranger", "miller",  "owl",     "goat"};
const char* const kThings[] = {
    "river",  "letter", "stone",  "apple", "basket", "lamp",  "song",  "story", "window",
    "door",   "boat",   "bridge", "garden", "tree",  "book",  "coat",  "key",   "bell",
    "road",   "cart",   "candle", "map",   "ring",   "cup",   "loaf",  "fire",  "field"};
const char* const kNames[] = {"Anna", "Tom",  "Mira", "Jonas", "Lena", "Paul",
                              "Clara", "Hugo", "Ida",  "Oskar", "Rosa", "Emil"};
const char* const kAdjectives[] = {
    "old",   "young", "small",  "large",  "quiet", "loud",  "happy", "tired",  "brave",
    "clever", "gentle", "green", "red",    "dark",  "bright", "cold",  "warm",   "heavy",
    "little", "wooden", "broken", "golden", "strange", "careful"};
// Transitive verbs in two forms: questions use the base ("did ... find"), stories the past tense,
// so each form appears in its own predictable context.
struct Verb {
  const char* base;
  const char* past;
};
const Verb kVerbs[] = {
    {"see", "saw"},       {"find", "found"},     {"carry", "carried"}, {"watch", "watched"},
    {"follow", "followed"}, {"help", "helped"},  {"open", "opened"},   {"take", "took"},
    {"bring", "brought"}, {"hold", "held"},      {"paint", "painted"}, {"call", "called"},
    {"visit", "visited"}, {"remember", "remembered"}, {"build", "built"}, {"hear", "heard"},
    {"keep", "kept"},     {"lose", "lost"},      {"sell", "sold"},     {"clean", "cleaned"}};
const char* const kIntransitive[] = {"slept",  "laughed", "waited", "sang",    "smiled",
                                     "walked", "rested",  "cried",  "listened", "stayed"};
const char* const kAdverbs[] = {"slowly", "quickly", "quietly", "again", "carefully", "happily"};
const char* const kPlaces[] = {"the village", "the forest", "the market", "the river", "the hill",
                               "the old mill", "the town",  "the garden", "the harbour", "the castle"};
const char* const kPrepositions[] = {"near", "in", "behind", "beside", "under", "across"};
const char* const kTimes[] = {"in the morning", "at night",        "one day", "after the storm",
                              "before dinner",  "in the evening", "every spring", "at noon"};
const char* const kDeterminers[] = {"the", "the", "the", "a", "his", "her", "my", "that"};
const char* const kSaying[] = {"said", "asked", "whispered", "shouted"};
const char* const kConnectives[] = {"and", "but", "so", "because"};

// Appends words and handles the capital at the start of a sentence.
class TextWriter {
 public:
  explicit TextWriter(std::string* out) : out_(out) {}
  void word(const char* w) {
    if (need_space_) out_->push_back(' ');
    if (capitalize_ && *w >= 'a' && *w <= 'z') {
      out_->push_back(char(*w - 'a' + 'A'));
      w++;
    }
    out_->append(w);
    need_space_ = true;
    capitalize_ = false;
  }
  void punct(char c) { out_->push_back(c); }  // attaches to the previous word
  void end_sentence(char c) {
    out_->push_back(c);
    capitalize_ = true;
  }
  void open_quote() {
    if (need_space_) out_->push_back(' ');
    out_->push_back('"');
    need_space_ = false;
    capitalize_ = true;
  }
  void close_quote() { out_->push_back('"'); }
  void newline() {
    out_->push_back('\n');
    need_space_ = false;
    capitalize_ = true;
  }

 private:
  std::string* out_;
  bool need_space_ = false;
  bool capitalize_ = true;
};

enum class Role { Actor, Object };  // who does something, or what it is done to

// "the old farmer", "a dog", "Anna" (actors); "her red key", "an apple" (mostly things).
void noun_phrase(Lcg& rng, TextWriter& w, Role role) {
  const bool creature = role == Role::Actor || rng.percent(30);
  if (creature && rng.percent(20)) {
    w.word(pick(rng, kNames));
    return;
  }
  const char* det = pick(rng, kDeterminers);
  const char* adj = rng.percent(45) ? pick(rng, kAdjectives) : nullptr;
  const char* noun = creature ? pick(rng, kCreatures) : pick(rng, kThings);
  // "a" before a vowel becomes "an": a rule the model can pick up from the bytes.
  const char* first = adj ? adj : noun;
  const bool vowel = std::strchr("aeiou", *first) != nullptr;
  w.word(std::strcmp(det, "a") == 0 && vowel ? "an" : det);
  if (adj) w.word(adj);
  w.word(noun);
}

// "found the red key near the river"
void predicate(Lcg& rng, TextWriter& w) {
  if (rng.percent(20)) {
    w.word(pick(rng, kIntransitive));
    if (rng.percent(40)) w.word(pick(rng, kAdverbs));
  } else {
    w.word(pick(rng, kVerbs).past);
    noun_phrase(rng, w, Role::Object);
  }
  if (rng.percent(35)) {
    w.word(pick(rng, kPrepositions));
    w.word(pick(rng, kPlaces));  // a place is several words; word() only spaces before the first
  }
}

void clause(Lcg& rng, TextWriter& w) {
  noun_phrase(rng, w, Role::Actor);
  predicate(rng, w);
}

void sentence(Lcg& rng, TextWriter& w) {
  const uint32_t shape = rng.below(100);
  if (shape < 40) {  // The dog found the key.
    clause(rng, w);
    w.end_sentence('.');
  } else if (shape < 55) {  // In the morning, the dog found the key.
    w.word(pick(rng, kTimes));
    w.punct(',');
    clause(rng, w);
    w.end_sentence('.');
  } else if (shape < 72) {  // The dog found the key, and the cat slept.
    clause(rng, w);
    w.punct(',');
    w.word(pick(rng, kConnectives));
    clause(rng, w);
    w.end_sentence('.');
  } else if (shape < 82) {  // Did the dog find the key?
    w.word("did");
    noun_phrase(rng, w, Role::Actor);
    w.word(pick(rng, kVerbs).base);
    noun_phrase(rng, w, Role::Object);
    w.end_sentence('?');
  } else if (shape < 92) {  // "The cat slept," said the girl.
    w.open_quote();
    clause(rng, w);
    w.punct(',');
    w.close_quote();
    w.word(pick(rng, kSaying));
    noun_phrase(rng, w, Role::Actor);
    w.end_sentence('.');
  } else {  // The lamp was warm and bright!
    noun_phrase(rng, w, rng.percent(50) ? Role::Actor : Role::Object);
    w.word("was");
    w.word(pick(rng, kAdjectives));
    if (rng.percent(50)) {
      w.word("and");
      w.word(pick(rng, kAdjectives));
    }
    w.end_sentence(rng.percent(30) ? '!' : '.');
  }
}

}  // namespace

std::string default_corpus() {
  const size_t kTargetBytes = 1 << 20;  // 1 MiB: enough that a short run never repeats a window
  Lcg rng(20240229);                    // fixed seed: the corpus is part of the reproducible setup
  std::string text;
  text.reserve(kTargetBytes + 1024);
  TextWriter w(&text);
  while (text.size() < kTargetBytes) {
    const uint32_t sentences = 3 + rng.below(5);  // a paragraph of 3..7 sentences
    for (uint32_t s = 0; s < sentences; s++) sentence(rng, w);
    w.newline();
    if (rng.percent(30)) w.newline();  // sometimes a blank line between paragraphs
  }
  return text;
}
