// Random 4-bit affine matrices (MLX layout, group 64, bf16 scales that are sometimes negative)
// for the microbenchmarks, uploaded to any backend.
#pragma once
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "model/family_shapes.h"
#include "ops/ops.h"

namespace dq::bench {

inline Matrix random_q4(Backend& be, int rows, int cols, std::mt19937_64& rng) {
  Matrix m;
  m.format = WFormat::Affine;
  m.rows = rows;
  m.cols = cols;
  m.bits = 4;
  m.group_size = 64;
  m.scale_dtype = DType::BF16;
  std::vector<uint64_t> w(size_t(rows) * cols / 16);
  for (auto& v : w) v = rng();
  std::vector<uint16_t> s(size_t(rows) * cols / 64), b(s.size());
  for (size_t g = 0; g < s.size(); ++g) {
    float sc = 0.004f * float(int(rng() % 100) + 50) / 100.f * (rng() & 1 ? -1.f : 1.f);
    s[g] = f32_to_bf16(sc);
    b[g] = f32_to_bf16(-7.5f * sc);
  }
  m.w = be.upload(w.data(), w.size() * 8, "w");
  m.scales = be.upload(s.data(), s.size() * 2, "s");
  m.biases = be.upload(b.data(), b.size() * 2, "b");
  return m;
}

// The weight products of one Qwen3.5 decode step (2B: 187 products in 97 stages; a stage is the
// products that share one input), lm_head included.
struct Stage {
  std::vector<Matrix> mats;
  int in;  // input length
};
constexpr int k2bHidden = 2048, k2bInter = 6144, k2bVocab = 248320;

// One size of the family (model/family_shapes.h).
inline std::vector<Stage> qwen35_step(Backend& be, std::mt19937_64& rng, const FamilyShape& s) {
  const int H = s.hidden, I = s.inter, C = 2 * s.lk_heads * s.lk_dim + s.lv_heads * s.lv_dim,
            VD = s.lv_heads * s.lv_dim, QG = 2 * s.heads * s.head_dim, KV = s.kv_heads * s.head_dim;
  std::vector<Stage> stages;
  // The layers' matrices in the backend's layout for products, as the engine loads them
  // (model/weights.cpp); the head keeps the checkpoint's.
  auto random_q4 = [&be](Backend&, int rows, int cols, std::mt19937_64& r) {
    return be.product_matrix(bench::random_q4(be, rows, cols, r));
  };
  for (int l = 0; l < s.layers; ++l) {
    if ((l + 1) % 4) {  // Gated DeltaNet layer
      stages.push_back({{random_q4(be, C, H, rng), random_q4(be, VD, H, rng), random_q4(be, s.lv_heads, H, rng),
                         random_q4(be, s.lv_heads, H, rng)}, H});
      stages.push_back({{random_q4(be, H, VD, rng)}, VD});
    } else {  // full attention layer
      stages.push_back({{random_q4(be, QG, H, rng), random_q4(be, KV, H, rng), random_q4(be, KV, H, rng)}, H});
      stages.push_back({{random_q4(be, H, QG / 2, rng)}, QG / 2});
    }
    stages.push_back({{random_q4(be, I, H, rng), random_q4(be, I, H, rng)}, H});
    stages.push_back({{random_q4(be, H, I, rng)}, I});
  }
  stages.push_back({{bench::random_q4(be, s.vocab, H, rng)}, H});
  return stages;
}

inline std::vector<Stage> qwen35_2b_step(Backend& be, std::mt19937_64& rng) {
  return qwen35_step(be, rng, *family_shape("qwen3.5-2b"));
}

}  // namespace dq::bench
