// The 4-bit (and 8-bit) weight unit of the canonical affine dot (ops/numerics.h affine_dot),
// shared by the streaming and the resident mat-vec kernels.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/kernels.cuh"

namespace dq::cuda {

__device__ __forceinline__ float load_scale(const void* p, int i, SDt t) {
  if (t == SDt::BF16) return __uint_as_float(uint32_t(__ldg(static_cast<const unsigned short*>(p) + i)) << 16);
  if (t == SDt::F16) return __half2float(static_cast<const __half*>(p)[i]);
  return __ldg(static_cast<const float*>(p) + i);
}

// Group of unit u (8 inputs): u * 8 / gs, a shift for power-of-two group sizes.
__device__ __forceinline__ int group_of(const MatDev& m, int u) {
  return m.gs_shift >= 0 ? (u * 8) >> m.gs_shift : u * 8 / m.gs;
}

// The bits of 2^23, kept in constant memory so that the compiler holds them in a register:
// with a literal, PRMT's one immediate slot goes to it and every PRMT then needs an extra
// instruction to materialise its selector (measured: ~8 more instructions per 4-bit word).
static __constant__ uint32_t kTwo23Bits = 0x4B000000u;

// q value of byte I of t (0 <= byte <= 15) as an exact float: PRMT places the byte under the
// exponent of 2^23 (magic = kTwo23Bits), then 2^23 is subtracted (one int op per value, no I2F).
template <int I>
__device__ __forceinline__ float q_byte(uint32_t t, uint32_t magic) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(t), "r"(magic), "n"(0x7540 | I));
  return __uint_as_float(r) - 8388608.0f;
}

// p = chain_k fmaf(q_k, x_k, p) over the 8 values of one 4-bit unit (one word).
__device__ __forceinline__ float unit_q4(uint32_t w, float4 xa, float4 xb) {
  const uint32_t lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;  // nibbles 0,2,4,6 / 1,3,5,7
  const uint32_t magic = kTwo23Bits;
  float p = 0.0f;
  p = fmaf(q_byte<0>(lo, magic), xa.x, p);
  p = fmaf(q_byte<0>(hi, magic), xa.y, p);
  p = fmaf(q_byte<1>(lo, magic), xa.z, p);
  p = fmaf(q_byte<1>(hi, magic), xa.w, p);
  p = fmaf(q_byte<2>(lo, magic), xb.x, p);
  p = fmaf(q_byte<2>(hi, magic), xb.y, p);
  p = fmaf(q_byte<3>(lo, magic), xb.z, p);
  p = fmaf(q_byte<3>(hi, magic), xb.w, p);
  return p;
}

__device__ __forceinline__ float unit_q8(uint32_t w0, uint32_t w1, float4 xa, float4 xb) {
  const uint32_t magic = kTwo23Bits;
  float p = 0.0f;
  p = fmaf(q_byte<0>(w0, magic), xa.x, p);
  p = fmaf(q_byte<1>(w0, magic), xa.y, p);
  p = fmaf(q_byte<2>(w0, magic), xa.z, p);
  p = fmaf(q_byte<3>(w0, magic), xa.w, p);
  p = fmaf(q_byte<0>(w1, magic), xb.x, p);
  p = fmaf(q_byte<1>(w1, magic), xb.y, p);
  p = fmaf(q_byte<2>(w1, magic), xb.z, p);
  p = fmaf(q_byte<3>(w1, magic), xb.w, p);
  return p;
}

// The canonical sum of squares of x[0..n) (the RMSNorm of x) by one warp: lane = index mod 32,
// a chain per lane, then the butterfly.
__device__ __forceinline__ float warp_sum_squares(const float* x, int n, int lane) {
  float ss = 0.0f;
#pragma unroll 16
  for (int j = lane; j < n; j += 32) ss = fmaf(x[j], x[j], ss);
  return warp_butterfly(ss);
}

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

}  // namespace dq::cuda
