// Shared helpers of the chat template tests: the engine and python3-jinja2 (jinja_oracle.py)
// render the same cases, and the results are compared byte for byte.
#pragma once
#include <string>
#include <vector>

#include "chat/template.h"

namespace dq::chat::test {

// One rendering: the text, or the error message (raised: it came from raise_exception).
struct Outcome {
  bool ok = false;
  std::string text;
  std::string error;
  bool raised = false;
};

std::string read_file(const std::string& path);
std::string data_path(const std::string& rel);  // under tests/data/chat

// Cases use jinja_oracle.py's protocol: {"template", "context"} or {"template", "chat"}.
std::vector<Outcome> run_engine(const Json& cases, const Limits& limits = {});
// Runs python3 tests/chat/jinja_oracle.py (DQ_PYTHON overrides the interpreter). A missing
// python3 or jinja2 is a test failure with a message saying so, never a silent skip.
std::vector<Outcome> run_oracle(const Json& cases);

// Compares case by case; a case where both sides fail counts as agreement, except that a
// raise_exception message must be the same. Returns the number of mismatches (each reported
// with ADD_FAILURE, the first `max_reports` in full).
int compare(const Json& cases, const std::vector<Outcome>& engine, const std::vector<Outcome>& oracle,
            const std::string& label, int max_reports = 8);

// The Qwen3 chat template shipped in tests/data/chat/tokenizer_config.json.
std::string qwen3_template();

// Deterministic random conversations (SplitMix64), for the property tests.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next();
  size_t below(size_t n) { return static_cast<size_t>(next() % n); }
  bool chance(double p) { return static_cast<double>(next() >> 11) * 0x1.0p-53 < p; }

 private:
  uint64_t s_;
};

// A random ChatInput in the protocol's "chat" form: system/user/assistant/tool messages,
// tool calls with dict or string arguments, reasoning_content, tricky text, tool lists with
// nested schemas, add_generation_prompt / enable_thinking / extra kwargs variations.
// rich_content: also list-of-parts contents (text/image/video), as Qwen3.5-style templates take.
Json random_chat(Rng& rng, bool rich_content);

}  // namespace dq::chat::test
