// deltaq make-model: a checkpoint with random weights in the real MLX 4-bit layout, at the
// shapes of a Qwen3.5 size, so that benchmarks at real sizes need no download.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "app/cli_common.h"
#include "core/error.h"
#include "format/safetensors.h"
#include "model/family_shapes.h"

namespace dq::app {

namespace {

const FamilyShape& shape_of(const std::string& like) {
  if (const FamilyShape* s = family_shape(like)) return *s;
  fail("--like: unknown size '{}' (expected qwen3.5-0.8b, qwen3.5-2b, qwen3.5-4b, qwen3.5-9b or tiny)", like);
}

// splitmix64: fast, seeded, reproducible.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }
  double normal() {
    double u = uniform() + 1e-300, v = uniform();
    return std::sqrt(-2 * std::log(u)) * std::cos(6.283185307179586 * v);
  }
};

struct Blob {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

void bf16s(std::vector<uint8_t>& out, const std::vector<float>& v) {
  out.resize(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t h = f32_to_bf16(v[i]);
    std::memcpy(&out[2 * i], &h, 2);
  }
}

// A 4-bit affine matrix whose dequantized weights have roughly standard deviation `std`.
void quantized(std::vector<Blob>& out, Rng& rng, const std::string& module, int rows, int cols, double std_dev) {
  const int gs = 64, G = cols / gs;
  Blob w{module + ".weight", DType::U32, {rows, cols / 8}, std::vector<uint8_t>(size_t(rows) * cols / 2)};
  for (size_t i = 0; i < w.bytes.size(); i += 8) {
    uint64_t r = rng.next();
    std::memcpy(&w.bytes[i], &r, std::min<size_t>(8, w.bytes.size() - i));
  }
  std::vector<float> s(size_t(rows) * G), b(s.size());
  const double step = std_dev / 4.6;  // uniform q in 0..15 has std 4.6
  for (size_t i = 0; i < s.size(); ++i) {
    double sc = step * (0.75 + 0.5 * rng.uniform()) * (rng.next() & 1 ? -1.0 : 1.0);  // MLX scales can be negative
    s[i] = float(sc);
    b[i] = float(-7.5 * sc);
  }
  Blob sb{module + ".scales", DType::BF16, {rows, G}, {}}, bb{module + ".biases", DType::BF16, {rows, G}, {}};
  bf16s(sb.bytes, s);
  bf16s(bb.bytes, b);
  out.push_back(std::move(w));
  out.push_back(std::move(sb));
  out.push_back(std::move(bb));
}

void vector_bf16(std::vector<Blob>& out, Rng& rng, const std::string& name, std::vector<int64_t> shape, double mean,
                 double std_dev) {
  size_t n = 1;
  for (auto d : shape) n *= size_t(d);
  std::vector<float> v(n);
  for (auto& e : v) e = float(mean + std_dev * rng.normal());
  Blob bl{name, DType::BF16, shape, {}};
  bf16s(bl.bytes, v);
  out.push_back(std::move(bl));
}

}  // namespace

Command add_make_model(CLI::App& app) {
  auto* cmd = app.add_subcommand("make-model", "write a random-weight checkpoint (MLX 4-bit layout) at a real size");
  auto like = std::make_shared<std::string>();
  auto seed = std::make_shared<uint64_t>(1);
  auto outdir = std::make_shared<std::string>();
  cmd->add_option("--like", *like, "qwen3.5-0.8b, qwen3.5-2b, qwen3.5-4b, qwen3.5-9b or tiny")->required();
  cmd->add_option("--seed", *seed, "random seed");
  cmd->add_option("-o,--out", *outdir, "output folder")->required();
  return {cmd, [like, seed, outdir]() {
            const FamilyShape& sh = shape_of(*like);
            Rng rng{*seed * 0x2545F4914F6CDD1Dull + 12345};
            std::filesystem::create_directories(*outdir);
            const std::string P = "language_model.model.";
            const int C = 2 * sh.lk_heads * sh.lk_dim + sh.lv_heads * sh.lv_dim, VD = sh.lv_heads * sh.lv_dim;
            std::vector<Blob> t;
            quantized(t, rng, P + "embed_tokens", sh.vocab, sh.hidden, 0.5);
            if (!sh.tied) quantized(t, rng, "language_model.lm_head", sh.vocab, sh.hidden, 1.0 / std::sqrt(sh.hidden));
            vector_bf16(t, rng, P + "norm.weight", {sh.hidden}, 1.0, 0.1);
            nlohmann::json layer_types = nlohmann::json::array();
            for (int i = 0; i < sh.layers; ++i) {
              const bool full = (i + 1) % 4 == 0;
              layer_types.push_back(full ? "full_attention" : "linear_attention");
              const std::string p = P + "layers." + std::to_string(i) + ".";
              const double sH = 1.0 / std::sqrt(sh.hidden);
              vector_bf16(t, rng, p + "input_layernorm.weight", {sh.hidden}, 1.0, 0.1);
              vector_bf16(t, rng, p + "post_attention_layernorm.weight", {sh.hidden}, 1.0, 0.1);
              if (!full) {
                const std::string a = p + "linear_attn.";
                quantized(t, rng, a + "in_proj_qkv", C, sh.hidden, sH);
                quantized(t, rng, a + "in_proj_z", VD, sh.hidden, sH);
                quantized(t, rng, a + "in_proj_b", sh.lv_heads, sh.hidden, sH);
                quantized(t, rng, a + "in_proj_a", sh.lv_heads, sh.hidden, sH);
                quantized(t, rng, a + "out_proj", sh.hidden, VD, 1.0 / std::sqrt(VD));
                vector_bf16(t, rng, a + "conv1d.weight", {C, 4, 1}, 0.0, 0.4);
                vector_bf16(t, rng, a + "dt_bias", {sh.lv_heads}, 0.0, 0.5);
                vector_bf16(t, rng, a + "norm.weight", {sh.lv_dim}, 1.0, 0.1);
                std::vector<float> A(sh.lv_heads);
                for (auto& e : A) e = float(std::log(1.0 + 15.0 * rng.uniform()));
                Blob ab{a + "A_log", DType::F32, {sh.lv_heads}, std::vector<uint8_t>(A.size() * 4)};
                std::memcpy(ab.bytes.data(), A.data(), ab.bytes.size());
                t.push_back(std::move(ab));
              } else {
                const std::string a = p + "self_attn.";
                quantized(t, rng, a + "q_proj", 2 * sh.heads * sh.head_dim, sh.hidden, sH);
                quantized(t, rng, a + "k_proj", sh.kv_heads * sh.head_dim, sh.hidden, sH);
                quantized(t, rng, a + "v_proj", sh.kv_heads * sh.head_dim, sh.hidden, sH);
                quantized(t, rng, a + "o_proj", sh.hidden, sh.heads * sh.head_dim, 1.0 / std::sqrt(sh.heads * sh.head_dim));
                vector_bf16(t, rng, a + "q_norm.weight", {sh.head_dim}, 1.0, 0.1);
                vector_bf16(t, rng, a + "k_norm.weight", {sh.head_dim}, 1.0, 0.1);
              }
              quantized(t, rng, p + "mlp.gate_proj", sh.inter, sh.hidden, sH);
              quantized(t, rng, p + "mlp.up_proj", sh.inter, sh.hidden, sH);
              quantized(t, rng, p + "mlp.down_proj", sh.hidden, sh.inter, 1.0 / std::sqrt(sh.inter));
            }
            std::sort(t.begin(), t.end(), [](const Blob& a, const Blob& b) { return a.name < b.name; });
            std::vector<TensorToWrite> w;
            nlohmann::json wm = nlohmann::json::object();
            size_t total = 0;
            for (const Blob& b : t) {
              w.push_back({b.name, b.dtype, b.shape, b.bytes.data(), b.bytes.size()});
              wm[b.name] = "model.safetensors";
              total += b.bytes.size();
            }
            write_safetensors(*outdir + "/model.safetensors", w, {{"format", "mlx"}});
            nlohmann::json q = {{"group_size", 64}, {"bits", 4}, {"mode", "affine"}};
            nlohmann::json tc = {
                {"model_type", "qwen3_5_text"}, {"vocab_size", sh.vocab}, {"hidden_size", sh.hidden},
                {"intermediate_size", sh.inter}, {"num_hidden_layers", sh.layers}, {"num_attention_heads", sh.heads},
                {"num_key_value_heads", sh.kv_heads}, {"head_dim", sh.head_dim}, {"linear_num_key_heads", sh.lk_heads},
                {"linear_num_value_heads", sh.lv_heads}, {"linear_key_head_dim", sh.lk_dim},
                {"linear_value_head_dim", sh.lv_dim}, {"linear_conv_kernel_dim", 4}, {"rms_norm_eps", 1e-6},
                {"max_position_embeddings", 262144}, {"tie_word_embeddings", sh.tied}, {"layer_types", layer_types},
                {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.25}}},
                {"full_attention_interval", 4}, {"attn_output_gate", true}, {"hidden_act", "silu"},
                {"eos_token_id", sh.vocab > 248046 ? 248044 : sh.vocab - 1}, {"dtype", "bfloat16"}};
            nlohmann::json cfg = {{"architectures", {"Qwen3_5ForConditionalGeneration"}}, {"model_type", "qwen3_5"},
                                  {"text_config", tc}, {"tie_word_embeddings", sh.tied},
                                  {"eos_token_id", sh.vocab > 248046 ? nlohmann::json{248046, 248044} : nlohmann::json{sh.vocab - 1}},
                                  {"quantization", q},
                                  {"quantization_config", q}, {"deltaq_random_weights", {{"like", *like}, {"seed", *seed}}}};
            std::ofstream(*outdir + "/config.json") << cfg.dump(2) << "\n";
            std::ofstream(*outdir + "/model.safetensors.index.json")
                << nlohmann::json{{"metadata", {{"total_size", total}}}, {"weight_map", wm}}.dump(2) << "\n";
            std::printf("wrote %s: %s shapes, random weights (seed %llu), %.3f GB\n", outdir->c_str(), like->c_str(),
                        (unsigned long long)*seed, total / 1e9);
            return 0;
          }};
}

}  // namespace dq::app
