#include "format/model_config.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dq {

using json = nlohmann::json;

int ModelConfig::n_linear() const {
  int n = 0;
  for (LayerKind k : layers) n += k == LayerKind::Linear;
  return n;
}
int ModelConfig::n_full() const { return num_layers - n_linear(); }

namespace {

struct Reader {
  const std::string& src;
  const json& obj;
  std::string prefix;  // "text_config." or ""

  const json* find(const char* key) const {
    auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  std::string where(const char* key) const { return src + ": " + prefix + key; }

  int integer(const char* key, int lo, int hi, std::optional<int> def = std::nullopt) const {
    const json* v = find(key);
    if (!v) {
      if (def) return *def;
      fail("{}: missing (expected an integer in [{}, {}])", where(key), lo, hi);
    }
    if (!v->is_number_integer()) fail("{}: expected an integer, got {}", where(key), v->dump());
    int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) fail("{}: expected an integer in [{}, {}], got {}", where(key), lo, hi, x);
    return int(x);
  }
  double number(const char* key, double lo, double hi, std::optional<double> def = std::nullopt) const {
    const json* v = find(key);
    if (!v) {
      if (def) return *def;
      fail("{}: missing (expected a number)", where(key));
    }
    if (!v->is_number()) fail("{}: expected a number, got {}", where(key), v->dump());
    double x = v->get<double>();
    if (!(x >= lo && x <= hi)) fail("{}: expected a number in [{}, {}], got {}", where(key), lo, hi, x);
    return x;
  }
};

std::vector<int> read_ids(const json& v, const std::string& where) {
  std::vector<int> out;
  auto one = [&](const json& e) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > (1 << 30))
      fail("{}: expected a token id or a list of token ids, got {}", where, e.dump());
    out.push_back(int(e.get<int64_t>()));
  };
  if (v.is_array())
    for (const json& e : v) one(e);
  else
    one(v);
  return out;
}

QuantSpec read_quant(const json& q, const std::string& where) {
  if (!q.is_object()) fail("{}: expected an object with group_size and bits, got {}", where, q.dump());
  QuantSpec s;
  auto gs = q.find("group_size");
  auto bits = q.find("bits");
  if (gs == q.end() || !gs->is_number_integer() || gs->get<int64_t>() < 1 || gs->get<int64_t>() > 65536)
    fail("{}.group_size: expected a positive integer, got {}", where, gs == q.end() ? "nothing" : gs->dump());
  if (bits == q.end() || !bits->is_number_integer() || bits->get<int64_t>() < 1 || bits->get<int64_t>() > 32)
    fail("{}.bits: expected an integer in [1, 32], got {}", where, bits == q.end() ? "nothing" : bits->dump());
  s.group_size = int(gs->get<int64_t>());
  s.bits = int(bits->get<int64_t>());
  return s;
}

}  // namespace

