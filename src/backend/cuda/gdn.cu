// Gated DeltaNet token mixer (op::GdnCore), in the reference order of ops/reference_impl.h:
// kernel 1: causal conv + SiLU for every channel (one thread per channel, tokens in order);
// kernel 2: per value head: q/k L2 norms, gates, the delta-rule update of S (fp32, in shared
// memory while the head is processed), read-out and the gated RMSNorm. For ungrouped 128-dim
// heads (0.8B, 2B) one fused kernel does both (fused_kernel below); in decode, split_kernel
// spreads each head over a cluster of blocks, for grouped heads too (4B, 9B: two value heads a
// key head).
#include <cooperative_groups.h>

#include <cstdlib>

#include "backend/cuda/kernels.cuh"
#include "ops/numerics.h"

namespace dq::cuda {

namespace cg = cooperative_groups;

DQ_TIMELINE_FILE

namespace {

__global__ void conv_kernel(GdnArgs a) {
  pdl_trigger();
  pdl_wait();
  const int C = 2 * a.hk * a.dk + a.hv * a.dv, K = a.K;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const float* w = a.conv_w + size_t(c) * K;
  for (int t = 0; t < a.T; ++t) {
    const float in = a.mixed[size_t(t) * C + c];
    float acc = 0.0f;
    for (int j = 0; j < K - 1; ++j) acc = fmaf(w[j], a.conv_state[size_t(j) * C + c], acc);
    acc = fmaf(w[K - 1], in, acc);
    a.u[size_t(t) * C + c] = num::silu(acc);
    for (int j = 0; j + 1 < K - 1; ++j) a.conv_state[size_t(j) * C + c] = a.conv_state[size_t(j + 1) * C + c];
    if (K > 1) a.conv_state[size_t(K - 2) * C + c] = in;
  }
}

template <bool SMEM_STATE>
__global__ void head_kernel(GdnArgs a) {
  pdl_trigger();
  pdl_wait();
  extern __shared__ float smem[];
  const int hv = blockIdx.x, Hk = a.hk, Hv = a.hv, Dk = a.dk, Dv = a.dv;
  const int C = 2 * Hk * Dk + Hv * Dv;
  const int hk = hv / (Hv / Hk);
  float* qn = smem;           // [Dk]
  float* kn = qn + Dk;        // [Dk]
  float* ob = kn + Dk;        // [Dv] read-out
  float* slot = ob + Dv;      // [4]
  float* Ssm = slot + 4;      // [Dk][Dv] when SMEM_STATE
  float* Sg = a.S + size_t(hv) * Dk * Dv;
  float* S = SMEM_STATE ? Ssm : Sg;
  const int v = threadIdx.x;
  const float scale = 1.0f / sqrtf(float(Dk));
  if (SMEM_STATE)
    for (int i = threadIdx.x; i < Dk * Dv; i += blockDim.x) Ssm[i] = Sg[i];
  for (int t = 0; t < a.T; ++t) {
    const float* u = a.u + size_t(t) * C;
    const float* q = u + hk * Dk;
    const float* k = u + Hk * Dk + hk * Dk;
    const float rq = 1.0f / sqrtf(block_sum_squares(q, Dk, slot) + 1e-6f);
    const float rk = 1.0f / sqrtf(block_sum_squares(k, Dk, slot + 1) + 1e-6f);
    for (int i = threadIdx.x; i < Dk; i += blockDim.x) {
      qn[i] = (q[i] * rq) * scale;
      kn[i] = k[i] * rk;
    }
    __syncthreads();
    const float beta = num::sigmoid(a.b[size_t(t) * Hv + hv]);
    const float g = a.A_neg[hv] * num::softplus(a.a[size_t(t) * Hv + hv] + a.dt_bias[hv]);
    const float alpha = num::exp(g);
    if (v < Dv) {
      float m = 0.0f;
      for (int i = 0; i < Dk; ++i) {
        float s = alpha * S[i * Dv + v];
        S[i * Dv + v] = s;
        m = fmaf(s, kn[i], m);
      }
      const float delta = beta * (u[2 * Hk * Dk + hv * Dv + v] - m);
      float o = 0.0f;
      for (int i = 0; i < Dk; ++i) {
        float s = fmaf(kn[i], delta, S[i * Dv + v]);
        S[i * Dv + v] = s;
        o = fmaf(s, qn[i], o);
      }
      ob[v] = o;
    }
    __syncthreads();
    const float r = num::rms_inv(block_sum_squares(ob, Dv, slot + 2), Dv, a.eps);
    if (v < Dv) {
      const size_t at = size_t(t) * Hv * Dv + size_t(hv) * Dv + v;
      a.out[at] = ((ob[v] * r) * a.norm[v]) * num::silu(a.z[at]);
    }
    __syncthreads();
  }
  if (SMEM_STATE) {
    __syncthreads();
    for (int i = threadIdx.x; i < Dk * Dv; i += blockDim.x) Sg[i] = Ssm[i];
  }
}

// The delta-rule step of one state column (thread v holds column v of S in registers):
// decay, read-out against k, the update with beta * (v - m), read-out against q. Returns o_v.
template <int DK>
__device__ __forceinline__ float delta_rule_column(float (&col)[DK], const float* kn, const float* qn, float alpha,
                                                   float beta, float vv) {
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < DK; ++i) {
    col[i] = alpha * col[i];
    m = fmaf(col[i], kn[i], m);
  }
  const float delta = beta * (vv - m);
  float o = 0.0f;
#pragma unroll
  for (int i = 0; i < DK; ++i) {
    col[i] = fmaf(kn[i], delta, col[i]);
    o = fmaf(col[i], qn[i], o);
  }
  return o;
}

// The common case (Dk a compile-time 128 or 64): thread v keeps column v of S in registers;
// all its loads are issued at once, S is read once and written once per step.
template <int DK>
__global__ void __launch_bounds__(256) head_kernel_reg(GdnArgs a) {
  pdl_trigger();
  pdl_wait();
  __shared__ float qn[DK], kn[DK], ob[256], slot[4];
  const int hv = blockIdx.x, Hk = a.hk, Hv = a.hv, Dv = a.dv;
  const int C = 2 * Hk * DK + Hv * Dv;
  const int hk = hv / (Hv / Hk);
  const int v = threadIdx.x;
  float* Sg = a.S + size_t(hv) * DK * Dv;
  float col[DK];
  if (v < Dv) {
#pragma unroll
    for (int i = 0; i < DK; ++i) col[i] = Sg[i * Dv + v];
  }
  const float scale = 1.0f / sqrtf(float(DK));
  for (int t = 0; t < a.T; ++t) {
    const float* u = a.u + size_t(t) * C;
    for (int i = threadIdx.x; i < DK; i += blockDim.x) {  // q and k to shared memory first
      qn[i] = u[hk * DK + i];
      kn[i] = u[Hk * DK + hk * DK + i];
    }
    __syncthreads();
    const float rq = 1.0f / sqrtf(block_sum_squares(qn, DK, slot) + 1e-6f);
    const float rk = 1.0f / sqrtf(block_sum_squares(kn, DK, slot + 1) + 1e-6f);
    for (int i = threadIdx.x; i < DK; i += blockDim.x) {
      qn[i] = (qn[i] * rq) * scale;
      kn[i] = kn[i] * rk;
    }
    __syncthreads();
    const float beta = num::sigmoid(a.b[size_t(t) * Hv + hv]);
    const float g = a.A_neg[hv] * num::softplus(a.a[size_t(t) * Hv + hv] + a.dt_bias[hv]);
    const float alpha = num::exp(g);
    if (v < Dv) ob[v] = delta_rule_column<DK>(col, kn, qn, alpha, beta, u[2 * Hk * DK + hv * Dv + v]);
    __syncthreads();
    const float r = num::rms_inv(block_sum_squares(ob, Dv, slot + 2), Dv, a.eps);
    if (v < Dv) {
      const size_t at = size_t(t) * Hv * Dv + size_t(hv) * Dv + v;
      a.out[at] = ((ob[v] * r) * a.norm[v]) * num::silu(a.z[at]);
    }
    __syncthreads();
  }
  if (v < Dv) {
#pragma unroll
    for (int i = 0; i < DK; ++i) Sg[i * Dv + v] = col[i];
  }
}

// The 2B-family case in one kernel (Hk == Hv, Dk == Dv == 128, conv kernel 4): block hv also
// runs the causal conv + SiLU of its 384 channels (q and k of its key head, v of its value head:
// thread v owns channel v of each), so the conv costs no launch of its own. Before the
// programmatic-launch wait the block only prefetches its state into L2 (the values are read
// after the wait, when the previous step's writes are certain to be complete) and loads the
// conv weights, which no kernel writes.
// Prefill runs gdn_prefill.cu's scan instead unless DELTAQ_GDN_SCAN=0.
template <int KC>
__global__ void __launch_bounds__(128) fused_kernel(GdnArgs a, int skip) {
  constexpr int DK = 128;
  DQ_TL_SLOTS();  // (the timeline build: the recorder's slots, reserved before the wait)
  pdl_trigger();
  __shared__ float qn[DK], kn[DK], ob[DK], slot[4];
  const int hv = blockIdx.x, H = a.hv;
  const int C = 3 * H * DK;
  const int v = threadIdx.x;
  const int ch[3] = {hv * DK + v, H * DK + hv * DK + v, 2 * H * DK + hv * DK + v};  // q, k, v channels
  float* Sg = a.S + size_t(hv) * DK * DK;
  {  // this block's 64 KB of state into L2: 512 lines of 128 bytes, 4 per thread
    const char* base = reinterpret_cast<const char*>(Sg);
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("prefetch.global.L2 [%0];" ::"l"(base + (size_t(v) + 128 * i) * 128));
  }
  // Weights (no kernel writes them) before the wait.
  float w[3][KC];
#pragma unroll
  for (int c = 0; c < 3; ++c)
#pragma unroll
    for (int j = 0; j < KC; ++j) w[c][j] = a.conv_w[size_t(ch[c]) * KC + j];
  const float A_neg = a.A_neg[hv], dt_bias = a.dt_bias[hv], nw = a.norm[v];
  pdl_wait();
  if (skip) return;  // the kernel lab only (DELTAQ_LAB_SKIP=gdn): results are then wrong
  // Every load of the step is issued here, before the first barrier.
  float st[3][KC - 1];
#pragma unroll
  for (int c = 0; c < 3; ++c)
#pragma unroll
    for (int j = 0; j < KC - 1; ++j) st[c][j] = a.conv_state[size_t(j) * C + ch[c]];
  float col[DK];
#pragma unroll
  for (int i = 0; i < DK; ++i) col[i] = Sg[i * DK + v];
  const float scale = 1.0f / sqrtf(float(DK));
  for (int t = 0; t < a.T; ++t) {
    float in[3];
#pragma unroll
    for (int c = 0; c < 3; ++c) in[c] = a.mixed[size_t(t) * C + ch[c]];
    const float bt = a.b[size_t(t) * H + hv], at_ = a.a[size_t(t) * H + hv];
    const float zv = a.z[size_t(t) * H * DK + size_t(hv) * DK + v];
    const size_t at = size_t(t) * H * DK + size_t(hv) * DK + v;
    float uc[3];
#pragma unroll
    for (int c = 0; c < 3; ++c) {  // conv_kernel's order: chain over the state, then the input
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < KC - 1; ++j) acc = fmaf(w[c][j], st[c][j], acc);
      acc = fmaf(w[c][KC - 1], in[c], acc);
      uc[c] = num::silu(acc);
      a.u[size_t(t) * C + ch[c]] = uc[c];
#pragma unroll
      for (int j = 0; j + 1 < KC - 1; ++j) st[c][j] = st[c][j + 1];
      st[c][KC - 2] = in[c];
    }
    if (t == 0) DQ_MARK();  // (the first token only: prefill would fill the records)
    qn[v] = uc[0];
    kn[v] = uc[1];
    __syncthreads();
    const float rq = 1.0f / sqrtf(block_sum_squares(qn, DK, slot) + 1e-6f);
    const float rk = 1.0f / sqrtf(block_sum_squares(kn, DK, slot + 1) + 1e-6f);
    qn[v] = (qn[v] * rq) * scale;
    kn[v] = kn[v] * rk;
    __syncthreads();
    const float beta = num::sigmoid(bt);
    const float g = A_neg * num::softplus(at_ + dt_bias);
    const float alpha = num::exp(g);
    if (t == 0) DQ_MARK();
    ob[v] = delta_rule_column<DK>(col, kn, qn, alpha, beta, uc[2]);
    __syncthreads();
    if (t == 0) DQ_MARK();
    const float r = num::rms_inv(block_sum_squares(ob, DK, slot + 2), DK, a.eps);
    a.out[at] = ((ob[v] * r) * nw) * num::silu(zv);
    __syncthreads();
    if (t == 0) DQ_MARK();
  }
#pragma unroll
  for (int i = 0; i < DK; ++i) Sg[i * DK + v] = col[i];
#pragma unroll
  for (int c = 0; c < 3; ++c)
#pragma unroll
    for (int j = 0; j < KC - 1; ++j) a.conv_state[size_t(j) * C + ch[c]] = st[c][j];
}

