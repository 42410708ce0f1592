// The OpenAI API surface without HTTP: request parsing and validation, error objects, response and
// stream-chunk JSON, and the <think> splitter. Everything here is plain functions on strings and JSON,
// tested without a socket (tests/server/test_server_api.cpp).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/generator.h"

namespace dq::server {

using Json = nlohmann::ordered_json;

// An OpenAI-style error: {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
  Json to_json() const;
};

[[noreturn]] void throw_api(int status, std::string message, std::string param = {}, std::string code = {},
                            std::string type = {});

// Request limits that the parser enforces (the server sets them from its options).
struct ApiLimits {
  int max_json_depth = 64;
  size_t max_stop = 16;            // stop strings per request
  size_t max_stop_bytes = 512;     // bytes per stop string
  size_t max_messages = 10'000;
  size_t max_prompt_ids = 1 << 20; // token ids in a completions prompt
};

// A parsed, validated /v1/chat/completions or /v1/completions request (before the prompt is built).
struct CompletionRequest {
  bool chat = false;
  std::string model;  // as sent (any value is accepted: one model per server)
  bool stream = false;
  bool include_usage = false;
  std::optional<int64_t> max_tokens;  // max_completion_tokens, else max_tokens; nullopt: up to the context
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool ignore_eos = false;  // vLLM's extension: do not stop at eos / end-of-turn ids
  // chat
  Json messages;                       // normalized: content is a string or null
  std::optional<bool> enable_thinking; // chat_template_kwargs.enable_thinking
  Json template_kwargs = Json::object();  // the other chat_template_kwargs
  // completions: exactly one of these
  std::optional<std::string> prompt_text;
  std::vector<int32_t> prompt_ids;
};

// Throws ApiError (400) naming the field for malformed JSON, wrong types, out-of-range values and
// unsupported options. Unknown fields are ignored.
CompletionRequest parse_completion_request(std::string_view body, bool chat, const ApiLimits& limits = {});

// Parses a JSON object body (depth-limited); ApiError 400 when it is not one.
Json parse_json_object(std::string_view body, const ApiLimits& limits = {});

// Nesting depth of the JSON text (brackets outside strings); stops counting at cap + 1.
int json_depth(std::string_view body, int cap);
bool valid_utf8(std::string_view s);

// JSON text of j; invalid UTF-8 (never expected) is replaced rather than thrown on.
std::string dump(const Json& j);

// Splits generated text into reasoning (inside <think>...</think>) and content, incrementally: the
// result does not depend on how the text is cut into pieces. Only a think block at the very start
// of the output is reasoning (or, when the prompt already opened one, everything up to </think>);
// newlines right after </think> are dropped.
class ThinkSplitter {
 public:
  ThinkSplitter(bool enabled, bool starts_inside);
  // Appends text; adds what is decided to reasoning / content.
  void push(std::string_view text, std::string& reasoning, std::string& content);
  void finish(std::string& reasoning, std::string& content);

  // True when the rendered prompt ends inside an open <think> block (Qwen3.5's generation prompt).
  static bool prompt_opens_think(std::string_view prompt);

 private:
  enum class State { Start, Reasoning, AfterThink, Content };
  State state_;
  std::string hold_;
};

// Per-response timing numbers (the "timings" field).
Json timings_json(const GenerateResult& r);
Json usage_json(const GenerateResult& r);

}  // namespace dq::server
