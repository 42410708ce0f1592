// x prepared for the SIMD 4-bit rows (kernels_avx512.cpp, kernels_avx2.cpp): per unit the exact
// integers of ops/numerics.h quantize_unit, split into signed-byte limbs, in blocks of L units
// (L = the vector's 32-bit lanes). A block holds seven slots of L lanes: limb 1, 2, 3 of the even
// inputs (byte i of a lane = input 2i of that unit), interleaved with the same limbs of the odd
// inputs (slots 0, 2, 4 even; 1, 3, 5 odd), then the units' steps as floats (slot 6).
#pragma once
#include <cstdint>
#include <cstring>

#include "ops/numerics.h"

namespace dq::cpu {

constexpr int kLimbSlotStep = 6;

// Unit l of a block (the block's lanes L) from its 8 inputs: limbs and step into their slots.
inline void put_unit_limbs(const float* x8, int L, int l, float* blk) {
  const num::UnitInts q = num::quantize_unit(x8);
  auto* bytes = reinterpret_cast<int8_t*>(blk);
  for (int k = 0; k < 8; ++k) {
    int32_t limb[3];
    num::split_limbs(q.xi[k], &limb[0], &limb[1], &limb[2]);
    for (int j = 0; j < 3; ++j) bytes[((2 * j + k % 2) * L + l) * 4 + k / 2] = int8_t(limb[j]);
  }
  std::memcpy(blk + kLimbSlotStep * L + l, &q.step, sizeof(float));
}

// U units of x into blocks of L units, `block_floats` apart (>= 7 L); zero past the last unit.
// The scalar form; a kernel set may make whole blocks with vectors (the bytes must be these).
inline void prepare_unit_limbs(const float* x, int U, int L, size_t block_floats, size_t total_floats, float* xp) {
  std::memset(xp, 0, sizeof(float) * total_floats);
  for (int u = 0; u < U; ++u) put_unit_limbs(x + 8 * u, L, u % L, xp + size_t(u / L) * block_floats);
}

}  // namespace dq::cpu
