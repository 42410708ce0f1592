#include "text/model_text.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"

namespace dq::text {
namespace {

using nlohmann::json;

std::string show(const json& j) {
  if (j.is_object()) return "an object";
  if (j.is_array()) return "an array";
  std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 60 ? s.substr(0, 60) + "..." : s;
}

// A small JSON file, or nullopt when it does not exist.
std::optional<json> read_json(const std::string& path) {
  if (!file_exists(path)) return std::nullopt;
  std::string text = read_text_file(path);
  try {
    json j = json::parse(text);
    if (!j.is_object()) fail("{}: expected a JSON object at the top level, got {}", path, show(j));
    return j;
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", path, e.what());
  }
}

// eos_token_id: an int, a list of ints, or null.
void add_ids(const json& j, const std::string& file, const std::string& field, std::vector<TokenId>& out) {
  auto one = [&](const json& v, const std::string& where) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      fail("{}: {}: expected a non-negative integer token id, got {}", file, where, show(v));
    auto id = TokenId(v.get<int64_t>());
    if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  };
  if (j.is_null()) return;
  if (j.is_array()) {
    for (size_t k = 0; k < j.size(); ++k) one(j[k], fmt::format("{}[{}]", field, k));
  } else {
    one(j, field);
  }
}

// bos_token / eos_token / pad_token: a string, {"content": "..."} or null.
std::optional<std::string> token_string(const json& cfg, const char* key, const std::string& file) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
    fail("{}: {}.content: expected a string, got {}", file, key, c == it->end() ? "nothing" : show(*c));
  }
  fail("{}: {}: expected a string, {{\"content\": ...}} or null, got {}", file, key, show(*it));
}

bool get_flag(const json& obj, const char* key, bool fallback, const std::string& file,
              const std::string& field) {
  auto it = obj.find(key);
  if (it == obj.end()) return fallback;
  if (!it->is_boolean()) fail("{}: {}.{}: expected true or false, got {}", file, field, key, show(*it));
  return it->get<bool>();
}

}  // namespace

bool TextConfig::is_eos(TokenId id) const {
  return std::find(eos_ids.begin(), eos_ids.end(), id) != eos_ids.end();
}

TextConfig TextConfig::load(const std::string& folder) {
  TextConfig tc;
  tc.folder = folder;
  if (!is_directory(folder)) fail("{}: not a directory", folder);
  std::string tok_path = folder + "/tokenizer.json";
  if (!file_exists(tok_path)) fail("{}: tokenizer.json not found (needed for text)", folder);
  tc.tokenizer = std::make_shared<const Tokenizer>(Tokenizer::load(tok_path));
  const Tokenizer& tok = *tc.tokenizer;

  // generation_config.json and config.json: eos ids.
  std::string gen_path = folder + "/generation_config.json";
  if (auto gen = read_json(gen_path)) {
    if (auto it = gen->find("eos_token_id"); it != gen->end()) add_ids(*it, gen_path, "eos_token_id", tc.eos_ids);
  }
  std::string cfg_path = folder + "/config.json";
  if (auto cfg = read_json(cfg_path)) {
    if (auto it = cfg->find("eos_token_id"); it != cfg->end()) add_ids(*it, cfg_path, "eos_token_id", tc.eos_ids);
    if (auto tcfg = cfg->find("text_config"); tcfg != cfg->end() && !tcfg->is_null()) {
      if (!tcfg->is_object()) fail("{}: text_config: expected an object, got {}", cfg_path, show(*tcfg));
      if (auto it = tcfg->find("eos_token_id"); it != tcfg->end())
        add_ids(*it, cfg_path, "text_config.eos_token_id", tc.eos_ids);
    }
  }

  // tokenizer_config.json: token strings, template, added_tokens_decoder.
  std::string tcfg_path = folder + "/tokenizer_config.json";
  if (auto tcfg = read_json(tcfg_path)) {
    const json& c = *tcfg;
    if (auto it = c.find("added_tokens_decoder"); it != c.end() && !it->is_null()) {
      if (!it->is_object())
        fail("{}: added_tokens_decoder: expected an object, got {}", tcfg_path, show(*it));
      for (const auto& [key, value] : it->items()) {
        std::string field = fmt::format("added_tokens_decoder[\"{}\"]", key);
        char* end = nullptr;
        long long id = std::strtoll(key.c_str(), &end, 10);
        if (key.empty() || *end != '\0' || id < 0 || id > INT32_MAX)
          fail("{}: {}: the key must be a token id", tcfg_path, field);
        if (!value.is_object()) fail("{}: {}: expected an object, got {}", tcfg_path, field, show(value));
        auto content = value.find("content");
        if (content == value.end() || !content->is_string())
          fail("{}: {}.content: expected a string, got {}", tcfg_path, field,
               content == value.end() ? "nothing" : show(*content));
        AddedToken t;
        t.id = TokenId(id);
        t.content = content->get<std::string>();
        t.special = get_flag(value, "special", false, tcfg_path, field);
        t.lstrip = get_flag(value, "lstrip", false, tcfg_path, field);
        t.rstrip = get_flag(value, "rstrip", false, tcfg_path, field);
        t.normalized = get_flag(value, "normalized", !t.special, tcfg_path, field);
        t.single_word = get_flag(value, "single_word", false, tcfg_path, field);
        if (auto known = tok.id_to_token(t.id); known && *known != t.content)
          fail("{}: {}: content \"{}\" but tokenizer.json has \"{}\" for id {}", tcfg_path, field, t.content,
               *known, id);
        tc.added_tokens_decoder.push_back(std::move(t));
      }
    }
    tc.bos_token = token_string(c, "bos_token", tcfg_path);
    tc.eos_token = token_string(c, "eos_token", tcfg_path);
    tc.pad_token = token_string(c, "pad_token", tcfg_path);
    auto resolve = [&](const std::string& s, const char* key) -> TokenId {
      if (auto id = tok.token_to_id(s)) return *id;
      for (const AddedToken& t : tc.added_tokens_decoder)
        if (t.content == s) return t.id;
      fail("{}: {}: \"{}\" is not a token of tokenizer.json", tcfg_path, key, s);
    };
    if (tc.bos_token) tc.bos_id = resolve(*tc.bos_token, "bos_token");
    if (tc.eos_token) {
      TokenId id = resolve(*tc.eos_token, "eos_token");
      if (!tc.is_eos(id)) tc.eos_ids.push_back(id);
    }
    if (auto it = c.find("chat_template"); it != c.end() && !it->is_null()) {
      if (it->is_string()) {
        tc.chat_template = it->get<std::string>();
      } else if (it->is_array()) {
        for (size_t k = 0; k < it->size(); ++k) {
          const json& e = (*it)[k];
          auto name = e.is_object() ? e.find("name") : e.end();
          auto tmpl = e.is_object() ? e.find("template") : e.end();
          if (!e.is_object() || name == e.end() || !name->is_string() || tmpl == e.end() || !tmpl->is_string())
            fail("{}: chat_template[{}]: expected {{\"name\": string, \"template\": string}}, got {}", tcfg_path, k,
                 show(e));
          tc.named_chat_templates.emplace_back(name->get<std::string>(), tmpl->get<std::string>());
          if (name->get<std::string>() == "default") tc.chat_template = tmpl->get<std::string>();
        }
      } else {
        fail("{}: chat_template: expected a string or a list of {{name, template}}, got {}", tcfg_path, show(*it));
      }
    }
  }
  std::string jinja_path = folder + "/chat_template.jinja";
  if (file_exists(jinja_path)) tc.chat_template = read_text_file(jinja_path);
  return tc;
}

}  // namespace dq::text
