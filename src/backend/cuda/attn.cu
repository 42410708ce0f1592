// Gated attention (op::AttnCore) in the reference order of ops/reference_impl.h:
// kernel 1 appends k (RMSNorm + rotary) and v to the cache for every new token;
// kernel 2: q norm + rotary and the scores (one warp per position, canonical dot);
// (decode: kernels 1 and 2 are one, scores_append_kernel);
// kernel 3: max, exp, canonical sum, weighted sum of V in position order, output gate.
#include <cstdlib>

#include "backend/cuda/kernels.cuh"
#include "ops/numerics.h"

namespace dq::cuda {

DQ_TIMELINE_FILE

namespace {

// x[0..hd) = rmsnorm(src) * w, then rotary on the first `rot` dims (numerics.h rope), in smem.
// src is first copied to x with independent loads; the sum of squares then reads shared memory.
__device__ void norm_rope(const float* src, const float* w, int hd, int rot, float eps, const float* cs,
                          const float* sn, float* x, float* slot) {
  for (int i = threadIdx.x; i < hd; i += blockDim.x) x[i] = src[i];
  __syncthreads();
  const float r = num::rms_inv(block_sum_squares(x, hd, slot), hd, eps);
  for (int i = threadIdx.x; i < hd; i += blockDim.x) x[i] = (x[i] * r) * w[i];
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

// norm_rope for hd <= blockDim.x with thread i's norm weight and rotary cos / sin already in
// registers (loaded before the programmatic wait): the same arithmetic, one trip to L2 fewer
// on each side of the sum.
__device__ void norm_rope_own(const float* src, float w_i, float c_i, float s_i, int hd, int rot, float eps, float* x,
                              float* slot) {
  const int i = threadIdx.x, half = rot / 2;
  if (i < hd) x[i] = src[i];
  __syncthreads();
  const float r = num::rms_inv(block_sum_squares(x, hd, slot), hd, eps);
  if (i < hd) x[i] = (x[i] * r) * w_i;
  __syncthreads();
  if (i < half) {
    float a = x[i], b = x[i + half];
    float lo = a * c_i - b * s_i;
    float hi = b * c_i + a * s_i;
    x[i] = lo;
    x[i + half] = hi;
  }
  __syncthreads();
}

__global__ void append_kernel(AttnArgs a) {
  pdl_trigger();
  pdl_wait();
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

// Scores: blocks over (token x head, chunk of kPos positions); each warp takes kPos / 8
// positions, one canonical dot each (lane = dim mod 32, then the butterfly). Blocks past the
// current length exit at once, so the grid can be sized for the whole context (graph replay).
constexpr int kPos = 64;

__global__ void __launch_bounds__(256) scores_kernel(AttnArgs a, int skip) {
  pdl_trigger();
  pdl_wait();
  if (skip) return;  // the kernel lab only (DELTAQ_LAB_SKIP=attn)
  extern __shared__ float smem[];
  const int t = blockIdx.x / a.h, h = blockIdx.x % a.h, hd = a.hd, half = a.rot / 2;
  const int p = *a.pos + t;
  const int tau0 = blockIdx.y * kPos;
  if (p < 0 || p >= a.max_ctx || tau0 > p) return;  // out of range: reported by the append kernel
  const int L = p + 1, j = h / (a.h / a.hkv);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* q = smem;          // [hd]
  float* slot = smem + hd;  // [32]
  const float* qg = a.qg + (size_t(t) * a.h + h) * 2 * hd;
  norm_rope(qg, a.q_norm, hd, a.rot, a.eps, a.rope_cos + size_t(p) * half, a.rope_sin + size_t(p) * half, q, slot);
  const float scale = 1.0f / sqrtf(float(hd));
  const size_t stride = size_t(a.hkv) * hd;
  const float* kc = a.k_cache + size_t(j) * hd;
  float* s = a.scores + (size_t(t) * a.h + h) * a.max_ctx;
  const int nc = (hd + 31) / 32;  // values per lane per position (hd <= 512: <= 16)
  for (int k0 = 0; k0 < kPos / 8; k0 += 4) {
    float kv[4][16];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int tau = tau0 + warp * (kPos / 8) + k0 + k;
#pragma unroll
      for (int c = 0; c < 16; ++c)
        kv[k][c] = (c < nc && tau < L && lane + 32 * c < hd) ? kc[tau * stride + lane + 32 * c] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int tau = tau0 + warp * (kPos / 8) + k0 + k;
      float acc = 0.0f;
#pragma unroll
      for (int c = 0; c < 16; ++c)
        if (c < nc && lane + 32 * c < hd) acc = fmaf(q[lane + 32 * c], kv[k][c], acc);
      acc = warp_butterfly(acc);
      if (lane == 0 && tau < L) s[tau] = acc * scale;
    }
  }
}

// Decode (T = 1, hd <= 256): the append and the scores in one kernel, blocks over (query head,
// chunk of kPos positions). The block whose chunk holds the new position p makes k's row (norm
// + rotary, as the append kernel) itself for its score, and the group's first query head also
// appends k and v to the cache; the other positions' rows come from the cache, read before the
// programmatic wait when the queue says nothing in flight writes them (AttnArgs::early).
constexpr int kFusedNc = 8;  // values per lane per position: hd <= 256

__global__ void __launch_bounds__(256) scores_append_kernel(AttnArgs a, int skip) {
  pdl_trigger();
  extern __shared__ float smem[];
  const int h = blockIdx.x, hd = a.hd, half = a.rot / 2;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int group = a.h / a.hkv, j = h / group;
  const int tau0 = blockIdx.y * kPos, first = tau0 + warp * (kPos / 8);
  const size_t stride = size_t(a.hkv) * hd;
  const float* kc = a.k_cache + size_t(j) * hd;
  const int nc = (hd + 31) / 32;
  float kv[kPos / 8][kFusedNc];
  auto load_k = [&](int lim) {  // this warp's positions below lim
#pragma unroll
    for (int k = 0; k < kPos / 8; ++k)
#pragma unroll
      for (int c = 0; c < kFusedNc; ++c)
        kv[k][c] = (c < nc && first + k < lim && lane + 32 * c < hd) ? kc[(first + k) * stride + lane + 32 * c] : 0.0f;
  };
  // Thread i's q / k norm weights and rotary cos / sin at position p (blockDim >= hd).
  float wq = 0.0f, wk = 0.0f, ci = 0.0f, si = 0.0f;
  auto load_own = [&](int pp) {
    const int i = threadIdx.x;
    if (i < hd) wq = a.q_norm[i], wk = a.k_norm[i];
    if (i < half) ci = a.rope_cos[size_t(pp) * half + i], si = a.rope_sin[size_t(pp) * half + i];
  };
  int p = 0;
  if (a.early) {
    p = *a.pos;
    if (p >= 0 && p < a.max_ctx) {
      load_k(p);
      load_own(p);
    }
  }
  pdl_wait();
  if (skip) return;  // the kernel lab only (DELTAQ_LAB_SKIP=attn)
  if (!a.early) p = *a.pos;
  if (p < 0 || p >= a.max_ctx) {
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) report_error(a.err, kErrContextFull, p, a.max_ctx);
    return;
  }
  if (tau0 > p) return;
  if (!a.early) {
    load_k(p);
    load_own(p);
  }
  float* q = smem;          // [hd]
  float* kn = smem + hd;    // [hd] the new position's k
  float* slot = kn + hd;    // [32]
  norm_rope_own(a.qg + size_t(h) * 2 * hd, wq, ci, si, hd, a.rot, a.eps, q, slot);
  if (p < tau0 + kPos) {  // this chunk holds p (uniform over the block)
    norm_rope_own(a.k + size_t(j) * hd, wk, ci, si, hd, a.rot, a.eps, kn, slot);
    if (h % group == 0)
      for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        a.k_cache[size_t(p) * stride + size_t(j) * hd + i] = kn[i];
        a.v_cache[size_t(p) * stride + size_t(j) * hd + i] = a.v[size_t(j) * hd + i];
      }
#pragma unroll
    for (int k = 0; k < kPos / 8; ++k)
      if (first + k == p)
#pragma unroll
        for (int c = 0; c < kFusedNc; ++c)
          if (c < nc && lane + 32 * c < hd) kv[k][c] = kn[lane + 32 * c];
  }
  const float scale = 1.0f / sqrtf(float(hd));
  float* s = a.scores + size_t(h) * a.max_ctx;
#pragma unroll
  for (int k = 0; k < kPos / 8; ++k) {
    float acc = 0.0f;
#pragma unroll
    for (int c = 0; c < kFusedNc; ++c)
      if (c < nc && lane + 32 * c < hd) acc = fmaf(q[lane + 32 * c], kv[k][c], acc);
    acc = warp_butterfly(acc);
    if (lane == 0 && first + k <= p) s[first + k] = acc * scale;
  }
}

// Softmax and the weighted sum of V: blocks over (token x head, 64 dims). Each block takes the
// max, makes e = exp(s - max) into shared memory and the canonical sum Z (warp 0: lane =
// position mod 32), then thread i runs the position-ordered chain over V[., i].
constexpr int kDims = 64;

__global__ void __launch_bounds__(kDims) softmax_v_kernel(AttnArgs a, int skip) {
  pdl_trigger();
  pdl_wait();
  if (skip) return;  // the kernel lab only (DELTAQ_LAB_SKIP=attn)
  extern __shared__ float e[];  // [L] exp(s - max), then slot
  const int t = blockIdx.x / a.h, h = blockIdx.x % a.h, hd = a.hd;
  const int p = *a.pos + t;
  if (p < 0 || p >= a.max_ctx) return;
  const int L = p + 1, j = h / (a.h / a.hkv);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __shared__ float slot[4];
  const float* s = a.scores + (size_t(t) * a.h + h) * a.max_ctx;
  float mx = -INFINITY;
#pragma unroll 4
  for (int tau = threadIdx.x; tau < L; tau += blockDim.x) mx = fmaxf(mx, s[tau]);
  for (int m = 16; m >= 1; m >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, m));
  if (lane == 0) slot[warp] = mx;
  __syncthreads();
  mx = fmaxf(slot[0], slot[1]);
  for (int tau = threadIdx.x; tau < L; tau += blockDim.x) e[tau] = num::exp(s[tau] - mx);
  __syncthreads();
  if (warp == 0) {
    float z = 0.0f;
    for (int tau = lane; tau < L; tau += 32) z = z + e[tau];
    z = warp_butterfly(z);
    if (lane == 0) slot[2] = z;
  }
  __syncthreads();
  const float Z = slot[2];
  const int i = blockIdx.y * kDims + threadIdx.x;
  if (i >= hd) return;
  const size_t stride = size_t(a.hkv) * hd;
  const float* vc = a.v_cache + size_t(j) * hd + i;
  // The chain over positions, with the next 64 values of V loading while 64 are consumed.
  constexpr int B = 64;
  auto load = [&](float (&dst)[B], int t0) {
#pragma unroll
    for (int k = 0; k < B; ++k) dst[k] = t0 + k < L ? vc[size_t(t0 + k) * stride] : 0.0f;
  };
  auto chain = [&](const float (&src)[B], int t0, float acc) {
#pragma unroll
    for (int k = 0; k < B; ++k)
      if (t0 + k < L) acc = fmaf(e[t0 + k], src[k], acc);
    return acc;
  };
  float va[B], vb[B];
  float acc = 0.0f;
  load(va, 0);
  for (int t0 = 0; t0 < L; t0 += 2 * B) {
    if (t0 + B < L) load(vb, t0 + B);
    acc = chain(va, t0, acc);
    if (t0 + 2 * B < L) load(va, t0 + 2 * B);
    if (t0 + B < L) acc = chain(vb, t0 + B, acc);
  }
  const float* gate = a.qg + (size_t(t) * a.h + h) * 2 * hd + hd;
  a.out[(size_t(t) * a.h + h) * hd + i] = (acc / Z) * num::sigmoid(gate[i]);
}

