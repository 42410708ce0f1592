#include "format/checkpoint.h"

#include <dirent.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/mapped_file.h"

namespace dq {

using json = nlohmann::json;

size_t LinearRef::bytes() const {
  size_t n = weight ? weight->nbytes : 0;
  if (scales) n += scales->nbytes;
  if (biases) n += biases->nbytes;
  return n;
}

namespace {

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) out.push_back(e->d_name);
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

bool is_float_dtype(DType t) { return t == DType::BF16 || t == DType::F16 || t == DType::F32; }

std::string shape_of(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& dir_in) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (!is_directory(dir)) fail("{}: not a directory (expected a model folder with config.json and safetensors)", dir);
  const std::string cfg_path = dir + "/config.json";
  if (!file_exists(cfg_path)) fail("{}: not a model folder: no config.json", dir);
  Checkpoint ck;
  ck.dir_ = dir;
  ck.config_ = parse_model_config(read_text_file(cfg_path), cfg_path);

  // Shards: through the index when there is one, else model.safetensors, else model*.safetensors.
  std::vector<std::string> shards;
  std::vector<std::pair<std::string, std::string>> index_map;  // tensor -> shard
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (file_exists(index_path)) {
    json idx;
    try {
      idx = json::parse(read_text_file(index_path));
    } catch (const json::exception& e) {
      fail("{}: not valid JSON: {}", index_path, e.what());
    }
    if (!idx.is_object() || !idx.contains("weight_map") || !idx["weight_map"].is_object())
      fail("{}: weight_map: missing (expected an object mapping tensor names to shard files)", index_path);
    std::set<std::string> seen;
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
      if (!it->is_string()) fail("{}: weight_map[\"{}\"]: expected a file name, got {}", index_path, it.key(), it->dump());
      std::string f = it->get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
        fail("{}: weight_map[\"{}\"]: \"{}\" is not a file name inside the model folder", index_path, it.key(), f);
      index_map.emplace_back(it.key(), f);
      if (seen.insert(f).second) shards.push_back(f);
    }
    if (shards.empty()) fail("{}: weight_map is empty", index_path);
  } else if (file_exists(dir + "/model.safetensors")) {
    shards.push_back("model.safetensors");
  } else {
    for (const std::string& f : list_dir(dir))
      if (f.rfind("model", 0) == 0 && ends_with(f, ".safetensors")) shards.push_back(f);
    if (shards.empty()) fail("{}: not a model folder: no model.safetensors, model*.safetensors or index", dir);
  }
  for (const std::string& f : shards) {
    std::string path = dir + "/" + f;
    if (!file_exists(path)) fail("{}: shard '{}' named by the index does not exist", dir, f);
    ck.files_.push_back(SafetensorsFile::open(path));
    for (const TensorInfo& t : ck.files_.back()->tensors()) {
      auto [it, fresh] = ck.tensors_.emplace(t.name, &t);
      if (!fresh)
        fail("{}: tensor '{}' appears in two shards ({} and {})", dir, t.name, ck.tensor_file_[t.name], path);
      ck.tensor_file_[t.name] = path;
    }
  }
  for (const auto& [name, f] : index_map) {
    auto it = ck.tensor_file_.find(name);
    if (it == ck.tensor_file_.end() || it->second != dir + "/" + f)
      fail("{}: weight_map says tensor '{}' is in '{}', but that file has no such tensor", index_path, name, f);
  }

  // Layout from the key prefix.
  const char* prefixes[][2] = {{"language_model.model.", "mlx"}, {"model.language_model.", "hf"}, {"model.", "hf"}};
  for (auto& p : prefixes)
    if (ck.find(std::string(p[0]) + "embed_tokens.weight")) {
      ck.prefix_ = p[0];
      ck.layout_ = std::string(p[1]) == "mlx" ? Layout::MLX : Layout::HF;
      break;
    }
  if (ck.prefix_.empty())
    fail("{}: cannot find the token embedding (none of language_model.model.embed_tokens.weight, "
         "model.language_model.embed_tokens.weight, model.embed_tokens.weight)",
         dir);
  ck.resolve();
  return ck;
}

const TensorInfo* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second;
}

size_t Checkpoint::file_bytes() const {
  size_t n = 0;
  for (const auto& f : files_) {
    for (const auto& t : f->tensors()) n += t.nbytes;
  }
  return n;
}

std::vector<std::pair<const TensorInfo*, bool>> Checkpoint::all_tensors() const {
  std::vector<std::pair<const TensorInfo*, bool>> out;
  for (const auto& f : files_)
    for (const auto& t : f->tensors()) out.emplace_back(&t, used_.count(&t) > 0);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first->name < b.first->name; });
  return out;
}

