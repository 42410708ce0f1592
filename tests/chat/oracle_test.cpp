// The engine against python3-jinja2 configured as HF transformers configures it
// (jinja_oracle.py): hand-written snippets and templates, then random conversations through
// the real Qwen3 template and a Qwen3.5-style one. Byte-for-byte.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "chat_test_util.h"

namespace dq::chat::test {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> files_with(const std::string& dir, const std::string& ext) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(data_path(dir)))
    if (e.path().extension() == ext) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(ChatOracle, PythonJinja2IsAvailable) {
  Json cases = Json::array({{{"template", "{{ 1 + 1 }}"}, {"context", Json::object()}}});
  auto py = run_oracle(cases);
  ASSERT_EQ(py.size(), 1u);
  EXPECT_TRUE(py[0].ok);
  EXPECT_EQ(py[0].text, "2");
}

// tests/data/chat/templates/snippets/*.txt: snippets separated by "\n====\n", rendered with
// context.json. In errors.txt every snippet must fail on both sides.
TEST(ChatOracle, Snippets) {
  Json ctx = Json::parse(read_file(data_path("templates/snippets/context.json")));
  Json cases = Json::array();
  std::vector<bool> must_fail;
  for (const auto& path : files_with("templates/snippets", ".txt")) {
    std::string src = read_file(path.string());
    if (!src.empty() && src.back() == '\n') src.pop_back();
    size_t start = 0;
    while (true) {
      size_t sep = src.find("\n====\n", start);
      cases.push_back({{"template", src.substr(start, sep == std::string::npos ? sep : sep - start)},
                       {"context", ctx}, {"file", path.filename().string()}});
      must_fail.push_back(path.filename() == "errors.txt");
      if (sep == std::string::npos) break;
      start = sep + 6;
    }
  }
  ASSERT_GT(cases.size(), 150u);
  auto engine = run_engine(cases);
  auto oracle = run_oracle(cases);
  EXPECT_EQ(compare(cases, engine, oracle, "snippet"), 0);
  for (size_t i = 0; i < cases.size() && i < engine.size(); ++i)
    if (must_fail[i]) {
      EXPECT_FALSE(engine[i].ok) << "should fail: " << cases[i]["template"];
    }
}

// tests/data/chat/templates/NAME.jinja with NAME.cases.json (contexts or chats).
TEST(ChatOracle, Templates) {
  Json cases = Json::array();
  for (const auto& path : files_with("templates", ".jinja")) {
    std::string tmpl = read_file(path.string());
    fs::path list = path;
    list.replace_extension(".cases.json");
    for (Json c : Json::parse(read_file(list.string()))) {
      c["template"] = tmpl;
      cases.push_back(c);
    }
  }
  ASSERT_GE(cases.size(), 15u);
  EXPECT_EQ(compare(cases, run_engine(cases), run_oracle(cases), "template"), 0);
}

void random_conversations(const std::string& label, const std::string& tmpl, bool rich, uint64_t seed, int n) {
  Rng rng(seed);
  Json cases = Json::array();
  for (int i = 0; i < n; ++i) cases.push_back({{"template", tmpl}, {"chat", random_chat(rng, rich)}});
  auto engine = run_engine(cases);
  auto oracle = run_oracle(cases);
  EXPECT_EQ(compare(cases, engine, oracle, label), 0);
  int rendered = 0;
  for (const auto& o : engine) rendered += o.ok;
  std::printf("%s: %d random conversations, %d rendered, %d failed on both sides\n", label.c_str(), n, rendered,
              n - rendered);
  EXPECT_GT(rendered, n / 2) << "most random conversations should render";
}

TEST(ChatOracle, Qwen3TemplateRandomConversations) {
  random_conversations("qwen3", qwen3_template(), false, 20240601, 3000);
}

TEST(ChatOracle, Qwen35StyleTemplateRandomConversations) {
  random_conversations("qwen35_style", read_file(data_path("templates/qwen35_style.jinja")), true, 7, 2000);
}

}  // namespace
}  // namespace dq::chat::test
