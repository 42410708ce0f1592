// A GDN layer's token mixer in one kernel for decode (op::ProjectGdn, one token): the
// in-projections, the causal conv + SiLU, the q/k norms and gates, the delta rule and the gated
// RMSNorm, with no launch between the products and the recurrence. Shapes: the 2B family
// (Hk == Hv, 128-dim heads, conv kernel 4, hidden 2048 or the 0.8B's 1024, the in-projections
// 4-bit in the lane layout with groups of 64 and bf16 scales).
//
// A cluster of SL = 8 blocks per head (128 blocks for the 2B's 16 heads). Block sl owns
// CB = 16 channels of its head: it copies their q, k, v and z rows (block 0 also the head's b
// and a rows) into shared memory before the programmatic wait (as the resident mat-vec),
// computes them against the normalised x with the resident kernel's dot, convolves each q, k,
// v channel in the lane that computed it, and pushes q's and k's into every block of the
// cluster (distributed shared memory, st.async: each store is counted on the receiver's
// mbarrier, so no cluster barrier and no memory fence stands between the phases); block 0
// computes the gates from b and a and pushes them too. Once a block has received them all,
// its warp 0 normalises k and runs the delta rule of the block's CB state columns (its own v
// channels), warp 1 normalises q meanwhile, and the other warps write the updated columns to S
// once warp 0 has the deltas; the outputs are pushed the same way, and each block applies the
// gated RMSNorm to its CB outputs (its own z rows) once the head's outputs are all there.
// Everything the two ops write is written (projections, conv output, rolled conv state, S,
// output), with the reference's arithmetic and order, so results equal it bit for bit.
#include <cstdlib>

#include "backend/cuda/kernels.cuh"
#include "backend/cuda/q4.cuh"
#include "ops/numerics.h"

