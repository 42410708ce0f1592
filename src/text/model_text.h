// The text side of a model folder: tokenizer, stop tokens, chat template, special token strings.
//
// Reads (in the folder):
//   tokenizer.json          required
//   tokenizer_config.json   optional: chat_template (a string, or a list of {name, template}
//                           of which "default" is used), bos_token / eos_token / pad_token
//                           (a string or {"content": ...}), added_tokens_decoder
//   chat_template.jinja     optional: when present it replaces tokenizer_config's template
//                           (as in transformers)
//   generation_config.json  optional: eos_token_id (int or list)
//   config.json             optional: eos_token_id at the top level or in text_config
// Missing optional files are fine; malformed ones throw dq::Error naming the file and field.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "text/tokenizer.h"

namespace dq::text {

struct TextConfig {
  std::string folder;
  std::shared_ptr<const Tokenizer> tokenizer;

  // Every id any of the files names as end of sequence (generation_config, config.json,
  // text_config, tokenizer_config's eos_token), without duplicates, in that order. Generation
  // stops on any of them (Qwen3.5: <|im_end|> 248046 and <|endoftext|> 248044).
  std::vector<TokenId> eos_ids;

  std::string chat_template;  // empty when the folder has none
  // All named templates when tokenizer_config lists several ({name, template}).
  std::vector<std::pair<std::string, std::string>> named_chat_templates;

  std::optional<std::string> bos_token, eos_token, pad_token;
  std::optional<TokenId> bos_id;  // bos_token's id, when there is one

  // tokenizer_config.json's added_tokens_decoder (checked against tokenizer.json).
  std::vector<AddedToken> added_tokens_decoder;

  bool is_eos(TokenId id) const;

  static TextConfig load(const std::string& folder);
};

}  // namespace dq::text
