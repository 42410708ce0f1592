// The pipelined product: one token's 4-bit products whose rows do not fit the resident kernel's
// shared memory (the 4B's and 9B's layers, their heads) or whose width is not a multiple of 2048
// (the 0.8B's and 4B's layers). Each SM's block streams its contiguous rows through a ring of
// shared-memory stages (cp.async, a commit group a stage), a stage holding a tile of up to 32
// rows by an equal part of their inputs (whole rows where three stages fit); the first stages
// are copied before the programmatic wait, as the resident and head kernels do. A warp computes
// two rows of each tile (SwiGLU: the gate and the up row of one item) in pieces of up to 2048
// inputs, carrying its chains from piece to piece.
//
// Order: the canonical one of ops/numerics.h affine_dot, which a chunk of 2048 inputs keeps:
// lane l's units are l, l + 32, ... (chunk c holds its units 256 c + l + 32 i, in order), its
// bias terms are over the groups g with g mod 32 = l in increasing g (chunk by chunk), then
// acc + bias and the butterfly. So the results are the CPU's bit for bit.
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/kernels.cuh"
#include "backend/cuda/q4.cuh"
#include "ops/numerics.h"

namespace dq::cuda {

DQ_TIMELINE_FILE

namespace {

constexpr int kWarps = 16, kTileRows = 2 * kWarps, kChunk = 2048;

// One chunk of two rows (a and b) into their lanes' chains. The rows' words, scales and biases
// are the chunk's own (stage slots); x's unit integers and group sums are the whole row's, from
// `ubase` (the chunk's first unit) and `gbase` (its first group). nu: units a lane in the chunk
// (1..8); gc: groups in the chunk. LANES: the chunk in q4.cuh's lane layout (whole chunks only).
template <bool LANES>
__device__ __forceinline__ void chunk_pair(const uint32_t* wa, const unsigned short* sa, const unsigned short* ba,
                                           const uint32_t* wb, const unsigned short* sb, const unsigned short* bb,
                                           int nu, int gc, int ubase, int gbase, int shift, const uint4* xa,
                                           const uint4* xb, const float* xg, int lane, float& acc_a, float& acc_b,
                                           float& bias_a, float& bias_b) {
  uint32_t va[8], vb[8];
  float fa[8], fb[8];
  if constexpr (LANES) {  // dot2_fast's loads of one chunk: two 16-byte loads of words, one of scales
    const uint4* wa4 = reinterpret_cast<const uint4*>(wa) + lane;
    const uint4* wb4 = reinterpret_cast<const uint4*>(wb) + lane;
    const uint4 a0 = wa4[0], a1 = wa4[32], b0 = wb4[0], b1 = wb4[32];
    const uint4 s_a = reinterpret_cast<const uint4*>(sa)[lane >> (shift - 3)];
    const uint4 s_b = reinterpret_cast<const uint4*>(sb)[lane >> (shift - 3)];
    va[0] = a0.x, va[1] = a0.y, va[2] = a0.z, va[3] = a0.w, va[4] = a1.x, va[5] = a1.y, va[6] = a1.z, va[7] = a1.w;
    vb[0] = b0.x, vb[1] = b0.y, vb[2] = b0.z, vb[3] = b0.w, vb[4] = b1.x, vb[5] = b1.y, vb[6] = b1.z, vb[7] = b1.w;
    const uint32_t sw_a[4] = {s_a.x, s_a.y, s_a.z, s_a.w}, sw_b[4] = {s_b.x, s_b.y, s_b.z, s_b.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      fa[i] = i & 1 ? bf16_hi(sw_a[i >> 1]) : bf16_lo(sw_a[i >> 1]);
      fb[i] = i & 1 ? bf16_hi(sw_b[i >> 1]) : bf16_lo(sw_b[i >> 1]);
    }
  } else {
    // Unit lane + 32 i of the chunk is in its group g0 + i * gstep (256 inputs are whole groups).
    const int gstep = 256 >> shift, g0 = (lane * 8) >> shift;
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (i < nu) {
        va[i] = wa[lane + 32 * i];
        vb[i] = wb[lane + 32 * i];
        fa[i] = __uint_as_float(uint32_t(sa[g0 + i * gstep]) << 16);
        fb[i] = __uint_as_float(uint32_t(sb[g0 + i * gstep]) << 16);
      }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (LANES || i < nu) {
      const int u = ubase + lane + 32 * i;
      const uint4 x0 = xa[u], x1 = xb[u];
      acc_a = fmaf(fa[i], unit_q4(va[i], x0, x1), acc_a);
      acc_b = fmaf(fb[i], unit_q4(vb[i], x0, x1), acc_b);
    }
  // The chunk's groups whose lane (global group mod 32) is this lane, in increasing order.
  for (int gl = (lane - gbase) & 31; gl < gc; gl += 32) {
    const float xv = xg[gbase + gl];
    bias_a = fmaf(__uint_as_float(uint32_t(ba[gl]) << 16), xv, bias_a);
    bias_b = fmaf(__uint_as_float(uint32_t(bb[gl]) << 16), xv, bias_b);
  }
}

// items: rows of the concatenated matrices (Store, Add) or gate/up pairs (SwiGLU); block b takes
// items [b * items / grid, (b + 1) * items / grid). A tile is up to 32 rows of one matrix (SwiGLU:
// 16 items, gate rows in slots 0-15 and up rows in slots 16-31); stage s holds tile s / chunks,
// part s % chunks of each row: `span` inputs (K / span parts a row; span a multiple of 256 and
// of 8 gs, of 2048 in the lane layout), computed in pieces of up to 2048 (chunk_pair).
// skip_rows: the kernel lab only (DELTAQ_MV_PIPE_SKIP=1: no row arithmetic, wrong results; the
// copies alone stream the 9B's gate/up at 86% of the bandwidth, against 61% with the rows).
// NU > 0: a stage holds whole rows of K = 256 NU inputs (row layout, G <= 64), and each lane
// keeps its x units in registers (q4.cuh XRegs, dot2_reg, as the pipelined head does): the rows
// then read only their weights and scales from shared memory.
template <int STAGES, bool LANES, int NU = 0>
__global__ void __launch_bounds__(kWarps * 32, 1) pipe_kernel(ProjectArgs a, int items, int span, int skip_rows) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ float s_r;
  const int K = a.K, U = K / 8;
  const int shift = a.m[0].gs_shift, G = K >> shift;
  const bool swiglu = a.epi == Epilogue::SwiGLU;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int chunks = K / span;
  const int ck_max = span, gc_max = ck_max >> shift;
  const uint32_t wslot = uint32_t(ck_max / 2), sslot = uint32_t(gc_max * 2);  // bytes a row slot
  const uint32_t w_bytes = kTileRows * wslot, s_bytes = kTileRows * sslot;
  const uint32_t stage_bytes = w_bytes + 2 * s_bytes;
  // Shared memory: x's unit integers (make_unit_q4's split layout), group sums, the stages
  // (16-byte aligned: G % 8 == 0), then x as given when it is normalised.
  uint4* xa = reinterpret_cast<uint4*>(smem);
  uint4* xb = xa + U;
  float* xg = reinterpret_cast<float*>(xb + U);
  unsigned char* stages = reinterpret_cast<unsigned char*>(xg + G);

  const int i0 = int(int64_t(blockIdx.x) * items / gridDim.x);
  const int i1 = int(int64_t(blockIdx.x + 1) * items / gridDim.x);
  // Tile t: matrix mi, rows r0 .. r0 + n - 1 (SwiGLU: items, the same rows of both matrices).
  const int per_tile = swiglu ? kWarps : kTileRows;
  auto tile_of = [&](int t, int& mi, int& r0, int& n) {
    if (swiglu) {
      mi = 0;
      r0 = i0 + t * per_tile;
      n = min(per_tile, i1 - r0);
      return;
    }
    int base = 0;
    for (int m = 0; m < a.n; ++m) {
      const int lo = max(i0, base), hi = min(i1, base + a.m[m].rows);
      const int nt = hi > lo ? (hi - lo + per_tile - 1) / per_tile : 0;
      if (t < nt) {
        mi = m;
        r0 = lo - base + t * per_tile;
        n = min(per_tile, hi - lo - t * per_tile);
        return;
      }
      t -= nt;
      base += a.m[m].rows;
    }
    mi = 0, r0 = 0, n = 0;
  };
  // (The count repeats tile_of's walk on purpose: one helper for both, which tile_of then
  // called in every stage's copy issue, measured 1.3-2.5% slower; docs/bench.md, session 28.)
  int tiles = 0;
  if (swiglu) {
    tiles = (i1 - i0 + per_tile - 1) / per_tile;
  } else {
    int base = 0;
    for (int m = 0; m < a.n; ++m) {
      const int lo = max(i0, base), hi = min(i1, base + a.m[m].rows);
      if (hi > lo) tiles += (hi - lo + per_tile - 1) / per_tile;
      base += a.m[m].rows;
    }
  }
  const int total = tiles * chunks;

  // Stage s's copies by every thread, then one commit (also past the end: the count of groups
  // stays regular for the waits below). Thread i copies the pieces i, i + blockDim, ... of the
  // stage's rows (row j = piece / pieces a row); the divisions are made once here, and each step
  // moves (row, piece) on by (dj, dp): the issue runs in every stage's critical path.
  const int pw = span / 32, ps = (span >> shift) / 8;  // 16-byte pieces of a row's words, of its scales
  const int jw0 = threadIdx.x / pw, pw0 = threadIdx.x % pw, djw = blockDim.x / pw, dpw = blockDim.x % pw;
  const int js0 = threadIdx.x / ps, ps0 = threadIdx.x % ps, djs = blockDim.x / ps, dps = blockDim.x % ps;
  auto issue = [&](int s) {
    if (s < total) {
      int mi, r0, n;
      tile_of(s / chunks, mi, r0, n);
      const int c = s % chunks;
      unsigned char* st = stages + (s % STAGES) * stage_bytes;
      for (int half = 0; half < (swiglu ? 2 : 1); ++half) {
        const MatDev& m = a.m[mi + half];
        const int slot0 = half * kWarps;
        const unsigned char* w = static_cast<const unsigned char*>(m.w) + size_t(r0) * (K / 2) + size_t(c) * (span / 2);
        const size_t soff = size_t(r0) * (G * 2) + size_t((c * span) >> shift) * 2;
        const unsigned char* sc = static_cast<const unsigned char*>(m.s) + soff;
        const unsigned char* bi = static_cast<const unsigned char*>(m.b) + soff;
        for (int j = jw0, p = pw0; j < n;) {
          async_copy16(st + (slot0 + j) * wslot + 16 * p, w + size_t(j) * (K / 2) + 16 * p);
          j += djw, p += dpw;
          if (p >= pw) p -= pw, ++j;
        }
        for (int j = js0, p = ps0; j < n;) {
          async_copy16(st + w_bytes + (slot0 + j) * sslot + 16 * p, sc + size_t(j) * (G * 2) + 16 * p);
          async_copy16(st + w_bytes + s_bytes + (slot0 + j) * sslot + 16 * p, bi + size_t(j) * (G * 2) + 16 * p);
          j += djs, p += dps;
          if (p >= ps) p -= ps, ++j;
        }
      }
    }
    async_commit();
  };

  pdl_trigger();
  // The weights do not depend on earlier kernels: the first stages stream before the wait.
  for (int s = 0; s < STAGES - 1; ++s) issue(s);
  pdl_wait();

  // x after the wait, in one trip to L2: each thread loads its units (unit u is thread
  // u mod 512, up to three at once), a raw copy goes to shared memory when x is normalised, and
  // one warp makes the canonical sum of squares from it. Then each unit's exact integers and
  // its sum (the chain of its 8 values); a group's gs / 8 <= 32 units lie on consecutive lanes
  // of one warp, so the group sum (the chain of its unit sums) is made by shuffles. The same
  // arithmetic as the resident kernel. (Warp-uniform: U is a multiple of 32.)
  const float4* x4 = reinterpret_cast<const float4*>(a.x);
  const float4* w4 = reinterpret_cast<const float4*>(a.norm);
  float4* raw4 = reinterpret_cast<float4*>(stages + STAGES * stage_bytes);  // K floats when a.norm
  constexpr int kHeld = 3;
  float4 v[kHeld][2];
#pragma unroll
  for (int k = 0; k < kHeld; ++k) {
    const int u = threadIdx.x + k * blockDim.x;
    if (u < U) {
      v[k][0] = x4[2 * u];
      v[k][1] = x4[2 * u + 1];
      if (a.norm) raw4[2 * u] = v[k][0], raw4[2 * u + 1] = v[k][1];
    }
  }
  if (a.norm) {
    for (int u = threadIdx.x + kHeld * blockDim.x; u < U; u += blockDim.x)
      raw4[2 * u] = x4[2 * u], raw4[2 * u + 1] = x4[2 * u + 1];
    __syncthreads();
    if (warp == 0) {
      const float ss = warp_sum_squares(reinterpret_cast<const float*>(raw4), K, lane);
      if (lane == 0) s_r = num::rms_inv(ss, K, a.eps);
    }
    __syncthreads();
  }
  const float r = a.norm ? s_r : 1.0f;
  const int upg = 1 << (shift - 3);  // units a group
  auto finish_unit = [&](int u, float4 v0, float4 v1) {
    if (a.norm) {
      const float4 n0 = w4[2 * u], n1 = w4[2 * u + 1];
      v0 = make_float4((v0.x * r) * n0.x, (v0.y * r) * n0.y, (v0.z * r) * n0.z, (v0.w * r) * n0.w);
      v1 = make_float4((v1.x * r) * n1.x, (v1.y * r) * n1.y, (v1.z * r) * n1.z, (v1.w * r) * n1.w);
    }
    make_unit_q4(v0, v1, xa[u], xb[u]);
    const float p = unit_sum(v0, v1);
    const int first = lane & ~(upg - 1);
    float gsum = 0.0f;
    for (int k = 0; k < upg; ++k) gsum = gsum + __shfl_sync(0xffffffffu, p, first + k);
    if (lane == first) xg[u >> (shift - 3)] = gsum;
  };
#pragma unroll
  for (int k = 0; k < kHeld; ++k) {
    const int u = threadIdx.x + k * blockDim.x;
    if (u < U) finish_unit(u, v[k][0], v[k][1]);
  }
  for (int u = threadIdx.x + kHeld * blockDim.x; u < U; u += blockDim.x)
    finish_unit(u, a.norm ? raw4[2 * u] : x4[2 * u], a.norm ? raw4[2 * u + 1] : x4[2 * u + 1]);
  // (the first wait's barrier below makes x visible to every warp)
  XRegs<(NU > 0 ? NU : 1)> xr;
  if constexpr (NU > 0) {
    __syncthreads();
    load_xregs(xr, xa, xb, xg, G, lane);
  }

  using S = const unsigned short*;
  for (int t = 0; t < tiles; ++t) {
    int mi, r0, n;
    tile_of(t, mi, r0, n);
    // This warp's rows: slots ja and jb (SwiGLU: item `warp`, gate and up; else rows 2 warp and
    // 2 warp + 1, the first twice when it is the tile's last).
    const bool mine = swiglu ? warp < n : 2 * warp < n;
    const int ja = swiglu ? warp : 2 * warp;
    const int jb = swiglu ? kWarps + warp : min(2 * warp + 1, n - 1);
    float acc_a = 0.0f, acc_b = 0.0f, bias_a = 0.0f, bias_b = 0.0f;
    for (int c = 0; c < chunks; ++c) {
      const int s = t * chunks + c;
      async_wait_group<STAGES - 2>();  // this thread's copies of stage s have landed
      __syncthreads();                 // everyone's have, and stage s - 1's slot is free again
      issue(s + STAGES - 1);
      if constexpr (NU > 0) {  // whole rows (chunks == 1), x in registers
        if (mine && !skip_rows) {
          const unsigned char* st = stages + (s % STAGES) * stage_bytes;
          const uint32_t* w = reinterpret_cast<const uint32_t*>(st);
          S sc = reinterpret_cast<S>(st + w_bytes), bi = reinterpret_cast<S>(st + w_bytes + s_bytes);
          dot2_reg<NU>(w + ja * U, sc + ja * G, bi + ja * G, w + jb * U, sc + jb * G, bi + jb * G, G, shift, xr, lane,
                       acc_a, acc_b);
        }
      } else if (mine && !skip_rows) {
        const unsigned char* st = stages + (s % STAGES) * stage_bytes;
        const uint32_t* w = reinterpret_cast<const uint32_t*>(st);
        S sc = reinterpret_cast<S>(st + w_bytes), bi = reinterpret_cast<S>(st + w_bytes + s_bytes);
        for (int p = 0; p < span; p += kChunk) {  // the part's pieces of up to 2048 inputs, in order
          const int ck = min(kChunk, span - p), in0 = c * span + p;
          const int wo = p / 8, so = p >> shift;  // the piece's first word and group in the slot
          chunk_pair<LANES>(w + ja * (wslot / 4) + wo, sc + ja * (sslot / 2) + so, bi + ja * (sslot / 2) + so,
                            w + jb * (wslot / 4) + wo, sc + jb * (sslot / 2) + so, bi + jb * (sslot / 2) + so, ck / 256,
                            ck >> shift, in0 / 8, in0 >> shift, shift, xa, xb, xg, lane, acc_a, acc_b, bias_a, bias_b);
        }
      }
    }
    if (mine) {
      // a in lanes 0-15, b in 16-31 (NU > 0: dot2_reg's sums are in every lane)
      const float v = NU > 0 ? (lane & 16 ? acc_b : acc_a) : warp_butterfly2(acc_a + bias_a, acc_b + bias_b, lane);
      if (swiglu) {
        const float gv = __shfl_sync(0xffffffffu, v, 0), uv = __shfl_sync(0xffffffffu, v, 16);
        if (lane == 0) a.m[0].y[r0 + ja] = num::silu(gv) * uv;
      } else if (lane == 0 || (lane == 16 && jb != ja)) {
        float* y = a.m[mi].y + r0 + (lane == 0 ? ja : jb);
        *y = a.epi == Epilogue::Add ? *y + v : v;
      }
    }
  }
  async_wait_all();
}

template <int STAGES>
void launch_stages(bool lanes, bool xregs, int blocks, size_t smem, cudaStream_t s, const ProjectArgs& a, int items,
                   int span) {
  using Kernel = void (*)(ProjectArgs, int, int, int);
  static const int skip_rows = env_int("DELTAQ_MV_PIPE_SKIP", 0);
  const Kernel k = xregs ? pipe_kernel<STAGES, false, 10> : lanes ? pipe_kernel<STAGES, true> : pipe_kernel<STAGES, false>;
  static bool attr_set = false;
  if (!attr_set) {
    for (Kernel kk : {pipe_kernel<STAGES, true>, pipe_kernel<STAGES, false>, pipe_kernel<STAGES, false, 10>})
      DQ_CUDA_CHECK(cudaFuncSetAttribute(kk, cudaFuncAttributeMaxDynamicSharedMemorySize, 225 * 1024));
    attr_set = true;
  }
  launch_kernel(k, blocks, kWarps * 32, smem, s, a, items, span, skip_rows);
}

}  // namespace

int project_pipe_mode() {
  static const int mode = env_int("DELTAQ_MV_PIPE", 1);
  return mode;
}

bool launch_project_pipe(const ProjectArgs& a, int num_sms, cudaStream_t s) {
  if (project_pipe_mode() == 0 || a.T != 1 || a.n < 1) return false;
  const MatDev& m0 = a.m[0];
  const int K = a.K;
  if (m0.fmt != WFmt::Affine || m0.bits != 4 || m0.sdt != SDt::BF16 || m0.gs_shift < 3 || m0.gs_shift > 8) return false;
  // A stage's part of a row (below) holds whole lanes of units (% 256) and whole 16-byte pieces
  // of scales (% (8 gs)), and in the lane layout whole chunks of 2048.
  if (K % 256 != 0 || K % (8 * m0.gs) != 0) return false;
  if (m0.lanes && K % kChunk != 0) return false;
  const bool swiglu = a.epi == Epilogue::SwiGLU;
  if (swiglu && (a.n != 2 || a.m[1].rows != m0.rows)) return false;
  for (int i = 0; i < a.n; ++i) {
    const MatDev& m = a.m[i];
    if (m.fmt != WFmt::Affine || m.bits != 4 || m.sdt != SDt::BF16 || m.gs != m0.gs || m.lanes != m0.lanes ||
        m.cols != K)
      return false;
    if (reinterpret_cast<uintptr_t>(m.w) % 16 || reinterpret_cast<uintptr_t>(m.s) % 16 ||
        reinterpret_cast<uintptr_t>(m.b) % 16)
      return false;
  }
  if (reinterpret_cast<uintptr_t>(a.x) % 16 || (a.norm && reinterpret_cast<uintptr_t>(a.norm) % 16)) return false;
  int items = swiglu ? m0.rows : 0;
  if (!swiglu)
    for (int i = 0; i < a.n; ++i) items += a.m[i].rows;
  if (items < 1) return false;
  const int G = K / m0.gs;
  const size_t raw_bytes = a.norm ? size_t(K) * 4 : 0;  // x as given, for the sum of squares
  const size_t x_bytes = size_t(K / 8) * 32 + size_t(G) * 4 + raw_bytes;
  auto stage_bytes_of = [&](int span) { return size_t(kTileRows) * (span / 2 + 2 * (span / m0.gs) * 2); };
  // Three stages: on an H100 the 9B decoded 309.3 tok/s with 3, 304.3 with 4 and 295.6 with 5
  // (as many as fit), the 4B 342.5 / 339.9 / 338.8 (docs/bench.md, session 27).
  // DELTAQ_MV_PIPE_STAGES=4 or 5 (when they fit; an A/B knob, results never depend on it).
  static const int max_stages = std::clamp(env_int("DELTAQ_MV_PIPE_STAGES", 3), 3, 5);
  // A stage's part of a row: the longest equal part (whole rows first) with which three stages
  // fit, so that every stage carries as many bytes: with 2048 and a remainder (the 4B's K =
  // 2560: 2048 + 512) a small stage left the ring short of bytes in flight.
  int span = 0;
  for (int n = 1; n <= K / 256 && !span; ++n) {
    const int sp = K / n;
    if (K % n || sp % 256 || sp % (8 * m0.gs) || (m0.lanes && sp % kChunk)) continue;
    if (x_bytes + 3 * stage_bytes_of(sp) <= 225 * 1024) span = sp;
  }
  if (!span) return false;
  const size_t stage_bytes = stage_bytes_of(span);
  int stages = max_stages;
  while (stages > 3 && x_bytes + stages * stage_bytes > 225 * 1024) --stages;
  const int blocks = std::min(num_sms, items);
  const size_t smem = x_bytes + stages * stage_bytes;
  // Whole rows of the 4B's width (K = 2560, 10 units a lane) with x in registers
  // (DELTAQ_MV_PIPE_XREGS=0: from shared memory, chunk_pair; results never depend on it).
  static const bool xregs_on = env_int("DELTAQ_MV_PIPE_XREGS", 1) != 0;
  const bool xregs = xregs_on && !m0.lanes && span == K && K == 2560 && G <= 64;
  if (stages == 5) launch_stages<5>(m0.lanes, xregs, blocks, smem, s, a, items, span);
  else if (stages == 4) launch_stages<4>(m0.lanes, xregs, blocks, smem, s, a, items, span);
  else launch_stages<3>(m0.lanes, xregs, blocks, smem, s, a, items, span);
  return true;
}

}  // namespace dq::cuda
