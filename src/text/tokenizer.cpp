#include "text/tokenizer.h"

#include "core/error.h"
#include "core/mapped_file.h"
#include "text/nfc.h"
#include "text/tokenizer_impl.h"
#include "text/utf8.h"

namespace dq::text {
namespace {

// State of one encode call: regex match data per Split, the BPE encoder (cache), NFC scratch.
struct EncodeCall {
  const Tokenizer::Impl& t;
  std::vector<std::unique_ptr<RegexSplit::Scratch>> scratch;
  BpeModel::Encoder bpe;
  std::string nfc_buf;
  std::vector<TokenId>& out;

  EncodeCall(const Tokenizer::Impl& impl, std::vector<TokenId>& ids) : t(impl), bpe(impl.bpe), out(ids) {
    for (const RegexSplit& s : t.splits) scratch.push_back(std::make_unique<RegexSplit::Scratch>(s));
  }

  void pre_tokenize(size_t level, std::string_view s) {
    if (level == t.splits.size()) {
      bpe.encode(s, out);
      return;
    }
    t.splits[level].split(s, *scratch[level], [&](std::string_view piece) { pre_tokenize(level + 1, piece); });
  }

  void run(std::string_view text, bool parse_special) {
    auto push = [&](TokenId id) { out.push_back(id); };
    auto plain = [&](std::string_view segment) {
      std::string_view norm = t.nfc ? nfc(segment, nfc_buf) : segment;
      if (t.norm_matcher.empty()) {
        pre_tokenize(0, norm);
      } else {
        t.norm_matcher.split(norm, parse_special, [&](std::string_view s) { pre_tokenize(0, s); }, push);
      }
    };
    t.raw_matcher.split(text, parse_special, plain, push);
  }
};

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::string& path) {
  auto file = MappedFile::open(path);
  file->prefault();  // one madvise instead of ~300 page faults while parsing
  std::string_view text(reinterpret_cast<const char*>(file->data()), file->size());
  return from_json(text, path);
}

Tokenizer Tokenizer::from_json(std::string_view json, const std::string& file) {
  auto impl = std::make_unique<Impl>();
  impl->file = file;
  parse_tokenizer_json(json, *impl);
  return Tokenizer(std::move(impl));
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  std::string repaired;
  text = repair_utf8(text, repaired);
  EncodeCall call(*impl_, ids);
  call.run(text, parse_special);
  return ids;
}

std::vector<TokenId> Tokenizer::encode_reference(std::string_view text, bool parse_special) const {
  const Impl& t = *impl_;
  std::vector<TokenId> ids;
  std::string repaired;
  text = repair_utf8(text, repaired);
  std::vector<std::unique_ptr<RegexSplit::Scratch>> scratch;
  for (const RegexSplit& s : t.splits) scratch.push_back(std::make_unique<RegexSplit::Scratch>(s));
  auto push = [&](TokenId id) { ids.push_back(id); };
  auto pre_tokenize = [&](auto& self, size_t level, std::string_view s) -> void {
    if (level == t.splits.size()) {
      t.bpe.encode_reference(s, ids);
      return;
    }
    t.splits[level].split(s, *scratch[level], [&](std::string_view piece) { self(self, level + 1, piece); });
  };
  t.raw_matcher.split(text, parse_special, [&](std::string_view segment) {
    std::string norm = t.nfc ? nfc_reference(segment) : std::string(segment);
    t.norm_matcher.split(norm, parse_special, [&](std::string_view s) { pre_tokenize(pre_tokenize, 0, s); }, push);
  }, push);
  return ids;
}

std::string_view Tokenizer::token_bytes(TokenId id) const {
  const Impl& t = *impl_;
  if (id < 0 || size_t(id) >= t.vocab_size) return {};
  return std::string_view(t.decoded).substr(t.decoded_off[size_t(id)],
                                            t.decoded_off[size_t(id) + 1] - t.decoded_off[size_t(id)]);
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special) const {
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  for (TokenId id : ids) {
    if (skip_special && is_special(id)) continue;
    bytes.append(token_bytes(id));
  }
  std::string repaired;
  std::string_view fixed = repair_utf8(bytes, repaired);
  return fixed.data() == bytes.data() ? bytes : repaired;
}

size_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_ids.find(std::string(token)); it != impl_->added_ids.end()) return it->second;
  return impl_->bpe.find(token);
}

std::optional<std::string_view> Tokenizer::id_to_token(TokenId id) const {
  const Impl& t = *impl_;
  if (id < 0 || size_t(id) >= t.vocab_size || !(t.flags[size_t(id)] & Impl::kPresent)) return std::nullopt;
  if (auto it = t.added_index.find(id); it != t.added_index.end()) return std::string_view(t.added[it->second].content);
  return t.bpe.text(id);
}

bool Tokenizer::is_special(TokenId id) const {
  return id >= 0 && size_t(id) < impl_->vocab_size && (impl_->flags[size_t(id)] & Impl::kSpecial);
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }

std::vector<std::string> Tokenizer::split_patterns() const {
  std::vector<std::string> out;
  for (const RegexSplit& s : impl_->splits) out.push_back(s.pattern());
  return out;
}

bool Tokenizer::uses_nfc() const { return impl_->nfc; }

size_t Tokenizer::merge_count() const { return impl_->bpe.merge_count(); }

// ---- StreamDecoder ----------------------------------------------------------------------------

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tok_(&tokenizer), skip_special_(skip_special) {}

std::string StreamDecoder::push(TokenId id) {
  if (skip_special_ && tok_->is_special(id)) return {};
  pending_.append(tok_->token_bytes(id));
  size_t ready = pending_.size() - incomplete_utf8_tail(pending_);
  std::string out;
  append_repaired_utf8(std::string_view(pending_).substr(0, ready), out);
  pending_.erase(0, ready);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  append_repaired_utf8(pending_, out);
  pending_.clear();
  return out;
}

}  // namespace dq::text
