// config.json of a Qwen3.5 checkpoint: the text hyper-parameters (under "text_config" in the
// published VL wrapper, or flat), validated, plus the MLX "quantization" block.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dq {

enum class LayerKind { Linear, Full };  // Gated DeltaNet / gated full attention

struct QuantSpec {
  int group_size = 0;
  int bits = 0;
};

struct ModelConfig {
  std::string model_type;  // as written ("qwen3_5" / "qwen3_5_text")
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int lin_k_heads = 0, lin_v_heads = 0, lin_k_dim = 0, lin_v_dim = 0, conv_kernel = 0;
  float rms_eps = 1e-6f;
  double rope_theta = 1e7;
  double partial_rotary = 0.25;
  int rotary_dim = 0;
  int max_position = 0;
  std::vector<LayerKind> layers;
  std::optional<bool> tie_embeddings;  // as written; the checkpoint decides when absent
  std::vector<int> eos_ids;
  // MLX affine quantization ("quantization" block); overrides keyed by module path,
  // nullopt = "not quantized" (false in the file).
  std::optional<QuantSpec> quant;
  std::string quant_mode;
  std::map<std::string, std::optional<QuantSpec>> quant_overrides;

  int conv_dim() const { return 2 * lin_k_heads * lin_k_dim + lin_v_heads * lin_v_dim; }
  int n_linear() const;
  int n_full() const;
};

// Parses and validates; throws dq::Error "SOURCE: field: expected ..., got ..." on any problem.
ModelConfig parse_model_config(std::string_view json_text, const std::string& source);

}  // namespace dq
