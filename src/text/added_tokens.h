// Added tokens (special and not) are cut out of the text before the normalizer and the
// pre-tokenizer see it, the way HF's AddedVocabulary does: leftmost match first, longest among
// those starting there, then lstrip / rstrip / single_word adjust or reject the match.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dq::text {

using TokenId = int32_t;

struct AddedToken {
  std::string content;
  TokenId id = 0;
  bool special = false;
  bool lstrip = false;       // swallow the whitespace before the match
  bool rstrip = false;       // swallow the whitespace after the match
  bool normalized = false;   // matched in the NFC text instead of the raw text
  bool single_word = false;  // only when not inside a word
};

class AddedTokenMatcher {
 public:
  // Looks for `pattern` (the token's content, NFC'ed when it is a normalized token).
  void add(std::string_view pattern, const AddedToken& token);
  bool empty() const { return infos_.empty(); }

  // Cuts `text` into plain stretches, emit_text(string_view), and tokens, emit_token(id).
  // With parse_special false, special tokens are left in the text (HF's encode_special_tokens).
  template <class EmitText, class EmitToken>
  void split(std::string_view text, bool parse_special, EmitText&& emit_text,
             EmitToken&& emit_token) const {
    size_t done = 0, pos = 0;
    while (pos < text.size()) {
      if (!first_byte_[uint8_t(text[pos])]) {
        ++pos;
        continue;
      }
      int match_len = 0;
      int k = longest_match(text, pos, match_len);
      if (k < 0) {
        ++pos;
        continue;
      }
      size_t start = pos, stop = pos + size_t(match_len);
      pos = stop;  // the search resumes after the match even when it is rejected
      const Info& t = infos_[size_t(k)];
      if (t.special && !parse_special) continue;
      if (t.single_word && !is_single_word(text, start, stop)) continue;
      if (t.lstrip) start = std::max(strip_left(text, start), done);
      if (t.rstrip) pos = stop = strip_right(text, stop);
      if (start > done) emit_text(text.substr(done, start - done));
      emit_token(t.id);
      done = stop;
    }
    if (done < text.size()) emit_text(text.substr(done));
  }

 private:
  struct Info {
    TokenId id;
    bool special, lstrip, rstrip, single_word;
  };
  struct Node {
    int32_t info = -1;  // index into infos_ when a pattern ends here
    std::vector<std::pair<uint8_t, int32_t>> next;  // sorted by byte
  };
  int longest_match(std::string_view text, size_t pos, int& len) const;
  static bool is_single_word(std::string_view text, size_t start, size_t stop);
  static size_t strip_left(std::string_view text, size_t start);
  static size_t strip_right(std::string_view text, size_t stop);

  std::vector<Info> infos_;
  std::vector<Node> nodes_{1};  // a trie over bytes; node 0 is the root
  std::array<bool, 256> first_byte_{};
};

}  // namespace dq::text
