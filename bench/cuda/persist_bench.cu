// The persistent step's first risk, measured (docs/persistent-step.md): the 186 weight products
// of a Qwen3.5-2B decode step without the head (96 stages, the same shapes and order as
// deltaq-bench-stages, 0.77 GB) run as ONE persistent kernel, one block of 16 warps an SM, the
// stages separated by a grid handover (a counter), each block's weights streamed ahead by the
// copy engine (cp.async.bulk onto mbarriers) into a ring in shared memory by a producer warp that
// never waits for the handovers. Each stage reads the previous stage's output as x (its first K
// values), normalises it, makes x's units (q4.cuh make_unit_q4) and group sums, and computes its
// block's rows with the engine's row code (dot4_lanes, dot2_fast: lane layout, groups of 64).
// Compared in the same run with the same work as one kernel a stage (programmatic dependent
// launch, weights from global memory), whose outputs every variant must equal bit for bit.
// The engine's own chain of these products is deltaq-bench-stages (c) (run it beside this one).
// Variants: how many pieces may be in flight, the release (fence + atomicAdd, atom.release),
// relaxed polls, a tagged handover (each output a 64-bit word with its stage's tag: no counter,
// no fence), copies issued only as a stage's rows begin (so that a handover's fence finds few
// in flight), rows from global memory (no ring), and probes without rows or without any work.
// Block 0's stamps split a stage into x's phase, rows and handover; every block's end of its
// rows gives the spread, and the last block's fence and arrival times split the handover.
// Session 22's runs: docs/bench.md; what they say for the plan: docs/persistent-step.md.
// usage: deltaq-bench-persist [--reps R] [--layers L]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/q4.cuh"
#include "ops/numerics.h"

#define CK(e)                                                                                                  \
  do {                                                                                                         \
    cudaError_t r_ = (e);                                                                                      \
    if (r_ != cudaSuccess) {                                                                                   \
      std::fprintf(stderr, "deltaq-bench-persist: %s at %s:%d\n", cudaGetErrorString(r_), __FILE__, __LINE__); \
      std::exit(1);                                                                                            \
    }                                                                                                          \
  } while (0)

namespace {
using namespace dq::cuda;

constexpr int kThreads = 512, kWarps = 16;  // the one-kernel-a-stage reference
// The persistent kernel: CW consumer warps and one producer warp (15 + 1 = 512 threads at up to
// 128 registers, or 16 + 1 = 544 at up to 120).
constexpr int kSlots = 10, kSlotBytes = 18 * 1024;                      // the weight ring: 180 KB
constexpr int kMaxK = 6144, kNormK = 2048, kMaxStages = 128, kGShift = 6;  // groups of 64
// x as given (normalised stages only, K <= kNormK), x's units, the group sums, the sum of squares.
constexpr size_t kXBytes = size_t(kNormK) * 4 + 2 * size_t(kMaxK / 8) * 16 + size_t(kMaxK / 64) * 4 + 16;

struct StageDev {
  const unsigned char* w;  // rows x K/2 (lane layout words)
  const unsigned char* s;  // rows x K/64 bf16 scales (lane layout)
  const unsigned char* b;  // rows x K/64 bf16 biases
  const float* x;          // the previous stage's output (its first K values)
  float* y;                // rows
  unsigned long long* ty;  // rows: y with the stage's tag in the upper half (the tagged handover)
  const unsigned long long* tx;  // the previous stage's ty (null for the first stage)
  int rows, K;
  int norm;  // x is normalised first (the engine's in-projections and gate/up), else used as given
};
__constant__ StageDev c_stage[kMaxStages];

__host__ __device__ __forceinline__ int row_bytes(int K) { return K / 2 + 2 * (K / 64) * 2; }
// Rows of a ring slot (a warp's four rows may straddle two slots).
__host__ __device__ __forceinline__ int rows_per_slot(int K) { return kSlotBytes / row_bytes(K); }
// Block b's rows of a stage: an even split in pairs.
__host__ __device__ __forceinline__ void share(int rows, int b, int nb, int& r0, int& n) {
  const int64_t p = rows / 2;
  r0 = int(int64_t(b) * p / nb) * 2;
  n = int(int64_t(b + 1) * p / nb) * 2 - r0;
}

__device__ __forceinline__ bool mbar_test(uint64_t* bar, unsigned parity) {
  uint32_t done;
  asm volatile("{ .reg .pred p; mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
               : "=r"(done)
               : "r"(smem_addr(bar)), "r"(parity)
               : "memory");
  return done != 0;
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
template <int NT>  // the NT threads that compute (the producer warp never joins)
__device__ __forceinline__ void bar_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(NT) : "memory");
}
__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