namespace dq::cuda {

DQ_TIMELINE_FILE

namespace {

constexpr int kDK = 128, kKC = 4;
constexpr int kST = kDK + 4;  // floats between two state columns in shared memory (float4 reads, no conflicts)
// Blocks a head (one cluster): 128 blocks for 16 heads, one beside the previous kernel's on each SM.
constexpr int kSL = 8;
// The input width K (hidden: 2048, or 1024): units, groups of 64, bytes of a row's words and scales.
template <int K>
struct Width {
  static constexpr int U = K / 8, G = K / 64;
  static constexpr uint32_t WRow = K / 2, SRow = G * 2;
};

// The block's fixed shared memory (after x's); its weight rows follow.
template <int SL>
struct alignas(16) MixerShared {
  static constexpr int CB = kDK / SL;
  // What other blocks (and this block's other warps) store here arrives by st.async, counted on
  // two barriers: q, k, the gates and its own v and z channels (kPushQK bytes), then the
  // head's outputs (kPushO bytes).
  static constexpr uint32_t kPushQK = 4 * (2 * kDK + 2 + 2 * CB), kPushO = 4 * kDK;
  uint64_t bar_qk, bar_o;
  float sS[CB * kST];          // its state columns, column-major (column j at j * kST)
  float qu[kDK], ku[kDK];      // the head's q and k after conv + SiLU (pushed by every block)
  float qn[kDK], kn[kDK];      // normalised
  float o_all[kDK];            // the head's delta-rule outputs (pushed by every block)
  float gates[2];              // the head's beta = sigmoid(b) and decay alpha (pushed by block 0)
  float delta[CB];             // the delta rule's per-column factor (warp 0 to the others)
  float vloc[CB], zloc[CB];    // its v channels after conv + SiLU, silu of its z rows
  float cw[3 * CB][kKC];       // conv weights of its q, k, v channels
  float cst[kKC - 1][3 * CB];  // their conv state, oldest first
};

template <int SL, int K>
constexpr size_t mixer_smem_bytes() {
  constexpr int CB = kDK / SL, ROWS = 4 * CB + 2, kK = K, kU = Width<K>::U;
  constexpr uint32_t kWRow = Width<K>::WRow, kSRow = Width<K>::SRow;
  return size_t(kU) * 16 * 2 + size_t(kU) * 4 * 2 + size_t(kK) * 4 + sizeof(MixerShared<SL>) +
         size_t(ROWS) * (kWRow + 2 * kSRow);
}

// W warps: 8, 9 (block 0's extra pair, b and a, then adds no round of rows) or 11 (3 rounds).
template <int SL, bool EARLY, int W, int K>
__global__ void __launch_bounds__(W * 32, 2) mixer_kernel(ProjectArgs p, GdnArgs g, int trigger, bool stores_late) {
  constexpr int kWarps = W, kK = K, kU = Width<K>::U, kG = Width<K>::G;
  constexpr uint32_t kWRow = Width<K>::WRow, kSRow = Width<K>::SRow;
  constexpr int CB = kDK / SL, ROWS = 4 * CB + 2;
  using Fix = MixerShared<SL>;
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int hv = blockIdx.x / SL, sl = blockIdx.x % SL, H = g.hv, C = 3 * H * kDK;
  const int c0 = sl * CB;  // this block's channels within the head, and its state columns
  // stores_late (the default; DELTAQ_GDN_MIXER_STORES=0 clears it): the other warps write the
  // updated columns once warp 0 has pushed its outputs (they then overlap the wait for the
  // head's outputs), not while warp 0 runs its second chain; the same values either way
  // (H100, session 35 runs 1-2: +0.18% and +0.17%, 3 rounds each, every round ahead).
  DQ_TL_SLOTS();  // (the timeline build: the recorder's slots, reserved before the wait)
  DQ_SM(121);
  // trigger: when the next kernel (the out-projection) may launch: 0 at the start, 1 after x's
  // phase, 2 after the rows.
  if (trigger == 0) pdl_trigger();
  // Shared memory: x's unit integers (make_unit_q4's split layout), unit sums (unused but for
  // the sum of squares' handover), group sums, x as given, the fixed part, the weight rows
  // (q, k, v, z: CB rows each, then b and a): words, then scales, then biases.
  uint4* xa = reinterpret_cast<uint4*>(smem);
  uint4* xb = xa + kU;
  float* pu = reinterpret_cast<float*>(xb + kU);
  float* xg = pu + kU;
  float* raw = xg + kU;
  Fix& f = *reinterpret_cast<Fix*>(raw + kK);
  unsigned char* wsm = reinterpret_cast<unsigned char*>(&f + 1);
  // The push barriers (parity 0: the one arrival here, then the bytes). Then: this block has
  // started and its barriers are set (a block's shared memory may be written by the others only
  // then); waited for just before the first remote store, long after every block arrived.
  if (threadIdx.x == 0) {
    mbar_init(&f.bar_qk, 1);
    mbar_arrive_expect(&f.bar_qk, Fix::kPushQK);
    mbar_init(&f.bar_o, 1);
    mbar_arrive_expect(&f.bar_o, Fix::kPushO);
    mbar_init_fence_cluster();
  }
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  constexpr size_t so = size_t(ROWS) * kWRow, bo = so + size_t(ROWS) * kSRow;

  // Nothing before the wait depends on earlier kernels: the weight rows, the conv weights, the
  // norm weights and (EARLY: the queue's promise, GdnArgs::early) the recurrent state.
  auto copy_rows = [&](int r, const MatDev& m, int r0, int n) {
    const auto* w = static_cast<const unsigned char*>(m.w);
    stage_copy(wsm + size_t(r) * kWRow, w + size_t(r0) * kWRow, n * kWRow);
    stage_copy(wsm + so + size_t(r) * kSRow, static_cast<const unsigned char*>(m.s) + size_t(r0) * kSRow, n * kSRow);
    stage_copy(wsm + bo + size_t(r) * kSRow, static_cast<const unsigned char*>(m.b) + size_t(r0) * kSRow, n * kSRow);
  };
  copy_rows(0, p.m[0], hv * kDK + c0, CB);                     // q
  copy_rows(CB, p.m[0], H * kDK + hv * kDK + c0, CB);          // k
  copy_rows(2 * CB, p.m[0], 2 * H * kDK + hv * kDK + c0, CB);  // v
  copy_rows(3 * CB, p.m[1], hv * kDK + c0, CB);                // z
  if (sl == 0) {
    copy_rows(4 * CB, p.m[2], hv, 1);      // b
    copy_rows(4 * CB + 1, p.m[3], hv, 1);  // a
  }
  auto chan = [&](int r) { return (r / CB) * H * kDK + hv * kDK + c0 + r % CB; };  // conv channel of row r < 3 CB
  for (int i = threadIdx.x; i < 3 * CB * kKC; i += blockDim.x)
    async_copy4(&f.cw[i / kKC][i % kKC], g.conv_w + size_t(chan(i / kKC)) * kKC + i % kKC);
  auto load_state = [&] {
    for (int i = threadIdx.x; i < (kKC - 1) * 3 * CB; i += blockDim.x)
      async_copy4(&f.cst[i / (3 * CB)][i % (3 * CB)], g.conv_state + size_t(i / (3 * CB)) * C + chan(i % (3 * CB)));
    // S is [i][column] in memory: a warp's copies read 32 / CB rows' CB columns at a time.
    const float* Sg = g.S + size_t(hv) * kDK * kDK + c0;
    for (int c = threadIdx.x; c < kDK * CB; c += blockDim.x)
      async_copy4(f.sS + (c % CB) * kST + c / CB, Sg + size_t(c / CB) * kDK + c % CB);
  };
  if (EARLY) load_state();
  const int u = threadIdx.x;  // the unit this thread stages (kU units: warps from kU / 32 on stage none)
  const bool stager = u < kU;
  float4 nw0 = make_float4(0, 0, 0, 0), nw1 = nw0;
  if (stager) {
    nw0 = reinterpret_cast<const float4*>(p.norm)[2 * u];
    nw1 = reinterpret_cast<const float4*>(p.norm)[2 * u + 1];
  }
  const float A_neg = g.A_neg[hv], dt_bias = g.dt_bias[hv];
  const float gnorm = lane < CB ? g.norm[c0 + lane] : 0.0f;
  pdl_wait();
  DQ_SM(122);
  if (!EARLY) load_state();

  // x in, RMSNorm'd, in the split layout with its group sums: the resident kernel's fast path
  // (matvec_resident.cu, FAST with groups of 64), in the same order.
  {
    const float4* x4 = reinterpret_cast<const float4*>(p.x);
    float4 v0 = make_float4(0, 0, 0, 0), v1 = v0;
    if (stager) {
      v0 = x4[2 * u];
      v1 = x4[2 * u + 1];
      reinterpret_cast<float4*>(raw)[2 * u] = v0;
      reinterpret_cast<float4*>(raw)[2 * u + 1] = v1;
    }
    __syncthreads();
    if (warp == 0) {
      const float ss = warp_sum_squares(raw, kK, lane);
      if (lane == 0) pu[0] = ss;
    }
    __syncthreads();
    const float r = num::rms_inv(pu[0], kK, p.eps);
    if (stager) {  // (warp-uniform)
      const float4 a0 = make_float4((v0.x * r) * nw0.x, (v0.y * r) * nw0.y, (v0.z * r) * nw0.z, (v0.w * r) * nw0.w);
      const float4 a1 = make_float4((v1.x * r) * nw1.x, (v1.y * r) * nw1.y, (v1.z * r) * nw1.z, (v1.w * r) * nw1.w);
      make_unit_q4(a0, a1, xa[u], xb[u]);
      const float s = unit_sum(a0, a1);
      // A group of 64 is 8 units on consecutive lanes: its sum in the canonical chain by shuffles.
      const int first = lane & ~7;
      float v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = __shfl_sync(0xffffffffu, s, first + k);
      float gsum = 0.0f;
#pragma unroll
      for (int k = 0; k < 8; ++k) gsum = gsum + v[k];
      if (lane == first) xg[u >> 3] = gsum;
    }
  }
  DQ_MARK();
  async_wait_all();  // this thread's copies have landed
  __syncthreads();
  DQ_MARK();
  if (trigger == 1) pdl_trigger();

  // The rows, two a warp (pairs never straddle a part: CB is even). Each row's epilogue: the
  // projection's output, then for q, k and v the conv + SiLU of its channel (gdn.cu's order)
  // and the rolled conv state, then the pushes. The epilogues wait until the warp's dots are
  // done: lane 2k (2k + 1) keeps the first (second) row of the warp's k-th pair, and the lanes
  // then run their epilogues side by side instead of lanes 0 and 16 after each dot while the
  // warp's next dot waits (at most 5 pairs a warp: 2 * 5 lanes).
  const int npairs = 2 * CB + (sl == 0 ? 1 : 0);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(wsm);
  using S = const unsigned short*;
  float keep = 0.0f;
  int kept = 0;
  for (int pi = warp; pi < npairs; pi += kWarps, ++kept) {
    const int ra = 2 * pi, rb = ra + 1;
    const float y2 = dot2_fast<6, true>(w + size_t(ra) * kU, S(wsm + so + ra * kSRow), S(wsm + bo + ra * kSRow),
                                        w + size_t(rb) * kU, S(wsm + so + rb * kSRow), S(wsm + bo + rb * kSRow), kU, kG,
                                        6, xa, xb, xg, lane);
    const float ya = __shfl_sync(0xffffffffu, y2, 0), yb = __shfl_sync(0xffffffffu, y2, 16);
    if (lane == 2 * kept) keep = ya;
    if (lane == 2 * kept + 1) keep = yb;
  }
  DQ_MARK();
  // Every block of the cluster has started (and set its barriers) before the first push: waited
  // for here, after the dots, so that a block that started late does not hold the others' rows.
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
  if (lane < 2 * kept) {
    const float y = keep;
    const int r = 2 * (warp + (lane >> 1) * kWarps) + (lane & 1);
    if (r < 3 * CB) {
      const int part = r / CB, c = r % CB, ch = chan(r);
      p.m[0].y[ch] = y;
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < kKC - 1; ++j) acc = fmaf(f.cw[r][j], f.cst[j][r], acc);
      const float uv = num::silu(fmaf(f.cw[r][kKC - 1], y, acc));
      g.u[ch] = uv;
#pragma unroll
      for (int j = 0; j + 1 < kKC - 1; ++j) g.conv_state[size_t(j) * C + ch] = f.cst[j + 1][r];
      g.conv_state[size_t(kKC - 2) * C + ch] = y;
      if (part == 2) {
        push_f32(&f.vloc[c], sl, uv, &f.bar_qk);
      } else {
        float* dst = part == 0 ? f.qu : f.ku;
#pragma unroll
        for (int b = 0; b < SL; ++b) push_f32(&dst[c0 + c], b, uv, &f.bar_qk);
      }
    } else if (r < 4 * CB) {
      p.m[1].y[hv * kDK + c0 + r - 3 * CB] = y;
      push_f32(&f.zloc[r - 3 * CB], sl, num::silu(y), &f.bar_qk);
    } else {  // the gates, here rather than after the barrier (the reference's arithmetic)
      const int which = r - 4 * CB;  // 0: b, 1: a
      p.m[2 + which].y[hv] = y;
      const float gate = which == 0 ? num::sigmoid(y) : num::exp(A_neg * num::softplus(y + dt_bias));
#pragma unroll
      for (int b = 0; b < SL; ++b) push_f32(&f.gates[which], b, gate, &f.bar_qk);
    }
  }
  DQ_MARK();
  if (trigger == 2) pdl_trigger();