// The same softmax and chain, for contexts where V's loads, not the chain, would set the pace:
// 256 threads stream V's 64-position chunks (64 dims x 256 bytes each) into a ring of shared
// memory with cp.async, kVStages chunks in flight, while threads 0..63 run the chain over the
// chunk that has landed. Same order and arithmetic as softmax_v_kernel.
constexpr int kVThreads = 256, kVPos = 64, kVStages = 4;

// One whole chunk of the chain: acc = fmaf(e[k], v[k * STRIDE], acc) for k = 0..63 in order.
// Every load goes to registers first, then the 64 fmaf: the chain then runs at fmaf's latency
// (interleaved, each fmaf waited for its own shared loads: about 20 cycles a position).
// (The compiler moved plain loads of v next to their fmaf; volatile loads keep their order.)
template <int STRIDE>
__device__ __forceinline__ float chain_chunk(const float* ec, const float* v, float acc) {
  float vv[kVPos];
  float4 ee[kVPos / 4];
  const uint32_t va = smem_addr(v);
#pragma unroll
  for (int k = 0; k < kVPos; ++k) asm volatile("ld.shared.f32 %0, [%1];" : "=f"(vv[k]) : "r"(va + 4u * k * STRIDE));
#pragma unroll
  for (int k = 0; k < kVPos / 4; ++k) ee[k] = reinterpret_cast<const float4*>(ec)[k];
#pragma unroll
  for (int k = 0; k < kVPos / 4; ++k) {
    acc = fmaf(ee[k].x, vv[4 * k], acc);
    acc = fmaf(ee[k].y, vv[4 * k + 1], acc);
    acc = fmaf(ee[k].z, vv[4 * k + 2], acc);
    acc = fmaf(ee[k].w, vv[4 * k + 3], acc);
  }
  return acc;
}
constexpr size_t kVRingBytes = size_t(kVStages) * kVPos * kDims * 4;

