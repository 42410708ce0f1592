#include "server/api.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "text/utf8.h"

namespace dq::server {

Json ApiError::to_json() const {
  Json e = Json::object();
  e["message"] = message;
  e["type"] = type;
  e["param"] = param.empty() ? Json(nullptr) : Json(param);
  e["code"] = code.empty() ? Json(nullptr) : Json(code);
  return Json{{"error", e}};
}

void throw_api(int status, std::string message, std::string param, std::string code, std::string type) {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  if (!type.empty()) e.type = std::move(type);
  throw e;
}

bool valid_utf8(std::string_view s) { return text::is_valid_utf8(s); }

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

int json_depth(std::string_view s, int cap) {
  int depth = 0, max_depth = 0;
  bool in_str = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_str) {
      if (c == '\\') ++i;
      else if (c == '"') in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth && (max_depth = depth) > cap) return max_depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

Json parse_json_object(std::string_view body, const ApiLimits& limits) {
  if (!valid_utf8(body)) throw_api(400, "the request body is not valid UTF-8", {}, "invalid_utf8");
  if (json_depth(body, limits.max_json_depth) > limits.max_json_depth)
    throw_api(400, fmt::format("the request JSON is nested deeper than {} levels", limits.max_json_depth));
  Json j;
  try {
    j = Json::parse(body.begin(), body.end());
  } catch (const std::exception& e) {
    throw_api(400, fmt::format("the request body is not valid JSON: {}", e.what()), {}, "invalid_json");
  }
  if (!j.is_object()) throw_api(400, "the request body must be a JSON object", {}, "invalid_json");
  return j;
}

namespace {

const char* type_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::string: return "a string";
    case Json::value_t::array: return "an array";
    case Json::value_t::object: return "an object";
    case Json::value_t::number_float: return "a non-integer number";
    default: return "a number";
  }
}

[[noreturn]] void wrong_type(const std::string& name, const char* want, const Json& v) {
  throw_api(400, fmt::format("'{}' must be {}, got {}", name, want, type_name(v)), name);
}

