// Gated DeltaNet prefill (op::GdnCore over T >= 2 tokens; 128-dim heads, conv kernel 4) in three
// kernels, so that the token-by-token recurrence runs with no barrier and no reduction per token:
// 1. prep (a warp per token and key head, tokens in parallel): the causal conv + SiLU of the key
//    head's q and k and of its value heads' v (a token's window comes from mixed or the old conv
//    state), q and k L2-normalised (q scaled), all into conv_out;
// 2. scan (128 threads per value head, thread v holding column v of S in registers): per token
//    the gates, the delta rule and the raw read-out into out. The inputs reach shared memory
//    8 tokens at a time by cp.async, three groups in a ring: one barrier per 8 tokens. Token t's
//    read-out chain runs interleaved with token t + 1's decay-and-dot chain (both need only
//    delta_t), so the token's critical path is one 128-step chain. Then the new conv state.
// 3. norm (a warp per token and value head): the gated RMSNorm of the read-out, in place.
// The arithmetic and its order are fused_kernel's (gdn.cu) and the reference's: the same bits.
#include "backend/cuda/kernels.cuh"
#include "ops/numerics.h"

namespace dq::cuda {

DQ_TIMELINE_FILE

namespace {

constexpr int DK = 128;             // head dim of q, k and v
constexpr int KC = 4;               // conv kernel
constexpr int kGroup = 8;           // tokens a staging group
constexpr int kSlot = 3 * DK + 4;   // a token in shared memory: k, q, v, then b and a (2 floats pad)

// conv + SiLU of channel c at token t (the reference's order: the chain over the window's older
// inputs, then the token's own).
__device__ __forceinline__ float conv_silu(const GdnArgs& a, int C, int c, int t) {
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < KC - 1; ++j) {
    const int idx = t - (KC - 1) + j;
    const float x = idx >= 0 ? a.mixed[size_t(idx) * C + c] : a.conv_state[size_t(idx + KC - 1) * C + c];
    acc = fmaf(a.conv_w[size_t(c) * KC + j], x, acc);
  }
  acc = fmaf(a.conv_w[size_t(c) * KC + KC - 1], a.mixed[size_t(t) * C + c], acc);
  return num::silu(acc);
}

__global__ void __launch_bounds__(128) prep_kernel(GdnArgs a) {
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const int hk = blockIdx.x * 4 + (threadIdx.x >> 5), t = blockIdx.y;
  const int Hk = a.hk, Hv = a.hv, G = Hv / Hk, C = (2 * Hk + Hv) * DK;
  pdl_wait();
  if (hk >= Hk) return;
  // Lane l owns channels l, l + 32, l + 64, l + 96 of the head: the canonical sum-of-squares order.
  float uq[4], uk[4], sq = 0.0f, sk = 0.0f;
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    uq[p] = conv_silu(a, C, hk * DK + lane + 32 * p, t);
    uk[p] = conv_silu(a, C, Hk * DK + hk * DK + lane + 32 * p, t);
    sq = fmaf(uq[p], uq[p], sq);
    sk = fmaf(uk[p], uk[p], sk);
  }
  const float rq = 1.0f / sqrtf(warp_butterfly(sq) + 1e-6f);
  const float rk = 1.0f / sqrtf(warp_butterfly(sk) + 1e-6f);
  const float scale = 1.0f / sqrtf(float(DK));
  float* u = a.u + size_t(t) * C;
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    u[hk * DK + lane + 32 * p] = (uq[p] * rq) * scale;
    u[Hk * DK + hk * DK + lane + 32 * p] = uk[p] * rk;
  }
  for (int hv = hk * G; hv < (hk + 1) * G; ++hv)
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const int c = 2 * Hk * DK + hv * DK + lane + 32 * p;
      u[c] = conv_silu(a, C, c, t);
    }
}

// The decay of a token: exp(A_neg * softplus(a + dt_bias)), fused_kernel's expression.
__device__ __forceinline__ float decay(float A_neg, float a_raw, float dt_bias) {
  return num::exp(A_neg * num::softplus(a_raw + dt_bias));
}