struct XArea {
  float* raw;
  uint4 *xa, *xb;
  float *xg, *ss;
};
__device__ __forceinline__ XArea x_area(unsigned char* p) {
  XArea a;
  a.raw = reinterpret_cast<float*>(p);
  a.xa = reinterpret_cast<uint4*>(p + kNormK * 4);
  a.xb = a.xa + kMaxK / 8;
  a.xg = reinterpret_cast<float*>(a.xb + kMaxK / 8);
  a.ss = a.xg + kMaxK / 64;
  return a;
}

// The tagged handover (flags & 8): each output is stored as one 64-bit word, its tag (the
// launch's epoch and the stage) above its bits, so a reader knows it has arrived without a
// counter or a fence (the word is written and read whole). x's unit u in: its 8 words, re-read
// until every tag is this one.
__device__ __forceinline__ unsigned long long ld_relaxed64(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void load_unit_tagged(const unsigned long long* tx, int u, unsigned tag, float4& v0,
                                                 float4& v1) {
  unsigned long long w[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) w[k] = ld_relaxed64(tx + 8 * u + k);
#pragma unroll
  for (int k = 0; k < 8; ++k)
    while (unsigned(w[k] >> 32) != tag) w[k] = ld_relaxed64(tx + 8 * u + k);
  auto f = [](unsigned long long v) { return __uint_as_float(unsigned(v)); };
  v0 = make_float4(f(w[0]), f(w[1]), f(w[2]), f(w[3]));
  v1 = make_float4(f(w[4]), f(w[5]), f(w[6]), f(w[7]));
}

// x's phase with NT threads, as the engine's resident kernel has it: x from L2 (it was written
// by other blocks); when normalised, x into shared memory, the canonical sum of squares by warp 0
// handed over there; the units and the group sums (8 units a group: 8 lanes).
template <int NT>
__device__ __forceinline__ void x_phase(const float* x, int K, bool norm, const XArea& a, int tid, int lane,
                                        const unsigned long long* tx = nullptr, unsigned tag = 0) {
  const float4* x4 = reinterpret_cast<const float4*>(x);
  float r = 1.0f;
  if (norm) {
    if (tx) {
      for (int u = tid; u < K / 8; u += NT) {
        float4 v0, v1;
        load_unit_tagged(tx, u, tag, v0, v1);
        reinterpret_cast<float4*>(a.raw)[2 * u] = v0;
        reinterpret_cast<float4*>(a.raw)[2 * u + 1] = v1;
      }
    } else {
      for (int i = tid; i < K / 4; i += NT) reinterpret_cast<float4*>(a.raw)[i] = __ldcg(x4 + i);
    }
    bar_sync<NT>();
    if (tid < 32) {
      const float ss = warp_sum_squares(a.raw, K, lane);
      if (lane == 0) a.ss[0] = ss;
    }
    bar_sync<NT>();
    r = rsqrtf(a.ss[0] / float(K) + 1e-6f);
    x4 = reinterpret_cast<const float4*>(a.raw);
  }
  for (int u = tid; u < K / 8; u += NT) {
    float4 v0, v1;
    if (norm) {
      v0 = x4[2 * u], v1 = x4[2 * u + 1];
    } else if (tx) {
      load_unit_tagged(tx, u, tag, v0, v1);
    } else {
      v0 = __ldcg(x4 + 2 * u), v1 = __ldcg(x4 + 2 * u + 1);
    }
    v0 = make_float4(v0.x * r, v0.y * r, v0.z * r, v0.w * r);
    v1 = make_float4(v1.x * r, v1.y * r, v1.z * r, v1.w * r);
    uint4 ua, ub;
    make_unit_q4(v0, v1, ua, ub);
    a.xa[u] = ua;
    a.xb[u] = ub;
    float sg = ((v0.x + v0.y) + (v0.z + v0.w)) + ((v1.x + v1.y) + (v1.z + v1.w));
    sg += __shfl_xor_sync(0xffffffffu, sg, 1);
    sg += __shfl_xor_sync(0xffffffffu, sg, 2);
    sg += __shfl_xor_sync(0xffffffffu, sg, 4);
    if ((u & 7) == 0) a.xg[u >> 3] = sg;
  }
  bar_sync<NT>();
}

// Where local row lr of a block's share sits: in its ring slot (ring; waited for) or in global memory.
struct RowPtrs {
  const uint32_t* w;
  const unsigned short *s, *b;
};
__device__ __forceinline__ RowPtrs row_ptrs(const StageDev& st, int r0, int n, int lr, bool ring,
                                            unsigned char* ring_base, uint64_t* full, int seq0) {
  const int wrow = st.K / 2, srow = (st.K / 64) * 2;
  using W = const uint32_t*;
  using S = const unsigned short*;
  if (!ring) {
    const size_t r = size_t(r0 + lr);
    return {W(st.w + r * wrow), S(st.s + r * srow), S(st.b + r * srow)};
  }
  const int rpp = rows_per_slot(st.K), j = lr / rpp, nr = min(rpp, n - j * rpp), i = lr - j * rpp;
  const int seq = seq0 + j, slot = seq % kSlots;
  mbar_wait(&full[slot], unsigned(seq / kSlots) & 1u);
  const unsigned char* base = ring_base + size_t(slot) * kSlotBytes;
  return {W(base + size_t(i) * wrow), S(base + size_t(nr) * wrow + size_t(i) * srow),
          S(base + size_t(nr) * (wrow + srow) + size_t(i) * srow)};
}

// NR rows (pairs 0-1, 2-3, ...) against x, the lane layout, words and scales by half chunks to
// keep the registers: each row's chain is dot2_fast's and dot4_lanes' (units lane, lane + 32, ...
// chunk by chunk, its groups' bias terms, the paired butterfly), so the results are their bits.
template <int NR>
__device__ __forceinline__ void dotn_lanes(const uint32_t* const (&w)[NR], const unsigned short* const (&sc)[NR],
                                           const unsigned short* const (&bi)[NR], int U, int G, const uint4* xa,
                                           const uint4* xb, const float* xg, int lane, float (&out)[NR / 2]) {
  float acc[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) acc[r] = 0.0f;
  for (int base = 0; base < U; base += 256) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t v[NR][4], sw[NR][2];
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        const uint4 a = reinterpret_cast<const uint4*>(w[r] + base)[lane + 32 * h];
        const uint2 s2 = reinterpret_cast<const uint2*>(sc[r] + ((base * 8) >> kGShift))[(lane >> 3) * 2 + h];
        v[r][0] = a.x, v[r][1] = a.y, v[r][2] = a.z, v[r][3] = a.w;
        sw[r][0] = s2.x, sw[r][1] = s2.y;
      }
#pragma unroll
      for (int ii = 0; ii < 4; ++ii) {
        const int u = base + lane + 32 * (4 * h + ii);
        const uint4 x0 = xa[u], x1 = xb[u];
#pragma unroll
        for (int r = 0; r < NR; ++r) {
          const float f = ii & 1 ? bf16_hi(sw[r][ii >> 1]) : bf16_lo(sw[r][ii >> 1]);
          acc[r] = fmaf(f, unit_q4(v[r][ii], x0, x1), acc[r]);
        }
      }
    }
  }
  float bias[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) bias[r] = 0.0f;
  for (int g = lane; g < G; g += 32) {
    const float xgv = xg[g];
#pragma unroll
    for (int r = 0; r < NR; ++r) bias[r] = fmaf(__uint_as_float(uint32_t(bi[r][g]) << 16), xgv, bias[r]);
  }