void Checkpoint::resolve() {
  const ModelConfig& c = config_;
  const bool mlx = layout_ == Layout::MLX;

  auto file_of = [&](const TensorInfo* t) { return tensor_file_.at(t->name); };
  auto need = [&](const std::string& name, const std::string& role) -> const TensorInfo* {
    const TensorInfo* t = find(name);
    if (!t) fail("{}: missing tensor '{}' ({})", dir_, name, role);
    used_[t] = true;
    return t;
  };

  auto linear = [&](const std::string& module, int rows, int cols, const std::string& role) {
    LinearRef r;
    r.module = module;
    r.rows = rows;
    r.cols = cols;
    r.weight = need(module + ".weight", role);
    const TensorInfo* w = r.weight;
    const std::string wf = file_of(w);
    if (const TensorInfo* s = find(module + ".scales")) {
      r.quantized = true;
      r.scales = s;
      used_[s] = true;
      r.biases = need(module + ".biases", role + ", quantized: scales and biases go together");
      // Expected quantization: the config block, with per-module overrides.
      std::optional<QuantSpec> spec = c.quant;
      bool overridden = false;
      for (const std::string& key : {module, module.substr(module.find('.') + 1)}) {
        auto it = c.quant_overrides.find(key);
        if (it != c.quant_overrides.end()) {
          spec = it->second;
          overridden = true;
          break;
        }
      }
      if (!spec)
        fail("{}: tensor '{}.scales' says {} is quantized, but config.json {}", wf, module, module,
             overridden ? "marks this module as not quantized" : "has no \"quantization\" block");
      if (w->dtype != DType::U32)
        fail("{}: tensor '{}': quantized weights must be U32, got {}", wf, w->name, dtype_name(w->dtype));
      if (w->shape.size() != 2 || w->shape[0] != rows)
        fail("{}: tensor '{}': expected shape [{}, {}*bits/32] for a quantized [{}, {}] matrix, got {}", wf, w->name,
             rows, cols, rows, cols, w->shape_str());
      if ((w->shape[1] * 32) % cols != 0)
        fail("{}: tensor '{}': {} words per row do not hold {} whole values (bits = 32*{}/{})", wf, w->name,
             w->shape[1], cols, w->shape[1], cols);
      r.bits = int(w->shape[1] * 32 / cols);
      if (r.bits != spec->bits)
        fail("{}: tensor '{}': shape {} means {}-bit values for {} inputs, but config.json says bits = {}", wf,
             w->name, w->shape_str(), r.bits, cols, spec->bits);
      if (r.bits != 4 && r.bits != 8)
        fail("{}: tensor '{}': {}-bit quantization is not supported (deltaq runs 4- and 8-bit affine)", wf, w->name,
             r.bits);
      if (!is_float_dtype(s->dtype))
        fail("{}: tensor '{}': scales must be BF16, F16 or F32, got {}", file_of(s), s->name, dtype_name(s->dtype));
      if (s->shape.size() != 2 || s->shape[0] != rows || s->shape[1] < 1 || cols % s->shape[1] != 0)
        fail("{}: tensor '{}': expected shape [{}, {}/group_size], got {}", file_of(s), s->name, rows, cols,
             s->shape_str());
      r.group_size = int(cols / s->shape[1]);
      if (r.group_size != spec->group_size)
        fail("{}: tensor '{}': shape {} means group size {} for {} inputs, but config.json says group_size = {}",
             file_of(s), s->name, s->shape_str(), r.group_size, cols, spec->group_size);
      if (r.group_size % 8)
        fail("{}: tensor '{}': group size {} is not a multiple of 8", file_of(s), s->name, r.group_size);
      const TensorInfo* b = r.biases;
      if (b->dtype != s->dtype || b->shape != s->shape)
        fail("{}: tensor '{}': expected {} {} like its scales, got {} {}", file_of(b), b->name,
             dtype_name(s->dtype), s->shape_str(), dtype_name(b->dtype), b->shape_str());
    } else {
      if (!is_float_dtype(w->dtype))
        fail("{}: tensor '{}': expected BF16, F16 or F32 weights (or U32 with .scales/.biases), got {}", wf,
             w->name, dtype_name(w->dtype));
      if (w->shape != std::vector<int64_t>{rows, cols})
        fail("{}: tensor '{}': expected shape [{}, {}], got {}", wf, w->name, rows, cols, w->shape_str());
      if (cols % 8) fail("{}: tensor '{}': {} inputs is not a multiple of 8", wf, w->name, cols);
    }
    return r;
  };

  auto vec = [&](const std::string& name, int n, bool zero_centred, const std::string& role) {
    VectorRef v;
    v.t = need(name, role);
    v.n = n;
    v.add_one = zero_centred && !mlx;  // MLX bakes 1 + w in; HF stores w
    if (!is_float_dtype(v.t->dtype))
      fail("{}: tensor '{}': expected BF16, F16 or F32, got {}", file_of(v.t), name, dtype_name(v.t->dtype));
    if (v.t->shape != std::vector<int64_t>{n})
      fail("{}: tensor '{}': expected shape [{}], got {}", file_of(v.t), name, n, v.t->shape_str());
    return v;
  };

  const std::string& P = prefix_;
  const int H = c.hidden_size;
  refs_.embed = linear(P + "embed_tokens", c.vocab_size, H, "token embedding");
  refs_.final_norm = vec(P + "norm.weight", H, true, "final norm");

  // Head: tied to the embedding unless the config unties it or an lm_head is present.
  const std::string head_module = mlx ? "language_model.lm_head" : (P == "model." ? "lm_head" : "lm_head");
  const bool has_head = find(head_module + ".weight") != nullptr;
  if (c.tie_embeddings.value_or(!has_head)) {
    refs_.tied = true;
    refs_.head = refs_.embed;
  } else {
    if (!has_head)
      fail("{}: config.json sets tie_word_embeddings = false but tensor '{}.weight' is missing", dir_, head_module);
    refs_.tied = false;
    refs_.head = linear(head_module, c.vocab_size, H, "output head");
  }

  const int C = c.conv_dim(), VD = c.lin_v_heads * c.lin_v_dim, QD = c.num_heads * c.head_dim,
            KD = c.num_kv_heads * c.head_dim, I = c.intermediate_size;
  for (int i = 0; i < c.num_layers; ++i) {
    LayerRefs l;
    l.kind = c.layers[i];
    const std::string p = P + "layers." + std::to_string(i) + ".";
    const std::string what = "layer " + std::to_string(i);
    l.input_norm = vec(p + "input_layernorm.weight", H, true, what + " input norm");
    l.post_norm = vec(p + "post_attention_layernorm.weight", H, true, what + " post-attention norm");
    if (l.kind == LayerKind::Linear) {
      const std::string a = p + "linear_attn.";
      const std::string w = what + " (linear attention)";
      l.qkv = linear(a + "in_proj_qkv", C, H, w);
      l.z = linear(a + "in_proj_z", VD, H, w);
      l.b = linear(a + "in_proj_b", c.lin_v_heads, H, w);
      l.a = linear(a + "in_proj_a", c.lin_v_heads, H, w);
      l.out = linear(a + "out_proj", H, VD, w);
      l.A_log = vec(a + "A_log", c.lin_v_heads, false, w);
      l.dt_bias = vec(a + "dt_bias", c.lin_v_heads, false, w);
      l.gdn_norm = vec(a + "norm.weight", c.lin_v_dim, false, w);
      l.conv.t = need(a + "conv1d.weight", w);
      l.conv.channels = C;
      l.conv.kernel = c.conv_kernel;
      const TensorInfo* cv = l.conv.t;
      std::vector<int64_t> want = mlx ? std::vector<int64_t>{C, c.conv_kernel, 1} : std::vector<int64_t>{C, 1, c.conv_kernel};
      if (cv->shape != want)
        fail("{}: tensor '{}': expected shape {} ({} layout), got {}", file_of(cv), cv->name, shape_of(want),
             mlx ? "MLX [C, K, 1]" : "HF [C, 1, K]", cv->shape_str());
      if (!is_float_dtype(cv->dtype))
        fail("{}: tensor '{}': expected BF16, F16 or F32, got {}", file_of(cv), cv->name, dtype_name(cv->dtype));
    } else {
      const std::string a = p + "self_attn.";
      const std::string w = what + " (full attention)";
      l.q = linear(a + "q_proj", 2 * QD, H, w);
      l.k = linear(a + "k_proj", KD, H, w);
      l.v = linear(a + "v_proj", KD, H, w);
      l.o = linear(a + "o_proj", H, QD, w);
      l.q_norm = vec(a + "q_norm.weight", c.head_dim, true, w);
      l.k_norm = vec(a + "k_norm.weight", c.head_dim, true, w);
    }
    l.gate = linear(p + "mlp.gate_proj", I, H, what + " MLP");
    l.up = linear(p + "mlp.up_proj", I, H, what + " MLP");
    l.down = linear(p + "mlp.down_proj", H, I, what + " MLP");
    if (l.gate.quantized != l.up.quantized || l.gate.group_size != l.up.group_size ||
        l.gate.weight->dtype != l.up.weight->dtype)
      fail("{}: layer {}: mlp.gate_proj and mlp.up_proj must be stored alike (they share one fused product)", dir_, i);
    refs_.layers.push_back(std::move(l));
  }
}

}  // namespace dq
