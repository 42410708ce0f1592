// The 4-bit unit dot of numerics.h on the tensor cores: the same exact integers as q4.cuh's
// dp4a form (unit_q4), so the same bits.
//
// One mma.m16n8k32 (s8 x s8 -> s32) takes 16 weight rows (A) against 32 inputs = 4 units
// (a "chunk"). A's k-group q (inputs 4q..4q+3 of the fragment) holds, for q < 4, unit q's even
// inputs (the word's low nibbles) and, for q >= 4, unit q-4's odd inputs (the high nibbles), so
// a thread's A registers are the low and high nibbles of one weight word per row. B's columns
// hold x's limbs (make_unit_q4's split layout), each column zero outside its unit:
//   first mma:  column 2j = unit j's limb 1, column 2j+1 = unit j's limb 2 (j = 0..3)
//   second mma: column 2j = unit j's limb 3, odd columns zero.
// Thread (g = lane / 4, t = lane % 4) then holds in its C registers exactly unit t's three limb
// sums of rows g and g+8, and combines them as unit_q4 does: s1 * 2^16 + (s2 * 2^8 + s3), exact
// in int32, one rounding to float, times the unit's step. No shuffles.
#pragma once
#include <cstdint>

#include "backend/cuda/kernels.cuh"

namespace dq::cuda {

// D = A (16x32 s8, row-major) x B (32x8 s8, column-major), in int32, from zero.
// Fragments (PTX ISA, g = lane / 4, t = lane % 4): a0 = A[g][4t..4t+3], a1 = A[g+8][4t..],
// a2 = A[g][16+4t..], a3 = A[g+8][16+4t..]; b0 = B[4t..4t+3][g], b1 = B[16+4t..][g];
// d0 = D[g][2t], d1 = D[g][2t+1], d2 = D[g+8][2t], d3 = D[g+8][2t+1].
__device__ __forceinline__ void mma_s8_16832(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}

// This thread's B registers for the chunk whose unit t has split words xa (limbs 1 and 2) and
// xb (limb 3, step): the first mma's column g is unit g/2's limb 1 + g%2, the second's column g
// (g even) unit g/2's limb 3; k-group t is unit t's even inputs, k-group 4+t its odd ones.
struct ChunkB {
  uint32_t b10, b11, b20, b21;
  float step;  // unit t's step
};

__device__ __forceinline__ ChunkB chunk_b(uint4 xa, uint4 xb, int g, int t) {
  const bool first = (g >> 1) == t, second = g == 2 * t;
  ChunkB c;
  c.b10 = first ? ((g & 1) ? xa.z : xa.x) : 0u;
  c.b11 = first ? ((g & 1) ? xa.w : xa.y) : 0u;
  c.b20 = second ? xb.x : 0u;
  c.b21 = second ? xb.y : 0u;
  c.step = __uint_as_float(xb.z);
  return c;
}

// Unit t of the chunk against rows g (w0) and g+8 (w1): p0, p1 = float(Σ q xi) * step.
__device__ __forceinline__ void unit_q4_mma(uint32_t w0, uint32_t w1, const ChunkB& c, float& p0, float& p1) {
  const uint32_t lo0 = w0 & 0x0F0F0F0Fu, hi0 = (w0 >> 4) & 0x0F0F0F0Fu;
  const uint32_t lo1 = w1 & 0x0F0F0F0Fu, hi1 = (w1 >> 4) & 0x0F0F0F0Fu;
  int d1[4], d2[4];
  mma_s8_16832(d1, lo0, lo1, hi0, hi1, c.b10, c.b11);
  mma_s8_16832(d2, lo0, lo1, hi0, hi1, c.b20, c.b21);
  const int s0 = d1[0] * 65536 + (d1[1] * 256 + d2[0]);
  const int s1 = d1[2] * 65536 + (d1[3] * 256 + d2[2]);
  p0 = __int2float_rn(s0) * c.step;
  p1 = __int2float_rn(s1) * c.step;
}

// The canonical 32-lane butterfly (numerics.h butterfly32) of one row's lane values, by one
// thread: the same pairs as warp_butterfly's xor shuffles.
__device__ __forceinline__ float butterfly_row(const float* v) {
  float x[32];
#pragma unroll
  for (int l = 0; l < 32; ++l) x[l] = v[l];
#pragma unroll
  for (int l = 0; l < 16; ++l) x[l] = x[l] + x[l + 16];
#pragma unroll
  for (int l = 0; l < 8; ++l) x[l] = x[l] + x[l + 8];
#pragma unroll
  for (int l = 0; l < 4; ++l) x[l] = x[l] + x[l + 4];
  x[0] = x[0] + x[2];
  x[1] = x[1] + x[3];
  return x[0] + x[1];
}

}  // namespace dq::cuda
