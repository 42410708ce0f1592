// Gated attention (op::AttnCore) in the reference order of ops/reference_impl.h:
// kernel 1 appends k (RMSNorm + rotary) and v to the cache for every new token;
// kernel 2, one block per (token, query head): q norm + rotary, scores (one warp per position,
// canonical dot), max, exp, canonical sum, weighted sum of V in position order, output gate.
#include "backend/cuda/kernels.cuh"
#include "ops/numerics.h"

namespace dq::cuda {

namespace {

__device__ float block_sum_squares(const float* x, int n, float* slot) {
  if (threadIdx.x < 32) {
    float ss = 0.0f;
    for (int j = threadIdx.x; j < n; j += 32) ss = fmaf(x[j], x[j], ss);
    ss = warp_butterfly(ss);
    if (threadIdx.x == 0) *slot = ss;
  }
  __syncthreads();
  float v = *slot;
  __syncthreads();
  return v;
}

// x[0..hd) = rmsnorm(src) * w, then rotary on the first `rot` dims (numerics.h rope), in smem.
__device__ void norm_rope(const float* src, const float* w, int hd, int rot, float eps, const float* cs,
                          const float* sn, float* x, float* slot) {
  const float r = num::rms_inv(block_sum_squares(src, hd, slot), hd, eps);
  for (int i = threadIdx.x; i < hd; i += blockDim.x) x[i] = (src[i] * r) * w[i];
  __syncthreads();
  const int half = rot / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float a = x[i], b = x[i + half], c = cs[i], s = sn[i];
    float lo = a * c - b * s;
    float hi = b * c + a * s;
    x[i] = lo;
    x[i + half] = hi;
  }
  __syncthreads();
}

__global__ void append_kernel(AttnArgs a) {
  extern __shared__ float smem[];
  const int t = blockIdx.x / a.hkv, j = blockIdx.x % a.hkv, hd = a.hd, half = a.rot / 2;
  const int p = *a.pos + t;
  if (p < 0 || p >= a.max_ctx) {
    if (threadIdx.x == 0) report_error(a.err, kErrContextFull, p, a.max_ctx);
    return;
  }
  const float* k = a.k + (size_t(t) * a.hkv + j) * hd;
  const float* v = a.v + (size_t(t) * a.hkv + j) * hd;
  float* kc = a.k_cache + (size_t(p) * a.hkv + j) * hd;
  float* vc = a.v_cache + (size_t(p) * a.hkv + j) * hd;
  norm_rope(k, a.k_norm, hd, a.rot, a.eps, a.rope_cos + size_t(p) * half, a.rope_sin + size_t(p) * half, smem,
            smem + hd);
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    kc[i] = smem[i];
    vc[i] = v[i];
  }
}

// Positions are processed in chunks of kChunk rows of K (then of V) staged through shared
// memory with wide coalesced loads, so no thread waits on one global load at a time.
constexpr int kChunk = 32;

__global__ void __launch_bounds__(256) attention_kernel(AttnArgs a) {
  extern __shared__ float smem[];
  const int t = blockIdx.x / a.h, h = blockIdx.x % a.h, hd = a.hd, half = a.rot / 2;
  const int p = *a.pos + t;
  if (p < 0 || p >= a.max_ctx) return;  // reported by the append kernel
  const int L = p + 1, j = h / (a.h / a.hkv);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  float* q = smem;               // [hd]
  float* slot = smem + hd;       // [32]
  float* rows = smem + hd + 32;  // [kChunk][hd]
  const float* qg = a.qg + (size_t(t) * a.h + h) * 2 * hd;
  norm_rope(qg, a.q_norm, hd, a.rot, a.eps, a.rope_cos + size_t(p) * half, a.rope_sin + size_t(p) * half, q, slot);
  const float scale = 1.0f / sqrtf(float(hd));
  const size_t stride = size_t(a.hkv) * hd;
  const float* kc = a.k_cache + size_t(j) * hd;
  const float* vc = a.v_cache + size_t(j) * hd;
  float* s = a.scores + (size_t(t) * a.h + h) * a.max_ctx;
  auto stage = [&](const float* src, int t0, int n) {  // rows t0..t0+n of src into `rows`
    const int v4 = hd / 4;
    for (int e = threadIdx.x; e < n * v4; e += blockDim.x) {
      const int r = e / v4, c = e % v4;
      reinterpret_cast<float4*>(rows + r * hd)[c] = reinterpret_cast<const float4*>(src + (t0 + r) * stride)[c];
    }
    __syncthreads();
  };
  for (int t0 = 0; t0 < L; t0 += kChunk) {
    const int n = min(kChunk, L - t0);
    stage(kc, t0, n);
    for (int r = warp; r < n; r += nwarps) {
      const float* kr = rows + r * hd;
      float acc = 0.0f;
      for (int i = lane; i < hd; i += 32) acc = fmaf(q[i], kr[i], acc);
      acc = warp_butterfly(acc);
      if (lane == 0) s[t0 + r] = acc * scale;
    }
    __syncthreads();
  }
  // max (order does not matter; NaN never wins)
  float mx = -INFINITY;
  for (int tau = threadIdx.x; tau < L; tau += blockDim.x) mx = fmaxf(mx, s[tau]);
  for (int m = 16; m >= 1; m >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, m));
  if (lane == 0) slot[warp] = mx;
  __syncthreads();
  mx = -INFINITY;
  for (int w = 0; w < nwarps; ++w) mx = fmaxf(mx, slot[w]);
  __syncthreads();
  for (int tau = threadIdx.x; tau < L; tau += blockDim.x) s[tau] = num::exp(s[tau] - mx);
  __syncthreads();
  if (warp == 0) {  // canonical sum: lane = position mod 32, then the butterfly
    float z = 0.0f;
    for (int tau = lane; tau < L; tau += 32) z = z + s[tau];
    z = warp_butterfly(z);
    if (lane == 0) slot[0] = z;
  }
  __syncthreads();
  const float Z = slot[0];
  float acc[2] = {0.0f, 0.0f};  // dims threadIdx.x and threadIdx.x + 256 (hd <= 512)
  for (int t0 = 0; t0 < L; t0 += kChunk) {
    const int n = min(kChunk, L - t0);
    stage(vc, t0, n);
    for (int c = 0; c < 2; ++c) {
      const int i = threadIdx.x + 256 * c;
      if (i < hd)
        for (int r = 0; r < n; ++r) acc[c] = fmaf(s[t0 + r], rows[r * hd + i], acc[c]);
    }
    __syncthreads();
  }
  const float* gate = qg + hd;
  float* out = a.out + (size_t(t) * a.h + h) * hd;
  for (int c = 0; c < 2; ++c) {
    const int i = threadIdx.x + 256 * c;
    if (i < hd) out[i] = (acc[c] / Z) * num::sigmoid(gate[i]);
  }
}

}  // namespace

void launch_attn(const AttnArgs& a, cudaStream_t s) {
  DQ_CHECK(a.hd <= 512 && a.hd % 4 == 0, "attention head dim {} (CUDA supports multiples of 4 up to 512)", a.hd);
  const size_t smem = size_t(a.hd + 32) * 4;
  append_kernel<<<a.T * a.hkv, 256, smem, s>>>(a);
  DQ_CUDA_CHECK(cudaGetLastError());
  static bool attr_set = false;
  if (!attr_set) {
    DQ_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024));
    attr_set = true;
  }
  attention_kernel<<<a.T * a.h, 256, smem + size_t(kChunk) * a.hd * 4, s>>>(a);
  DQ_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dq::cuda