// Decode (one token) of the same shapes spread over SL blocks per head, one warp each: block
// (hv, sl) owns state columns [sl * CW, (sl + 1) * CW), so the 1 MB of a layer's state moves
// through 16 * SL SMs instead of 16. Every block convolves and normalises q and k of its head
// itself (lane l owns channels l, l + 32, l + 64, l + 96: the canonical sum-of-squares order),
// its CW lanes run the delta rule of their columns and store o before the gated RMSNorm; the
// head's last block to arrive (a counter per head) normalises the head's 128 outputs in the
// canonical order and resets the counter. Same arithmetic and order as fused_kernel.
//
// CLUSTER (SL == 4, launched as clusters of the head's 4 blocks): no counter and no last block.
// Each block pushes its 32 outputs into the shared memory of all four (distributed shared
// memory), one cluster barrier, and every block normalises its own 32 from the head's 128 in the
// same order; block sl keeps the conv state of q's and k's channels lane + 32 sl. The global
// fence that made the state stores and the outputs visible before the count, and the last
// block's reads through L2, leave the critical path.
// Grouped heads (the 4B's and 9B's Hv = 2 Hk, CLUSTER only): the cluster is the key head's G
// value heads, 4 G blocks; every block convolves its key head's q and k, and only the first
// value head's blocks keep their conv state and u, after the cluster barrier, by when every
// block of the group has read it.
// q's and k's conv output, rolled conv state and channels, for one of a lane's four channels.
template <int KC>
struct QkKeepT {
  float uq, uk, inq, ink, sq[KC - 2], sk[KC - 2];
  int chq, chk;
};

