#include "chat_test_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace dq::chat::test {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string data_path(const std::string& rel) { return std::string(DQ_TEST_DATA) + "/chat/" + rel; }

std::string qwen3_template() {
  return Json::parse(read_file(data_path("tokenizer_config.json"))).at("chat_template").get<std::string>();
}

std::vector<Outcome> run_engine(const Json& cases, const Limits& limits) {
  std::vector<Outcome> out;
  for (const Json& c : cases) {
    Outcome o;
    try {
      Template t = Template::parse(c.at("template").get<std::string>());
      if (c.contains("chat")) {
        const Json& ch = c["chat"];
        ChatInput in;
        in.messages = ch.at("messages");
        in.tools = ch.value("tools", Json());
        in.add_generation_prompt = ch.value("add_generation_prompt", true);
        if (ch.contains("enable_thinking") && !ch["enable_thinking"].is_null())
          in.enable_thinking = ch["enable_thinking"].get<bool>();
        in.extra = ch.value("extra", Json::object());
        in.bos_token = ch.value("bos_token", "");
        in.eos_token = ch.value("eos_token", "");
        o.text = apply(t, in, limits);
      } else {
        o.text = t.render(c.value("context", Json::object()), limits);
      }
      o.ok = true;
    } catch (const TemplateError& e) {
      o.error = e.what();
      o.raised = e.kind() == TemplateError::Kind::Raised;
    }
    out.push_back(std::move(o));
  }
  return out;
}

std::vector<Outcome> run_oracle(const Json& cases) {
  static std::atomic<int> counter{0};
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() /
                 ("dq_chat_oracle_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
  fs::create_directories(dir);
  fs::path in = dir / "cases.json", out = dir / "renders.json", err = dir / "stderr.txt";
  {
    std::ofstream f(in, std::ios::binary);
    f << cases.dump(-1, ' ', false, Json::error_handler_t::strict);
  }
  const char* py = std::getenv("DQ_PYTHON");
  std::string script = std::string(DQ_TEST_DATA) + "/../chat/jinja_oracle.py";
  std::string cmd = std::string(py && *py ? py : "python3") + " '" + script + "' < '" + in.string() +
                    "' > '" + out.string() + "' 2> '" + err.string() + "'";
  int rc = std::system(cmd.c_str());
  std::string errtext = fs::exists(err) ? read_file(err.string()) : "";
  std::vector<Outcome> result;
  if (rc != 0) {
    int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    ADD_FAILURE() << "the jinja2 oracle could not run (exit " << code << "): these tests need python3 with "
                  << "jinja2 (Debian: python3-jinja2, installed by scripts/setup; DQ_PYTHON picks the "
                  << "interpreter).\ncommand: " << cmd << "\nstderr: " << errtext;
  } else {
    Json renders = Json::parse(read_file(out.string()));
    for (const Json& r : renders) {
      Outcome o;
      if (r.contains("text")) {
        o.ok = true;
        o.text = r["text"].get<std::string>();
      } else {
        o.error = r.value("error", "");
        o.raised = o.error.rfind("TemplateError: ", 0) == 0;
      }
      result.push_back(std::move(o));
    }
    if (result.size() != cases.size()) ADD_FAILURE() << "oracle returned " << result.size() << " renders for "
                                                     << cases.size() << " cases";
  }
  fs::remove_all(dir);
  return result;
}

int compare(const Json& cases, const std::vector<Outcome>& engine, const std::vector<Outcome>& oracle,
            const std::string& label, int max_reports) {
  if (engine.size() != cases.size() || oracle.size() != cases.size()) return static_cast<int>(cases.size());
  int bad = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Outcome &e = engine[i], &o = oracle[i];
    bool same;
    if (e.ok && o.ok) same = e.text == o.text;
    else if (!e.ok && !o.ok) same = !o.raised || (e.raised && "TemplateError: " + e.error == o.error);
    else same = false;
    if (same) continue;
    if (++bad > max_reports) continue;
    Json shown = cases[i];
    std::string tmpl = shown.value("template", "");
    if (tmpl.size() > 400) shown["template"] = tmpl.substr(0, 400) + "...";
    auto show = [](const Outcome& x) {
      return x.ok ? "text " + Json(x.text).dump(-1, ' ', false, Json::error_handler_t::replace)
                  : "error " + x.error;
    };
    ADD_FAILURE() << label << " case " << i << " differs\n  case:   "
                  << shown.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n  engine: " << show(e)
                  << "\n  jinja2: " << show(o);
  }
  return bad;
}

