// Reading tokenizer.json. The big tables (model.vocab, model.merges) are streamed with the
// JsonReader straight into the BPE tables; the small subtrees (normalizer, pre_tokenizer,
// decoder) are handed to nlohmann. Every error names the file and the field.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <deque>
#include <optional>
#include <unordered_map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/byte_level.h"
#include "text/json_reader.h"
#include "text/nfc.h"
#include "text/tokenizer_impl.h"

namespace dq::text {
namespace {

using nlohmann::json;

constexpr int64_t kMaxId = (int64_t(1) << 24) - 1;  // 16.7 M ids: far above any real vocabulary

// GPT-2's split, used by a ByteLevel pre-tokenizer with use_regex = true.
constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string show_str(std::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < 60; ++i) {
    auto c = uint8_t(s[i]);
    if (c < 0x20)
      out += fmt::format("\\x{:02x}", c);
    else
      out.push_back(char(c));
  }
  return out + (s.size() > 60 ? "...\"" : "\"");
}

std::string show(const json& j) {
  if (j.is_object()) return "an object";
  if (j.is_array()) return "an array";
  std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 60 ? s.substr(0, 60) + "..." : s;
}

struct Loader {
  Tokenizer::Impl& impl;
  JsonReader r;
  const std::string& file;

  // Deferred until the vocabulary is complete (the file may list merges first).
  struct Merge {
    std::string_view left, right;
  };
  std::vector<Merge> merges;
  std::deque<std::string> owned;  // unescaped strings that do not live in the file text
  std::string_view text_begin;

  Loader(std::string_view text, Tokenizer::Impl& i)
      : impl(i), r(text, i.file), file(i.file), text_begin(text) {
    impl.bpe.reserve(text.size());
    merges.reserve(text.size() / 16);  // a merge takes at least 16 bytes of JSON
  }

  [[noreturn]] void fail_at(std::string_view field, std::string_view what) const {
    fail("{}: {}: {}", file, field, what);
  }

  // A view that stays valid: the reader's views into its scratch buffer are copied.
  std::string_view keep(std::string_view s) {
    if (s.data() >= text_begin.data() && s.data() + s.size() <= text_begin.data() + text_begin.size())
      return s;
    return owned.emplace_back(s);
  }

  json subtree(std::string_view field) {
    std::string_view raw = r.skip_value();
    try {
      return json::parse(raw);
    } catch (const json::exception& e) {
      fail_at(field, fmt::format("unreadable JSON value: {}", e.what()));
    }
  }

  // ---- top level ----------------------------------------------------------------------------
  json normalizer, pre_tokenizer, decoder;
  bool have_model = false, have_normalizer = false, have_pre_tokenizer = false, have_decoder = false;
  std::string model_type;
  bool have_vocab = false, have_merges = false, vocab_done = false;
  std::vector<AddedToken> added;

  void run() {
    r.begin_object("top level");
    std::string_view key;
    while (r.next_key(key)) {
      if (key == "model") {
        have_model = true;
        read_model();
      } else if (key == "added_tokens") {
        read_added_tokens();
      } else if (key == "normalizer") {
        have_normalizer = true;
        normalizer = subtree("normalizer");
      } else if (key == "pre_tokenizer") {
        have_pre_tokenizer = true;
        pre_tokenizer = subtree("pre_tokenizer");
      } else if (key == "decoder") {
        have_decoder = true;
        decoder = subtree("decoder");
      } else {
        r.skip_value();  // version, truncation, padding, post_processor: not used for encode
      }
    }
    r.finish();
    if (!have_model) fail_at("model", "missing");
    if (model_type.empty()) fail_at("model.type", "missing");
    if (model_type != "BPE") fail_at("model.type", fmt::format("expected \"BPE\", got {}", show_str(model_type)));
    if (!have_vocab) fail_at("model.vocab", "missing");
    resolve_merges();
    setup_normalizer();
    setup_pre_tokenizer();
    setup_decoder();
    setup_added_tokens();
  }