#pragma unroll
  for (int p = 0; p < NR / 2; ++p) out[p] = warp_butterfly2(acc[2 * p] + bias[2 * p], acc[2 * p + 1] + bias[2 * p + 1], lane);
}

// A warp's step of R rows from local row lr (rows past n repeat row lr and are not stored).
template <int R>
__device__ __forceinline__ void rows_step(const StageDev& st, int r0, int n, int lr, const XArea& a, bool ring,
                                          unsigned char* ring_base, uint64_t* full, int seq0, int lane, bool tagged,
                                          unsigned tag);

// A block's rows of one stage: four rows a warp step (dot4_lanes), the pair left over by dot2_fast;
// or (adaptive) the fewest rows a step (2, 4 or 6) that give every warp at most one step.
__device__ __forceinline__ void put(const StageDev& st, int r, float v, bool tagged, unsigned tag) {
  st.y[r] = v;
  if (tagged) {
    const unsigned long long w = (static_cast<unsigned long long>(tag) << 32) | __float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(st.ty + r), "l"(w) : "memory");
  }
}
__device__ __forceinline__ void stage_rows(const StageDev& st, int r0, int n, const XArea& a, bool ring,
                                           unsigned char* ring_base, uint64_t* full, int seq0, int warp, int nwarps,
                                           int lane, bool tagged = false, unsigned tag = 0, bool adaptive = false) {
  const int K = st.K, U = K / 8, G = K / 64;
  if (adaptive) {
    const int R = n <= 2 * nwarps ? 2 : n <= 4 * nwarps ? 4 : 6;
    for (int q = warp; q * R < n; q += nwarps) {
      if (R == 2) rows_step<2>(st, r0, n, q * R, a, ring, ring_base, full, seq0, lane, tagged, tag);
      else if (R == 4) rows_step<4>(st, r0, n, q * R, a, ring, ring_base, full, seq0, lane, tagged, tag);
      else rows_step<6>(st, r0, n, q * R, a, ring, ring_base, full, seq0, lane, tagged, tag);
    }
    return;
  }
  const int nq = n / 4;
  for (int q = warp; q < nq; q += nwarps) {
    RowPtrs p[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) p[r] = row_ptrs(st, r0, n, 4 * q + r, ring, ring_base, full, seq0);
    const uint32_t* const w[4] = {p[0].w, p[1].w, p[2].w, p[3].w};
    const unsigned short* const sc[4] = {p[0].s, p[1].s, p[2].s, p[3].s};
    const unsigned short* const bi[4] = {p[0].b, p[1].b, p[2].b, p[3].b};
    float r01, r23;
    dot4_lanes<kGShift>(w, sc, bi, U, G, a.xa, a.xb, a.xg, lane, r01, r23);
    const int y = r0 + 4 * q;
    if (lane == 0) put(st, y, r01, tagged, tag), put(st, y + 2, r23, tagged, tag);
    if (lane == 16) put(st, y + 1, r01, tagged, tag), put(st, y + 3, r23, tagged, tag);
  }
  if (n % 4 && warp == nq % nwarps) {
    const int lr = n - 2;
    const RowPtrs p = row_ptrs(st, r0, n, lr, ring, ring_base, full, seq0);
    const RowPtrs q = row_ptrs(st, r0, n, lr + 1, ring, ring_base, full, seq0);
    const float r = dot2_fast<kGShift, true>(p.w, p.s, p.b, q.w, q.s, q.b, U, G, kGShift, a.xa, a.xb, a.xg, lane);
    if (lane == 0) put(st, r0 + lr, r, tagged, tag);
    if (lane == 16) put(st, r0 + lr + 1, r, tagged, tag);
  }
}

