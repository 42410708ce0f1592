// Shared helpers for the tokenizer tests: fixture paths and the three fixture tokenizers.
#pragma once
#include <memory>
#include <string>

#include "core/error.h"
#include "core/mapped_file.h"
#include "text/tokenizer.h"

namespace dq::text::testing {

inline std::string data_path(const std::string& rel) { return std::string(DQ_TEST_DATA) + "/" + rel; }

// Loaded once per test binary (the Qwen3 file is 11 MB).
const Tokenizer& tiny_tokenizer();
const Tokenizer& qwen3_tokenizer();
// Qwen3's vocabulary and merges with the Qwen3.5 Split regex (taken from the tiny tokenizer,
// which ships Qwen3.5's pre-tokenizer): the "qwen3-vocab-q35-regex" fixture tokenizer.
const Tokenizer& qwen3_q35_tokenizer();
const Tokenizer& tokenizer_by_name(const std::string& name);

// tokenizer.json text of the fixture tokenizers.
std::string tiny_json();
std::string qwen3_json();
std::string qwen3_q35_json();

}  // namespace dq::text::testing
