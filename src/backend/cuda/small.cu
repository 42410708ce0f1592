// Embedding gather, argmax, position advance.
#include <cuda_fp16.h>

#include "backend/cuda/kernels.cuh"
#include "ops/numerics.h"

namespace dq::cuda {

namespace {

__device__ __forceinline__ float scale_at(const void* p, int i, SDt t) {
  if (t == SDt::BF16) return __uint_as_float(uint32_t(static_cast<const uint16_t*>(p)[i]) << 16);
  if (t == SDt::F16) return __half2float(static_cast<const __half*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

// out[t][j] = the dequantized table row tokens[t]: s * q + b rounded once (fmaf), as numerics.h.
__global__ void embed_kernel(EmbedArgs a) {
  const int t = blockIdx.x, H = a.table.cols;
  int row = a.tokens[t];
  float* out = a.out + size_t(t) * H;
  if (row < 0 || row >= a.table.rows) {
    if (threadIdx.x == 0) report_error(a.err, kErrTokenRange, row, a.table.rows);
    for (int j = threadIdx.x; j < H; j += blockDim.x) out[j] = 0.0f;
    return;
  }
  const MatDev& m = a.table;
  for (int j = threadIdx.x; j < H; j += blockDim.x) {
    float v;
    if (m.fmt == WFmt::Affine) {
      const int G = H / m.gs, per_word = 32 / m.bits;
      const uint32_t* w = static_cast<const uint32_t*>(m.w) + size_t(row) * (size_t(H) * m.bits / 32);
      uint32_t q = (w[j / per_word] >> (m.bits * (j % per_word))) & ((1u << m.bits) - 1u);
      v = fmaf(scale_at(m.s, row * G + j / m.gs, m.sdt), float(q), scale_at(m.b, row * G + j / m.gs, m.sdt));
    } else if (m.fmt == WFmt::BF16) {
      v = __uint_as_float(uint32_t(static_cast<const uint16_t*>(m.w)[size_t(row) * H + j]) << 16);
    } else if (m.fmt == WFmt::F16) {
      v = __half2float(static_cast<const __half*>(m.w)[size_t(row) * H + j]);
    } else {
      v = static_cast<const float*>(m.w)[size_t(row) * H + j];
    }
    out[j] = v;
  }
}

// The largest value, lowest index on ties, NaN never wins; index 0 when nothing beats -inf.
__device__ __forceinline__ void better(float& bv, int& bi, float v, int i) {
  if (v > bv || (v == bv && i < bi && bv > -INFINITY)) {
    bv = v;
    bi = i;
  }
}

__global__ void argmax_kernel(const float* x, int n, int32_t* out, int32_t* out2) {
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < n; i += blockDim.x) better(bv, bi, x[i], i);
  for (int m = 16; m >= 1; m >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, bv, m);
    int oi = __shfl_xor_sync(0xffffffffu, bi, m);
    better(bv, bi, ov, oi);
  }
  __shared__ float sv[32];
  __shared__ int si[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sv[warp] = bv, si[warp] = bi;
  __syncthreads();
  if (warp == 0) {
    bv = lane < int(blockDim.x / 32) ? sv[lane] : -INFINITY;
    bi = lane < int(blockDim.x / 32) ? si[lane] : 0x7fffffff;
    for (int m = 16; m >= 1; m >>= 1) {
      float ov = __shfl_xor_sync(0xffffffffu, bv, m);
      int oi = __shfl_xor_sync(0xffffffffu, bi, m);
      better(bv, bi, ov, oi);
    }
    if (lane == 0) {
      int r = bi == 0x7fffffff ? 0 : bi;
      *out = r;
      if (out2) *out2 = r;
    }
  }
}

__global__ void advance_kernel(int32_t* pos, int delta) { *pos += delta; }

}  // namespace

void launch_embed(const EmbedArgs& a, cudaStream_t s) {
  embed_kernel<<<a.T, 256, 0, s>>>(a);
  DQ_CUDA_CHECK(cudaGetLastError());
}

void launch_argmax(const float* x, int n, int32_t* out, int32_t* out2, cudaStream_t s) {
  argmax_kernel<<<1, 1024, 0, s>>>(x, n, out, out2);
  DQ_CUDA_CHECK(cudaGetLastError());
}

void launch_advance_pos(int32_t* pos, int delta, cudaStream_t s) {
  advance_kernel<<<1, 1, 0, s>>>(pos, delta);
  DQ_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dq::cuda
