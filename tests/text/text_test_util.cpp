#include "text_test_util.h"

#include <nlohmann/json.hpp>

namespace dq::text::testing {

std::string tiny_json() { return read_text_file(data_path("tokenizer/tiny/tokenizer.json")); }
std::string qwen3_json() { return read_text_file(data_path("tokenizer/qwen3/tokenizer.json")); }

std::string qwen3_q35_json() {
  std::string text = qwen3_json();
  std::string from = nlohmann::json(qwen3_tokenizer().split_patterns().at(0)).dump();
  std::string to = nlohmann::json(tiny_tokenizer().split_patterns().at(0)).dump();
  size_t at = text.find(from);
  if (at == std::string::npos || text.find(from, at + 1) != std::string::npos)
    fail("qwen3 tokenizer.json: the Split regex was not found exactly once");
  text.replace(at, from.size(), to);
  return text;
}

const Tokenizer& tiny_tokenizer() {
  static const Tokenizer t = Tokenizer::load(data_path("tokenizer/tiny/tokenizer.json"));
  return t;
}

const Tokenizer& qwen3_tokenizer() {
  static const Tokenizer t = Tokenizer::load(data_path("tokenizer/qwen3/tokenizer.json"));
  return t;
}

const Tokenizer& qwen3_q35_tokenizer() {
  static const Tokenizer t = Tokenizer::from_json(qwen3_q35_json(), "qwen3-vocab-q35-regex");
  return t;
}

const Tokenizer& tokenizer_by_name(const std::string& name) {
  if (name == "tiny") return tiny_tokenizer();
  if (name == "qwen3") return qwen3_tokenizer();
  if (name == "qwen3-vocab-q35-regex") return qwen3_q35_tokenizer();
  fail("unknown fixture tokenizer '{}'", name);
}

}  // namespace dq::text::testing