template <int R>
__device__ __forceinline__ void rows_step(const StageDev& st, int r0, int n, int lr, const XArea& a, bool ring,
                                          unsigned char* ring_base, uint64_t* full, int seq0, int lane, bool tagged,
                                          unsigned tag) {
  const int U = st.K / 8, G = st.K / 64;
  const uint32_t* w[R];
  const unsigned short *sc[R], *bi[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const RowPtrs p = row_ptrs(st, r0, n, lr + r < n ? lr + r : lr, ring, ring_base, full, seq0);
    w[r] = p.w, sc[r] = p.s, bi[r] = p.b;
  }
  float out[R / 2];
  if constexpr (R == 2) {
    out[0] = dot2_fast<kGShift, true>(w[0], sc[0], bi[0], w[1], sc[1], bi[1], U, G, kGShift, a.xa, a.xb, a.xg, lane);
  } else if constexpr (R == 4) {
    dot4_lanes<kGShift>(w, sc, bi, U, G, a.xa, a.xb, a.xg, lane, out[0], out[1]);
  } else {
    dotn_lanes<R>(w, sc, bi, U, G, a.xa, a.xb, a.xg, lane, out);
  }
#pragma unroll
  for (int p = 0; p < R / 2; ++p) {
    const int row = lr + 2 * p + (lane >> 4);
    if ((lane & 15) == 0 && row < n) put(st, r0 + row, out[p], tagged, tag);
  }
}

__device__ unsigned g_epoch;  // one more each launch (epoch_kernel): the tagged handover's tags
__global__ void epoch_kernel() { ++g_epoch; }

// One piece of a block's share (nr rows from row r) into ring slot `slot`, counted on full[slot].
__device__ __forceinline__ void issue_piece(unsigned char* ring, uint64_t* full, int slot, const StageDev& st, int r,
                                            int nr) {
  const int wrow = st.K / 2, srow = (st.K / 64) * 2;
  unsigned char* d = ring + size_t(slot) * kSlotBytes;
  mbar_arrive_expect(&full[slot], uint32_t(nr) * uint32_t(wrow + 2 * srow));
  bulk_copy(d, st.w + size_t(r) * wrow, uint32_t(nr * wrow), &full[slot]);
  bulk_copy(d + size_t(nr) * wrow, st.s + size_t(r) * srow, uint32_t(nr * srow), &full[slot]);
  bulk_copy(d + size_t(nr) * (wrow + srow), st.b + size_t(r) * srow, uint32_t(nr * srow), &full[slot]);
}

// MODE 0: the ring; 1: no ring (rows from global memory); 2: probe, the ring streams and x's
// phase runs but no rows; 3: probe, the handovers alone.