// trigger: when the next kernel (the out-projection) may launch: 0 at the start, 1 after the
// programmatic wait, when the in-projection's blocks have left their SMs (launched earlier, its
// blocks find SMs still full with the in-projection and some SMs get two).
template <int KC, int SL, bool EARLY, bool CLUSTER = false>
__global__ void __launch_bounds__(32) split_kernel(GdnArgs a, int skip, int trigger) {
  constexpr int DK = 128, CW = DK / SL;
  using QkKeep = QkKeepT<KC>;
  static_assert(CW <= 32 && DK % SL == 0, "one lane per column");
  static_assert(!CLUSTER || SL == 4, "the cluster finisher gives block sl the channels lane + 32 sl");
  DQ_TL_SLOTS();  // (the timeline build: the recorder's slots, reserved before the wait)
  DQ_SM(101);  // (the kernel lab's SM record: this block started; 103 below: it ends)
  if (trigger == 0) pdl_trigger();
  // CLUSTER: this block has started (a block's shared memory may be written by the others only
  // then); waited for just before the first remote store, long after every block arrived.
  if constexpr (CLUSTER) asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  __shared__ __align__(16) float qn[DK], kn[DK];  // read four at a time by the delta rule
  __shared__ float o_all[CLUSTER ? DK : 1];  // CLUSTER: the head's outputs, pushed by its blocks
  const int hv = blockIdx.x / SL, sl = blockIdx.x % SL, H = a.hv, Hk = a.hk;
  const int G = H / Hk, hk = hv / G;  // value heads a key head (1 unless CLUSTER)
  const int C = 2 * Hk * DK + H * DK;
  const int lane = threadIdx.x, c0 = sl * CW;
  const bool owner = lane < CW;  // this lane runs column c0 + lane
  float* Sg = a.S + size_t(hv) * DK * DK + c0;
  // Channels: q and k of lane's four positions, v of lane's column.
  int chq[4], chk[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    chq[j] = hk * DK + lane + 32 * j;
    chk[j] = Hk * DK + hk * DK + lane + 32 * j;
  }
  const int chv = 2 * Hk * DK + hv * DK + c0 + (owner ? lane : 0);
  float wq[4][KC], wk[4][KC], wv[KC];
#pragma unroll
  for (int j = 0; j < KC; ++j) {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      wq[p][j] = a.conv_w[size_t(chq[p]) * KC + j];
      wk[p][j] = a.conv_w[size_t(chk[p]) * KC + j];
    }
    wv[j] = a.conv_w[size_t(chv) * KC + j];
  }
  const float A_neg = a.A_neg[hv], dt_bias = a.dt_bias[hv];
  // CLUSTER: this lane's output channel lane + 32 sl; its norm weight now, its z with the
  // projections below, so that no load waits behind the cluster barrier at the end.
  [[maybe_unused]] const float gnorm = CLUSTER ? a.norm[c0 + lane] : 0.0f;
  // EARLY (GdnArgs::early): nothing since the stream was idle writes S or the conv state, so
  // both are read while the previous kernel still runs (2.3% faster decode on the H200).
  if (!EARLY) pdl_wait();
  // This block's slice of the state (128 rows of CW columns) into shared memory by 16-byte
  // asynchronous copies: with EARLY they land while the previous kernel runs, and the column
  // comes into registers from shared memory after the conv instead of from L2.
  __shared__ __align__(16) float s_cols[DK * CW];
  constexpr int kParts = CW / 4;  // 16-byte pieces per row segment
  for (int c = lane; c < DK * kParts; c += 32)
    async_copy16(s_cols + (c / kParts) * CW + (c % kParts) * 4, Sg + size_t(c / kParts) * DK + (c % kParts) * 4);
  if (skip & kLabSkip) {  // the kernel lab only (DELTAQ_LAB_SKIP=gdn): results are then wrong
    async_wait_all();
    if constexpr (CLUSTER) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
    return;
  }
  float sq[4][KC - 1], sk[4][KC - 1], sv[KC - 1];