  // Once every pushed value is here (bar_qk), warp 0 normalises k and lanes < CB run the delta
  // rule of columns c0 + lane in the reference's order: the decay, the read-out m against k,
  // delta = beta * (v - m), the updated column's read-out against q. Warp 1 normalises q
  // meanwhile (named barrier 2). The other warps wait for the deltas (named barrier 1: warp 0
  // has seen the gates) and write the updated columns to S, each element as the reference
  // makes it, while warp 0 reads out. The norms: lane l owns channels l + 32 p (the canonical
  // sum of squares).
  constexpr int kAll = kWarps * 32;
  auto normalise = [&](const float* in, float* out, bool is_q) {
    float v[4], ss = 0.0f;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      v[q] = in[lane + 32 * q];
      ss = fmaf(v[q], v[q], ss);
    }
    const float r = 1.0f / sqrtf(warp_butterfly(ss) + 1e-6f);
#pragma unroll
    for (int q = 0; q < 4; ++q) out[lane + 32 * q] = is_q ? (v[q] * r) * (1.0f / sqrtf(float(kDK))) : v[q] * r;
  };
  if (warp < 2) mbar_wait<true>(&f.bar_qk, 0);
  DQ_MARK();
  if (warp == 0) {
    const float beta = f.gates[0], alpha = f.gates[1];
    normalise(f.ku, f.kn, false);
    __syncwarp();
    DQ_MARK();
    const float4* col = reinterpret_cast<const float4*>(f.sS + (lane < CB ? lane : 0) * kST);
    const float4* kn4 = reinterpret_cast<const float4*>(f.kn);
    const float4* qn4 = reinterpret_cast<const float4*>(f.qn);
    float delta = 0.0f;
    // Both chains are loops unrolled by 2, not straight-line code: the mixer's code is cold at
    // every launch (the resident kernels run between), and fewer instructions fetch sooner
    // (H200, session 20 run 5: 1226.4 tok/s against 1220.9 fully unrolled and 1224.4 rolled).
    if (lane < CB) {  // (loads only in both loops: the compiler may issue them ahead)
      float m = 0.0f;
#pragma unroll 2
      for (int i0 = 0; i0 < kDK / 4; i0 += 8) {
        float4 c[8], k[8];
#pragma unroll
        for (int t = 0; t < 8; ++t) c[t] = col[i0 + t], k[t] = kn4[i0 + t];
#pragma unroll
        for (int t = 0; t < 8; ++t) {
          m = fmaf(alpha * c[t].x, k[t].x, m);
          m = fmaf(alpha * c[t].y, k[t].y, m);
          m = fmaf(alpha * c[t].z, k[t].z, m);
          m = fmaf(alpha * c[t].w, k[t].w, m);
        }
      }
      delta = beta * (f.vloc[lane] - m);
      f.delta[lane] = delta;
    }
    DQ_MARK();
    __syncwarp();
    if (!stores_late) asm volatile("bar.arrive 1, %0;" ::"n"(kAll) : "memory");
    asm volatile("bar.sync 2, 64;" ::: "memory");  // q normalised
    DQ_MARK();
    if (lane < CB) {
      float o = 0.0f;
#pragma unroll 2
      for (int i0 = 0; i0 < kDK / 4; i0 += 4) {
        float4 c[4], k[4], q[4];
#pragma unroll
        for (int t = 0; t < 4; ++t) c[t] = col[i0 + t], k[t] = kn4[i0 + t], q[t] = qn4[i0 + t];
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          o = fmaf(fmaf(k[t].x, delta, alpha * c[t].x), q[t].x, o);
          o = fmaf(fmaf(k[t].y, delta, alpha * c[t].y), q[t].y, o);
          o = fmaf(fmaf(k[t].z, delta, alpha * c[t].z), q[t].z, o);
          o = fmaf(fmaf(k[t].w, delta, alpha * c[t].w), q[t].w, o);
        }
      }
#pragma unroll
      for (int b = 0; b < SL; ++b) push_f32(&f.o_all[c0 + lane], b, o, &f.bar_o);
    }
    if (stores_late) {
      __syncwarp();
      asm volatile("bar.arrive 1, %0;" ::"n"(kAll) : "memory");
    }
  } else {
    if (warp == 1) {
      normalise(f.qu, f.qn, true);
      __syncwarp();
      asm volatile("bar.arrive 2, 64;" ::: "memory");
    }
    asm volatile("bar.sync 1, %0;" ::"n"(kAll) : "memory");
    const float alpha = f.gates[1];
    float* Sg = g.S + size_t(hv) * kDK * kDK + c0;
    for (int c = threadIdx.x - 32; c < kDK * CB; c += kAll - 32) {
      const int i = c / CB, j = c % CB;
      Sg[size_t(i) * kDK + j] = fmaf(f.kn[i], f.delta[j], alpha * f.sS[j * kST + i]);
    }
  }
  DQ_MARK();
  // The gated RMSNorm of this block's outputs: ((o * r) * w) * silu(z), once the head's outputs
  // are here (bar_o). Every block waits for all it receives before it exits.
  if (warp == 0) {
    mbar_wait<true>(&f.bar_o, 0);
    DQ_MARK();
    float ss = 0.0f;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float ov = f.o_all[lane + 32 * q];
      ss = fmaf(ov, ov, ss);
    }
    const float r = num::rms_inv(warp_butterfly(ss), kDK, g.eps);
    if (lane < CB) g.out[size_t(hv) * kDK + c0 + lane] = ((f.o_all[c0 + lane] * r) * gnorm) * f.zloc[lane];
  }
  DQ_SM(123);
}