ModelConfig parse_model_config(std::string_view text, const std::string& src) {
  json top;
  try {
    top = json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", src, e.what());
  }
  if (!top.is_object()) fail("{}: expected a JSON object, got {}", src, top.type_name());

  const json* tc = &top;
  std::string prefix;
  if (auto it = top.find("text_config"); it != top.end()) {
    if (!it->is_object()) fail("{}: text_config: expected an object, got {}", src, it->type_name());
    tc = &*it;
    prefix = "text_config.";
  }
  ModelConfig c;
  Reader r{src, *tc, prefix};

  // Architecture: qwen3_5 (VL wrapper) / qwen3_5_text.
  std::string mt;
  if (auto it = tc->find("model_type"); it != tc->end() && it->is_string()) mt = it->get<std::string>();
  else if (auto it2 = top.find("model_type"); it2 != top.end() && it2->is_string()) mt = it2->get<std::string>();
  if (mt.empty()) fail("{}: model_type: missing (expected \"qwen3_5\" or \"qwen3_5_text\")", src);
  if (mt != "qwen3_5" && mt != "qwen3_5_text")
    fail("{}: model_type: deltaq runs \"qwen3_5\" / \"qwen3_5_text\" models, got \"{}\"", src, mt);
  c.model_type = mt;

  c.vocab_size = r.integer("vocab_size", 1, 1 << 24);
  c.hidden_size = r.integer("hidden_size", 8, 1 << 16);
  c.intermediate_size = r.integer("intermediate_size", 8, 1 << 18);
  c.num_layers = r.integer("num_hidden_layers", 1, 1024);
  c.num_heads = r.integer("num_attention_heads", 1, 1024);
  c.num_kv_heads = r.integer("num_key_value_heads", 1, 1024);
  c.head_dim = r.integer("head_dim", 2, 512, c.hidden_size / c.num_heads);
  c.lin_k_heads = r.integer("linear_num_key_heads", 1, 1024);
  c.lin_v_heads = r.integer("linear_num_value_heads", 1, 1024);
  c.lin_k_dim = r.integer("linear_key_head_dim", 1, 256);
  c.lin_v_dim = r.integer("linear_value_head_dim", 1, 256);
  c.conv_kernel = r.integer("linear_conv_kernel_dim", 1, 16);
  c.rms_eps = float(r.number("rms_norm_eps", 0.0, 1.0, 1e-6));
  c.max_position = r.integer("max_position_embeddings", 1, 1 << 24, 262144);

  // Rotary parameters: rope_parameters {rope_theta, partial_rotary_factor, rope_type}, or flat.
  const json* rp = r.find("rope_parameters");
  if (!rp) rp = r.find("rope_scaling");
  if (rp && !rp->is_object()) fail("{}: {}rope_parameters: expected an object, got {}", src, prefix, rp->dump());
  Reader rr{src, rp ? *rp : json::object(), prefix + "rope_parameters."};
  c.rope_theta = rp && rr.find("rope_theta") ? rr.number("rope_theta", 1.0, 1e12) : r.number("rope_theta", 1.0, 1e12, 1e7);
  c.partial_rotary = rp && rr.find("partial_rotary_factor") ? rr.number("partial_rotary_factor", 0.0, 1.0)
                                                             : r.number("partial_rotary_factor", 0.0, 1.0, 0.25);
  if (rp) {
    if (const json* rt = rr.find("rope_type"); rt && !(rt->is_string() && (*rt == "default" || *rt == "mrope")))
      fail("{}: {}rope_parameters.rope_type: only \"default\" rotary embeddings are supported, got {}", src, prefix,
           rt->dump());
  }
  c.rotary_dim = int(std::floor(c.head_dim * c.partial_rotary));
  if (c.rotary_dim % 2) c.rotary_dim -= 1;

  if (c.num_heads % c.num_kv_heads)
    fail("{}: {}num_attention_heads ({}) must be a multiple of num_key_value_heads ({})", src, prefix, c.num_heads,
         c.num_kv_heads);
  if (c.lin_v_heads % c.lin_k_heads)
    fail("{}: {}linear_num_value_heads ({}) must be a multiple of linear_num_key_heads ({})", src, prefix,
         c.lin_v_heads, c.lin_k_heads);
  if (c.hidden_size % 8 || c.intermediate_size % 8 || (c.num_heads * c.head_dim) % 8 ||
      (c.lin_v_heads * c.lin_v_dim) % 8)
    fail("{}: {}: hidden_size, intermediate_size and the attention widths must be multiples of 8", src, prefix);

  if (const json* at = r.find("attn_output_gate"); at && !(at->is_boolean() && at->get<bool>()))
    fail("{}: {}attn_output_gate: deltaq implements the gated attention of Qwen3.5 (true), got {}", src, prefix,
         at->dump());

  // Layer pattern: layer_types, or every full_attention_interval-th layer.
  if (const json* lt = r.find("layer_types")) {
    if (!lt->is_array() || int(lt->size()) != c.num_layers)
      fail("{}: {}layer_types: expected a list of {} entries (num_hidden_layers), got {}", src, prefix, c.num_layers,
           lt->is_array() ? std::to_string(lt->size()) + " entries" : lt->dump());
    for (size_t i = 0; i < lt->size(); ++i) {
      const json& e = (*lt)[i];
      if (e == "linear_attention") c.layers.push_back(LayerKind::Linear);
      else if (e == "full_attention") c.layers.push_back(LayerKind::Full);
      else
        fail("{}: {}layer_types[{}]: expected \"linear_attention\" or \"full_attention\", got {}", src, prefix, i,
             e.dump());
    }
  } else {
    int interval = r.integer("full_attention_interval", 1, 1024, 4);
    for (int i = 0; i < c.num_layers; ++i)
      c.layers.push_back((i + 1) % interval == 0 ? LayerKind::Full : LayerKind::Linear);
  }

  for (const json* o : {tc, static_cast<const json*>(&top)}) {
    auto it = o->find("tie_word_embeddings");
    if (it != o->end() && !it->is_null()) {
      if (!it->is_boolean())
        fail("{}: {}tie_word_embeddings: expected true or false, got {}", src, o == tc ? prefix : "", it->dump());
      c.tie_embeddings = it->get<bool>();
      break;
    }
  }
  for (const json* o : {static_cast<const json*>(&top), tc}) {
    auto it = o->find("eos_token_id");
    if (it != o->end() && !it->is_null()) {
      for (int id : read_ids(*it, src + ": " + (o == tc ? prefix : std::string()) + "eos_token_id"))
        if (std::find(c.eos_ids.begin(), c.eos_ids.end(), id) == c.eos_ids.end()) c.eos_ids.push_back(id);
    }
  }

  // MLX quantization block (top level). Keys other than group_size/bits/mode are per-module overrides.
  const json* q = nullptr;
  if (auto it = top.find("quantization"); it != top.end() && !it->is_null()) q = &*it;
  else if (auto it2 = top.find("quantization_config"); it2 != top.end() && !it2->is_null()) q = &*it2;
  if (q) {
    if (!q->is_object()) fail("{}: quantization: expected an object, got {}", src, q->dump());
    if (q->contains("quant_method"))
      fail("{}: quantization_config: quant_method {} is not supported (deltaq reads MLX affine checkpoints)", src,
           (*q)["quant_method"].dump());
    c.quant = read_quant(*q, src + ": quantization");
    if (auto m = q->find("mode"); m != q->end()) {
      if (!m->is_string() || *m != "affine")
        fail("{}: quantization.mode: only \"affine\" is supported, got {}", src, m->dump());
      c.quant_mode = "affine";
    }
    for (auto it = q->begin(); it != q->end(); ++it) {
      const std::string& k = it.key();
      if (k == "group_size" || k == "bits" || k == "mode") continue;
      if (it->is_boolean() && !it->get<bool>()) c.quant_overrides[k] = std::nullopt;
      else if (it->is_object()) c.quant_overrides[k] = read_quant(*it, src + ": quantization[\"" + k + "\"]");
      else fail("{}: quantization[\"{}\"]: expected false or {{group_size, bits}}, got {}", src, k, it->dump());
    }
  }
  return c;
}

}  // namespace dq