__global__ void __launch_bounds__(kVThreads) softmax_v_ring_kernel(AttnArgs a, int skip) {
  pdl_trigger();
  extern __shared__ __align__(16) float sm[];
  float* ring = sm;                                  // [kVStages][kVPos][kDims]
  float* e = sm + size_t(kVStages) * kVPos * kDims;  // [L] exp(s - max)
  __shared__ float slot[kVThreads / 32 + 1];
  const int t = blockIdx.x / a.h, h = blockIdx.x % a.h, hd = a.hd;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int j = h / (a.h / a.hkv), d0 = blockIdx.y * kDims;
  const size_t stride = size_t(a.hkv) * hd;
  const float* vbase = a.v_cache + size_t(j) * hd + d0;
  constexpr int kPieces = kVPos * kDims / 4;  // 16-byte pieces per chunk
  auto issue = [&](int c, int lim) {  // chunk c's positions below lim
    float* dst = ring + size_t(c % kVStages) * kVPos * kDims;
    for (int k = tid; k < kPieces; k += kVThreads) {
      const int pos = k / (kDims / 4), part = k % (kDims / 4);
      const int tau = c * kVPos + pos;
      if (tau < lim && d0 + 4 * part < hd) async_copy16(dst + pos * kDims + 4 * part, vbase + size_t(tau) * stride + 4 * part);
    }
  };
  // One token with early reads (AttnArgs::early): the first chunks of V before the new
  // position stream in before the wait; the new row (written by the scores kernel) after it.
  int p = 0;
  if (a.early) {
    p = *a.pos;
#pragma unroll
    for (int c = 0; c < kVStages - 1; ++c) {
      issue(c, p);
      async_commit();
    }
  }
  pdl_wait();
  if (skip) return;  // the kernel lab only (DELTAQ_LAB_SKIP=attn)
  if (!a.early) p = *a.pos + t;
  if (p < 0 || p >= a.max_ctx) {
    async_wait_all();
    return;
  }
  const int L = p + 1;
  const float* s = a.scores + (size_t(t) * a.h + h) * a.max_ctx;
  // The scores come from L2 once (unrolled: the loads in flight together), into e; e is then
  // made in place, each thread over its own positions.
  float mx = -INFINITY;
#pragma unroll 8
  for (int tau = tid; tau < L; tau += kVThreads) {
    const float v = s[tau];
    e[tau] = v;
    mx = fmaxf(mx, v);
  }
  for (int m = 16; m >= 1; m >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, m));
  if (lane == 0) slot[warp] = mx;
  __syncthreads();
  mx = slot[0];
  for (int w = 1; w < kVThreads / 32; ++w) mx = fmaxf(mx, slot[w]);
  for (int tau = tid; tau < L; tau += kVThreads) e[tau] = num::exp(e[tau] - mx);
  __syncthreads();
  if (warp == kDims / 32) {  // the first warp that runs no chain: the chain starts without waiting for Z
    float z = 0.0f;
#pragma unroll 8
    for (int tau = lane; tau < L; tau += 32) z = z + e[tau];
    z = warp_butterfly(z);
    if (lane == 0) slot[kVThreads / 32] = z;
  }
  // (the barrier at the first chunk publishes Z)
  const int nchunks = (L + kVPos - 1) / kVPos;
  if (!a.early) {
#pragma unroll
    for (int c = 0; c < kVStages - 1; ++c) {
      issue(c, L);
      async_commit();
    }
  } else if (p / kVPos < kVStages - 1) {  // the new row's chunk was issued early without it
    float* dst = ring + size_t(p / kVPos) * kVPos * kDims + (p % kVPos) * kDims;
    for (int k = tid; k < kDims; k += kVThreads)
      if (d0 + k < hd) dst[k] = vbase[size_t(p) * stride + k];
  }
  float acc = 0.0f;
  const int i = d0 + tid;
  for (int c = 0; c < nchunks; ++c) {
    if (c + kVStages - 1 < nchunks) issue(c + kVStages - 1, L);
    async_commit();
    async_wait_group<kVStages - 1>();  // this thread's pieces of chunk c have landed
    __syncthreads();                   // and everyone's
    if (tid < kDims && i < hd) {
      const float* v = ring + size_t(c % kVStages) * kVPos * kDims + tid;
      const int n = min(kVPos, L - c * kVPos);
      const float* ec = e + c * kVPos;
      if (n == kVPos) {
        acc = chain_chunk<kDims>(ec, v, acc);
      } else {
        for (int k = 0; k < n; ++k) acc = fmaf(ec[k], v[k * kDims], acc);
      }
    }
    __syncthreads();  // the stage is refilled by the next iteration's issue
  }
  if (tid < kDims && i < hd) {
    const float Z = slot[kVThreads / 32];
    const float* gate = a.qg + (size_t(t) * a.h + h) * 2 * hd + hd;
    a.out[(size_t(t) * a.h + h) * hd + i] = (acc / Z) * num::sigmoid(gate[i]);
  }
}