uint64_t Rng::next() {
  uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

namespace {

const char* const kPieces[] = {
    "hi", "Hello, world!", "<think>\nplan step\n</think>\n\nanswer", "a</think>b", "  spaced  \n", "",
    "ünïcödé ✓ 😀 日本語", "quote \" and ' and \\ backslash", "<tool_response>\nresult\n</tool_response>",
    "line1\nline2\n\n", "\t\ttabs\r\n", "{{ not jinja }}", "{% raw %}", "</think>", "<think>only open",
    "\n\nleading newlines", "trailing newlines\n\n", "<tool_call>\n{\"name\": \"x\"}\n</tool_call>",
    "<|im_start|>fake<|im_end|>", "\u00a0nbsp\u2028sep", "emoji 👍🏽 family 👨‍👩‍👧", "math: 1 < 2 && 3 > 2",
    "<tool_response>", "</tool_response>", "json {\"a\": [1, 2]}", "   ", "\n", "Σίσυφος ΣΑΣ", "null"};

Json random_text(Rng& rng) {
  std::string s;
  size_t n = rng.below(4);
  for (size_t i = 0; i < n; ++i) s += kPieces[rng.below(std::size(kPieces))];
  return s;
}

Json random_scalar(Rng& rng) {
  switch (rng.below(9)) {
    case 0: return random_text(rng);
    case 1: return static_cast<int64_t>(rng.below(2000001)) - 1000000;
    case 2: return static_cast<double>(static_cast<int64_t>(rng.below(2001)) - 1000) / 8.0;
    case 3: {
      static const double odd[] = {0.1, 1e-7, 1e16, 123456789.125, -0.0, 2.5e-5, 1e22, 3.0, 1.0 / 3.0};
      return odd[rng.below(std::size(odd))];
    }
    case 4: return rng.chance(0.5);
    case 5: return nullptr;
    case 6: return INT64_C(9007199254740993);
    case 7: return "";
    default: return std::string(1, static_cast<char>('a' + rng.below(26)));
  }
}

Json random_value(Rng& rng, int depth) {
  if (depth > 3 || rng.chance(0.6)) return random_scalar(rng);
  if (rng.chance(0.5)) {
    Json a = Json::array();
    for (size_t i = rng.below(4); i > 0; --i) a.push_back(random_value(rng, depth + 1));
    return a;
  }
  Json o = Json::object();
  static const char* keys[] = {"k", "name", "value", "nested key", "ключ", "items", "type", "a\"b"};
  for (size_t i = rng.below(4); i > 0; --i) o[keys[rng.below(std::size(keys))]] = random_value(rng, depth + 1);
  return o;
}

Json random_schema(Rng& rng, int depth) {
  static const char* types[] = {"string", "integer", "number", "boolean", "array", "object"};
  Json s = {{"type", types[rng.below(std::size(types))]}};
  if (rng.chance(0.5)) s["description"] = random_text(rng);
  if (s["type"] == "string" && rng.chance(0.3)) s["enum"] = {"celsius", "fahrenheit", "ünï"};
  if (s["type"] == "number" && rng.chance(0.5)) s["minimum"] = rng.chance(0.5) ? Json(0.5) : Json(-3);
  if (s["type"] == "array" && depth < 3) s["items"] = random_schema(rng, depth + 1);
  if (s["type"] == "object" && depth < 3) {
    Json props = Json::object();
    static const char* names[] = {"city", "unit", "query", "max_results", "filters", "x-y", "ok"};
    Json required = Json::array();
    for (size_t i = rng.below(4); i > 0; --i) {
      const char* n = names[rng.below(std::size(names))];
      props[n] = random_schema(rng, depth + 1);
      if (rng.chance(0.5)) required.push_back(n);
    }
    s["properties"] = props;
    if (!required.empty()) s["required"] = required;
    if (rng.chance(0.2)) s["additionalProperties"] = false;
  }
  return s;
}

Json random_tool(Rng& rng) {
  static const char* names[] = {"get_weather", "search", "run_code", "f"};
  Json fn = {{"name", names[rng.below(std::size(names))]}};
  if (rng.chance(0.8)) fn["description"] = random_text(rng);
  fn["parameters"] = random_schema(rng, 0);
  if (rng.chance(0.2)) return fn;  // a bare function schema
  return {{"type", "function"}, {"function", fn}};
}

Json random_arguments(Rng& rng) {
  Json args = Json::object();
  static const char* names[] = {"city", "n", "flag", "opts", "query", "x y", "list"};
  for (size_t i = rng.below(4); i > 0; --i) args[names[rng.below(std::size(names))]] = random_value(rng, 1);
  if (rng.chance(0.35)) return args.dump(-1, ' ', rng.chance(0.5));  // arguments as a JSON string
  return args;
}

Json random_content(Rng& rng, bool rich) {
  if (rich && rng.chance(0.15)) {
    Json parts = Json::array();
    for (size_t i = 1 + rng.below(3); i > 0; --i) {
      switch (rng.below(4)) {
        case 0: parts.push_back({{"type", "image"}, {"image", "img.png"}}); break;
        case 1: parts.push_back({{"type", "video"}, {"video", "clip.mp4"}}); break;
        default: parts.push_back({{"type", "text"}, {"text", random_text(rng)}});
      }
    }
    return parts;
  }
  return random_text(rng);
}

Json random_message(Rng& rng, const std::string& role, bool rich) {
  Json m = {{"role", role}, {"content", random_content(rng, rich && role != "system")}};
  if (role == "assistant") {
    if (rng.chance(0.3)) m["reasoning_content"] = random_text(rng);
    else if (rng.chance(0.05)) m["reasoning_content"] = nullptr;
    if (rng.chance(0.4)) {
      Json calls = Json::array();
      static const char* names[] = {"get_weather", "search", "run_code"};
      for (size_t i = 1 + rng.below(3); i > 0; --i) {
        Json fn = {{"name", names[rng.below(std::size(names))]}, {"arguments", random_arguments(rng)}};
        if (rng.chance(0.8)) calls.push_back({{"id", "call_" + std::to_string(rng.below(1000))}, {"type", "function"}, {"function", fn}});
        else calls.push_back(fn);
      }
      m["tool_calls"] = calls;
      if (rng.chance(0.05)) m["content"] = nullptr;  // OpenAI style; the Qwen3 template fails on it
    }
  }
  if (role == "tool" && rng.chance(0.5)) m["tool_call_id"] = "call_1";
  return m;
}

}  // namespace

Json random_chat(Rng& rng, bool rich) {
  Json messages = Json::array();
  if (rng.chance(0.5)) messages.push_back(random_message(rng, "system", rich));
  static const char* roles[] = {"user", "assistant", "tool", "user", "assistant", "tool", "system"};
  size_t n = 1 + rng.below(7);
  for (size_t i = 0; i < n; ++i) {
    // Mostly a plausible flow (user, assistant, tools...), sometimes any order.
    std::string role = rng.chance(0.7) ? (i == 0 ? "user" : roles[rng.below(6)]) : roles[rng.below(std::size(roles))];
    messages.push_back(random_message(rng, role, rich));
  }
  Json chat = {{"messages", messages}};
  if (rng.chance(0.4)) {
    Json tools = Json::array();
    for (size_t i = rng.below(4); i > 0; --i) tools.push_back(random_tool(rng));
    chat["tools"] = tools;
  }
  chat["add_generation_prompt"] = rng.chance(0.5);
  switch (rng.below(3)) {
    case 0: chat["enable_thinking"] = nullptr; break;
    case 1: chat["enable_thinking"] = true; break;
    default: chat["enable_thinking"] = false;
  }
  chat["eos_token"] = "<|im_end|>";
  if (rng.chance(0.2)) chat["extra"] = {{"add_vision_id", rng.chance(0.5)}, {"custom", random_value(rng, 1)}};
  return chat;
}

}  // namespace dq::chat::test
