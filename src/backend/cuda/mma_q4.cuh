// The 4-bit unit dot of numerics.h on the tensor cores, for a warp that owns 16 whole rows: the
// same exact integers as q4.cuh's dp4a form (unit_q4), so the same bits, with about half the
// integer-pipe work a unit (the six dp4a / dp2a of a unit become a share of two mma).
//
// One mma.m16n8k32 (s8 x s8 -> s32) takes 16 rows (A) against 32 inputs = 4 units (a k-block).
// A's k-group q (inputs 4q..4q+3 of the fragment) holds, for q < 4, unit q's even inputs (the
// word's low nibbles) and, for q >= 4, unit q-4's odd inputs (the high nibbles): a thread's A
// registers are the low and high nibbles of one weight word of each of its two rows. B's
// columns hold x's limbs (numerics.h split_limbs), each column zero outside its unit:
//   first mma:  column 2j = unit j's limb 1 (x 2^16), column 2j+1 = unit j's limb 2 (x 2^8);
//   second mma: column 2j = unit j's limb 3, odd columns zero.
// Thread (g = lane / 4, t = lane % 4) then holds in its C registers unit t's three limb sums of
// rows g and g+8, and combines them as unit_q4 does (exact in int32, one rounding to float,
// times the unit's step).
//
// The k-block of 4 units is chosen so that thread t's unit is always in canonical lane
// l = 4 kb + t (units l, l + 32, ...): a thread carries the chains of lanes t, t+4, ..., t+28 of
// both its rows, and butterfly32's first three steps (lanes l + 16, l + 8, l + 4) are additions
// inside the thread, its last two (l + 2, l + 1) shuffles across t.
#pragma once
#include <cstdint>

#include "backend/cuda/kernels.cuh"
#include "ops/numerics.h"

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

// x's unit in the form the mma's B columns take (32 bytes): c0 = {limb 1 of inputs 0,2,4,6 |
// of 1,3,5,7 | limb 2 of 0,2,4,6 | of 1,3,5,7}, c1 = {limb 3 of 0,2,4,6 | of 1,3,5,7 | step |
// 0}, each limb a signed byte (split_limbs), lower inputs in lower bytes.
__device__ __forceinline__ void make_unit_mma(float4 v0, float4 v1, uint4& c0, uint4& c1) {
  const float x[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
  const num::UnitInts q = num::quantize_unit(x);
  uint32_t w[6] = {0, 0, 0, 0, 0, 0};
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    int32_t l1, l2, l3;
    num::split_limbs(q.xi[k], &l1, &l2, &l3);
    const int odd = k & 1, sh = 8 * (k >> 1);
    w[0 + odd] |= (uint32_t(l1) & 0xFFu) << sh;
    w[2 + odd] |= (uint32_t(l2) & 0xFFu) << sh;
    w[4 + odd] |= (uint32_t(l3) & 0xFFu) << sh;
  }
  c0 = make_uint4(w[0], w[1], w[2], w[3]);
  c1 = make_uint4(w[4], w[5], __float_as_uint(q.step), 0u);
}

// Where thread (g, t) finds its B registers in a unit's 32 bytes, and whether it has any: the
// first mma's column g is unit g/2's limb 1 + g%2 (bytes 8 (g % 2) of c0), the second's column g
// (g even) unit g/2's limb 3 (bytes 16); every other thread's B registers are zero.
struct MmaLane {
  bool on1, on2;
  uint32_t off1;
};
__device__ __forceinline__ MmaLane mma_lane(int g, int t) { return MmaLane{(g >> 1) == t, g == 2 * t, uint32_t(8 * (g & 1))}; }

// Unit t of a k-block against the thread's two rows (words w0 of row g, w1 of row g+8), x's unit
// at xu (make_unit_mma's 32 bytes, shared memory): p0, p1 = float(Σ q xi) * step.
__device__ __forceinline__ void unit_q4_mma(uint32_t w0, uint32_t w1, const unsigned char* xu, const MmaLane& ml,
                                            float& p0, float& p1) {
  uint2 b1 = make_uint2(0u, 0u), b2 = make_uint2(0u, 0u);
  if (ml.on1) b1 = *reinterpret_cast<const uint2*>(xu + ml.off1);
  if (ml.on2) b2 = *reinterpret_cast<const uint2*>(xu + 16);
  const float step = *reinterpret_cast<const float*>(xu + 24);
  const uint32_t lo0 = w0 & 0x0F0F0F0Fu, hi0 = (w0 >> 4) & 0x0F0F0F0Fu;
  const uint32_t lo1 = w1 & 0x0F0F0F0Fu, hi1 = (w1 >> 4) & 0x0F0F0F0Fu;
  int d1[4], d2[4];
  mma_s8_16832(d1, lo0, lo1, hi0, hi1, b1.x, b1.y);
  mma_s8_16832(d2, lo0, lo1, hi0, hi1, b2.x, b2.y);
  const int s0 = d1[0] * 65536 + (d1[1] * 256 + d2[0]);
  const int s1 = d1[2] * 65536 + (d1[3] * 256 + d2[2]);
  p0 = __int2float_rn(s0) * step;
  p1 = __int2float_rn(s1) * step;
}

}  // namespace dq::cuda
