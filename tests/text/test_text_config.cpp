// TextConfig: eos ids from every file, the chat template, token strings, and clear errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "text/model_text.h"
#include "text_test_util.h"

namespace dq::text::testing {
namespace {

namespace fs = std::filesystem;

// A model folder under the test temp dir holding the tiny tokenizer.json plus `files`.
std::string make_folder(const std::string& name, const std::vector<std::pair<std::string, std::string>>& files) {
  fs::path dir = fs::path(::testing::TempDir()) / ("dq_text_config_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(data_path("tokenizer/tiny/tokenizer.json"), dir / "tokenizer.json");
  for (const auto& [file, text] : files) std::ofstream(dir / file) << text;
  return dir.string();
}

std::string load_error(const std::string& folder) {
  try {
    TextConfig::load(folder);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_error(const std::string& folder, const std::string& file, const std::string& part) {
  std::string msg = load_error(folder);
  EXPECT_NE(msg.find(folder + "/" + file + ": "), std::string::npos) << msg;
  EXPECT_NE(msg.find(part), std::string::npos) << msg;
}

TEST(TextConfig, OnlyTokenizerJson) {
  TextConfig tc = TextConfig::load(make_folder("bare", {}));
  ASSERT_TRUE(tc.tokenizer);
  EXPECT_EQ(tc.tokenizer->vocab_size(), 1021u);
  EXPECT_TRUE(tc.eos_ids.empty());
  EXPECT_TRUE(tc.chat_template.empty());
  EXPECT_FALSE(tc.eos_token.has_value());
  EXPECT_FALSE(tc.bos_id.has_value());
}

TEST(TextConfig, UnionOfEosIds) {
  // Qwen3.5 style: generation_config names <|im_end|> and <|endoftext|>; config.json names
  // <|endoftext|> at the top and in text_config; tokenizer_config's eos_token is <|im_end|>.
  std::string folder = make_folder("union", {
      {"generation_config.json", R"({"eos_token_id": [1018, 1016], "top_k": 20})"},
      {"config.json", R"({"eos_token_id": 1016, "text_config": {"eos_token_id": 1017, "vocab_size": 1024}})"},
      {"tokenizer_config.json", R"({"bos_token": null, "eos_token": {"content": "<|im_end|>", "special": true},
                                    "pad_token": "<|endoftext|>", "chat_template": "{{ messages }}"})"},
  });
  TextConfig tc = TextConfig::load(folder);
  EXPECT_EQ(tc.eos_ids, (std::vector<TokenId>{1018, 1016, 1017}));
  EXPECT_TRUE(tc.is_eos(1016));
  EXPECT_TRUE(tc.is_eos(1018));
  EXPECT_FALSE(tc.is_eos(1019));
  EXPECT_EQ(tc.eos_token, "<|im_end|>");
  EXPECT_EQ(tc.pad_token, "<|endoftext|>");
  EXPECT_FALSE(tc.bos_token.has_value());
  EXPECT_EQ(tc.chat_template, "{{ messages }}");
}

TEST(TextConfig, EosTokenStringAddsItsId) {
  TextConfig tc = TextConfig::load(make_folder("eos_string", {
      {"generation_config.json", R"({"eos_token_id": 1016})"},
      {"tokenizer_config.json", R"({"eos_token": "<|im_end|>", "bos_token": "<|im_start|>"})"},
  }));
  EXPECT_EQ(tc.eos_ids, (std::vector<TokenId>{1016, 1018}));
  EXPECT_EQ(tc.bos_id, 1017);
}

TEST(TextConfig, NamedTemplatesPickDefault) {
  TextConfig tc = TextConfig::load(make_folder("named", {
      {"tokenizer_config.json",
       R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})"},
  }));
  EXPECT_EQ(tc.chat_template, "D");
  ASSERT_EQ(tc.named_chat_templates.size(), 2u);
  EXPECT_EQ(tc.named_chat_templates[0].first, "tool_use");
}

TEST(TextConfig, JinjaFileWins) {
  TextConfig tc = TextConfig::load(make_folder("jinja", {
      {"tokenizer_config.json", R"({"chat_template": "old"})"},
      {"chat_template.jinja", "new {{ x }}"},
  }));
  EXPECT_EQ(tc.chat_template, "new {{ x }}");
}

TEST(TextConfig, AddedTokensDecoder) {
  TextConfig tc = TextConfig::load(make_folder("atd", {
      {"tokenizer_config.json", R"({"added_tokens_decoder": {
          "1016": {"content": "<|endoftext|>", "special": true, "lstrip": false, "rstrip": false,
                   "normalized": false, "single_word": false},
          "1020": {"content": "</think>", "special": true}}})"},
  }));
  ASSERT_EQ(tc.added_tokens_decoder.size(), 2u);
  EXPECT_EQ(tc.added_tokens_decoder[0].id, 1016);
  EXPECT_TRUE(tc.added_tokens_decoder[0].special);
}

TEST(TextConfig, FixtureFolders) {
  TextConfig tiny = TextConfig::load(data_path("tokenizer/tiny"));
  EXPECT_EQ(tiny.eos_ids, (std::vector<TokenId>{1018}));  // eos_token <|im_end|>
  EXPECT_NE(tiny.chat_template.find("<|im_start|>"), std::string::npos);
  TextConfig q = TextConfig::load(data_path("tokenizer/qwen3"));
  EXPECT_EQ(q.eos_ids, (std::vector<TokenId>{151645}));
  EXPECT_EQ(q.pad_token, "<|endoftext|>");
  EXPECT_FALSE(q.bos_token.has_value());
  EXPECT_FALSE(q.chat_template.empty());
  EXPECT_EQ(q.added_tokens_decoder.size(), 26u);
}

TEST(TextConfig, Errors) {
  expect_error(make_folder("e1", {{"generation_config.json", R"({"eos_token_id": ["x"]})"}}),
               "generation_config.json", "eos_token_id[0]: expected a non-negative integer token id, got \"x\"");
  expect_error(make_folder("e2", {{"config.json", "{not json"}}), "config.json", "invalid JSON");
  expect_error(make_folder("e3", {{"config.json", R"({"text_config": {"eos_token_id": -3}})"}}), "config.json",
               "text_config.eos_token_id: expected a non-negative integer token id, got -3");
  expect_error(make_folder("e4", {{"tokenizer_config.json", R"({"chat_template": 42})"}}), "tokenizer_config.json",
               "chat_template: expected a string or a list of {name, template}, got 42");
  expect_error(make_folder("e5", {{"tokenizer_config.json", R"({"chat_template": [{"name": "default"}]})"}}),
               "tokenizer_config.json", "chat_template[0]: expected {\"name\": string, \"template\": string}");
  expect_error(make_folder("e6", {{"tokenizer_config.json", R"({"eos_token": "<nope>"})"}}), "tokenizer_config.json",
               "eos_token: \"<nope>\" is not a token of tokenizer.json");
  expect_error(make_folder("e7", {{"tokenizer_config.json", R"({"eos_token": {"text": "x"}})"}}),
               "tokenizer_config.json", "eos_token.content: expected a string, got nothing");
  expect_error(make_folder("e8", {{"tokenizer_config.json", R"({"added_tokens_decoder": {"1016": {"content": "<x>"}}})"}}),
               "tokenizer_config.json", "added_tokens_decoder[\"1016\"]: content \"<x>\" but tokenizer.json has \"<|endoftext|>\"");
  expect_error(make_folder("e9", {{"tokenizer_config.json", R"({"added_tokens_decoder": {"abc": {"content": "<x>"}}})"}}),
               "tokenizer_config.json", "added_tokens_decoder[\"abc\"]: the key must be a token id");
  expect_error(make_folder("e10", {{"tokenizer_config.json", "[]"}}), "tokenizer_config.json",
               "expected a JSON object at the top level, got an array");
  // tokenizer.json is required; a broken one is reported with its path.
  std::string no_tok = make_folder("e11", {});
  fs::remove(fs::path(no_tok) / "tokenizer.json");
  EXPECT_NE(load_error(no_tok).find("tokenizer.json not found"), std::string::npos);
  std::string bad_tok = make_folder("e12", {});
  std::ofstream(fs::path(bad_tok) / "tokenizer.json") << "{\"model\": 1}";
  expect_error(bad_tok, "tokenizer.json", "model: expected an object, got 1");
  EXPECT_NE(load_error("/nonexistent/folder").find("not a directory"), std::string::npos);
}

}  // namespace
}  // namespace dq::text::testing
