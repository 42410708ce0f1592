// Internal state of a Tokenizer (shared by tokenizer_json.cpp, which fills it, and
// tokenizer.cpp, which runs it).
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

#include "text/added_tokens.h"
#include "text/bpe.h"
#include "text/regex_split.h"
#include "text/tokenizer.h"

namespace dq::text {

struct Tokenizer::Impl {
  std::string file;
  bool nfc = false;
  std::vector<RegexSplit> splits;  // applied in order; ByteLevel's byte mapping is implicit
  BpeModel bpe;

  std::vector<AddedToken> added;  // in file order
  std::unordered_map<std::string, TokenId> added_ids;  // content -> id
  std::unordered_map<TokenId, size_t> added_index;     // id -> index in `added`
  AddedTokenMatcher raw_matcher;   // normalized == false: matched in the raw text
  AddedTokenMatcher norm_matcher;  // normalized == true: matched in the NFC text

  // Per id [vocab_size]: what decode emits, and flags.
  size_t vocab_size = 0;
  std::string decoded;                 // concatenated bytes
  std::vector<uint32_t> decoded_off;   // [vocab_size + 1]
  std::vector<uint8_t> flags;          // [vocab_size]
  static constexpr uint8_t kPresent = 1, kSpecial = 2, kAdded = 4;
};

// Parses tokenizer.json text into `impl` (throws dq::Error "<file>: <field>: ...").
void parse_tokenizer_json(std::string_view json, Tokenizer::Impl& impl);

}  // namespace dq::text
