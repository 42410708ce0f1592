// The fixture cases: ids and decoded text made by HF tokenizers (tests/data/tokenizer/README.md).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "text_test_util.h"

namespace dq::text::testing {
namespace {

struct Case {
  std::string tokenizer, text, decoded;
  std::vector<TokenId> ids;
};

std::vector<Case> load_cases(const std::string& file = "tokenizer/tok-cases.jsonl") {
  std::vector<Case> cases;
  std::ifstream in(data_path(file));
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    cases.push_back({j.at("tokenizer"), j.at("text"), j.at("decoded"), j.at("ids").get<std::vector<TokenId>>()});
  }
  return cases;
}

TEST(TokenizerCases, AllFixtureCasesMatchHf) {
  auto cases = load_cases();
  ASSERT_EQ(cases.size(), 117u);
  std::map<std::string, int> per_tokenizer;
  for (const Case& c : cases) {
    const Tokenizer& tok = tokenizer_by_name(c.tokenizer);
    auto ids = tok.encode(c.text);
    EXPECT_EQ(ids, c.ids) << c.tokenizer << ": " << c.text;
    EXPECT_EQ(tok.decode(c.ids), c.decoded) << c.tokenizer << ": " << c.text;
    EXPECT_EQ(tok.encode_reference(c.text), c.ids) << c.tokenizer << ": " << c.text;
    ++per_tokenizer[c.tokenizer];
  }
  EXPECT_EQ(per_tokenizer.size(), 3u);
}

// Random and edge-case texts (combining marks out of order, characters newer than Unicode 9.0,
// U+180E, 'ſ, added tokens inside text, ...) with ids from HF tokenizers 0.23.2, made by
// bench/text/hf_tokenizers_bench.py --cases-out on a machine that has it.
TEST(TokenizerCases, HfRandomCases) {
  auto cases = load_cases("tokenizer/hf-random-cases.jsonl");
  ASSERT_EQ(cases.size(), 1332u);
  size_t bad = 0;
  for (const Case& c : cases) {
    const Tokenizer& tok = tokenizer_by_name(c.tokenizer);
    bool ok = tok.encode(c.text) == c.ids && tok.decode(c.ids) == c.decoded && tok.encode_reference(c.text) == c.ids;
    EXPECT_TRUE(ok) << c.tokenizer << ": " << nlohmann::json(c.text).dump();
    bad += !ok;
  }
  EXPECT_EQ(bad, 0u);
}

TEST(TokenizerCases, Qwen35RegexIsTheOneWithMarks) {
  auto q3 = qwen3_tokenizer().split_patterns();
  auto q35 = qwen3_q35_tokenizer().split_patterns();
  ASSERT_EQ(q3.size(), 1u);
  ASSERT_EQ(q35.size(), 1u);
  EXPECT_EQ(q3[0].find("\\p{M}"), std::string::npos);
  EXPECT_NE(q35[0].find("[\\p{L}\\p{M}]+"), std::string::npos);
  // The regexes differ on combining marks: a base letter plus a non-composing mark (U+0301
  // after 'q' has no precomposed form) stays one piece with Qwen3.5's regex only.
  std::string text = "q\xCC\x81q";
  auto a = qwen3_tokenizer().encode(text);
  auto b = qwen3_q35_tokenizer().encode(text);
  EXPECT_EQ(qwen3_tokenizer().decode(a), text);
  EXPECT_EQ(qwen3_q35_tokenizer().decode(b), text);
}

TEST(TokenizerCases, VocabularyAndSpecialTokens) {
  const Tokenizer& q = qwen3_tokenizer();
  EXPECT_EQ(q.vocab_size(), 151669u);
  EXPECT_EQ(q.merge_count(), 151387u);
  EXPECT_EQ(q.token_to_id("<|im_start|>"), 151644);
  EXPECT_EQ(q.token_to_id("<|endoftext|>"), 151643);
  EXPECT_EQ(q.token_to_id("Ġthe"), 279);
  EXPECT_EQ(q.token_to_id("no such token"), std::nullopt);
  EXPECT_EQ(q.id_to_token(151645), "<|im_end|>");
  EXPECT_EQ(q.id_to_token(198), "Ċ");
  EXPECT_EQ(q.id_to_token(-1), std::nullopt);
  EXPECT_EQ(q.id_to_token(151669), std::nullopt);
  EXPECT_TRUE(q.is_special(151643));
  EXPECT_TRUE(q.is_special(151645));
  EXPECT_FALSE(q.is_special(151667));  // <think> is an added token but not special in Qwen3
  EXPECT_FALSE(q.is_special(198));
  EXPECT_TRUE(q.uses_nfc());
  EXPECT_EQ(q.token_bytes(198), "\n");
  EXPECT_EQ(q.token_bytes(151644), "<|im_start|>");

  const Tokenizer& t = tiny_tokenizer();
  EXPECT_EQ(t.vocab_size(), 1021u);
  EXPECT_TRUE(t.is_special(1020));
}

TEST(TokenizerCases, ParseSpecialFalseKeepsSpecialTokensAsText) {
  const Tokenizer& q = qwen3_tokenizer();
  std::string text = "<|im_start|>user\nhi<|im_end|>";
  auto parsed = q.encode(text, true);
  EXPECT_EQ(parsed, (std::vector<TokenId>{151644, 872, 198, 6023, 151645}));
  auto plain = q.encode(text, false);
  for (TokenId id : plain) EXPECT_FALSE(q.is_special(id)) << id;
  EXPECT_EQ(q.decode(plain), text);
  EXPECT_GT(plain.size(), parsed.size());
  // Non-special added tokens (Qwen3's <think>) are still matched, as in HF.
  auto think = q.encode("<think>x", false);
  EXPECT_EQ(think.front(), 151667);
}

TEST(TokenizerCases, DecodeSkipSpecial) {
  const Tokenizer& q = qwen3_tokenizer();
  std::vector<TokenId> ids = {151644, 872, 198, 6023, 151645, 151667};
  EXPECT_EQ(q.decode(ids), "<|im_start|>user\nhi<|im_end|><think>");
  EXPECT_EQ(q.decode(ids, true), "user\nhi<think>");
  // Unknown ids are skipped.
  std::vector<TokenId> odd = {-5, 872, 999999999};
  EXPECT_EQ(q.decode(odd), "user");
}

}  // namespace
}  // namespace dq::text::testing
