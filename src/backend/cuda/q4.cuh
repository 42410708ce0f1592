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

// q value of byte `i` of t (0 <= byte <= 15) as an exact float: PRMT places the byte under
// the exponent of 2^23, then 2^23 is subtracted (one int op per value, no I2F).
__device__ __forceinline__ float q_byte(uint32_t t, int i) {
  return __uint_as_float(__byte_perm(t, 0x4B000000u, 0x7540u | uint32_t(i))) - 8388608.0f;
}

// p = chain_k fmaf(q_k, x_k, p) over the 8 values of one 4-bit unit (one word).
__device__ __forceinline__ float unit_q4(uint32_t w, float4 xa, float4 xb) {
  const uint32_t lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;  // nibbles 0,2,4,6 / 1,3,5,7
  float p = 0.0f;
  p = fmaf(q_byte(lo, 0), xa.x, p);
  p = fmaf(q_byte(hi, 0), xa.y, p);
  p = fmaf(q_byte(lo, 1), xa.z, p);
  p = fmaf(q_byte(hi, 1), xa.w, p);
  p = fmaf(q_byte(lo, 2), xb.x, p);
  p = fmaf(q_byte(hi, 2), xb.y, p);
  p = fmaf(q_byte(lo, 3), xb.z, p);
  p = fmaf(q_byte(hi, 3), xb.w, p);
  return p;
}

__device__ __forceinline__ float unit_q8(uint32_t w0, uint32_t w1, float4 xa, float4 xb) {
  float p = 0.0f;
  p = fmaf(q_byte(w0, 0), xa.x, p);
  p = fmaf(q_byte(w0, 1), xa.y, p);
  p = fmaf(q_byte(w0, 2), xa.z, p);
  p = fmaf(q_byte(w0, 3), xa.w, p);
  p = fmaf(q_byte(w1, 0), xb.x, p);
  p = fmaf(q_byte(w1, 1), xb.y, p);
  p = fmaf(q_byte(w1, 2), xb.z, p);
  p = fmaf(q_byte(w1, 3), xb.w, p);
  return p;
}

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

}  // namespace dq::cuda
