// Deterministic mutation of valid inputs through the fuzz entry points (tests/fuzz): runs in
// every CI build, also under ASan+UBSan. Any crash or sanitizer report fails the run.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "fuzz/fuzz_targets.h"

namespace {

std::vector<uint8_t> file_bytes(const std::string& path, size_t max = 1 << 20) {
  auto f = dq::MappedFile::open(path);
  size_t n = std::min(f->size(), max);
  return std::vector<uint8_t>(f->data(), f->data() + n);
}

// Byte flips, insertions, deletions, truncations, length-field edits, and splices of
// JSON-meaningful tokens.
std::vector<uint8_t> mutate(std::vector<uint8_t> b, std::mt19937& rng) {
  static const char* tokens[] = {"{", "}", "[", "]", ",", ":", "\"", "-1", "1e309", "18446744073709551615", "null",
                                 "\"F32\"", "\"U32\"", "\"data_offsets\"", "\"shape\"", "[0,0]", "[]", "\\u0000", "\xff"};
  int edits = 1 + int(rng() % 4);
  for (int e = 0; e < edits && !b.empty(); ++e) {
    size_t at = rng() % b.size();
    switch (rng() % 6) {
      case 0: b[at] ^= uint8_t(1u << (rng() % 8)); break;
      case 1: b.erase(b.begin() + long(at), b.begin() + long(std::min(b.size(), at + 1 + rng() % 16))); break;
      case 2: {
        const char* t = tokens[rng() % (sizeof tokens / sizeof *tokens)];
        b.insert(b.begin() + long(at), t, t + std::char_traits<char>::length(t));
        break;
      }
      case 3: b.resize(at); break;
      case 4:
        if (b.size() >= 8) b[rng() % 8] = uint8_t(rng());  // the header length
        break;
      case 5: b[at] = uint8_t("0123456789"[rng() % 10]); break;
    }
  }
  return b;
}

}  // namespace

TEST(FuzzSmoke, SafetensorsHeader) {
  // A small valid file: the fixture's header plus its first bytes of data.
  std::vector<uint8_t> seed = file_bytes(std::string(DQ_TEST_DATA) + "/tiny-q4/model.safetensors", 64 << 10);
  std::mt19937 rng(1);
  for (int i = 0; i < 3000; ++i) {
    auto m = mutate(seed, rng);
    dq::fuzz::safetensors_header(m.data(), m.size());
  }
  dq::fuzz::safetensors_header(nullptr, 0);
}

TEST(FuzzSmoke, ModelConfig) {
  for (const char* name : {"/tiny-q4/config.json", "/tiny-hf16/config.json"}) {
    std::vector<uint8_t> seed = file_bytes(std::string(DQ_TEST_DATA) + name);
    std::mt19937 rng(2);
    for (int i = 0; i < 5000; ++i) {
      auto m = mutate(seed, rng);
      dq::fuzz::model_config(m.data(), m.size());
    }
  }
}