__global__ void __launch_bounds__(128) scan_kernel(GdnArgs a) {
  pdl_trigger();
  __shared__ __align__(16) float ring[3][kGroup][kSlot];
  const int hv = blockIdx.x, v = threadIdx.x, Hk = a.hk, Hv = a.hv, T = a.T;
  const int hk = hv / (Hv / Hk), C = (2 * Hk + Hv) * DK;
  const int n_groups = (T + kGroup - 1) / kGroup;
  float* Sg = a.S + size_t(hv) * DK * DK;
  {  // this head's 64 KB of state into L2 while the prep kernel runs: 4 lines of 128 bytes a thread
    const char* base = reinterpret_cast<const char*>(Sg);
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("prefetch.global.L2 [%0];" ::"l"(base + (size_t(v) + 128 * i) * 128));
  }
  const float A_neg = a.A_neg[hv], dt_bias = a.dt_bias[hv];
  pdl_wait();
  // Group g's k, q, v (16-byte copies) and b, a (4-byte) into ring[g % 3].
  auto stage = [&](int g) {
    const int t0 = g * kGroup, n = min(kGroup, T - t0);
    float(*buf)[kSlot] = ring[g % 3];
    const int src_at[3] = {Hk * DK + hk * DK, hk * DK, 2 * Hk * DK + hv * DK};  // k, q, v
    for (int i = threadIdx.x; i < n * 96; i += blockDim.x) {
      const int tt = i / 96, part = (i % 96) / 32, f = i % 32;
      async_copy16(&buf[tt][part * DK + 4 * f], a.u + size_t(t0 + tt) * C + src_at[part] + 4 * f);
    }
    if (int(threadIdx.x) < n) {
      async_copy4(&buf[threadIdx.x][3 * DK], a.b + size_t(t0 + threadIdx.x) * Hv + hv);
      async_copy4(&buf[threadIdx.x][3 * DK + 1], a.a + size_t(t0 + threadIdx.x) * Hv + hv);
    }
    async_commit();
  };
  stage(0);
  if (n_groups > 1) stage(1);
  float col[DK];
#pragma unroll
  for (int i = 0; i < DK; ++i) col[i] = Sg[i * DK + v];
  async_wait_all();
  __syncthreads();
  // Token 0's decay and dot against k.
  float beta = num::sigmoid(ring[0][0][3 * DK]), m = 0.0f;
  {
    const float alpha = decay(A_neg, ring[0][0][3 * DK + 1], dt_bias);
    const float4* k4 = reinterpret_cast<const float4*>(ring[0][0]);
#pragma unroll
    for (int j = 0; j < DK / 4; ++j) {
      const float4 k = k4[j];
      const float kk[4] = {k.x, k.y, k.z, k.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        col[4 * j + e] = alpha * col[4 * j + e];
        m = fmaf(col[4 * j + e], kk[e], m);
      }
    }
  }
  for (int t = 0; t < T; ++t) {
    const float* cur = ring[(t / kGroup) % 3][t % kGroup];
    const float delta = beta * (cur[2 * DK + v] - m);
    const float4* k4 = reinterpret_cast<const float4*>(cur);
    const float4* q4 = reinterpret_cast<const float4*>(cur + DK);
    float o = 0.0f;
    if (t + 1 < T) {
      if (t % kGroup == kGroup - 1) {  // token t + 1 opens the next group, staged a group ago
        async_wait_all();
        __syncthreads();  // ... and every thread is past the group before: its buffer is free
        if ((t + 1) / kGroup + 1 < n_groups) stage((t + 1) / kGroup + 1);
      }
      const float* nxt = ring[((t + 1) / kGroup) % 3][(t + 1) % kGroup];
      const float alpha_n = decay(A_neg, nxt[3 * DK + 1], dt_bias);
      beta = num::sigmoid(nxt[3 * DK]);
      const float4* kn4 = reinterpret_cast<const float4*>(nxt);
      m = 0.0f;
#pragma unroll
      for (int j = 0; j < DK / 4; ++j) {
        const float4 k = k4[j], q = q4[j], kn = kn4[j];
        const float kk[4] = {k.x, k.y, k.z, k.w}, qq[4] = {q.x, q.y, q.z, q.w}, kx[4] = {kn.x, kn.y, kn.z, kn.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float& s = col[4 * j + e];
          s = fmaf(kk[e], delta, s);  // token t: the update, then the read-out against q
          o = fmaf(s, qq[e], o);
          s = alpha_n * s;            // token t + 1: the decay, then the dot against its k
          m = fmaf(s, kx[e], m);
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < DK / 4; ++j) {
        const float4 k = k4[j], q = q4[j];
        const float kk[4] = {k.x, k.y, k.z, k.w}, qq[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          col[4 * j + e] = fmaf(kk[e], delta, col[4 * j + e]);
          o = fmaf(col[4 * j + e], qq[e], o);
        }
      }
    }
    a.out[(size_t(t) * Hv + hv) * DK + v] = o;  // raw: norm_kernel applies the gated RMSNorm
  }
#pragma unroll
  for (int i = 0; i < DK; ++i) Sg[i * DK + v] = col[i];
  // The new conv state: the last KC - 1 inputs (older ones from the old state when T < KC - 1;
  // ascending j reads index T + j > j, not yet overwritten). The key head's q and k channels by
  // its first value head's block.
  const int ch[3] = {hk * DK + v, Hk * DK + hk * DK + v, 2 * Hk * DK + hv * DK + v};
  for (int c = hv % (Hv / Hk) == 0 ? 0 : 2; c < 3; ++c)
#pragma unroll
    for (int j = 0; j < KC - 1; ++j) {
      const int idx = T - (KC - 1) + j;
      a.conv_state[size_t(j) * C + ch[c]] =
          idx >= 0 ? a.mixed[size_t(idx) * C + ch[c]] : a.conv_state[size_t(idx + KC - 1) * C + ch[c]];
    }
}

__global__ void __launch_bounds__(128) norm_kernel(GdnArgs a) {
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const int hv = blockIdx.x * 4 + (threadIdx.x >> 5), t = blockIdx.y;
  pdl_wait();
  if (hv >= a.hv) return;
  const size_t at = (size_t(t) * a.hv + hv) * DK;
  float ov[4], ss = 0.0f;
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    ov[p] = a.out[at + lane + 32 * p];
    ss = fmaf(ov[p], ov[p], ss);
  }
  const float r = num::rms_inv(warp_butterfly(ss), DK, a.eps);
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const int v = lane + 32 * p;
    a.out[at + v] = ((ov[p] * r) * a.norm[v]) * num::silu(a.z[at + v]);
  }
}

}  // namespace

bool launch_gdn_prefill(const GdnArgs& a, cudaStream_t s) {
  if (a.T < 2 || a.T > 65535 || a.dk != DK || a.dv != DK || a.K != KC || a.hk <= 0 || a.hv % a.hk != 0) return false;
  launch_kernel(prep_kernel, dim3((a.hk + 3) / 4, a.T), 128, 0, s, a);
  launch_kernel(scan_kernel, a.hv, 128, 0, s, a);
  launch_kernel(norm_kernel, dim3((a.hv + 3) / 4, a.T), 128, 0, s, a);
  return true;
}

}  // namespace dq::cuda