  // ---- model ------------------------------------------------------------------------------------
  void read_model() {
    r.begin_object("model");
    std::string_view key;
    std::string unk_token;
    bool has_unk = false, fuse_unk = false, ignore_merges = false;
    while (r.next_key(key)) {
      if (key == "type") {
        model_type = std::string(r.read_string("model.type"));
        if (model_type.empty()) model_type = "\"\"";
      } else if (key == "vocab") {
        if (have_vocab) fail_at("model.vocab", "appears twice");
        read_vocab();
        have_vocab = true;
      } else if (key == "merges") {
        if (have_merges) fail_at("model.merges", "appears twice");
        have_merges = true;
        read_merges();
      } else if (key == "unk_token") {
        if (!r.read_null()) {
          unk_token = std::string(r.read_string("model.unk_token"));
          has_unk = true;
        }
      } else if (key == "fuse_unk") {
        fuse_unk = r.read_null() ? false : r.read_bool("model.fuse_unk");
      } else if (key == "ignore_merges") {
        ignore_merges = r.read_null() ? false : r.read_bool("model.ignore_merges");
      } else if (key == "byte_fallback") {
        if (!r.read_null() && r.read_bool("model.byte_fallback"))
          fail_at("model.byte_fallback", "true is not supported (byte-level BPE needs no byte fallback)");
      } else if (key == "dropout") {
        if (!r.read_null()) {
          if (r.peek() != JsonReader::Kind::Number) r.fail_type("model.dropout", "null or a number");
          std::string raw(r.skip_value());
          if (std::strtod(raw.c_str(), nullptr) != 0.0)
            fail_at("model.dropout", fmt::format("{} is not supported (only null or 0: encoding must be deterministic)", raw));
        }
      } else if (key == "continuing_subword_prefix" || key == "end_of_word_suffix") {
        std::string field = fmt::format("model.{}", key);
        if (!r.read_null()) {
          std::string_view v = r.read_string(field);
          if (!v.empty()) fail_at(field, fmt::format("{} is not supported (only null or \"\")", show_str(v)));
        }
      } else {
        r.skip_value();
      }
    }
    pending_unk = has_unk ? std::optional<std::string>(unk_token) : std::nullopt;
    pending_fuse_unk = fuse_unk;
    pending_ignore_merges = ignore_merges;
  }
  std::optional<std::string> pending_unk;
  bool pending_fuse_unk = false, pending_ignore_merges = false;
  std::vector<uint8_t> id_seen;

  void read_vocab() {
    r.begin_object("model.vocab");
    std::string_view key;
    while (r.next_key(key)) {
      int64_t id;
      if (!r.try_read_index(id) || id > kMaxId) {
        id = r.read_integer(fmt::format("model.vocab[{}]", show_str(key)), 0, kMaxId);
      }
      if (size_t(id) >= id_seen.size()) id_seen.resize(std::max(size_t(id) + 1, id_seen.size() * 2), 0);
      if (id_seen[size_t(id)])
        fail_at(fmt::format("model.vocab[{}]", show_str(key)), fmt::format("id {} is used by another token too", id));
      id_seen[size_t(id)] = 1;
      impl.bpe.add_token(key, TokenId(id));
    }
  }

  // With the vocabulary already read (the usual order), merges are resolved while parsing;
  // otherwise they are kept and resolved at the end.
  void read_merges() {
    bool stream = have_vocab;
    if (stream) finish_vocab();
    auto add = [&](std::string_view a, std::string_view b) {
      if (stream)
        pipeline.push(a, b);
      else
        merges.push_back({a, b});
    };
    r.begin_array("model.merges");
    size_t index = 0;
    auto expected = [&] {
      r.fail_type(fmt::format("model.merges[{}]", index), "\"a b\" or [\"a\",\"b\"]");
    };
    while (r.next_element()) {
      auto kind = r.peek();
      if (kind == JsonReader::Kind::String) {
        std::string_view s = r.read_string("model.merges");
        size_t sp = s.find(' ');
        if (sp == std::string_view::npos || sp == 0 || sp + 1 == s.size() ||
            s.find(' ', sp + 1) != std::string_view::npos) {
          fail_at(fmt::format("model.merges[{}]", index),
                  fmt::format("expected \"a b\" (two tokens and one space), got {}", show_str(s)));
        }
        s = keep(s);
        add(s.substr(0, sp), s.substr(sp + 1));
      } else if (kind == JsonReader::Kind::Array) {
        auto field = [&] { return fmt::format("model.merges[{}]", index); };
        r.begin_array("model.merges");
        std::string_view parts[2];
        for (auto& p : parts) {
          if (!r.next_element()) fail_at(field(), "expected [\"a\",\"b\"], got fewer than 2 items");
          if (r.peek() != JsonReader::Kind::String) expected();
          p = keep(r.read_string("model.merges"));
        }
        if (r.next_element()) fail_at(field(), "expected [\"a\",\"b\"], got more than 2 items");
        add(parts[0], parts[1]);
      } else {
        expected();
      }
      ++index;
    }
    if (stream) pipeline.drain();
  }

