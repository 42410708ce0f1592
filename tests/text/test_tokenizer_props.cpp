// Properties of the tokenizer: round trips, fast path == plain path, NFC, streaming,
// invalid UTF-8, long inputs, added-token options, concurrency.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "text/byte_level.h"
#include "text/nfc.h"
#include "text/utf8.h"
#include "text_test_util.h"

namespace dq::text::testing {
namespace {

std::string utf8(char32_t cp) {
  std::string s;
  append_utf8(s, cp);
  return s;
}

// Random valid UTF-8, weighted towards the hard parts: combining marks, Hangul jamo,
// characters NFC changes, emoji sequences, whitespace runs, apostrophes, digits.
std::string random_text(std::mt19937_64& rng, size_t n_chars) {
  static const std::vector<std::pair<char32_t, char32_t>> ranges = {
      {0x20, 0x7E},        {0x09, 0x0D},        {0xA0, 0xFF},        {0x100, 0x24F},
      {0x300, 0x36F},      {0x370, 0x3FF},      {0x400, 0x4FF},      {0x590, 0x5FF},
      {0x600, 0x6FF},      {0x900, 0x97F},      {0x980, 0x9FF},      {0xB00, 0xBFF},
      {0xD00, 0xD7F},      {0xE00, 0xE7F},      {0x1100, 0x11FF},    {0x1E00, 0x1EFF},
      {0x2000, 0x206F},    {0x2100, 0x214F},    {0x3000, 0x30FF},    {0x4E00, 0x9FFF},
      {0xAC00, 0xD7A3},    {0xF900, 0xFAFF},    {0xFE00, 0xFE0F},    {0xFF00, 0xFFEF},
      {0x1F300, 0x1FAFF},  {0x1D100, 0x1D1FF},  {0x2F800, 0x2FA1F},  {0x10000, 0x10FFFF}};
  std::string s;
  for (size_t k = 0; k < n_chars; ++k) {
    switch (rng() % 10) {
      case 0: s += " "; break;
      case 1: s += "'s"; break;
      case 2: s += utf8(char32_t(0x300 + rng() % 0x70)); break;  // combining marks
      default: {
        auto [lo, hi] = ranges[rng() % ranges.size()];
        char32_t cp = lo + char32_t(rng() % (hi - lo + 1));
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
        s += utf8(cp);
      }
    }
  }
  return s;
}

const std::vector<std::string>& varied_texts() {
  static const std::vector<std::string> texts = {
      "Hello, world! It's a test; we'll see. DON'T SHOUT.",
      "  leading and trailing   \t\t\n\n\r\n  ",
      "def f(x):\n    return x**2  # squares\n\tprint(f\"{x!r}\")\n",
      "for (int i = 0; i < n; ++i) { a[i] += b[i] >> 2; }",
      "中文测试：你好，世界！日本語のテキストです。カタカナとひらがな",
      "한국어 문장입니다. 한글 자모: \u1112\u1161\u11ab",
      "مرحبا بالعالم — كَتَبَ مُحَمَّد",
      "नमस्ते दुनिया, क़ानून और ज़िंदगी",
      "Tiếng Việt có dấu; Tie\u0302\u0301ng Vie\u0323\u0302t decomposed",
      "e\u0301 a\u0300 o\u0308 n\u0303 q\u0301 \u212B \u2126 \uF900 \u0958",
      "emoji 😀 👍🏽 👩‍👩‍👧 🏳️‍🌈 🇫🇷🇯🇵 1️⃣",
      "Ελληνικά και Кириллица, ﬁ ligature, ① ② ③, ½ ¾",
      "numbers 1234567890 3.14159 -42 1,000,000.00 $5 €10",
      "zero\u200bwidth\u200cjoin\u200d \u00a0nbsp\u2003em\u3000ideographic \u180e mongolian",
      "\u0301 starts with a mark, and \u0327\u0301 two",
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
      "!!!!!!??????......,,,,,;;;;;::::::''''''\"\"\"\"",
      "",
  };
  return texts;
}

const Tokenizer* all_tokenizers[3];
const Tokenizer* const* tokenizers() {
  all_tokenizers[0] = &tiny_tokenizer();
  all_tokenizers[1] = &qwen3_tokenizer();
  all_tokenizers[2] = &qwen3_q35_tokenizer();
  return all_tokenizers;
}

TEST(TokenizerProps, RoundTripIsNfc) {
  std::mt19937_64 rng(12345);
  std::vector<std::string> texts = varied_texts();
  for (int k = 0; k < 300; ++k) texts.push_back(random_text(rng, 1 + rng() % 60));
  for (int t = 0; t < 3; ++t) {
    const Tokenizer& tok = *tokenizers()[t];
    for (const std::string& s : texts) {
      auto ids = tok.encode(s);
      EXPECT_EQ(tok.decode(ids), nfc_reference(s)) << "tokenizer " << t << ": " << s;
    }
  }
}

TEST(TokenizerProps, FastPathMatchesPlainPath) {
  std::mt19937_64 rng(777);
  std::vector<std::string> texts = varied_texts();
  for (int k = 0; k < 300; ++k) texts.push_back(random_text(rng, 1 + rng() % 80));
  // Long pieces go through the heap merge, short ones through the small-piece merge.
  texts.push_back(std::string(300, 'x') + "yz" + std::string(50, 'q'));
  std::string cjk;
  for (int k = 0; k < 200; ++k) cjk += utf8(char32_t(0x4E00 + rng() % 0x5000));
  texts.push_back(cjk);
  for (int t = 0; t < 3; ++t) {
    const Tokenizer& tok = *tokenizers()[t];
    for (int pass = 0; pass < 2; ++pass) {  // the second pass hits the piece cache
      for (const std::string& s : texts) EXPECT_EQ(tok.encode(s), tok.encode_reference(s)) << t << ": " << s;
    }
  }
}

TEST(TokenizerProps, NfcFastPathMatchesUtf8proc) {
  std::mt19937_64 rng(99);
  // Characters around which NFC does something: marks (some out of canonical order),
  // Hangul L/V/T jamo and LV syllables, singletons, exclusions, Indic two-part vowels.
  const std::vector<char32_t> tricky = {
      'a', 'e', 'A', 'o', 'u', 0x300, 0x301, 0x302, 0x308, 0x323, 0x327, 0x328, 0x345, 0x34F,
      0x1100, 0x1161, 0x11A8, 0xAC00, 0xAC01, 0x212B, 0x2126, 0x0958, 0xF900, 0x0344,
      0x09C7, 0x09BE, 0x09D7, 0x0B47, 0x0B3E, 0x0DD9, 0x0DCF, 0x0DDF, 0x1025, 0x102E, 0x3099,
      0x304B, 0x309A, 0x1D15E, 0x1D165, 0x2F800, 0x110BA, 0x11099, 0xE9, 0x1EA0, 0x20, 0x4E2D,
      0x0D3B, 0x0D3C, 0x09FE, 0x1DF6, 0x1ABF, 0x1E4EC, 0x10EFD, 0x11F42};  // the last: after Unicode 9.0
  for (int k = 0; k < 3000; ++k) {
    std::string s;
    size_t n = 1 + rng() % 12;
    for (size_t j = 0; j < n; ++j) s += utf8(tricky[rng() % tricky.size()]);
    std::string scratch;
    EXPECT_EQ(std::string(nfc(s, scratch)), nfc_reference(s)) << s;
  }
  for (const std::string& s : varied_texts()) {
    std::string scratch;
    EXPECT_EQ(std::string(nfc(s, scratch)), nfc_reference(s)) << s;
  }
}

bool valid(const std::string& s) { return is_valid_utf8(s); }

TEST(TokenizerProps, StreamDecoderMatchesDecode) {
  const Tokenizer& tok = qwen3_tokenizer();
  std::string text;
  for (const std::string& s : varied_texts()) text += s;
  std::mt19937_64 rng(5);
  text += random_text(rng, 2000);
  auto ids = tok.encode(text);
  StreamDecoder sd(tok);
  std::string streamed;
  for (TokenId id : ids) {
    std::string part = sd.push(id);
    EXPECT_TRUE(valid(part));
    streamed += part;
  }
  streamed += sd.flush();
  EXPECT_EQ(streamed, tok.decode(ids));
  EXPECT_EQ(streamed, nfc_reference(text));
}

TEST(TokenizerProps, StreamDecoderOverEveryToken) {
  // Every id of the vocabulary, in a shuffled order: partial UTF-8 sequences, stray
  // continuation bytes, added tokens. Every push is valid UTF-8 and the whole equals decode().
  for (bool skip : {false, true}) {
    const Tokenizer& tok = qwen3_tokenizer();
    std::vector<TokenId> ids(tok.vocab_size());
    for (size_t k = 0; k < ids.size(); ++k) ids[k] = TokenId(k);
    std::mt19937_64 rng(skip ? 1 : 2);
    std::shuffle(ids.begin(), ids.end(), rng);
    StreamDecoder sd(tok, skip);
    std::string streamed;
    size_t bad = 0;
    for (TokenId id : ids) {
      std::string part = sd.push(id);
      bad += !valid(part);
      streamed += part;
      EXPECT_LE(sd.pending(), 3u);
    }
    streamed += sd.flush();
    EXPECT_EQ(bad, 0u);
    EXPECT_EQ(streamed, tok.decode(ids, skip));
  }
}

TEST(TokenizerProps, StreamDecoderHoldsSplitCharacters) {
  const Tokenizer& tok = qwen3_tokenizer();
  auto byte_id = [&](uint8_t b) {
    std::string ch;
    append_utf8(ch, byte_to_char(b));
    auto id = tok.token_to_id(ch);
    EXPECT_TRUE(id.has_value()) << int(b);
    return id.value_or(0);
  };
  // 中 = E4 B8 AD, split over three tokens.
  StreamDecoder sd(tok);
  EXPECT_EQ(sd.push(byte_id(0xE4)), "");
  EXPECT_EQ(sd.push(byte_id(0xB8)), "");
  EXPECT_EQ(sd.push(byte_id(0xAD)), "中");
  // A broken sequence becomes U+FFFD as soon as it can never complete.
  EXPECT_EQ(sd.push(byte_id(0xE4)), "");
  EXPECT_EQ(sd.push(tok.token_to_id("A").value()), "\xEF\xBF\xBD" "A");
  // An unfinished tail at the end becomes one U+FFFD.
  EXPECT_EQ(sd.push(byte_id(0xF0)), "");
  EXPECT_EQ(sd.push(byte_id(0x9F)), "");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(sd.flush(), "");
}

// Expected strings from Python: bytes.decode("utf-8", "replace").
TEST(TokenizerProps, InvalidUtf8BecomesReplacementChars) {
  const std::string R = "\xEF\xBF\xBD";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a\x80" "b", "a" + R + "b"},
      {"\xE2\x82", R},
      {"\xE2\x82" "A", R + "A"},
      {"\xF0\x80\x80", R + R + R},           // overlong: F0 needs 90..BF next
      {"\xED\xA0\x80", R + R + R},           // a surrogate
      {"\xC0\xAF", R + R},
      {"\xF4\x90\x80\x80", R + R + R + R},   // above U+10FFFF
      {"\xFF", R},
      {"\xF0\x9F\x98", R},                   // a truncated emoji is one U+FFFD
      {"\xE0\x80\x80", R + R + R},
      {"\xF0\x9F\x98\x80\x80", "\xF0\x9F\x98\x80" + R},
      {"ab\xC3", "ab" + R},
      {"\xC3\xA9\xA9", "\xC3\xA9" + R},
      {"\xE4\xB8\xAD\xE6\x96", "\xE4\xB8\xAD" + R},
  };
  for (const auto& [bad, expected] : cases) {
    std::string scratch;
    EXPECT_EQ(std::string(repair_utf8(bad, scratch)), expected);
    for (int t = 0; t < 3; ++t) {
      const Tokenizer& tok = *tokenizers()[t];
      auto ids = tok.encode(bad);
      EXPECT_EQ(ids, tok.encode(expected));
      EXPECT_EQ(tok.decode(ids), expected);
    }
  }
  // Decoding bytes that are not UTF-8 gives U+FFFD too (HF's errors="replace").
  const Tokenizer& q = qwen3_tokenizer();
  auto e4 = q.token_to_id("\xC3\xA4");  // byte-level 'ä' stands for byte E4
  ASSERT_TRUE(e4.has_value());
  std::vector<TokenId> ids = {*e4, q.token_to_id("A").value()};
  EXPECT_EQ(q.decode(ids), R + "A");
}

double seconds_to_encode(const Tokenizer& tok, const std::string& s, size_t& n_ids) {
  double best = 1e9;
  for (int rep = 0; rep < 2; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    n_ids = tok.encode(s).size();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

TEST(TokenizerProps, LongInputsAreNotQuadratic) {
  // One 1 MB piece goes through the heap merge: O(n log n), about 0.3-0.7 s here (a quadratic
  // merge or a per-match UTF-8 recheck of the subject would take hours). The bound is loose
  // for sanitizer builds; the 4x-size ratio (n log n: ~5 here, quadratic: 16) catches worse.
  const Tokenizer& tok = qwen3_tokenizer();
  std::mt19937_64 rng(3);
  auto letters = [&](size_t n) {
    std::string s;
    for (size_t k = 0; k < n; ++k) s.push_back(char('a' + rng() % 26));
    return s;
  };
  struct Input {
    const char* name;
    std::string small, big;
  };
  std::vector<Input> inputs = {
      {"letters without spaces", letters(256 << 10), letters(1 << 20)},
      {"one repeated character", std::string(256 << 10, 'a'), std::string(1 << 20, 'a')},
      {"spaces", std::string(256 << 10, ' '), std::string(1 << 20, ' ')},
  };
  for (const Input& in : inputs) {
    size_t n_small = 0, n_big = 0;
    double t_small = seconds_to_encode(tok, in.small, n_small);
    double t_big = seconds_to_encode(tok, in.big, n_big);
    std::printf("%s: 256 KB %.3f s, 1 MB %.3f s (%zu ids)\n", in.name, t_small, t_big, n_big);
    EXPECT_LT(t_big, 30.0) << in.name;
    EXPECT_LT(t_big / std::max(t_small, 1e-3), 12.0) << in.name << ": grows faster than n log n";
    EXPECT_GT(n_big, 0u);
  }
  // And the result is still right: a run of 'a' is made of the longest 'a' tokens.
  auto ids = tok.encode(std::string(1 << 20, 'a'));
  EXPECT_EQ(tok.decode(ids), std::string(1 << 20, 'a'));
}

// A tokenizer.json made from the tiny one plus added tokens with every option.
std::string with_added_tokens(const std::vector<nlohmann::json>& extra) {
  auto j = nlohmann::json::parse(tiny_json());
  for (const auto& t : extra) j["added_tokens"].push_back(t);
  return j.dump();
}

nlohmann::json added(int id, const std::string& content, bool special, bool lstrip, bool rstrip,
                     bool normalized, bool single_word) {
  return {{"id", id}, {"content", content}, {"special", special}, {"lstrip", lstrip}, {"rstrip", rstrip},
          {"normalized", normalized}, {"single_word", single_word}};
}

TEST(TokenizerProps, AddedTokenOptions) {
  Tokenizer tok = Tokenizer::from_json(with_added_tokens({
      added(2000, "<L>", true, true, false, false, false),    // lstrip
      added(2001, "<R>", true, false, true, false, false),    // rstrip
      added(2002, "ony", false, false, false, false, true),   // single_word
      added(2003, "\xC3\xA9t\xC3\xA9", false, false, false, true, false),  // normalized "été"
      added(2004, "\xC3\xA9" "a", false, false, false, false, false),      // raw "éa"
      added(2005, "<R><R>", true, false, false, false, false),             // longest match wins
  }));
  const Tokenizer& base = tiny_tokenizer();
  auto cat = [](std::vector<TokenId> a, const std::vector<TokenId>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  EXPECT_EQ(tok.vocab_size(), 2006u);
  // lstrip: the spaces before <L> belong to it.
  EXPECT_EQ(tok.encode("hi  <L>x"), cat(cat(base.encode("hi"), {2000}), base.encode("x")));
  // rstrip: the spaces after <R> belong to it.
  EXPECT_EQ(tok.encode("x<R> \t y"), cat(cat(base.encode("x"), {2001}), base.encode("y")));
  // The longest match at the leftmost position.
  EXPECT_EQ(tok.encode("<R><R>"), (std::vector<TokenId>{2005}));
  // single_word: not inside a word.
  EXPECT_EQ(tok.encode("Anthony"), base.encode("Anthony"));
  EXPECT_EQ(tok.encode("ony"), (std::vector<TokenId>{2002}));
  EXPECT_EQ(tok.encode("a ony."), cat(cat(base.encode("a "), {2002}), base.encode(".")));
  // normalized: matched after NFC, so the decomposed spelling matches too.
  EXPECT_EQ(tok.encode("\xC3\xA9t\xC3\xA9"), (std::vector<TokenId>{2003}));
  EXPECT_EQ(tok.encode("e\xCC\x81te\xCC\x81"), (std::vector<TokenId>{2003}));
  // not normalized: only the raw spelling matches.
  EXPECT_EQ(tok.encode("\xC3\xA9" "a"), (std::vector<TokenId>{2004}));
  EXPECT_NE(tok.encode("e\xCC\x81" "a"), (std::vector<TokenId>{2004}));
  // parse_special = false leaves special tokens as text but still matches the others.
  EXPECT_EQ(tok.encode("<L>", false), base.encode("<L>"));
  EXPECT_EQ(tok.encode("ony", false), (std::vector<TokenId>{2002}));
  EXPECT_TRUE(tok.is_special(2000));
  EXPECT_FALSE(tok.is_special(2002));
  EXPECT_EQ(tok.id_to_token(2003), "\xC3\xA9t\xC3\xA9");
  EXPECT_EQ(tok.token_to_id("<R><R>"), 2005);
}

TEST(TokenizerProps, ConcurrentEncodesAgree) {
  const Tokenizer& tok = qwen3_tokenizer();
  std::mt19937_64 rng(11);
  std::vector<std::string> texts;
  for (int k = 0; k < 40; ++k) texts.push_back(random_text(rng, 200));
  std::vector<std::vector<TokenId>> expected;
  for (const auto& s : texts) expected.push_back(tok.encode_reference(s));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 5; ++rep)
        for (size_t k = 0; k < texts.size(); ++k) mismatches[size_t(t)] += tok.encode(texts[k]) != expected[k];
    });
  }
  for (auto& th : threads) th.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

}  // namespace
}  // namespace dq::text::testing