// The same softmax and chain with the query heads of one KV head together (grouped-query
// attention): a block takes KV head j's V for kGroupDims dims and runs the chains of all G of
// its query heads over them, so V crosses from memory once per KV head instead of once per
// query head, and each block streams only 64 bytes per position (the per-block stream was what
// set the pace at long contexts). Threads (g, d) run head g's chain over dim d; head g's
// scores, max and exp go to warps g (8 / G) ... (its share of the 8), its Z to warp 2 + g.
// S stages of 4 KB in the ring: a block's V stream is latency-bound (S - 1 chunks in flight),
// and the chain eats a chunk in ~130 ns. The scores come in by 4-byte asynchronous copies, all
// in flight at once. Same order and arithmetic as softmax_v_kernel.
constexpr int kGroupDims = 16, kGroupThreads = 256;
constexpr size_t group_ring_floats(int stages) { return size_t(stages) * kVPos * kGroupDims; }

template <int G, int S>
__global__ void __launch_bounds__(kGroupThreads, 1) softmax_v_group_kernel(AttnArgs a, int skip, int trigger) {
  static_assert(8 % G == 0 && G * kGroupDims <= 64 && 2 + G <= 8, "heads per KV head: 1, 2 or 4");
  constexpr int kVStages = S;
  if (trigger == 0) pdl_trigger();  // 1: after the wait (the out-projection's blocks then find free SMs)
  extern __shared__ __align__(16) float sm[];
  float* ring = sm;                                // [S][kVPos][kGroupDims]
  float* e_all = sm + group_ring_floats(S);        // [G][ctx4] exp(s - max) of each query head
  const int ctx4 = (a.max_ctx + 3) & ~3;  // (16-byte rows for the chain's loads)
  __shared__ float slot[kGroupThreads / 32], zs[G];
  const int t = blockIdx.x / a.hkv, j = blockIdx.x % a.hkv, hd = a.hd;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int d0 = blockIdx.y * kGroupDims;
  const size_t stride = size_t(a.hkv) * hd;
  const float* vbase = a.v_cache + size_t(j) * hd + d0;
  constexpr int kPieces = kVPos * kGroupDims / 4;  // 16-byte pieces per chunk: one per thread
  static_assert(kPieces == kGroupThreads, "one piece per thread");
  auto issue = [&](int c, int lim) {  // chunk c's positions below lim
    float* dst = ring + size_t(c % kVStages) * kVPos * kGroupDims;
    const int pos = tid / (kGroupDims / 4), part = tid % (kGroupDims / 4);
    const int tau = c * kVPos + pos;
    if (tau < lim && d0 + 4 * part < hd) async_copy16(dst + pos * kGroupDims + 4 * part, vbase + size_t(tau) * stride + 4 * part);
  };
  int p = 0;
  if (a.early) {
    p = *a.pos;
#pragma unroll
    for (int c = 0; c < kVStages - 1; ++c) {
      issue(c, p);
      async_commit();
    }
  }
  pdl_wait();
  if (trigger != 0) pdl_trigger();
  if (skip & kLabSkip) return;  // the kernel lab only (DELTAQ_LAB_SKIP=attn)
  if (!a.early) p = *a.pos + t;
  // This thread's chain: head g's dim i. Its output gate comes in now, with the scores, rather
  // than after the chain, where its load would be the last round trip to L2 before the exit
  // (kLabLateLoads, an A/B knob: loaded after the chain, as before session 33).
  const int g = tid / kGroupDims, d = tid % kGroupDims, i = d0 + d;
  const bool chain = tid < G * kGroupDims && i < hd;
  const float* gate = a.qg + (size_t(t) * a.h + j * G + (g < G ? g : 0)) * 2 * hd + hd;
  const float gate_v = chain && !(skip & kLabLateLoads) ? gate[i] : 0.0f;
  if (p < 0 || p >= a.max_ctx) {
    async_wait_all();
    return;
  }
  const int L = p + 1;
  for (int g = 0; g < G; ++g) {  // the G heads' scores into e, every copy in flight at once
    const float* s = a.scores + (size_t(t) * a.h + size_t(j) * G + g) * a.max_ctx;
    for (int tau = tid; tau < L; tau += kGroupThreads) async_copy4(e_all + size_t(g) * ctx4 + tau, s + tau);
  }
  async_commit();
  async_wait_all();
  __syncthreads();
  // Head g's max and exp by its 8 / G warps.
  constexpr int kWarpsPerHead = 8 / G;
  const int g_own = warp / kWarpsPerHead, sub = (warp % kWarpsPerHead) * 32 + lane;
  float* e = e_all + size_t(g_own) * ctx4;
  float mx = -INFINITY;
#pragma unroll 8
  for (int tau = sub; tau < L; tau += 32 * kWarpsPerHead) mx = fmaxf(mx, e[tau]);
  for (int m = 16; m >= 1; m >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, m));
  if (lane == 0) slot[warp] = mx;
  __syncthreads();
  mx = slot[g_own * kWarpsPerHead];
  for (int w = 1; w < kWarpsPerHead; ++w) mx = fmaxf(mx, slot[g_own * kWarpsPerHead + w]);
  for (int tau = sub; tau < L; tau += 32 * kWarpsPerHead) e[tau] = num::exp(e[tau] - mx);
  __syncthreads();
  if (warp >= 2 && warp < 2 + G) {  // Z of head warp - 2, by a warp that runs no chain
    const float* ez = e_all + size_t(warp - 2) * ctx4;
    float z = 0.0f;
#pragma unroll 8
    for (int tau = lane; tau < L; tau += 32) z = z + ez[tau];
    z = warp_butterfly(z);
    if (lane == 0) zs[warp - 2] = z;
  }
  // (the barrier at the first chunk publishes Z)
  const int nchunks = (L + kVPos - 1) / kVPos;
  if (!a.early) {
#pragma unroll
    for (int c = 0; c < kVStages - 1; ++c) {
      issue(c, L);
      async_commit();
    }
  } else if (p / kVPos < kVStages - 1) {  // the new row's chunk was issued early without it
    float* dst = ring + size_t(p / kVPos) * kVPos * kGroupDims + (p % kVPos) * kGroupDims;
    for (int k = tid; k < kGroupDims; k += kGroupThreads)
      if (d0 + k < hd) dst[k] = vbase[size_t(p) * stride + k];
  }
  const float* ec_all = e_all + size_t(g < G ? g : 0) * ctx4;
  float acc = 0.0f;
  for (int c = 0; c < nchunks; ++c) {
    if (c + kVStages - 1 < nchunks) issue(c + kVStages - 1, L);
    async_commit();
    async_wait_group<kVStages - 1>();  // this thread's piece of chunk c has landed
    __syncthreads();                   // and everyone's
    if (chain) {
      const float* v = ring + size_t(c % kVStages) * kVPos * kGroupDims + d;
      const int n = min(kVPos, L - c * kVPos);
      const float* ec = ec_all + c * kVPos;
      if (n == kVPos) {
        acc = chain_chunk<kGroupDims>(ec, v, acc);
      } else {
        for (int k = 0; k < n; ++k) acc = fmaf(ec[k], v[k * kGroupDims], acc);
      }
    }
    __syncthreads();  // the stage is refilled by the next iteration's issue
  }
  if (chain) a.out[(size_t(t) * a.h + j * G + g) * hd + i] = (acc / zs[g]) * num::sigmoid(skip & kLabLateLoads ? gate[i] : gate_v);
}

}  // namespace