  void finish_vocab() {
    if (vocab_done) return;
    vocab_done = true;
    std::string duplicate;
    if (!impl.bpe.finish_vocab(duplicate))
      fail_at("model.vocab", fmt::format("the token {} appears twice", show_str(duplicate)));
  }

  // Resolves merges to ids. Lookups run kAhead merges behind the hashing so that the table
  // slots are prefetched (the table is far bigger than the caches). The merged token is
  // usually the id after the previous one (BPE training appends it), which is checked by
  // comparing texts before falling back to a lookup.
  struct MergePipeline {
    static constexpr size_t kAhead = 16;
    Loader& L;
    struct Slot {
      std::string_view left, right;
      uint64_t hl = 0, hr = 0;
    } ring[kAhead];
    size_t count = 0, done = 0;
    TokenId guess = -1;
    std::string both;

    explicit MergePipeline(Loader& l) : L(l) {}

    void push(std::string_view a, std::string_view b) {
      if (count - done == kAhead) resolve();
      Slot& s = ring[count % kAhead];
      s = {a, b, BpeModel::hash(a), BpeModel::hash(b)};
      L.impl.bpe.prefetch(s.hl);
      L.impl.bpe.prefetch(s.hr);
      ++count;
    }
    void drain() {
      while (done < count) resolve();
    }
    void resolve() {
      const BpeModel& bpe = L.impl.bpe;
      const Slot& s = ring[done % kAhead];
      auto a = bpe.find(s.left, s.hl);
      auto b = bpe.find(s.right, s.hr);
      both.assign(s.left).append(s.right);
      std::optional<TokenId> ab;
      if (auto t = bpe.text(guess + 1); t && *t == both)
        ab = guess + 1;
      else
        ab = bpe.find(both);
      if (!a || !b || !ab) {
        std::string_view missing = !a ? s.left : !b ? s.right : std::string_view(both);
        L.fail_at(fmt::format("model.merges[{}]", done),
                  fmt::format("{}token {} is not in model.vocab", ab || !a || !b ? "" : "the merged ",
                              show_str(missing)));
      }
      guess = *ab;
      L.impl.bpe.add_merge(*a, *b, *ab);
      ++done;
    }
  };
  MergePipeline pipeline{*this};

  void resolve_merges() {
    finish_vocab();
    BpeModel& bpe = impl.bpe;
    for (const Merge& m : merges) pipeline.push(m.left, m.right);
    pipeline.drain();
    TokenId unk = -1;
    if (pending_unk) {
      auto id = bpe.find(*pending_unk);
      if (!id) fail_at("model.unk_token", fmt::format("{} is not in model.vocab", show_str(*pending_unk)));
      unk = *id;
    }
    bpe.finish(pending_ignore_merges, unk, pending_fuse_unk);
  }

  // ---- added tokens ------------------------------------------------------------------------------
  void read_added_tokens() {
    if (r.read_null()) return;
    r.begin_array("added_tokens");
    size_t index = 0;
    while (r.next_element()) {
      std::string field = fmt::format("added_tokens[{}]", index);
      r.begin_object(field);
      AddedToken t;
      bool has_id = false, has_content = false, has_normalized = false;
      std::string_view key;
      while (r.next_key(key)) {
        std::string sub = fmt::format("{}.{}", field, key);
        if (key == "id") {
          t.id = TokenId(r.read_integer(sub, 0, kMaxId));
          has_id = true;
        } else if (key == "content") {
          t.content = std::string(r.read_string(sub));
          has_content = true;
        } else if (key == "special") {
          t.special = r.read_bool(sub);
        } else if (key == "lstrip") {
          t.lstrip = r.read_bool(sub);
        } else if (key == "rstrip") {
          t.rstrip = r.read_bool(sub);
        } else if (key == "single_word") {
          t.single_word = r.read_bool(sub);
        } else if (key == "normalized") {
          t.normalized = r.read_bool(sub);
          has_normalized = true;
        } else {
          r.skip_value();
        }
      }
      if (!has_id) fail_at(field + ".id", "missing");
      if (!has_content) fail_at(field + ".content", "missing");
      if (t.content.empty()) fail_at(field + ".content", "must not be empty");
      if (!has_normalized) t.normalized = !t.special;  // HF's default
      added.push_back(std::move(t));
      ++index;
    }
  }

