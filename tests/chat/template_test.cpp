// The engine on its own: HF-rendered fixtures, the API, error reporting, and the limits that
// keep hostile templates from hanging or crashing.
#include <gtest/gtest.h>

#include <pthread.h>

#include <chrono>
#include <thread>

#include "chat_test_util.h"

namespace dq::chat::test {
namespace {

using Clock = std::chrono::steady_clock;

std::string render(const std::string& tmpl, const Json& ctx = Json::object(), const Limits& lim = {}) {
  return Template::parse(tmpl).render(ctx, lim);
}

// Runs `fn`, expects a TemplateError of `kind` whose message contains `needle`, within `secs`.
template <class Fn>
void expect_error(Fn fn, TemplateError::Kind kind, const std::string& needle, double secs = 30) {
  auto t0 = Clock::now();
  try {
    fn();
    ADD_FAILURE() << "expected a TemplateError containing '" << needle << "'";
  } catch (const TemplateError& e) {
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(took, secs) << "took " << took << " s";
}

// ---- HF fixtures -------------------------------------------------------------------------------

// tests/data/chat/chat-cases.jsonl: texts HF transformers rendered with the Qwen3 template.
TEST(ChatTemplate, Qwen3FixtureCasesMatchHF) {
  Template t = Template::parse(qwen3_template());
  std::string lines = read_file(data_path("chat-cases.jsonl"));
  size_t start = 0, n = 0;
  while (start < lines.size()) {
    size_t end = lines.find('\n', start);
    std::string line = lines.substr(start, end == std::string::npos ? std::string::npos : end - start);
    start = end == std::string::npos ? lines.size() : end + 1;
    if (line.empty()) continue;
    Json c = Json::parse(line);
    ChatInput in;
    in.messages = c.at("messages");
    if (c.contains("tools")) in.tools = c["tools"];
    in.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
    if (!c.at("enable_thinking").is_null()) in.enable_thinking = c["enable_thinking"].get<bool>();
    in.eos_token = "<|im_end|>";
    EXPECT_EQ(apply(t, in), c.at("text").get<std::string>()) << line;
    ++n;
  }
  EXPECT_EQ(n, 24u);
}

TEST(ChatTemplate, Qwen3GenerationPrompts) {
  Template t = Template::parse(qwen3_template());
  ChatInput in;
  in.messages = Json::parse(R"([{"role": "user", "content": "Hi"}])");
  EXPECT_EQ(apply(t, in), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  in.enable_thinking = false;
  EXPECT_EQ(apply(t, in), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  in.add_generation_prompt = false;
  EXPECT_EQ(apply(t, in), "<|im_start|>user\nHi<|im_end|>\n");
}

// ---- the context apply() builds ---------------------------------------------------------------

TEST(ChatTemplate, ApplyBuildsTheHFContext) {
  Template t = Template::parse(
      "{{ enable_thinking is defined }}|{{ tools is none }}|{{ documents is none }}|{{ bos_token is defined }}|"
      "{{ eos_token }}|{{ add_generation_prompt }}|{{ custom }}|{{ messages | length }}");
  ChatInput in;
  in.messages = Json::array({Json{{"role", "user"}, {"content", "x"}}});
  in.eos_token = "</s>";
  in.extra = {{"custom", 7}};
  EXPECT_EQ(apply(t, in), "False|True|True|False|</s>|True|7|1");
  in.enable_thinking = true;
  in.tools = Json::array();
  in.bos_token = "<s>";
  EXPECT_EQ(apply(t, in), "True|False|True|True|</s>|True|7|1");
  in.extra = {{"messages", 1}};
  expect_error([&] { apply(t, in); }, TemplateError::Kind::Runtime, "may not set 'messages'");
  in.extra = Json::object();
  in.messages = Json::object();
  expect_error([&] { apply(t, in); }, TemplateError::Kind::Runtime, "messages must be a JSON array");
}

TEST(ChatTemplate, RenderContextKeepsOrderAndTypes) {
  Json ctx = Json::parse(R"({"d": {"z": 1, "a": [1.5, true, null, "s"]}, "big": 9007199254740993})");
  EXPECT_EQ(render("{{ d }}|{{ d | tojson }}|{{ big }}", ctx),
            "{'z': 1, 'a': [1.5, True, None, 's']}|{\"z\": 1, \"a\": [1.5, true, null, \"s\"]}|9007199254740993");
  expect_error([] { render("x", Json::array()); }, TemplateError::Kind::Runtime, "must be a JSON object");
}

TEST(ChatTemplate, TemplateIsCopyableAndRendersFromManyThreads) {
  Template t = Template::parse(qwen3_template());
  Template copy = t;
  ChatInput in;
  in.messages = Json::parse(R"([{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}])");
  std::string want = apply(copy, in);
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i)
        if (apply(t, in) != want) ++bad;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

// ---- errors ---------------------------------------------------------------------------------------

TEST(ChatTemplate, SyntaxErrorsReportLineAndColumn) {
  try {
    Template::parse("line one\n{% if x %}\n  {{ 1 + }}\n{% endif %}");
    FAIL() << "expected a syntax error";
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.kind(), TemplateError::Kind::Syntax);
    EXPECT_EQ(e.line(), 3);
    EXPECT_EQ(e.column(), 10);
    EXPECT_EQ(std::string(e.what()), "chat template:3:10: unexpected 'end of print statement'");
  }
  expect_error([] { Template::parse("{% for x in y %}\n{{ x }}"); }, TemplateError::Kind::Syntax,
               "chat template:2:8: Unexpected end of template. Jinja was looking for the following tags: "
               "'endfor' or 'else'. The innermost block that needs to be closed is 'for'.");
  expect_error([] { Template::parse("ab\n  {% endif %}"); }, TemplateError::Kind::Syntax,
               "chat template:2:6: Encountered unknown tag 'endif'.");
  expect_error([] { Template::parse("{{ x | nofilter }}"); }, TemplateError::Kind::Syntax,
               "chat template:1:8: No filter named 'nofilter'.");
  expect_error([] { Template::parse("é\n {{ 'open }}"); }, TemplateError::Kind::Syntax, "chat template:2:5:");
  expect_error([] { Template::parse("{# open"); }, TemplateError::Kind::Syntax, "Missing end of comment tag");
  expect_error([] { Template::parse("{% raw %}x"); }, TemplateError::Kind::Syntax, "Missing end of raw directive");
  expect_error([] { Template::parse("{% include 'x' %}"); }, TemplateError::Kind::Syntax, "not supported");
}

TEST(ChatTemplate, RaiseExceptionMessageReachesTheCaller) {
  try {
    render("{% if true %}{{ raise_exception('Conversation roles must alternate ' ~ 'user/assistant') }}{% endif %}");
    FAIL() << "expected raise_exception to throw";
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.kind(), TemplateError::Kind::Raised);
    EXPECT_EQ(std::string(e.what()), "Conversation roles must alternate user/assistant");
  }
  // dq::Error is the base every deltaq layer catches.
  EXPECT_THROW(render("{{ raise_exception('x') }}"), dq::Error);
}

TEST(ChatTemplate, RuntimeErrorsNameThePosition) {
  expect_error([] { render("ok\n{{ messages[0].content.upper() }}"); }, TemplateError::Kind::Runtime,
               "chat template:2:");
  expect_error([] { render("{{ [].append(1) }}"); }, TemplateError::Kind::Runtime,
               "access to attribute 'append' of 'list' object is unsafe.");
  expect_error([] { render("{{ 1 // 0 }}"); }, TemplateError::Kind::Runtime, "integer division or modulo by zero");
}

// ---- limits ---------------------------------------------------------------------------------------

TEST(ChatTemplateLimits, HugeLoopsStopAtTheStepLimit) {
  Limits lim;
  lim.max_steps = 2'000'000;
  expect_error([&] { render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", Json::object(), lim); },
               TemplateError::Kind::Limit, "step limit", 20);
  // With the default limits too (50M steps; here about 1000 per iteration).
  expect_error([] { render("{% for i in range(100000) %}{% for j in range(100000) %}{% set y = 'x' * 4000 %}{% endfor %}{% endfor %}"); },
               TemplateError::Kind::Limit, "step limit", 60);
  expect_error([] { render("{{ range(1000000) | list }}"); }, TemplateError::Kind::Runtime, "Range too big");
}

// One step may not hide unbounded work: scans of big strings and lists are charged by size.
TEST(ChatTemplateLimits, WorkOnBigValuesIsCharged) {
  const char* loops[] = {
      "{% set l = range(100000) | list %}{% for i in range(100000) %}{% if -1 in l %}{% endif %}{% endfor %}",
      "{% set a = range(100000) | list %}{% set b = range(100000) | list %}"
      "{% for i in range(100000) %}{% if [a] * 50 == [b] * 50 %}{% endif %}{% endfor %}",
      "{% set s = '\u00e9' * 1000000 %}{% for i in range(100000) %}{% set c = s[500000] ~ s[-5:] %}{% endfor %}",
      "{% set s = 'x' * 4000000 %}{% for i in range(100000) %}{% if s == s ~ '' %}{% endif %}{% endfor %}",
      "{% set s = '\u00e9 ' * 500000 %}{% for i in range(100000) %}{% set c = s | title | wordcount %}{% endfor %}",
      "{% set s = 'x' * 4000000 %}{% for i in range(100000) %}{{ s.strip() | length }}{% endfor %}",
  };
  for (const char* t : loops) expect_error([&] { render(t); }, TemplateError::Kind::Limit, "step limit", 20);
  expect_error([] { render("{% set l = range(100000) | list %}{{ [l] * 40 }}"); }, TemplateError::Kind::Limit,
               "exceeds the limit");
}

TEST(ChatTemplateLimits, RecursionStopsAtTheMacroLimit) {
  expect_error([] { render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"); },
               TemplateError::Kind::Limit, "macro calls nested deeper than 200");
  Limits lim;
  lim.max_recursion = 10;
  expect_error([&] { render("{% macro f(n) %}{{ n }}{{ f(n + 1) if n < 50 }}{% endmacro %}{{ f(0) }}", Json::object(), lim); },
               TemplateError::Kind::Limit, "deeper than 10");
  EXPECT_EQ(render("{% macro f(n) %}{{ n }}{{ f(n - 1) if n > 0 }}{% endmacro %}{{ f(5) }}"), "543210");
  // Deep expressions inside deep recursion hit the evaluation depth cap, not the C++ stack.
  std::string deep = "{% macro f(n) %}{{ " + std::string(150, '[') + "f(n + 1)" + std::string(150, ']') +
                     " }}{% endmacro %}{{ f(0) }}";
  expect_error([&] { render(deep); }, TemplateError::Kind::Limit, "nested too deeply");
}

TEST(ChatTemplateLimits, OutputAndValueSizeAreBounded) {
  expect_error([] { render("{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}"); },
               TemplateError::Kind::Limit, "output exceeds");
  expect_error([] {
    render("{% set ns = namespace(s='ab') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}");
  }, TemplateError::Kind::Limit, "exceeds the limit");
  expect_error([] {
    render("{% set ns = namespace(l=[1]) %}{% for i in range(100) %}{% set ns.l = ns.l + ns.l %}{% endfor %}");
  }, TemplateError::Kind::Runtime, "too large");
  expect_error([] {
    render("{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = [ns.l] %}{% endfor %}");
  }, TemplateError::Kind::Runtime, "nested deeper than 256");
  expect_error([] { render("{{ 'x' * 100000000 }}"); }, TemplateError::Kind::Limit, "exceeds the limit");
  Limits small;
  small.max_output_bytes = 10;
  expect_error([&] { render("{{ 'hello world' }}", Json::object(), small); }, TemplateError::Kind::Limit, "output exceeds");
}

TEST(ChatTemplateLimits, NamespaceCyclesAreRefused) {
  expect_error([] { render("{% set ns = namespace() %}{% set ns.me = ns %}"); }, TemplateError::Kind::Runtime,
               "inside a namespace");
  expect_error([] { render("{% set ns = namespace() %}{% set ns.l = [1, {'x': ns}] %}"); },
               TemplateError::Kind::Runtime, "inside a namespace");
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

TEST(ChatTemplateLimits, DeepNestingIsASyntaxErrorNotACrash) {
  const int n = 100000;
  const std::string nested[] = {
      "{{ " + repeat("(", n) + "1" + repeat(")", n) + " }}",
      "{{ " + repeat("[", n) + repeat("]", n) + " }}",
      "{{ " + repeat("{'a': ", n) + "1" + repeat("}", n) + " }}",
      "{{ " + repeat("-", n) + "1 }}",
      "{{ " + repeat("not ", n) + "1 }}",
      "{{ 1" + repeat(" + 1", n) + " }}",
      "{{ x" + repeat(" or x", n) + " }}",
      "{{ 'a'" + repeat("|upper", n) + " }}",
      "{{ x" + repeat(".a", n) + " }}",
      "{{ f" + repeat("()", n) + " }}",
      "{{ 1" + repeat(" if 1 else 1", n) + " }}",
      repeat("{% if 1 %}", n) + repeat("{% endif %}", n),
      repeat("{% for x in y %}", n) + repeat("{% endfor %}", n),
      repeat("{% macro m() %}", n) + repeat("{% endmacro %}", n),
  };
  for (const auto& t : nested)
    expect_error([&] { Template::parse(t); }, TemplateError::Kind::Syntax, "nested too deeply", 30);
  // Moderate nesting is fine.
  EXPECT_EQ(render("{{ " + repeat("(", 50) + "7" + repeat(")", 50) + " }}"), "7");
  EXPECT_EQ(render(repeat("{% if 1 %}", 60) + "y" + repeat("{% endif %}", 60)), "y");
}

// Runs fn on a thread with a `kb` KiB stack (servers may run templates on small stacks).
template <class Fn>
void on_small_stack(size_t kb, Fn fn) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, kb * 1024), 0);
  pthread_t th;
  auto trampoline = [](void* p) -> void* {
    (*static_cast<Fn*>(p))();
    return nullptr;
  };
  ASSERT_EQ(pthread_create(&th, &attr, trampoline, &fn), 0);
  pthread_join(th, nullptr);
  pthread_attr_destroy(&attr);
}

TEST(ChatTemplateLimits, SmallThreadStacksAreSafe) {
  std::string deep_parse = "{{ " + repeat("[", 190) + repeat("]", 190) + " }}";
  std::string deep_eval = "{% macro f(n) %}{{ " + repeat("[", 100) + "f(n + 1)" + repeat("]", 100) +
                          " }}{% endmacro %}{{ f(0) }}";
  std::string recursion = "{% macro f(n) %}{% for x in [1] %}{% if true %}{% set y = [f(n + 1) | trim] %}"
                          "{% endif %}{% endfor %}{% endmacro %}{{ f(0) }}";
  Template qwen3 = Template::parse(qwen3_template());
  ChatInput in;
  in.messages = Json::parse(R"([{"role": "user", "content": "Hi"}])");
  std::string want = apply(qwen3, in);
  on_small_stack(256, [&] {
    for (const std::string* t : {&deep_parse, &deep_eval, &recursion}) {
      try {
        render(*t);
        ADD_FAILURE() << "expected a nesting error";
      } catch (const TemplateError& e) {
        EXPECT_NE(std::string(e.what()).find("deep"), std::string::npos) << e.what();
      }
    }
    EXPECT_EQ(apply(qwen3, in), want);  // ordinary templates are unaffected
  });
}

TEST(ChatTemplateLimits, DeepJsonInputIsRefused) {
  std::string deep = repeat("[", 10000) + repeat("]", 10000);
  Json ctx = {{"v", Json::parse(deep)}};
  expect_error([&] { render("{{ v }}", ctx); }, TemplateError::Kind::Runtime, "nested deeper than");
  Json ok = {{"v", Json::parse(repeat("[", 100) + repeat("]", 100))}};
  EXPECT_EQ(render("{{ v | tojson | length }}", ok), "200");
}

TEST(ChatTemplateLimits, HostileSortComparisonsAreSafe) {
  // NaN makes '<' inconsistent; the sort must still terminate and stay in bounds.
  std::string t = "{{ ([1e400 * 0] * 50 + [3, 1, 2] * 50) | sort | length }}";
  EXPECT_EQ(render(t), "200");
}

}  // namespace
}  // namespace dq::chat::test