void launch_attn(const AttnArgs& a, cudaStream_t s) {
  DQ_CHECK(a.hd <= 512 && a.hd % 4 == 0, "attention head dim {} (CUDA supports multiples of 4 up to 512)", a.hd);
  DQ_CHECK(size_t(a.max_ctx) * 4 <= 200 * 1024, "CUDA attention supports contexts up to 51200 tokens, got {}", a.max_ctx);
  const size_t smem = size_t(a.hd + 32) * 4;
  const dim3 grid(a.T * a.h, (a.max_ctx + kPos - 1) / kPos);
  // The kernel lab (DELTAQ_LAB_SKIP): "attn" skips all of attention, "scores" the scores
  // kernels, "softv" the softmax and weighted-sum kernels.
  const int skip = lab_skip("attn") || lab_skip("scores") ? 1 : 0;
  const int skip_v = lab_skip("attn") || lab_skip("softv") ? 1 : 0;
  // Decode: the append and the scores in one kernel (DELTAQ_ATTN_FUSED=0: the two kernels).
  static const char* fused_env = std::getenv("DELTAQ_ATTN_FUSED");
  static const bool fused_on = !(fused_env && fused_env[0] == '0');
  AttnArgs b = a;
  if (fused_on && a.T == 1 && a.hd <= 32 * kFusedNc) {
    launch_kernel(scores_append_kernel, grid, 256, size_t(2 * a.hd + 32) * 4, s, b, skip);
  } else {
    b.early = false;
    launch_kernel(append_kernel, a.T * a.hkv, 256, smem, s, b);
    launch_kernel(scores_kernel, grid, 256, smem, s, b, skip);
  }
  static bool attr_set = false;
  if (!attr_set) {
    DQ_CUDA_CHECK(cudaFuncSetAttribute(softmax_v_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    DQ_CUDA_CHECK(cudaFuncSetAttribute(softmax_v_ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 225 * 1024));
    attr_set = true;
  }
  // Grouped query heads over one ring when G is 1, 2 or 4, the dims split in 16s and the
  // context's weights fit (DELTAQ_ATTN_GROUP=0: never).
  static const char* group_env = std::getenv("DELTAQ_ATTN_GROUP");
  static const bool group_on = !(group_env && group_env[0] == '0');
  const int G = a.h / a.hkv;
  const size_t e_bytes = size_t(G) * ((a.max_ctx + 3) & ~3) * 4;
  // 16 stages when they fit beside the weights, else 4.
  const int stages = group_ring_floats(16) * 4 + e_bytes <= 225 * 1024 ? 16 : 4;
  const size_t group_smem = group_ring_floats(stages) * 4 + e_bytes;
  if (group_on && a.h % a.hkv == 0 && (G == 1 || G == 2 || G == 4) && a.hd % kGroupDims == 0 &&
      group_smem <= 225 * 1024) {
    using K = void (*)(AttnArgs, int, int);
    static const int trigger = env_int("DELTAQ_ATTN_TRIGGER", 0);
    static const K table[2][3] = {{softmax_v_group_kernel<1, 4>, softmax_v_group_kernel<2, 4>, softmax_v_group_kernel<4, 4>},
                                  {softmax_v_group_kernel<1, 16>, softmax_v_group_kernel<2, 16>,
                                   softmax_v_group_kernel<4, 16>}};
    static bool group_attr = false;
    if (!group_attr) {
      for (auto& row : table)
        for (K k : row) DQ_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 225 * 1024));
      group_attr = true;
    }
    launch_kernel(table[stages == 16 ? 1 : 0][G == 1 ? 0 : G == 2 ? 1 : 2], dim3(a.T * a.hkv, a.hd / kGroupDims),
                  kGroupThreads, group_smem, s, b, skip_v | late_loads(), trigger);
    return;
  }
  // The ring kernel when its ring and the context's weights fit in shared memory (DELTAQ_ATTN_RING=0: never).
  static const char* ring_env = std::getenv("DELTAQ_ATTN_RING");
  static const bool ring_on = !(ring_env && ring_env[0] == '0');
  const size_t ring_smem = kVRingBytes + size_t(a.max_ctx) * 4;
  if (ring_on && ring_smem <= 225 * 1024) {
    launch_kernel(softmax_v_ring_kernel, dim3(a.T * a.h, (a.hd + kDims - 1) / kDims), kVThreads, ring_smem, s, b, skip_v);
    return;
  }
  launch_kernel(softmax_v_kernel, dim3(a.T * a.h, (a.hd + kDims - 1) / kDims), kDims, size_t(a.max_ctx) * 4, s, b, skip_v);
}

}  // namespace dq::cuda