  void setup_added_tokens() {
    BpeModel& bpe = impl.bpe;
    size_t vocab_size = bpe.id_limit();
    for (const AddedToken& t : added) vocab_size = std::max(vocab_size, size_t(t.id) + 1);
    impl.vocab_size = vocab_size;
    impl.flags.assign(vocab_size, 0);
    std::unordered_map<TokenId, const AddedToken*> by_id;
    for (size_t k = 0; k < added.size(); ++k) {
      const AddedToken& t = added[k];
      std::string field = fmt::format("added_tokens[{}]", k);
      if (auto in_vocab = bpe.find(t.content); in_vocab && *in_vocab != t.id)
        fail_at(field, fmt::format("{} has id {} in model.vocab, not {}", show_str(t.content), *in_vocab, t.id));
      if (auto text = bpe.text(t.id); text && *text != t.content)
        fail_at(field, fmt::format("id {} is {} in model.vocab, not {}", t.id, show_str(*text), show_str(t.content)));
      if (auto it = by_id.find(t.id); it != by_id.end()) {
        const AddedToken* other = it->second;
        if (other->content != t.content)
          fail_at(field, fmt::format("id {} is also used by the added token {}", t.id, show_str(other->content)));
        continue;  // the same token twice
      }
      if (auto [it, fresh] = impl.added_ids.emplace(t.content, t.id); !fresh)
        fail_at(field, fmt::format("{} is also added with id {}", show_str(t.content), it->second));
      by_id[t.id] = &t;
      impl.added_index[t.id] = impl.added.size();
      impl.added.push_back(t);
    }
    for (const AddedToken& t : impl.added) {
      if (t.normalized) {
        std::string scratch;
        std::string pattern(impl.nfc ? nfc(t.content, scratch) : std::string_view(t.content));
        impl.norm_matcher.add(pattern, t);
      } else {
        impl.raw_matcher.add(t.content, t);
      }
    }
    // What decode emits per id: the ByteLevel decoder's view of the token text.
    impl.decoded_off.assign(vocab_size + 1, 0);
    impl.decoded.reserve(size_t(text_begin.size()) / 2);
    for (const AddedToken& t : impl.added) impl.flags[size_t(t.id)] |= Tokenizer::Impl::kAdded;
    for (size_t id = 0; id < vocab_size; ++id) {
      impl.decoded_off[id] = uint32_t(impl.decoded.size());
      std::optional<std::string_view> text;
      if (impl.flags[id] & Tokenizer::Impl::kAdded) {
        const AddedToken* t = by_id.at(TokenId(id));
        text = t->content;
        if (t->special) impl.flags[id] |= Tokenizer::Impl::kSpecial;
      } else {
        text = bpe.text(TokenId(id));
      }
      if (!text) continue;
      impl.flags[id] |= Tokenizer::Impl::kPresent;
      byte_level_decode(*text, impl.decoded);
    }
    impl.decoded_off[vocab_size] = uint32_t(impl.decoded.size());
  }

  // ---- normalizer / pre-tokenizer / decoder ------------------------------------------------------
  static std::string type_of(const json& j) {
    auto it = j.find("type");
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  }

  void setup_normalizer() {
    if (!have_normalizer || normalizer.is_null()) return;
    add_normalizer(normalizer, "normalizer");
  }

  void add_normalizer(const json& j, const std::string& field) {
    if (!j.is_object()) fail_at(field, fmt::format("expected an object or null, got {}", show(j)));
    std::string type = type_of(j);
    if (type == "NFC") {
      impl.nfc = true;
    } else if (type == "Sequence") {
      auto it = j.find("normalizers");
      if (it == j.end() || !it->is_array())
        fail_at(field + ".normalizers", "expected an array");
      for (size_t k = 0; k < it->size(); ++k) add_normalizer((*it)[k], fmt::format("{}.normalizers[{}]", field, k));
    } else {
      fail_at(field + ".type", fmt::format("{} is not supported (expected \"NFC\" or a null normalizer)",
                                            type.empty() ? "a missing type" : show_str(type)));
    }
  }

