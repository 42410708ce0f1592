// The tokenizer: HF tokenizer.json byte-level BPE (Qwen2 / Qwen3 / Qwen3.5), ids identical to HF
// tokenizers.
//
// encode: repair invalid UTF-8 (U+FFFD per maximal invalid subsequence) -> cut out added tokens
// (raw text) -> NFC -> cut out normalized added tokens -> Split regex (from the file) -> BPE per
// piece. No special tokens are added around the text (post_processor and truncation are not
// applied: the caller builds prompts, e.g. with the chat template).
// decode: ByteLevel decoder; bytes that are not valid UTF-8 become U+FFFD.
//
// A Tokenizer is immutable after loading; encode and decode may run concurrently.
#pragma once
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "text/added_tokens.h"

namespace dq::text {

class Tokenizer {
 public:
  // Loads tokenizer.json. Throws dq::Error naming the file and field on any problem.
  static Tokenizer load(const std::string& path);
  // The same from JSON text; `file` is the name used in error messages.
  static Tokenizer from_json(std::string_view json, const std::string& file = "tokenizer.json");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // parse_special = false: special added tokens in `text` are plain text (non-special added
  // tokens are still matched, as HF does with encode_special_tokens).
  std::vector<TokenId> encode(std::string_view text, bool parse_special = true) const;
  // Unknown ids are skipped; skip_special drops special added tokens.
  std::string decode(std::span<const TokenId> ids, bool skip_special = false) const;

  // Max id + 1 over the vocabulary and the added tokens.
  size_t vocab_size() const;
  std::optional<TokenId> token_to_id(std::string_view token) const;
  // The token as written in the file ("Ġthe", "<|im_end|>"); nullopt for unknown ids.
  std::optional<std::string_view> id_to_token(TokenId id) const;
  bool is_special(TokenId id) const;
  // The bytes decode() produces for this id (possibly part of a UTF-8 sequence).
  std::string_view token_bytes(TokenId id) const;
  const std::vector<AddedToken>& added_tokens() const;
  // The Split regexes in order, as written in the file.
  std::vector<std::string> split_patterns() const;
  bool uses_nfc() const;
  size_t merge_count() const;

  // The plain pipeline (utf8proc NFC on whole segments, O(n^2) BPE, no cache): the reference
  // the fast path is tested against.
  std::vector<TokenId> encode_reference(std::string_view text, bool parse_special = true) const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Incremental decoding for streaming output. push(id) returns the text that became complete;
// a UTF-8 sequence split across tokens is held back until its last byte arrives, so every
// returned string is valid UTF-8. Bytes that can never become valid are emitted as U+FFFD at
// once. The concatenation of all pushes and flush() equals decode() of all ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false);
  std::string push(TokenId id);
  // Emits what is held back (an unfinished sequence becomes U+FFFD) and resets.
  std::string flush();
  // Bytes held back (0..3).
  size_t pending() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace dq::text