// Present and not null.
const Json* field(const Json& j, const char* name) {
  auto it = j.find(name);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

std::optional<double> get_number(const Json& j, const char* name, double lo, double hi) {
  const Json* v = field(j, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) wrong_type(name, "a number", *v);
  double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    throw_api(400, fmt::format("'{}' is {}, expected a number in [{}, {}]", name, v->dump(), lo, hi), name);
  return x;
}

std::optional<int64_t> get_int(const Json& j, const char* name, int64_t lo, int64_t hi) {
  const Json* v = field(j, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) wrong_type(name, "an integer", *v);
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    throw_api(400, fmt::format("'{}' is {}, expected an integer in [{}, {}]", name, v->dump(), lo, hi), name);
  int64_t x = v->get<int64_t>();
  if (x < lo || x > hi)
    throw_api(400, fmt::format("'{}' is {}, expected an integer in [{}, {}]", name, x, lo, hi), name);
  return x;
}

std::optional<bool> get_bool(const Json& j, const char* name) {
  const Json* v = field(j, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong_type(name, "a boolean", *v);
  return v->get<bool>();
}

[[noreturn]] void unsupported(const std::string& name, const std::string& what) {
  throw_api(400, fmt::format("'{}': {} is not supported by this server", name, what), name, "unsupported");
}

// Content as a string: a string, null, or a list of {"type": "text", "text": ...} parts (joined).
Json normalize_content(const Json& c, const std::string& where) {
  if (c.is_null() || c.is_string()) return c;
  if (!c.is_array()) wrong_type(where, "a string, null or an array of text parts", c);
  std::string s;
  for (size_t i = 0; i < c.size(); ++i) {
    const Json& part = c[i];
    const std::string pw = fmt::format("{}[{}]", where, i);
    if (!part.is_object()) wrong_type(pw, "an object", part);
    const Json* type = field(part, "type");
    if (!type || !type->is_string()) throw_api(400, fmt::format("'{}.type' must be a string", pw), pw + ".type");
    if (*type != "text") unsupported(pw + ".type", fmt::format("content of type {}", type->dump()));
    const Json* text = field(part, "text");
    if (!text || !text->is_string()) throw_api(400, fmt::format("'{}.text' must be a string", pw), pw + ".text");
    s += text->get<std::string>();
  }
  return s;
}

}  // namespace

CompletionRequest parse_completion_request(std::string_view body, bool chat, const ApiLimits& limits) {
  Json j = parse_json_object(body, limits);
  CompletionRequest r;
  r.chat = chat;

  if (const Json* m = field(j, "model")) {
    if (!m->is_string()) wrong_type("model", "a string", *m);
    r.model = m->get<std::string>();
  }
  r.stream = get_bool(j, "stream").value_or(false);
  if (const Json* so = field(j, "stream_options")) {
    if (!so->is_object()) wrong_type("stream_options", "an object", *so);
    r.include_usage = get_bool(*so, "include_usage").value_or(false);
  }

  // Output length: max_completion_tokens (the current name) wins over max_tokens.
  const int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  auto mt = get_int(j, "max_tokens", 1, kMaxInt);
  auto mct = get_int(j, "max_completion_tokens", 1, kMaxInt);
  r.max_tokens = mct ? mct : mt;

  SamplingParams& s = r.sampling;
  s.temperature = float(get_number(j, "temperature", 0, 2).value_or(1.0));
  s.top_p = float(get_number(j, "top_p", 0, 1).value_or(1.0));
  if (s.top_p <= 0) throw_api(400, "'top_p' must be greater than 0", "top_p");
  s.top_k = int(get_int(j, "top_k", -1, kMaxInt).value_or(0));
  if (s.top_k < 0) s.top_k = 0;  // -1 (vLLM) = off
  s.min_p = float(get_number(j, "min_p", 0, 1).value_or(0.0));
  s.presence_penalty = float(get_number(j, "presence_penalty", -2, 2).value_or(0.0));
  s.frequency_penalty = float(get_number(j, "frequency_penalty", -2, 2).value_or(0.0));
  s.repetition_penalty = float(get_number(j, "repetition_penalty", 0, 10).value_or(1.0));
  if (s.repetition_penalty <= 0) throw_api(400, "'repetition_penalty' must be greater than 0", "repetition_penalty");
  if (const Json* seed = field(j, "seed")) {
    if (!seed->is_number_integer()) wrong_type("seed", "an integer", *seed);
    s.seed = seed->is_number_unsigned() ? seed->get<uint64_t>() : uint64_t(seed->get<int64_t>());
  }

  if (const Json* st = field(j, "stop")) {
    auto add = [&](const Json& v, const std::string& where) {
      if (!v.is_string()) wrong_type(where, "a string", v);
      std::string x = v.get<std::string>();
      if (x.empty()) throw_api(400, fmt::format("'{}' is an empty string", where), "stop");
      if (x.size() > limits.max_stop_bytes)
        throw_api(400, fmt::format("'{}' is {} bytes long, the limit is {}", where, x.size(), limits.max_stop_bytes),
                  "stop");
      r.stop.push_back(std::move(x));
    };
    if (st->is_string()) {
      add(*st, "stop");
    } else if (st->is_array()) {
      if (st->size() > limits.max_stop)
        throw_api(400, fmt::format("'stop' has {} strings, the limit is {}", st->size(), limits.max_stop), "stop");
      for (size_t i = 0; i < st->size(); ++i) add((*st)[i], fmt::format("stop[{}]", i));
    } else {
      wrong_type("stop", "a string or an array of strings", *st);
    }
  }

  r.ignore_eos = get_bool(j, "ignore_eos").value_or(false);

  // Options this server does not implement: accepted at their neutral value, refused otherwise.
  if (auto n = get_int(j, "n", 1, kMaxInt); n && *n != 1) unsupported("n", "more than one choice");
  if (auto b = get_int(j, "best_of", 1, kMaxInt); b && *b != 1) unsupported("best_of", "best_of > 1");
  if (const Json* lp = field(j, "logprobs")) {
    if (!(lp->is_boolean() && !lp->get<bool>()) && !(lp->is_number_integer() && lp->get<int64_t>() == 0))
      unsupported("logprobs", "returning log probabilities");
  }
  if (auto tl = get_int(j, "top_logprobs", 0, 20); tl && *tl != 0) unsupported("top_logprobs", "returning log probabilities");
  if (const Json* lb = field(j, "logit_bias")) {
    if (!lb->is_object()) wrong_type("logit_bias", "an object", *lb);
    if (!lb->empty()) unsupported("logit_bias", "a logit bias");
  }
  if (const Json* rf = field(j, "response_format")) {
    if (!rf->is_object()) wrong_type("response_format", "an object", *rf);
    const Json* t = field(*rf, "type");
    if (!t || *t != "text") unsupported("response_format", "a response format other than text");
  }
  if (const Json* tools = field(j, "tools")) {
    if (!tools->is_array()) wrong_type("tools", "an array", *tools);
    if (!tools->empty()) unsupported("tools", "tool calling");
  }
  if (get_bool(j, "echo").value_or(false)) unsupported("echo", "echoing the prompt");
  if (const Json* sx = field(j, "suffix")) {
    if (!sx->is_string()) wrong_type("suffix", "a string", *sx);
    if (!sx->get<std::string>().empty()) unsupported("suffix", "a suffix");
  }

  if (chat) {
    if (j.contains("prompt")) throw_api(400, "'prompt' belongs to /v1/completions; send 'messages' here", "prompt");
    const Json* msgs = field(j, "messages");
    if (!msgs) throw_api(400, "'messages' is required", "messages");
    if (!msgs->is_array()) wrong_type("messages", "an array", *msgs);
    if (msgs->empty()) throw_api(400, "'messages' is empty", "messages");
    if (msgs->size() > limits.max_messages)
      throw_api(400, fmt::format("'messages' has {} entries, the limit is {}", msgs->size(), limits.max_messages),
                "messages");
    r.messages = Json::array();
    for (size_t i = 0; i < msgs->size(); ++i) {
      const std::string where = fmt::format("messages[{}]", i);
      const Json& m = (*msgs)[i];
      if (!m.is_object()) wrong_type(where, "an object", m);
      const Json* role = field(m, "role");
      if (!role || !role->is_string() || role->get<std::string>().empty())
        throw_api(400, fmt::format("'{}.role' must be a non-empty string", where), where + ".role");
      Json nm = m;
      if (role->get<std::string>() == "developer") nm["role"] = "system";  // OpenAI's newer name
      if (m.contains("content")) nm["content"] = normalize_content(m["content"], where + ".content");
      else nm["content"] = nullptr;
      r.messages.push_back(std::move(nm));
    }
    if (const Json* kw = field(j, "chat_template_kwargs")) {
      if (!kw->is_object()) wrong_type("chat_template_kwargs", "an object", *kw);
      for (auto it = kw->begin(); it != kw->end(); ++it) {
        if (it.key() == "enable_thinking") {
          if (!it->is_boolean()) wrong_type("chat_template_kwargs.enable_thinking", "a boolean", *it);
          r.enable_thinking = it->get<bool>();
        } else {
          r.template_kwargs[it.key()] = *it;
        }
      }
    }
  } else {
    if (j.contains("messages")) throw_api(400, "'messages' belongs to /v1/chat/completions; send 'prompt' here", "messages");
    const Json* p = field(j, "prompt");
    if (!p) throw_api(400, "'prompt' is required", "prompt");
    const Json* one = p;
    // A batch of one prompt is accepted; more are not.
    if (p->is_array() && !p->empty() && (p->front().is_string() || p->front().is_array())) {
      if (p->size() != 1) unsupported("prompt", "a batch of several prompts");
      one = &p->front();
    }
    if (one->is_string()) {
      r.prompt_text = one->get<std::string>();
      if (r.prompt_text->empty()) throw_api(400, "'prompt' is empty", "prompt");
    } else if (one->is_array()) {
      if (one->empty()) throw_api(400, "'prompt' is empty", "prompt");
      if (one->size() > limits.max_prompt_ids)
        throw_api(400, fmt::format("'prompt' has {} token ids, the limit is {}", one->size(), limits.max_prompt_ids),
                  "prompt");
      r.prompt_ids.reserve(one->size());
      for (size_t i = 0; i < one->size(); ++i) {
        const Json& t = (*one)[i];
        if (!t.is_number_integer() || (t.is_number_unsigned() && t.get<uint64_t>() > uint64_t(INT32_MAX)) ||
            t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
          throw_api(400, fmt::format("'prompt[{}]' must be a token id (a non-negative integer), got {}", i, t.dump()),
                    "prompt");
        r.prompt_ids.push_back(int32_t(t.get<int64_t>()));
      }
    } else {
      wrong_type("prompt", "a string, an array of token ids, or an array of one of them", *p);
    }
  }
  return r;
}

// ---- ThinkSplitter -----------------------------------------------------------------------------

namespace {
constexpr std::string_view kOpen = "<think>", kClose = "</think>";

// Length of the longest tail of s that is a proper prefix of tag.
size_t partial_tail(std::string_view s, std::string_view tag) {
  for (size_t k = std::min(tag.size() - 1, s.size()); k > 0; --k)
    if (s.substr(s.size() - k) == tag.substr(0, k)) return k;
  return 0;
}
}  // namespace

ThinkSplitter::ThinkSplitter(bool enabled, bool starts_inside)
    : state_(!enabled ? State::Content : starts_inside ? State::Reasoning : State::Start) {}

bool ThinkSplitter::prompt_opens_think(std::string_view p) {
  while (!p.empty() && (p.back() == '\n' || p.back() == ' ' || p.back() == '\r' || p.back() == '\t')) p.remove_suffix(1);
  return p.size() >= kOpen.size() && p.substr(p.size() - kOpen.size()) == kOpen;
}

void ThinkSplitter::push(std::string_view text, std::string& reasoning, std::string& content) {
  hold_ += text;
  for (;;) {
    switch (state_) {
      case State::Start:
        if (hold_.size() < kOpen.size() && std::string_view(kOpen).substr(0, hold_.size()) == hold_) return;
        if (hold_.compare(0, kOpen.size(), kOpen) == 0) {
          hold_.erase(0, kOpen.size());
          state_ = State::Reasoning;
        } else {
          state_ = State::Content;
        }
        break;
      case State::Reasoning: {
        size_t p = hold_.find(kClose);
        if (p != std::string::npos) {
          reasoning.append(hold_, 0, p);
          hold_.erase(0, p + kClose.size());
          state_ = State::AfterThink;
          break;
        }
        size_t keep = partial_tail(hold_, kClose);
        reasoning.append(hold_, 0, hold_.size() - keep);
        hold_.erase(0, hold_.size() - keep);
        return;
      }
      case State::AfterThink: {
        size_t n = hold_.find_first_not_of('\n');
        if (n == std::string::npos) {
          hold_.clear();
          return;
        }
        hold_.erase(0, n);
        state_ = State::Content;
        break;
      }
      case State::Content:
        content += hold_;
        hold_.clear();
        return;
    }
  }
}

void ThinkSplitter::finish(std::string& reasoning, std::string& content) {
  if (state_ == State::Reasoning) reasoning += hold_;
  else if (state_ != State::AfterThink) content += hold_;
  hold_.clear();
}

// ---- response pieces ---------------------------------------------------------------------------

Json usage_json(const GenerateResult& r) {
  return Json{{"prompt_tokens", r.prompt_tokens},
              {"completion_tokens", r.completion_tokens},
              {"total_tokens", r.prompt_tokens + r.completion_tokens},
              {"prompt_tokens_details", Json{{"cached_tokens", r.cached_tokens}}}};
}

Json timings_json(const GenerateResult& r) {
  auto per_s = [](double n, double s) { return s > 0 ? n / s : 0.0; };
  const int fed = r.prompt_tokens - r.cached_tokens;  // prompt tokens actually run
  return Json{{"prompt_n", fed},
              {"cache_n", r.cached_tokens},
              {"prompt_ms", r.prompt_seconds * 1e3},
              {"prompt_per_second", per_s(fed, r.prompt_seconds)},
              {"predicted_n", r.completion_tokens},
              {"predicted_ms", r.gen_seconds * 1e3},
              {"predicted_per_second", per_s(r.completion_tokens, r.gen_seconds)}};
}

}  // namespace dq::server