// How many clusters of the head's SL blocks can be resident at once (the occupancy API, at the
// wider K's shared memory); the kernel is used only when every head's cluster can (H200: see
// tools/gpu-check's log).
template <int K>
void set_smem_attrs() {
  const size_t smem = mixer_smem_bytes<kSL, K>();
  for (auto k : {mixer_kernel<kSL, false, 8, K>, mixer_kernel<kSL, true, 8, K>, mixer_kernel<kSL, false, 9, K>,
                 mixer_kernel<kSL, true, 9, K>, mixer_kernel<kSL, false, 11, K>, mixer_kernel<kSL, true, 11, K>})
    DQ_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
}

int max_clusters() {
  static int n = -1;
  if (n < 0) {
    set_smem_attrs<2048>();
    set_smem_attrs<1024>();
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(16 * kSL);
    cfg.blockDim = dim3(11 * 32);
    cfg.dynamicSmemBytes = mixer_smem_bytes<kSL, 2048>();
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = kSL;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int got = 0;
    if (cudaOccupancyMaxActiveClusters(&got, mixer_kernel<kSL, true, 11, 2048>, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();
      got = 0;
    }
    n = got;
  }
  return n;
}

// The kernel for the launch's warps a block, K and whether the state may be read early.
template <int K>
void launch_width(int warps, bool early, int trigger, bool stores_late, const ProjectArgs& p, const GdnArgs& g,
                  cudaStream_t s) {
  using Kernel = void (*)(ProjectArgs, GdnArgs, int, bool);
  const Kernel k = warps == 8    ? (early ? mixer_kernel<kSL, true, 8, K> : mixer_kernel<kSL, false, 8, K>)
                   : warps == 11 ? (early ? mixer_kernel<kSL, true, 11, K> : mixer_kernel<kSL, false, 11, K>)
                                 : (early ? mixer_kernel<kSL, true, 9, K> : mixer_kernel<kSL, false, 9, K>);
  launch_kernel_in(kSL, k, g.hv * kSL, warps * 32, mixer_smem_bytes<kSL, K>(), s, p, g, trigger, stores_late);
}

}  // namespace

