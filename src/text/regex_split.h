// The Split pre-tokenizer with behaviour "Isolated": every regex match is a piece, and so is
// every gap between matches. The regex comes from tokenizer.json (written for Oniguruma, which
// HF tokenizers uses) and runs on PCRE2 with UTF + UCP + JIT.
#pragma once
#include <memory>
#include <string>
#include <string_view>

namespace dq::text {

class RegexSplit {
 public:
  // Throws dq::Error "<file>: <field>: ..." when PCRE2 rejects the pattern.
  RegexSplit(std::string_view pattern, std::string_view file, std::string_view field);
  ~RegexSplit();
  RegexSplit(RegexSplit&&) noexcept;
  RegexSplit& operator=(RegexSplit&&) noexcept;

  // Per-call matching state (PCRE2 match data). One per thread; cheap to make.
  class Scratch {
   public:
    explicit Scratch(const RegexSplit& re);
    ~Scratch();
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;

   private:
    friend class RegexSplit;
    void* match_data_ = nullptr;  // pcre2_match_data*
    void* context_ = nullptr;     // pcre2_match_context*, made when the JIT stack runs out
    void* jit_stack_ = nullptr;   // pcre2_jit_stack*
  };

  // Calls emit(piece) for each non-empty piece of valid UTF-8 `text`, in order; the pieces
  // concatenate to `text`. The regex sees only `text` (lookarounds stop at its ends).
  template <class Emit>
  void split(std::string_view text, Scratch& scratch, Emit&& emit) const {
    size_t prev = 0, at = 0;
    size_t start, end;
    while (at < text.size() && find(text, at, scratch, start, end)) {
      start = start < prev ? prev : start;
      end = end < start ? start : end;
      if (start > prev) emit(text.substr(prev, start - prev));
      if (end > start) {
        emit(text.substr(start, end - start));
        at = end;
      } else {
        at = next_char(text, end);  // an empty match splits but does not advance
      }
      prev = end;
    }
    if (prev < text.size()) emit(text.substr(prev));
  }

  const std::string& pattern() const { return pattern_; }

 private:
  bool find(std::string_view text, size_t from, Scratch& scratch, size_t& start,
            size_t& end) const;
  static size_t next_char(std::string_view text, size_t i);

  std::string pattern_;  // as written in the file
  void* code_ = nullptr;  // pcre2_code*
  bool jit_ = false;
};

// Oniguruma's \s is Unicode White_Space; PCRE2's (with UCP) also takes U+180E. Rewrites \s and
// \S outside character classes, and \s inside them, to the explicit White_Space set.
std::string onig_to_pcre2(std::string_view pattern);

}  // namespace dq::text
