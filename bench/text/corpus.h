// A deterministic mixed-language corpus for tokenizer benchmarks: English prose, code, Chinese,
// Japanese, Russian, Arabic, Hindi (combining marks), decomposed Latin accents, emoji (ZWJ
// sequences, skin tones, flags), numbers and whitespace runs. Same bytes on every platform
// (its own PRNG, integer arithmetic only).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dq::bench {

// Documents of a few hundred bytes to a few KB until `bytes` is reached (may end slightly
// beyond). Documents are joined by "\n\n".
std::vector<std::string> make_documents(size_t bytes, uint64_t seed);

std::string join_documents(const std::vector<std::string>& docs);

}  // namespace dq::bench