template <int MODE, int CW>
__global__ void __launch_bounds__(32 * (CW + 1), 1) persist_kernel(int nstages, unsigned* counter, unsigned long long* stamps,
                                                                      unsigned long long* ends, int inflight, int flags) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr bool kRing = MODE == 0 || MODE == 2;
  unsigned char* ring = smem;
  const XArea xa = x_area(smem + size_t(kSlots) * kSlotBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + size_t(kSlots) * kSlotBytes + kXBytes);
  uint64_t* empty = full + kSlots;
  volatile int* go = reinterpret_cast<volatile int*>(empty + kSlots);  // stages whose rows began (flags & 16)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0)
    for (int i = 0; i < kSlots; ++i) mbar_init(&full[i], 1), mbar_init(&empty[i], 1);
  if (tid == 0) *go = 0;
  __syncthreads();

  constexpr int kConsumers = 32 * CW;
  if (warp == CW) {  // the producer: every stage's pieces in order, as far as the ring allows
    if (!kRing || lane != 0) return;
    if (flags & 16) {
      // Quiet handovers: copies go out only when a stage's rows begin (and at the start), as
      // many pieces as the ring has free; a handover's fence and loads then find few in flight.
      int s_issue = 0, j_issue = 0, seq = 0;
      auto issue_one = [&](bool block) {  // the next piece; false when none is left or (!block) no room
        while (s_issue < nstages) {
          const StageDev st = c_stage[s_issue];
          int r0, n;
          share(st.rows, blockIdx.x, gridDim.x, r0, n);
          const int rpp = rows_per_slot(st.K);
          if (j_issue * rpp >= n) {
            ++s_issue, j_issue = 0;
            continue;
          }
          const int slot = seq % kSlots, nr = min(rpp, n - j_issue * rpp), r = r0 + j_issue * rpp;
          if (seq >= kSlots) {
            const unsigned par = unsigned(seq / kSlots - 1) & 1u;
            if (block) mbar_wait(&empty[slot], par);
            else if (!mbar_test(&empty[slot], par)) return false;
          }
          issue_piece(ring, full, slot, st, r, nr);
          ++j_issue, ++seq;
          return true;
        }
        return false;
      };
      while (issue_one(false)) {
      }
      int need = 0;  // pieces up to this stage's last
      for (int s = 0; s < nstages; ++s) {
        while (*go <= s) __nanosleep(64);  // (a spinning warp would take issue slots from the rows)
        // This stage's own pieces must be on their way (the ring had no room for them earlier).
        {
          const StageDev st = c_stage[s];
          int r0, n;
          share(st.rows, blockIdx.x, gridDim.x, r0, n);
          need += (n + rows_per_slot(st.K) - 1) / rows_per_slot(st.K);
        }
        int issued = 0;  // at most `inflight` a stage, the pieces it needs itself included
        while (seq < need) issue_one(true), ++issued;
        while (issued < inflight && issue_one(false)) ++issued;
      }
      return;
    }
    int seq = 0;
    for (int s = 0; s < nstages; ++s) {
      const StageDev st = c_stage[s];
      int r0, n;
      share(st.rows, blockIdx.x, gridDim.x, r0, n);
      const int rpp = rows_per_slot(st.K);
      for (int j = 0; j * rpp < n; ++j, ++seq) {
        const int slot = seq % kSlots, nr = min(rpp, n - j * rpp), r = r0 + j * rpp;
        if (seq >= kSlots) mbar_wait(&empty[slot], unsigned(seq / kSlots - 1) & 1u);
        // At most `inflight` pieces on their way: each SM's loads share one return path, so a
        // deep burst delays the latency-critical loads (x, the counter) queued behind it.
        if (seq >= inflight) mbar_wait(&full[(seq - inflight) % kSlots], unsigned((seq - inflight) / kSlots) & 1u);
        issue_piece(ring, full, slot, st, r, nr);
      }
    }
    return;
  }

  int seq0 = 0;
  const bool stamp = blockIdx.x == 0 && tid == 0 && stamps;
  const bool tagged = flags & 8;
  const unsigned epoch = g_epoch;
  for (int s = 0; s < nstages; ++s) {
    const StageDev st = c_stage[s];
    int r0, n;
    share(st.rows, blockIdx.x, gridDim.x, r0, n);
    const int pieces = (n + rows_per_slot(st.K) - 1) / rows_per_slot(st.K);
    const unsigned tag = (epoch << 8) | unsigned(s);
    if (s > 0 && !tagged) {
      if (tid == 0) {
        const unsigned target = unsigned(s) * gridDim.x;
        unsigned v;
        if (flags & 2) {  // relaxed polls, one fence after
          do {
            asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
          } while (v < target);
          asm volatile("fence.acq_rel.gpu;" ::: "memory");
        } else {
          do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
          } while (v < target);
        }
      }
      bar_sync<kConsumers>();
    }
    if (stamp) stamps[3 * s] = now_ns();
    if (MODE != 3)
      x_phase<kConsumers>(st.x, st.K, st.norm != 0, xa, tid, lane, tagged && s > 0 ? st.tx : nullptr,
                          (epoch << 8) | unsigned(s - 1));
    if (stamp) stamps[3 * s + 1] = now_ns();
    if (tid == 0 && (flags & 16)) *go = s + 1;
    if (MODE == 0 || MODE == 1) stage_rows(st, r0, n, xa, kRing, ring, full, seq0, warp, CW, lane, tagged, tag, flags & 32);
    if (MODE == 2 && tid == 0)
      for (int j = 0; j < pieces; ++j) mbar_wait(&full[(seq0 + j) % kSlots], unsigned((seq0 + j) / kSlots) & 1u);
    bar_sync<kConsumers>();
    if (stamp) stamps[3 * s + 2] = now_ns();
    if (tid == 0) ends[size_t(s) * gridDim.x + blockIdx.x] = now_ns();
    if (tid == 0) {
      if (kRing)
        for (int j = 0; j < pieces; ++j) mbar_arrive(&empty[(seq0 + j) % kSlots]);
      unsigned old = 0;
      if (tagged) {
      } else if (flags & 1) {
        asm volatile("atom.release.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
      } else {
        __threadfence();
        if (flags & 4) ends[size_t(nstages + s) * gridDim.x + blockIdx.x] = now_ns();  // the fence's end
        old = atomicAdd(counter, 1u);
      }
      // The arrival's round trip ends here (the value is used): split of the handover.
      if (old != 0xFFFFFFFFu) ends[size_t(2 * nstages + s) * gridDim.x + blockIdx.x] = now_ns();
    }
    seq0 += pieces;
  }
}