#pragma unroll
  for (int j = 0; j < KC - 1; ++j) {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      sq[p][j] = a.conv_state[size_t(j) * C + chq[p]];
      sk[p][j] = a.conv_state[size_t(j) * C + chk[p]];
    }
    sv[j] = a.conv_state[size_t(j) * C + chv];
  }
  if (EARLY) pdl_wait();
  if (trigger != 0) pdl_trigger();
  float inq[4], ink[4];
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    inq[p] = a.mixed[chq[p]];
    ink[p] = a.mixed[chk[p]];
  }
  const float inv = a.mixed[chv];
  const float bt = a.b[hv], at_ = a.a[hv];
  [[maybe_unused]] const float zv = CLUSTER ? a.z[size_t(hv) * DK + c0 + lane] : 0.0f;
  // The causal conv + SiLU (conv_kernel's order: chain over the state, then the input).
  auto conv = [](const float* w, const float* st, float in) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < KC - 1; ++j) acc = fmaf(w[j], st[j], acc);
    return num::silu(fmaf(w[KC - 1], in, acc));
  };
  float uq[4], uk[4];
  float ssq = 0.0f, ssk = 0.0f;
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    uq[p] = conv(wq[p], sq[p], inq[p]);
    uk[p] = conv(wk[p], sk[p], ink[p]);
    ssq = fmaf(uq[p], uq[p], ssq);
    ssk = fmaf(uk[p], uk[p], ssk);
  }
  const float uv = conv(wv, sv, inv);
  DQ_MARK();
  const float rq = 1.0f / sqrtf(warp_butterfly(ssq) + 1e-6f);
  const float rk = 1.0f / sqrtf(warp_butterfly(ssk) + 1e-6f);
  const float scale = 1.0f / sqrtf(float(DK));
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    qn[lane + 32 * p] = (uq[p] * rq) * scale;
    kn[lane + 32 * p] = uk[p] * rk;
  }
  // The conv state and u before the delta rule, so that nothing else is live beside the column.
  if (owner) {
    a.u[chv] = uv;
#pragma unroll
    for (int j = 0; j + 1 < KC - 1; ++j) a.conv_state[size_t(j) * C + chv] = sv[j + 1];
    a.conv_state[size_t(KC - 2) * C + chv] = inv;
  }
  // What keep_qk stores for channel set p; the cluster's block keeps only p = sl, picked here.
  // (With the column of S in registers this kernel spills 100 bytes, ptxas -v; picking was meant
  // to avoid that and did not: 72 bytes without it, the two not compared on the GPU.)
  auto pick = [&](int p) {
    QkKeep k{};
#pragma unroll
    for (int r = 0; r < 4; ++r)
      if (r == p) {
        k.uq = uq[r], k.uk = uk[r], k.inq = inq[r], k.ink = ink[r], k.chq = chq[r], k.chk = chk[r];
#pragma unroll
        for (int j = 0; j < KC - 2; ++j) k.sq[j] = sq[r][j + 1], k.sk[j] = sk[r][j + 1];
      }
    return k;
  };
  [[maybe_unused]] const QkKeep mine = CLUSTER ? pick(sl) : QkKeep{};
  DQ_MARK();
  // This lane's column of S into registers (the delta rule then reads no shared memory: a
  // single warp issues all of it, and its chains ran at the latency of the shared loads).
  async_wait_all();
  __syncwarp();
  DQ_MARK();
  float col[DK];
  if (owner) {
#pragma unroll
    for (int i = 0; i < DK; ++i) col[i] = s_cols[i * CW + lane];
  }
  __syncwarp();
  const float beta = num::sigmoid(bt);
  const float alpha = num::exp(A_neg * num::softplus(at_ + dt_bias));
  float* o_raw = a.out + size_t(hv) * DK;
  DQ_MARK();
  if constexpr (CLUSTER) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");  // all started
  DQ_MARK();
  if (owner) {  // delta_rule_column's arithmetic, the column in registers
    // q and k in 16-byte loads (one instead of four per row: a single warp issues every
    // instruction of this phase, so their count is its time); the same chains, i increasing.
    const float4* kn4 = reinterpret_cast<const float4*>(kn);
    const float4* qn4 = reinterpret_cast<const float4*>(qn);
    float m = 0.0f;
#pragma unroll
    for (int i4 = 0; i4 < DK / 4; ++i4) {
      const float4 k4 = kn4[i4];
      const float kk[4] = {k4.x, k4.y, k4.z, k4.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = 4 * i4 + j;
        col[i] = alpha * col[i];
        m = fmaf(col[i], kk[j], m);
      }
    }
    const float delta = beta * (uv - m);
    DQ_MARK();
    float o = 0.0f;
#pragma unroll
    for (int i4 = 0; i4 < DK / 4; ++i4) {
      const float4 k4 = kn4[i4], q4 = qn4[i4];
      const float kk[4] = {k4.x, k4.y, k4.z, k4.w}, qq[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = 4 * i4 + j;
        const float c = fmaf(kk[j], delta, col[i]);
        o = fmaf(c, qq[j], o);
        Sg[size_t(i) * DK + lane] = c;
      }
    }
    DQ_MARK();
    if constexpr (CLUSTER) {
      cg::cluster_group cl = cg::this_cluster();
#pragma unroll
      for (int r = 0; r < SL; ++r) cl.map_shared_rank(o_all, (hv % G) * SL + r)[c0 + lane] = o;
    } else {
      o_raw[c0 + lane] = o;
    }
  }
  DQ_MARK();
  // q's and k's conv output and rolled conv state for this lane's channels lane + 32 p.
  auto keep_qk = [&](const QkKeep& k) {
    a.u[k.chq] = k.uq;
    a.u[k.chk] = k.uk;
#pragma unroll
    for (int j = 0; j < KC - 2; ++j) {
      a.conv_state[size_t(j) * C + k.chq] = k.sq[j];
      a.conv_state[size_t(j) * C + k.chk] = k.sk[j];
    }
    a.conv_state[size_t(KC - 2) * C + k.chq] = k.inq;
    a.conv_state[size_t(KC - 2) * C + k.chk] = k.ink;
  };
  if constexpr (CLUSTER) {
    cg::this_cluster().sync();  // every block's outputs are in every block (release / acquire)
    float ov[4], ss = 0.0f;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      ov[p] = o_all[lane + 32 * p];
      ss = fmaf(ov[p], ov[p], ss);
    }
    const float r = num::rms_inv(warp_butterfly(ss), DK, a.eps);
    const int v = c0 + lane;  // = lane + 32 sl
    // (kLabLateLoads, an A/B knob: z and the norm weight loaded here, as before session 33)
    o_raw[v] = skip & kLabLateLoads ? ((ov[sl] * r) * a.norm[v]) * num::silu(a.z[size_t(hv) * DK + v])
                        : ((ov[sl] * r) * gnorm) * num::silu(zv);
    if (hv % G == 0) keep_qk(mine);  // every block of the cluster read q's and k's conv state before the barrier
    DQ_SM(103);
    return;
  }
  // The head's last block applies the gated RMSNorm to all 128 outputs and keeps q's and k's
  // conv state (every block has read it by then).
  __threadfence();
  __syncwarp();
  unsigned arrived = 0;
  if (lane == 0) arrived = atomicAdd(&a.counters[hv], 1u);
  arrived = __shfl_sync(0xffffffffu, arrived, 0);
  if (arrived != SL - 1) return;
  __threadfence();
  float ov[4], ss = 0.0f;
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    ov[p] = __ldcg(o_raw + lane + 32 * p);
    ss = fmaf(ov[p], ov[p], ss);
  }
  const float r = num::rms_inv(warp_butterfly(ss), DK, a.eps);
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const int v = lane + 32 * p;
    o_raw[v] = ((ov[p] * r) * a.norm[v]) * num::silu(a.z[size_t(hv) * DK + v]);
  }
  // q and k: every block of the head computed them and has read their conv state: the last keeps them.
