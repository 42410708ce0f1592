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

}  // namespace dq::bench
