// Chat templates: a Jinja interpreter that renders Hugging Face chat templates exactly as
// transformers does (jinja2 ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// loopcontrols, raise_exception, strftime_now and HF's tojson). See src/chat/README.md for the
// supported subset.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dq::chat {

using Json = nlohmann::ordered_json;

// Bounds on one render; exceeding any of them is a TemplateError, never a hang or a crash.
struct Limits {
  size_t max_output_bytes = 4 << 20;  // also caps every intermediate string
  int max_recursion = 200;            // macro call depth
  uint64_t max_steps = 50'000'000;    // statements + expressions + loop iterations + bytes/4
};

class TemplateError : public dq::Error {
 public:
  enum class Kind { Syntax, Runtime, Raised, Limit };
  // line/column are 1-based; 0 when unknown. what() is "chat template:LINE:COL: message"
  // when a position is known, and the template's own message for raise_exception.
  TemplateError(Kind kind, const std::string& what, int line = 0, int column = 0)
      : dq::Error(what), kind_(kind), line_(line), column_(column) {}
  Kind kind() const { return kind_; }
  int line() const { return line_; }
  int column() const { return column_; }

 private:
  Kind kind_;
  int line_, column_;
};

struct Program;  // the parsed template (parser.h)

class Template {
 public:
  // Throws TemplateError (Kind::Syntax) with line and column.
  static Template parse(std::string_view source);
  // Renders with `context` (a JSON object) as the template variables. Thread-safe.
  std::string render(const Json& context, const Limits& limits = {}) const;

 private:
  std::shared_ptr<const Program> program_;
};

// What HF's apply_chat_template receives.
struct ChatInput {
  Json messages;                       // a JSON array of message objects
  Json tools = nullptr;                // null: the template sees tools=None, as HF passes it
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking; // passed only when set (so `is defined` matches HF)
  Json extra = Json::object();         // other chat_template_kwargs
  std::string bos_token, eos_token;    // passed only when non-empty
};

// Builds the context HF's apply_chat_template builds (messages, tools, documents=None,
// add_generation_prompt, the special tokens, the kwargs) and renders.
std::string apply(const Template& tmpl, const ChatInput& input, const Limits& limits = {});

}  // namespace dq::chat