// The same work as one kernel a stage (16 warps, weights from global memory), launched with
// programmatic dependent launch: the reference for the bits and the launch-per-stage figure.
__global__ void __launch_bounds__(kThreads, 1) stage_kernel(int s, int adaptive) {
  extern __shared__ __align__(128) unsigned char smem[];
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const StageDev st = c_stage[s];
  const XArea xa = x_area(smem);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int r0, n;
  share(st.rows, blockIdx.x, gridDim.x, r0, n);
  x_phase<kThreads>(st.x, st.K, st.norm != 0, xa, tid, lane);
  stage_rows(st, r0, n, xa, false, nullptr, nullptr, 0, warp, kWarps, lane, false, 0, adaptive != 0);
}

__global__ void fill_kernel(unsigned char* w, size_t wbytes, unsigned short* sb, size_t nsb, uint32_t seed) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < wbytes / 4; i += stride) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    reinterpret_cast<uint32_t*>(w)[i] = h;
  }
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < nsb; i += stride) {
    uint32_t h = uint32_t(i) * 2246822519u ^ (seed * 7u);
    h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
    // Scales ~ +-0.002..0.006 (MLX's size), biases -7.5 times a scale: bf16 bits.
    const float f = (0.002f + 0.004f * float(h & 1023) / 1024.0f) * (h & 2048 ? -1.0f : 1.0f) * ((i & 1) ? -7.5f : 1.0f);
    sb[i] = uint16_t(__float_as_uint(f) >> 16);
  }
}