int project_gdn_max_clusters() { return max_clusters(); }

bool launch_project_gdn(const ProjectArgs& p, const GdnArgs& g, cudaStream_t s) {
  // DELTAQ_GDN_MIXER=0 (an A/B knob): the two ops' own kernels.
  static const char* env = std::getenv("DELTAQ_GDN_MIXER");
  static const bool enabled = !(env && env[0] == '0');
  if (!enabled || p.T != 1 || g.T != 1 || p.n != 4 || !p.norm || (p.K != 2048 && p.K != 1024)) return false;
  const int H = g.hv;
  if (g.hk != H || g.dk != kDK || g.dv != kDK || g.K != kKC) return false;
  const int rows[4] = {3 * H * kDK, H * kDK, H, H};
  for (int i = 0; i < 4; ++i) {
    const MatDev& m = p.m[i];
    if (m.fmt != WFmt::Affine || m.bits != 4 || m.gs != 64 || m.gs_shift != 6 || m.sdt != SDt::BF16 || !m.lanes ||
        m.cols != p.K || m.rows != rows[i] || reinterpret_cast<uintptr_t>(m.w) % 16)
      return false;
  }
  if (p.m[0].y != g.mixed || p.m[1].y != g.z || p.m[2].y != g.b || p.m[3].y != g.a) return false;
  if (reinterpret_cast<uintptr_t>(p.x) % 16 || reinterpret_cast<uintptr_t>(p.norm) % 16 ||
      reinterpret_cast<uintptr_t>(g.S) % 16)
    return false;
  if (max_clusters() < H) return false;
  // Warps a block: block 0's 33 pairs of rows take 5 rounds on 8 warps, 4 on 9, 3 on 11
  // (H200, session 14 runs 5-6: 1127.8 / 1137.5 / 1144.5 tok/s; the two kernels 1104.9).
  // DELTAQ_GDN_MIXER_WARPS=8 or 9 (an A/B knob; results never depend on it).
  static const int warps = [] {
    const char* e = std::getenv("DELTAQ_GDN_MIXER_WARPS");
    const int w = e ? std::atoi(e) : 11;
    return w == 8 || w == 9 ? w : 11;
  }();
  // After x's phase (H200, session 14 run 8: 1146.2 tok/s against 1140.7 at the start and 1094.2
  // after the rows). DELTAQ_GDN_MIXER_TRIGGER=0 or 2 (an A/B knob; results never depend on it).
  static const int trigger = std::abs(env_int("DELTAQ_GDN_MIXER_TRIGGER", 1)) % 3;
  static const bool stores_late = env_int("DELTAQ_GDN_MIXER_STORES", 1) != 0;
  if (p.K == 2048) launch_width<2048>(warps, g.early, trigger, stores_late, p, g, s);
  else launch_width<1024>(warps, g.early, trigger, stores_late, p, g, s);
  return true;
}

}  // namespace dq::cuda