#pragma unroll
  for (int p = 0; p < 4; ++p) keep_qk(pick(p));
  if (lane == 0) a.counters[hv] = 0u;
}

}  // namespace

void launch_gdn(const GdnArgs& a, cudaStream_t s) {
  static const char* fused_env = std::getenv("DELTAQ_GDN_FUSED");
  static const bool fused = !(fused_env && fused_env[0] == '0');
  static const char* split_env = std::getenv("DELTAQ_GDN_SPLIT");
  static const int split = split_env ? std::atoi(split_env) : 4;  // slices per head: 4, 8 or 16 (measured equal)
  const int si = split == 8 ? 1 : split == 16 ? 2 : 0;
  // DELTAQ_GDN_CLUSTER=0: the counter and the last block instead of the head's cluster.
  static const char* cl_env = std::getenv("DELTAQ_GDN_CLUSTER");
  static const bool cluster = !(cl_env && cl_env[0] == '0');
  // Value heads a key head: 1 (0.8B, 2B); 2 (4B, 9B) by the cluster only, unless
  // DELTAQ_GDN_GROUPED=0 (then the conv and head kernels below).
  static const bool grouped = env_int("DELTAQ_GDN_GROUPED", 1) != 0;
  const int G = a.hk > 0 && a.hv % a.hk == 0 ? a.hv / a.hk : 0;
  const bool split_ok = G == 1 || (G == 2 && grouped && cluster && si == 0);
  if (fused && a.T == 1 && split > 1 && a.counters && a.hv <= kGdnCounterSlots && split_ok && a.dk == 128 &&
      a.dv == 128 && a.K == 4) {
    const int skip = (lab_skip("gdn") ? kLabSkip : 0) | late_loads();
    // When the out-projection may launch: at the start for the 2B's heads (trigger 1 measured
    // -1.5% on the H200, session 13), after the wait for grouped heads, whose in-projection is the
    // pipelined product filling its SM (4B +1.0%, 9B +0.45% on an H100, session 33).
    // DELTAQ_GDN_TRIGGER=0 or 1 overrides (results never depend on it).
    static const int trigger_env = env_int("DELTAQ_GDN_TRIGGER", -1);
    const int trigger = trigger_env >= 0 ? trigger_env : G == 2 ? 1 : 0;
    using K = void (*)(GdnArgs, int, int);
    static const K table[3][2] = {{split_kernel<4, 4, false>, split_kernel<4, 4, true>},
                                  {split_kernel<4, 8, false>, split_kernel<4, 8, true>},
                                  {split_kernel<4, 16, false>, split_kernel<4, 16, true>}};
    if (cluster && si == 0) {  // a cluster is the key head's G value heads, 4 blocks each
      launch_kernel_in(4 * G, a.early ? split_kernel<4, 4, true, true> : split_kernel<4, 4, false, true>, a.hv * 4, 32,
                       0, s, a, skip, trigger);
      return;
    }
    launch_kernel(table[si][a.early ? 1 : 0], a.hv * (4 << si), 32, 0, s, a, skip, trigger);
    return;
  }
  // Prefill by the scan (gdn_prefill.cu; 1.15-1.17x the 2B's prefill on an H100, session 38);
  // DELTAQ_GDN_SCAN=0 keeps the kernels below.
  static const bool scan = env_int("DELTAQ_GDN_SCAN", 1) != 0;
  if (scan && a.T >= 2 && launch_gdn_prefill(a, s)) return;
  if (fused && a.hk == a.hv && a.dk == 128 && a.dv == 128 && a.K == 4) {
    launch_kernel(fused_kernel<4>, a.hv, 128, 0, s, a, lab_skip("gdn") ? 1 : 0);
    return;
  }
  const int C = 2 * a.hk * a.dk + a.hv * a.dv;
  launch_kernel(conv_kernel, (C + 255) / 256, 256, 0, s, a);
  const int threads = ((a.dv + 31) / 32) * 32;
  const size_t base = size_t(2 * a.dk + a.dv + 4) * 4;
  const size_t state = size_t(a.dk) * a.dv * 4;
  static bool attr_set = false;
  if (!attr_set) {
    DQ_CUDA_CHECK(cudaFuncSetAttribute(head_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024));
    attr_set = true;
  }
  if (a.dk == 128 && a.dv <= 256)
    launch_kernel(head_kernel_reg<128>, a.hv, threads, 0, s, a);
  else if (a.dk == 64 && a.dv <= 256)
    launch_kernel(head_kernel_reg<64>, a.hv, threads, 0, s, a);
  else if (base + state <= 150 * 1024)
    launch_kernel(head_kernel<true>, a.hv, threads, base + state, s, a);
  else
    launch_kernel(head_kernel<false>, a.hv, threads, base, s, a);
}

}  // namespace dq::cuda