__global__ void read_kernel(const uint4* p, size_t n, unsigned* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

float time_graph(cudaGraphExec_t g, cudaStream_t s, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaGraphLaunch(g, s));
  CK(cudaStreamSynchronize(s));
  CK(cudaEventRecord(a, s));
  for (int r = 0; r < reps; ++r) CK(cudaGraphLaunch(g, s));
  CK(cudaEventRecord(b, s));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return ms / reps;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 50, layers = 24;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--layers")) layers = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: deltaq-bench-persist [--reps R] [--layers L]\n");
      return 2;
    }
  }
  if ((argc - 1) % 2 || reps < 1 || layers < 1 || layers > kMaxStages / 4) {
    std::fprintf(stderr, "deltaq-bench-persist: --reps >= 1, --layers 1..%d\n", kMaxStages / 4);
    return 2;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;

  // The stages of deltaq-bench-stages (bench/random_weights.h qwen35_2b_step) without the head.
  struct Shape {
    int rows, K, norm;
  };
  std::vector<Shape> shapes;
  for (int l = 0; l < layers; ++l) {
    shapes.push_back({(l + 1) % 4 ? 6144 + 2048 + 16 + 16 : 4096 + 512 + 512, 2048, 1});  // in-projections
    shapes.push_back({2048, 2048, 0});                                                      // out / o
    shapes.push_back({2 * 6144, 2048, 1});                                                  // gate + up
    shapes.push_back({2048, 6144, 0});                                                      // down
  }
  const int ns = int(shapes.size());
  for (const Shape& sh : shapes)
    if ((sh.norm && sh.K > kNormK) || sh.K % 2048 || sh.rows % 2) {
      std::fprintf(stderr, "deltaq-bench-persist: a stage of %d x %d (norm %d) is not supported\n", sh.rows, sh.K, sh.norm);
      return 1;
    }
  size_t wbytes = 0, sbytes = 0, ybytes = 0, weights = 0;
  for (const Shape& sh : shapes) {
    wbytes += size_t(sh.rows) * sh.K / 2;
    sbytes += size_t(sh.rows) * (sh.K / 64) * 2;
    ybytes += size_t(sh.rows) * 4;
  }
  weights = wbytes + 2 * sbytes;
  unsigned char *dw, *dsb;
  float *dy, *dx0;
  unsigned long long* dty;
  CK(cudaMalloc(&dty, ybytes * 2));
  CK(cudaMemset(dty, 0, ybytes * 2));
  CK(cudaMalloc(&dw, wbytes));
  CK(cudaMalloc(&dsb, 2 * sbytes));
  CK(cudaMalloc(&dy, ybytes));
  CK(cudaMalloc(&dx0, kMaxK * 4));
  fill_kernel<<<4 * sms, 256>>>(dw, wbytes, reinterpret_cast<unsigned short*>(dsb), sbytes, 0x2545F491u);
  CK(cudaGetLastError());
  std::vector<float> hx(kMaxK);
  for (int i = 0; i < kMaxK; ++i) hx[i] = std::sin(0.01f * float(i)) * 2.0f;
  CK(cudaMemcpy(dx0, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
  std::vector<StageDev> hs(ns);
  {
    size_t wo = 0, so = 0, yo = 0;
    const float* prev = dx0;
    for (int s = 0; s < ns; ++s) {
      const Shape& sh = shapes[s];
      hs[s] = StageDev{dw + wo, dsb + so, dsb + sbytes + so, prev, dy + yo, dty + yo, s ? hs[s - 1].ty : nullptr,
                       sh.rows, sh.K, sh.norm};
      wo += size_t(sh.rows) * sh.K / 2;
      so += size_t(sh.rows) * (sh.K / 64) * 2;
      yo += size_t(sh.rows);
      prev = hs[s].y;
    }
  }
  CK(cudaMemcpyToSymbol(c_stage, hs.data(), sizeof(StageDev) * ns));

  // The device's read bandwidth now: 2 GB read once by every SM.
  double bw = 0;
  {
    const size_t n = size_t(2) << 30;
    uint4* p;
    unsigned* sink;
    CK(cudaMalloc(&p, n));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(p, 1, n));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    read_kernel<<<sms * 8, 512>>>(p, n / 16, sink);
    CK(cudaEventRecord(a));
    for (int r = 0; r < 5; ++r) read_kernel<<<sms * 8, 512>>>(p, n / 16, sink);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    bw = 5.0 * double(n) / (ms * 1e-3) / 1e9;
    CK(cudaFree(p));
    CK(cudaFree(sink));
  }
  std::printf("deltaq-bench-persist on %s (%d SMs): %d stages (%d layers of the 2B step without the head), %.1f MB "
              "of 4-bit weights; read bandwidth measured now %.1f GB/s\n",
              prop.name, sms, ns, layers, weights / 1e6, bw);

  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  unsigned* counter;
  unsigned long long* stamps;
  CK(cudaMalloc(&counter, 4));
  CK(cudaMalloc(&stamps, size_t(3) * ns * 8));
  unsigned long long* ends;
  CK(cudaMalloc(&ends, size_t(3) * ns * sms * 8));
  const size_t psmem = size_t(kSlots) * kSlotBytes + kXBytes + (2 * kSlots + 1) * 8;
  const size_t ssmem = kXBytes;
  using PK = void (*)(int, unsigned*, unsigned long long*, unsigned long long*, int, int);
  const PK pk[2][4] = {{persist_kernel<0, 15>, persist_kernel<1, 15>, persist_kernel<2, 15>, persist_kernel<3, 15>},
                       {persist_kernel<0, 16>, persist_kernel<1, 16>, persist_kernel<2, 16>, persist_kernel<3, 16>}};
  for (auto& row : pk)
    for (PK k : row) CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(psmem)));
  CK(cudaFuncSetAttribute(stage_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(ssmem)));
  int occ = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, persist_kernel<0, 16>, 32 * 17, psmem));
  if (occ < 1) {
    std::fprintf(stderr, "deltaq-bench-persist: the persistent kernel does not fit an SM (%zu B shared)\n", psmem);
    return 1;
  }

  // The reference: one kernel a stage.
  cudaGraphExec_t ge_stages;
  {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int s = 0; s < ns; ++s) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = sms;
      cfg.blockDim = kThreads;
      cfg.dynamicSmemBytes = ssmem;
      cfg.stream = st;
      cudaLaunchAttribute at[1];
      at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      at[0].val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = at;
      cfg.numAttrs = 1;
      CK(cudaLaunchKernelEx(&cfg, stage_kernel, s, 0));
    }
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge_stages, g, 0));
    CK(cudaGraphDestroy(g));
  }
  CK(cudaMemset(dy, 0, ybytes));
  CK(cudaGraphLaunch(ge_stages, st));
  CK(cudaStreamSynchronize(st));
  std::vector<float> yref(ybytes / 4), y(ybytes / 4);
  CK(cudaMemcpy(yref.data(), dy, ybytes, cudaMemcpyDeviceToHost));
  size_t finite = 0;
  for (float v : yref) finite += std::isfinite(v) ? 1 : 0;
  const float ms_stages = time_graph(ge_stages, st, reps);
  auto report = [&](const char* name, float ms, const char* check) {
    std::printf("  %-58s %8.1f us a step  %6.2f us a stage  %7.1f GB/s = %5.1f%%  %s\n", name, 1000.0f * ms,
                1000.0f * ms / ns, weights / (ms * 1e-3) / 1e9, 100.0 * weights / (ms * 1e-3) / 1e9 / bw, check);
  };
  report("one kernel a stage (PDL, weights from global)", ms_stages, finite == yref.size() ? "the reference" : "NOT FINITE");

  struct Variant {
    int mode, inflight, flags;
    const char* name;
    int cw = 15;
  };
  const Variant variants[] = {
      {0, kSlots, 4, "persistent, ring (TMA, 10 x 18 KB), 15+1 warps"},
      {0, 2, 4, "persistent, ring, at most 2 pieces in flight"},
      {0, kSlots, 1, "persistent, ring, atom.release"},
      {0, kSlots, 2, "persistent, ring, relaxed polls"},
      {0, kSlots, 8, "persistent, ring, tagged handover (no counter)"},
      {0, kSlots, 16 | 4, "persistent, ring, copies only as rows begin"},
      {0, 4, 16 | 4, "persistent, ring, copies as rows begin, 4 a stage"},
      {0, kSlots, 16 | 4, "the same with 16+1 warps", 16},
      {0, kSlots, 32 | 16 | 4, "the same, 2/4/6 rows a warp step: one step a warp", 16},
      {0, kSlots, 32 | 4, "16+1 warps, one step a warp, copies unpaced", 16},
      {1, kSlots, 32 | 4, "16+1 warps, one step a warp, rows from global", 16},
      {1, kSlots, 4, "persistent, rows from global memory"},
      {2, kSlots, 0, "probe: persistent, ring + x's phase, no rows"},
      {3, kSlots, 0, "probe: persistent, the handovers alone"}};
  for (const Variant& var : variants) {
    const int m = var.mode;
    cudaGraphExec_t ge;
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    CK(cudaMemsetAsync(counter, 0, 4, st));
    epoch_kernel<<<1, 1, 0, st>>>();
    pk[var.cw == 16][m]<<<sms, 32 * (var.cw + 1), psmem, st>>>(ns, counter, stamps, ends, var.inflight, var.flags);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphDestroy(g));
    CK(cudaMemset(dy, 0, ybytes));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(y.data(), dy, ybytes, cudaMemcpyDeviceToHost));
    const bool same = std::memcmp(y.data(), yref.data(), ybytes) == 0;
    const float ms = time_graph(ge, st, reps);
    report(var.name, ms, m < 2 ? (same ? "same bits" : "BITS DIFFER") : "(probe)");
    // Block 0's stamps of the last replay: x's phase, rows, and the handover (the rows' end to
    // the next stage's start), averaged per stage kind.
    std::vector<unsigned long long> t(size_t(3) * ns);
    CK(cudaMemcpy(t.data(), stamps, t.size() * 8, cudaMemcpyDeviceToHost));
    const char* kinds[4] = {"in-proj", "out", "gate/up", "down"};
    std::printf("    block 0, us:");
    for (int k = 0; k < 4; ++k) {
      double xs = 0, rs = 0, hs_ = 0;
      int c = 0, ch = 0;
      for (int s = k; s < ns; s += 4) {
        xs += double(t[3 * s + 1] - t[3 * s]) / 1e3;
        rs += double(t[3 * s + 2] - t[3 * s + 1]) / 1e3;
        ++c;
        if (s + 1 < ns) hs_ += double(t[3 * (s + 1)] - t[3 * s + 2]) / 1e3, ++ch;
      }
      std::printf("  %s x %.2f rows %.2f handover %.2f;", kinds[k], xs / c, rs / c, ch ? hs_ / ch : 0.0);
    }
    std::printf("\n");
    // Every block's end of its rows: how far the blocks spread, and from the last one's end to
    // block 0's start of the next stage (the handover itself).
    std::vector<unsigned long long> e(size_t(3) * ns * sms);
    CK(cudaMemcpy(e.data(), ends, e.size() * 8, cudaMemcpyDeviceToHost));
    std::printf("    all blocks, us:");
    for (int k = 0; k < 4; ++k) {
      double spread = 0, hand = 0, fence = 0, atom = 0;
      int c = 0;
      for (int s = k; s + 1 < ns; s += 4) {
        const auto* es = e.data() + size_t(s) * sms;
        const auto* ef = e.data() + size_t(ns + s) * sms;
        const auto* ea = e.data() + size_t(2 * ns + s) * sms;
        const int last = int(std::max_element(es, es + sms) - es);
        const unsigned long long lo = *std::min_element(es, es + sms), hi = es[last];
        spread += double(hi - lo) / 1e3;
        hand += double(t[3 * (s + 1)] - hi) / 1e3;
        if (var.flags & 4) fence += double(ef[last] - hi) / 1e3;
        atom += double(ea[last] - hi) / 1e3;
        ++c;
      }
      std::printf("  %s spread %.2f, last to next start %.2f (its fence %.2f, its arrival back %.2f);", kinds[k],
                  spread / c, hand / c, fence / c, atom / c);
    }
    std::printf("\n");
    CK(cudaGraphExecDestroy(ge));
  }
  return 0;
}
