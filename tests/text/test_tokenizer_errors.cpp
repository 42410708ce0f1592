// Malformed tokenizer.json: every variant throws dq::Error with one line that names the file
// and the field; none crashes (the mutation test below runs under ASan/UBSan too).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "text/regex_split.h"
#include "text_test_util.h"

namespace dq::text::testing {
namespace {

using nlohmann::json;

// The error message of loading `text`, or "" when it loads.
std::string load_error(const std::string& text) {
  try {
    Tokenizer::from_json(text, "tokenizer.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string edited(const std::function<void(json&)>& edit) {
  static const json base = json::parse(tiny_json());
  json j = base;
  edit(j);
  return j.dump();
}

void expect_error(const std::string& text, const std::string& expected_part) {
  std::string msg = load_error(text);
  ASSERT_FALSE(msg.empty()) << "loaded, but expected an error containing: " << expected_part;
  EXPECT_NE(msg.find(expected_part), std::string::npos) << "message: " << msg;
  EXPECT_EQ(msg.rfind("tokenizer.json: ", 0), 0u) << "message: " << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "message: " << msg;
}

TEST(TokenizerErrors, BadJson) {
  expect_error("", "invalid JSON at line 1, column 1: unexpected end of file");
  expect_error("{", "invalid JSON at line 1");
  expect_error("{\"model\": {\"type\": \"BPE\",}}", "invalid JSON at line 1, column 26: expected a key string");
  expect_error("[1, 2]", "top level: expected an object, got an array");
  expect_error("\x89PNG\r\n\x1a\n", "invalid JSON");
  expect_error("{\"a\": \"\\x\"}", "bad escape");
  expect_error("{\"a\": \"\\ud800\"}", "unpaired surrogate");
  expect_error("{\"a\": 1} 2", "unexpected text after the top-level value");
  expect_error("{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}", "nesting deeper than 256");
  std::string full = tiny_json();
  expect_error(full.substr(0, full.size() / 2), "invalid JSON");
}

TEST(TokenizerErrors, Model) {
  expect_error(edited([](json& j) { j.erase("model"); }), "tokenizer.json: model: missing");
  expect_error(edited([](json& j) { j["model"] = 3; }), "model: expected an object, got 3");
  expect_error(edited([](json& j) { j["model"]["type"] = "WordPiece"; }),
               "model.type: expected \"BPE\", got \"WordPiece\"");
  expect_error(edited([](json& j) { j["model"].erase("type"); }), "model.type: missing");
  expect_error(edited([](json& j) { j["model"].erase("vocab"); }), "model.vocab: missing");
  expect_error(edited([](json& j) { j["model"]["vocab"]["Ġt"] = "x"; }),
               "model.vocab[\"Ġt\"]: expected an integer, got \"x\"");
  expect_error(edited([](json& j) { j["model"]["vocab"]["Ġt"] = -1; }), "model.vocab[\"Ġt\"]: -1 is out of range");
  expect_error(edited([](json& j) { j["model"]["vocab"]["Ġt"] = 1.5; }), "model.vocab[\"Ġt\"]: expected an integer, got 1.5");
  expect_error(edited([](json& j) { j["model"]["vocab"]["Ġt"] = 99999999999LL; }), "out of range");
  expect_error(edited([](json& j) { j["model"]["vocab"]["zzzz"] = 5; }), "model.vocab[\"zzzz\"]: id 5 is used by another token");
  expect_error(edited([](json& j) { j["model"]["byte_fallback"] = true; }), "model.byte_fallback: true is not supported");
  expect_error(edited([](json& j) { j["model"]["dropout"] = 0.1; }), "model.dropout: 0.1 is not supported");
  expect_error(edited([](json& j) { j["model"]["continuing_subword_prefix"] = "##"; }),
               "model.continuing_subword_prefix: \"##\" is not supported");
  expect_error(edited([](json& j) { j["model"]["unk_token"] = "<nope>"; }), "model.unk_token: \"<nope>\" is not in model.vocab");
  // Accepted variants.
  EXPECT_EQ(load_error(edited([](json& j) { j["model"]["dropout"] = 0; })), "");
  EXPECT_EQ(load_error(edited([](json& j) { j["model"]["continuing_subword_prefix"] = ""; })), "");
}

TEST(TokenizerErrors, Merges) {
  // The example from the design: a merge that is neither "a b" nor ["a","b"].
  expect_error(edited([](json& j) { j["model"]["merges"][12] = 42; }),
               "tokenizer.json: model.merges[12]: expected \"a b\" or [\"a\",\"b\"], got 42");
  expect_error(edited([](json& j) { j["model"]["merges"][3] = "a b c"; }),
               "model.merges[3]: expected \"a b\" (two tokens and one space), got \"a b c\"");
  expect_error(edited([](json& j) { j["model"]["merges"][3] = "ab"; }), "model.merges[3]: expected \"a b\"");
  expect_error(edited([](json& j) { j["model"]["merges"][4] = json::array({"a"}); }),
               "model.merges[4]: expected [\"a\",\"b\"], got fewer than 2 items");
  expect_error(edited([](json& j) { j["model"]["merges"][4] = json::array({"a", "b", "c"}); }),
               "model.merges[4]: expected [\"a\",\"b\"], got more than 2 items");
  expect_error(edited([](json& j) { j["model"]["merges"][5] = json::array({"a", 7}); }),
               "model.merges[5]: expected \"a b\" or [\"a\",\"b\"], got 7");
  expect_error(edited([](json& j) { j["model"]["merges"][7] = json::array({"Ġ", "qqqq"}); }),
               "model.merges[7]: token \"qqqq\" is not in model.vocab");
  expect_error(edited([](json& j) { j["model"]["merges"][7] = json::array({"q", "z"}); }),
               "model.merges[7]: the merged token \"qz\" is not in model.vocab");
  expect_error(edited([](json& j) { j["model"]["merges"] = "x"; }), "model.merges: expected an array, got \"x\"");
  // Both spellings of a merge load the same model.
  std::string pairs = edited([](json&) {});
  std::string strings = edited([](json& j) {
    for (auto& m : j["model"]["merges"]) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  });
  Tokenizer a = Tokenizer::from_json(pairs), b = Tokenizer::from_json(strings);
  EXPECT_EQ(a.encode("The quick brown fox"), b.encode("The quick brown fox"));
}

TEST(TokenizerErrors, PipelineParts) {
  expect_error(edited([](json& j) { j["normalizer"] = {{"type", "NFKC"}}; }),
               "normalizer.type: \"NFKC\" is not supported (expected \"NFC\" or a null normalizer)");
  expect_error(edited([](json& j) { j["normalizer"] = "NFC"; }), "normalizer: expected an object or null, got \"NFC\"");
  expect_error(edited([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; }),
               "pre_tokenizer.pretokenizers[0].pattern.Regex: PCRE2 rejects the regex");
  expect_error(edited([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = 5; }),
               "pre_tokenizer.pretokenizers[0].pattern.Regex: expected a string, got 5");
  expect_error(edited([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; }),
               "pre_tokenizer.pretokenizers[0].behavior: expected \"Isolated\", got \"Removed\"");
  expect_error(edited([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true; }),
               "pre_tokenizer.pretokenizers[0].invert: true is not supported");
  expect_error(edited([](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["type"] = "Whitespace"; }),
               "pre_tokenizer.pretokenizers[1].type: \"Whitespace\" is not supported");
  expect_error(edited([](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; }),
               "pre_tokenizer.pretokenizers[1].add_prefix_space: true is not supported");
  expect_error(edited([](json& j) { j["pre_tokenizer"]["pretokenizers"].erase(1); }),
               "pre_tokenizer: has no ByteLevel step");
  expect_error(edited([](json& j) { j["pre_tokenizer"] = nullptr; }), "pre_tokenizer: missing");
  expect_error(edited([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }),
               "decoder.type: \"WordPiece\" is not supported (expected \"ByteLevel\")");
  expect_error(edited([](json& j) { j.erase("decoder"); }), "decoder: missing");
}

TEST(TokenizerErrors, AddedTokens) {
  expect_error(edited([](json& j) { j["added_tokens"][0].erase("id"); }), "added_tokens[0].id: missing");
  expect_error(edited([](json& j) { j["added_tokens"][1]["content"] = 7; }),
               "added_tokens[1].content: expected a string, got 7");
  expect_error(edited([](json& j) { j["added_tokens"][1]["content"] = ""; }), "added_tokens[1].content: must not be empty");
  expect_error(edited([](json& j) { j["added_tokens"][1]["special"] = "yes"; }),
               "added_tokens[1].special: expected true or false, got \"yes\"");
  expect_error(edited([](json& j) { j["added_tokens"][1]["id"] = 100; }), "added_tokens[1]: id 100 is");
  expect_error(edited([](json& j) { j["added_tokens"][1]["id"] = 1016; }),
               "added_tokens[1]: id 1016 is also used by the added token \"<|endoftext|>\"");
  expect_error(edited([](json& j) { j["added_tokens"][1]["content"] = "<|endoftext|>"; }),
               "added_tokens[1]: \"<|endoftext|>\" is also added with id 1016");
  expect_error(edited([](json& j) { j["added_tokens"] = 1; }), "added_tokens: expected an array, got 1");
}

TEST(TokenizerErrors, MissingFile) {
  try {
    Tokenizer::load("/nonexistent/tokenizer.json");
    FAIL() << "loaded a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tokenizer.json"), std::string::npos) << e.what();
  }
}

TEST(TokenizerErrors, MutatedFilesNeverCrash) {
  // Truncations and random byte edits of a real file: each either loads or throws dq::Error.
  std::string base = tiny_json();
  std::mt19937_64 rng(2024);
  int loaded = 0, rejected = 0;
  for (size_t cut = 0; cut < base.size(); cut += 257) {
    (load_error(base.substr(0, cut)).empty() ? loaded : rejected)++;
  }
  const char bytes[] = {'"', '\\', '{', '}', '[', ']', ',', ':', '0', '9', '-', 'e', ' ', '\0', '\xff', '\xc3'};
  for (int k = 0; k < 400; ++k) {
    std::string m = base;
    for (int e = 0; e < 3; ++e) m[rng() % m.size()] = bytes[rng() % sizeof(bytes)];
    (load_error(m).empty() ? loaded : rejected)++;
  }
  EXPECT_GT(rejected, 0);
  std::printf("mutations: %d loaded, %d rejected with dq::Error\n", loaded, rejected);
}

TEST(RegexSplit, IsolatedPiecesAndQwen35Marks) {
  auto pieces = [](const std::string& pattern, const std::string& text) {
    RegexSplit re(pattern, "test", "pattern");
    RegexSplit::Scratch scratch(re);
    std::vector<std::string> out;
    re.split(text, scratch, [&](std::string_view p) { out.emplace_back(p); });
    return out;
  };
  const std::string q3 = qwen3_tokenizer().split_patterns().at(0);
  const std::string q35 = qwen3_q35_tokenizer().split_patterns().at(0);
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces(q3, "Hello, world!  It's 42"), (V{"Hello", ",", " world", "!", " ", " It", "'s", " ", "4", "2"}));
  // A letter followed by a combining mark: Qwen3 cuts before the mark, Qwen3.5 keeps the word.
  EXPECT_EQ(pieces(q3, "q\xCC\x81q"), (V{"q", "\xCC\x81q"}));
  EXPECT_EQ(pieces(q35, "q\xCC\x81q"), (V{"q\xCC\x81q"}));
  EXPECT_EQ(pieces(q35, "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87 x"),
            (V{"\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87", " x"}));  // नमस्ते
  // Lookahead stops at the end of the text it is given.
  EXPECT_EQ(pieces(q3, "a   "), (V{"a", "   "}));
  EXPECT_EQ(pieces(q3, "a   b"), (V{"a", "  ", " b"}));
  // Oniguruma's \s is White_Space, which no longer includes U+180E (PCRE2's \s does).
  EXPECT_EQ(pieces(q3, "\xE1\xA0\x8E!"), (V{"\xE1\xA0\x8E!"}));
  EXPECT_EQ(onig_to_pcre2("[^\\s\\p{L}]\\s+(?!\\S)[\\]\\s]\\Q\\s\\E"),
            "[^\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}"
            "\\x{3000}\\p{L}][\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
            "\\x{202F}\\x{205F}\\x{3000}]+(?![^\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}"
            "\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}])[\\]\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}"
            "\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}]\\Q\\s\\E");
  // An empty match splits but does not advance (as HF's find_iter).
  EXPECT_EQ(pieces("(?=b)", "abab"), (V{"a", "ba", "b"}));
}

}  // namespace
}  // namespace dq::text::testing