  bool saw_byte_level = false;

  void setup_pre_tokenizer() {
    if (!have_pre_tokenizer || pre_tokenizer.is_null())
      fail_at("pre_tokenizer", "missing; a byte-level BPE needs a ByteLevel pre-tokenizer");
    add_pre_tokenizer(pre_tokenizer, "pre_tokenizer");
    if (!saw_byte_level) fail_at("pre_tokenizer", "has no ByteLevel step (byte-level BPE expected)");
  }

  static bool get_bool(const json& j, const char* key, bool fallback, const std::string& field,
                       const Loader& self) {
    auto it = j.find(key);
    if (it == j.end()) return fallback;
    if (!it->is_boolean()) self.fail_at(field + "." + key, fmt::format("expected true or false, got {}", show(*it)));
    return it->get<bool>();
  }

  void add_pre_tokenizer(const json& j, const std::string& field) {
    if (!j.is_object()) fail_at(field, fmt::format("expected an object, got {}", show(j)));
    std::string type = type_of(j);
    if (saw_byte_level) fail_at(field, "steps after ByteLevel are not supported");
    if (type == "Sequence") {
      auto it = j.find("pretokenizers");
      if (it == j.end() || !it->is_array()) fail_at(field + ".pretokenizers", "expected an array");
      for (size_t k = 0; k < it->size(); ++k)
        add_pre_tokenizer((*it)[k], fmt::format("{}.pretokenizers[{}]", field, k));
    } else if (type == "Split") {
      auto behavior = j.find("behavior");
      if (behavior == j.end() || !behavior->is_string() || behavior->get<std::string>() != "Isolated") {
        fail_at(field + ".behavior", fmt::format("expected \"Isolated\", got {}",
                                                 behavior == j.end() ? "nothing" : show(*behavior)));
      }
      if (get_bool(j, "invert", false, field, *this)) fail_at(field + ".invert", "true is not supported");
      auto pattern = j.find("pattern");
      if (pattern == j.end() || !pattern->is_object())
        fail_at(field + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
      if (auto re = pattern->find("Regex"); re != pattern->end()) {
        if (!re->is_string()) fail_at(field + ".pattern.Regex", fmt::format("expected a string, got {}", show(*re)));
        impl.splits.emplace_back(re->get<std::string>(), file, field + ".pattern.Regex");
      } else if (auto lit = pattern->find("String"); lit != pattern->end()) {
        if (!lit->is_string()) fail_at(field + ".pattern.String", fmt::format("expected a string, got {}", show(*lit)));
        std::string escaped;
        for (char c : lit->get<std::string>()) {
          if (uint8_t(c) < 0x80 && !std::isalnum(uint8_t(c))) escaped.push_back('\\');
          escaped.push_back(c);
        }
        if (escaped.empty()) fail_at(field + ".pattern.String", "must not be empty");
        impl.splits.emplace_back(escaped, file, field + ".pattern.String");
      } else {
        fail_at(field + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
      }
    } else if (type == "ByteLevel") {
      if (!j.contains("add_prefix_space")) fail_at(field + ".add_prefix_space", "missing");
      if (get_bool(j, "add_prefix_space", false, field, *this))
        fail_at(field + ".add_prefix_space", "true is not supported");
      if (get_bool(j, "use_regex", true, field, *this))
        impl.splits.emplace_back(kGpt2Regex, file, field + " (GPT-2 regex)");
      saw_byte_level = true;
    } else {
      fail_at(field + ".type", fmt::format("{} is not supported (expected Sequence, Split or ByteLevel)",
                                            type.empty() ? "a missing type" : show_str(type)));
    }
  }

  void setup_decoder() {
    if (!have_decoder || decoder.is_null()) fail_at("decoder", "missing; expected a ByteLevel decoder");
    if (!decoder.is_object()) fail_at("decoder", fmt::format("expected an object, got {}", show(decoder)));
    std::string type = type_of(decoder);
    if (type != "ByteLevel")
      fail_at("decoder.type", fmt::format("{} is not supported (expected \"ByteLevel\")",
                                          type.empty() ? "a missing type" : show_str(type)));
  }
};

}  // namespace

void parse_tokenizer_json(std::string_view json_text, Tokenizer::Impl& impl) {
  Loader loader(json_text, impl);
  loader.run();
}

}  // namespace dq::text
