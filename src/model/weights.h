// The model's weights on a backend: matrices used in place (CPU) or uploaded once (CUDA);
// small vectors converted to fp32 at load (1 + w for HF's zero-centred norms, -exp(A_log)).
#pragma once
#include <vector>

#include "backend/backend.h"
#include "format/checkpoint.h"
#include "ops/ops.h"

namespace dq {

struct LayerWeights {
  LayerKind kind;
  Ref input_norm, post_norm;  // f32 [H], multipliers (1 + w already applied)
  // Gated DeltaNet
  Matrix qkv, z, b, a, out;
  Ref conv_w;   // f32 [C][K]
  Ref A_neg;    // f32 [Hv] = -exp(A_log)
  Ref dt_bias;  // f32 [Hv]
  Ref gdn_norm; // f32 [Dv]
  // gated attention
  Matrix q, k, v, o;
  Ref q_norm, k_norm;  // f32 [hd], (1 + w)
  // MLP
  Matrix gate, up, down;
};

struct ModelWeights {
  Matrix embed, head;
  Ref final_norm;
  std::vector<LayerWeights> layers;
  size_t matrix_bytes = 0;  // bytes of all weight matrices (the head counted once when tied)
};

ModelWeights load_weights(const Checkpoint& ck, Backend& backend);

}  // namespace dq
