// Random 4-bit affine matrices (MLX layout, group 64, bf16 scales that are sometimes negative)
// for the microbenchmarks, uploaded to any backend.
#pragma once
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
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

// The weight products of one Qwen3.5-2B decode step: 187 products in 97 stages (a stage is the
// products that share one input), lm_head included.
struct Stage {
  std::vector<Matrix> mats;
  int in;  // input length
};
constexpr int k2bHidden = 2048, k2bInter = 6144, k2bVocab = 248320;

inline std::vector<Stage> qwen35_2b_step(Backend& be, std::mt19937_64& rng) {
  const int H = k2bHidden, I = k2bInter, C = 6144, VD = 2048, QG = 4096, KV = 512;
  std::vector<Stage> stages;
  // The layers' matrices in the backend's layout for products, as the engine loads them
  // (model/weights.cpp); the head keeps the checkpoint's.
  auto random_q4 = [&be](Backend&, int rows, int cols, std::mt19937_64& r) {
    return be.product_matrix(bench::random_q4(be, rows, cols, r));
  };
  for (int l = 0; l < 24; ++l) {
    if ((l + 1) % 4) {  // Gated DeltaNet layer
      stages.push_back({{random_q4(be, C, H, rng), random_q4(be, VD, H, rng), random_q4(be, 16, H, rng),
                         random_q4(be, 16, H, rng)}, H});
      stages.push_back({{random_q4(be, H, VD, rng)}, VD});
    } else {  // full attention layer
      stages.push_back({{random_q4(be, QG, H, rng), random_q4(be, KV, H, rng), random_q4(be, KV, H, rng)}, H});
      stages.push_back({{random_q4(be, H, QG / 2, rng)}, QG / 2});
    }
    stages.push_back({{random_q4(be, I, H, rng), random_q4(be, I, H, rng)}, H});
    stages.push_back({{random_q4(be, H, I, rng)}, I});
  }
  stages.push_back({{bench::random_q4(be, k2bVocab, H, rng)}, H});
  return stages;
}

}  // namespace dq::bench
