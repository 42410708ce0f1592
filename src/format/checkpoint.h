// A model folder: config.json + safetensors shards (through model.safetensors.index.json when
// present). The checkpoint rules of qwen35.md sections 2, 12 and 13 turn its tensors into plain
// references: which tensor is which weight, in which layout, quantized or not.
#pragma once
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "format/model_config.h"
#include "format/safetensors.h"

namespace dq {

enum class Layout { MLX, HF };  // MLX: language_model.model.*, conv [C,K,1], (1+w) baked in

// One stored weight matrix [rows, cols] (logical shape, as in PyTorch: [out, in]).
struct LinearRef {
  std::string module;  // e.g. "language_model.model.layers.0.mlp.gate_proj"
  int rows = 0, cols = 0;
  bool quantized = false;
  int bits = 0, group_size = 0;
  const TensorInfo* weight = nullptr;
  const TensorInfo* scales = nullptr;
  const TensorInfo* biases = nullptr;
  size_t bytes() const;
};

// A float vector; `add_one` marks HF's zero-centred norm weights (multiply by 1 + w).
struct VectorRef {
  const TensorInfo* t = nullptr;
  int n = 0;
  bool add_one = false;
};

// Depthwise conv weight, as [C][K] taps (HF [C,1,K], MLX [C,K,1]: same memory order).
struct ConvRef {
  const TensorInfo* t = nullptr;
  int channels = 0, kernel = 0;
};

struct LayerRefs {
  LayerKind kind = LayerKind::Linear;
  VectorRef input_norm, post_norm;
  // Gated DeltaNet
  LinearRef qkv, z, b, a, out;
  ConvRef conv;
  VectorRef A_log, dt_bias, gdn_norm;
  // gated attention
  LinearRef q, k, v, o;
  VectorRef q_norm, k_norm;
  // MLP
  LinearRef gate, up, down;
};

struct ModelRefs {
  LinearRef embed, head;  // head == embed when tied
  bool tied = true;
  VectorRef final_norm;
  std::vector<LayerRefs> layers;
};

class Checkpoint {
 public:
  // Opens and validates a model folder; throws dq::Error naming file, tensor or field.
  static Checkpoint open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  Layout layout() const { return layout_; }
  const std::string& prefix() const { return prefix_; }  // "language_model.model." etc.
  const ModelRefs& refs() const { return refs_; }
  const std::vector<std::shared_ptr<const SafetensorsFile>>& files() const { return files_; }
  const TensorInfo* find(const std::string& name) const;
  // Every tensor of the folder, and whether the model uses it.
  std::vector<std::pair<const TensorInfo*, bool>> all_tensors() const;
  size_t file_bytes() const;  // sum of shard sizes

 private:
  void resolve();
  std::string dir_;
  ModelConfig config_;
  Layout layout_ = Layout::MLX;
  std::string prefix_;
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::unordered_map<std::string, const TensorInfo*> tensors_;
  std::unordered_map<std::string, std::string> tensor_file_;  // name -> shard path
  std::unordered_map<const TensorInfo*, bool> used_;
  ModelRefs refs_;
};

}  // namespace dq
