// The resident mat-vec: when a product's 4-bit weights fit in shared memory spread over one
// block per SM, each block copies its rows into shared memory with asynchronous copies
// (cp.async; the copy engine measured no faster) *before* it waits for the previous kernel (programmatic dependent
// launch). The weight stream of this product then overlaps the previous kernels, and after the
// wait only the short critical path remains: normalise x, make the group sums, and compute the
// rows from shared memory. Rows are computed in the canonical order of ops/numerics.h
// (affine_dot: lane l takes units l, l+32, ...), so results equal the CPU's bit for bit.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backend/cuda/kernels.cuh"
#include "backend/cuda/q4.cuh"
#include "ops/numerics.h"

namespace dq::cuda {

DQ_TIMELINE_FILE

namespace {

// A block's rows of one matrix, and where they sit in shared memory (byte offsets: pointers
// made from the shared array at the point of use compile to shared-memory loads).
struct Seg {
  int m = 0, r0 = 0, n = 0;  // matrix, first row, rows
  uint32_t w = 0, s = 0, b = 0;
};

__device__ __forceinline__ float scale_at(const void* p, int i, SDt t) {
  if (t == SDt::BF16) return __uint_as_float(uint32_t(static_cast<const unsigned short*>(p)[i]) << 16);
  if (t == SDt::F16) return __half2float(static_cast<const __half*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

// Rows ra of A and rb of B (two = false: A only) against x in shared memory, canonical order:
// lane l accumulates units l, l+32, ... (fmaf(scale, unit dot, acc)), then the bias terms over
// groups l, l+32, ..., then acc + bias, then the butterfly.
__device__ __forceinline__ void dot_rows(const uint32_t* wa, const void* sa, const void* ba, const uint32_t* wb,
                                         const void* sb, const void* bb, bool two, int U, int G, int gs_shift,
                                         int gs, SDt sdt, const uint4* xa, const uint4* xb, const float* xg,
                                         int lane, float& out_a, float& out_b) {
  float acc_a = 0.0f, acc_b = 0.0f;
  for (int base = 0; base < U; base += 256) {
    uint32_t va[8], vb[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int u = base + lane + 32 * i;
      va[i] = u < U ? wa[u] : 0u;
      vb[i] = (two && u < U) ? wb[u] : 0u;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int u = base + lane + 32 * i;
      if (u < U) {
        const uint4 x0 = xa[u], x1 = xb[u];
        const int g = gs_shift >= 0 ? (u * 8) >> gs_shift : u * 8 / gs;
        acc_a = fmaf(scale_at(sa, g, sdt), unit_q4(va[i], x0, x1), acc_a);
        if (two) acc_b = fmaf(scale_at(sb, g, sdt), unit_q4(vb[i], x0, x1), acc_b);
      }
    }
  }
  float bias_a = 0.0f, bias_b = 0.0f;
  for (int g = lane; g < G; g += 32) {
    bias_a = fmaf(scale_at(ba, g, sdt), xg[g], bias_a);
    if (two) bias_b = fmaf(scale_at(bb, g, sdt), xg[g], bias_b);
  }
  out_a = warp_butterfly(acc_a + bias_a);
  if (two) out_b = warp_butterfly(acc_b + bias_b);
}

// Rows (ra of A, rb of B) of a block's segments: the fast or the general dot. Returns A's
// result in lanes 0-15 and B's in lanes 16-31 (the fast path's paired butterfly).
template <bool FAST, int GSHIFT, bool LANES>
__device__ __forceinline__ float dot_pair(const uint32_t* wa, const void* sa, const void* ba, const uint32_t* wb,
                                          const void* sb, const void* bb, bool two, int U, int G, int gs_shift,
                                          int gs, SDt sdt, const uint4* xa, const uint4* xb, const float* xg,
                                          int lane) {
  if constexpr (FAST) {
    using S = const unsigned short*;
    if (!two) {
      wb = wa;
      sb = sa;
      bb = ba;
    }
    return dot2_fast<GSHIFT, LANES>(wa, S(sa), S(ba), wb, S(sb), S(bb), U, G, gs_shift, xa, xb, xg, lane);
  } else {
    float out_a = 0.0f, out_b = 0.0f;
    dot_rows(wa, sa, ba, wb, sb, bb, two, U, G, gs_shift, gs, sdt, xa, xb, xg, lane, out_a, out_b);
    return lane & 16 ? out_b : out_a;
  }
}

// The first item of block b when the last `late` blocks of the grid take `w_late` / 16 of a
// block's share (the others 16 / 16): the hardware places blocks in index order, so the last
// ones are those that find an SM only when the previous kernel leaves (late = 0: even shares).
__host__ __device__ __forceinline__ int first_item(int b, int blocks, int items, int late, int w_late) {
  const int64_t early = blocks - late;
  const int64_t w = 16 * int64_t(b < early ? b : early) + int64_t(w_late) * (b > early ? b - early : 0);
  const int64_t total = 16 * early + int64_t(w_late) * late;
  return int(w * items / total);
}

// GSHIFT: the fast path's log2(gs) when compiled for one group size (see dot2_fast), else -1.
// LANES: the matrices are in the lane layout (q4.cuh; FAST only).
// KC: K when compiled for one width (0: a.K at run time). With U and G known, the row loop's
// chunk and bias loops are straight code: gate/up's rows alone took 8040 against 6771 cycles
// a block (deltaq-bench-rows, variants 7 and 0).
template <int WARPS, int MINB, bool FAST, int GSHIFT = -1, bool LANES = false, int KC = 0>
__global__ void __launch_bounds__(WARPS * 32, MINB) resident_kernel(ProjectArgs a, int gs, int items, int skip, int trigger, int tail) {
  extern __shared__ __align__(128) unsigned char smem[];
  DQ_TL_SLOTS();  // (the timeline build: the recorder's slots, reserved before the wait)
  constexpr int kMax = ProjectArgs::kMax;
  const int K = KC > 0 ? KC : a.K, U = K / 8, G = GSHIFT >= 0 ? K >> GSHIFT : K / gs;
  const int gs_shift = GSHIFT >= 0 ? GSHIFT : a.m[0].gs_shift;
  const SDt sdt = a.m[0].sdt;
  const int sbytes = sdt == SDt::F32 ? 4 : 2;
  const bool swiglu = a.epi == Epilogue::SwiGLU;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  // Shared memory: x's unit integers (q4.cuh make_unit_q4: two words per unit, split for
  // conflict-free lane reads), unit sums (the general path; FAST makes the group sums by
  // shuffles and uses pu[0] only to hand over the sum of squares), group sums, x as given (only
  // when it is normalised here), then the block's weights.
  uint4* xa = reinterpret_cast<uint4*>(smem);
  uint4* xb = xa + U;
  float* pu = reinterpret_cast<float*>(xb + U);
  float* xg = pu + U;
  float* raw = xg + U;
  const uint32_t wbase = uint32_t(4 * (4 * U + 4 * U + U + U) + (a.norm ? 4 * K : 0));

  // This block's items: rows of the concatenated matrices (SwiGLU: gate row j with up row j).
  // tail = late * 256 + w_late (first_item).
  const int i0 = first_item(blockIdx.x, gridDim.x, items, tail >> 8, tail & 255);
  const int i1 = first_item(blockIdx.x + 1, gridDim.x, items, tail >> 8, tail & 255);
  Seg seg[kMax];
  int nseg = 0;
  if (swiglu) {
    seg[0] = Seg{0, i0, i1 - i0};
    seg[1] = Seg{1, i0, i1 - i0};
    nseg = 2;
  } else {
    int base = 0;
#pragma unroll
    for (int m = 0; m < kMax; ++m)
      if (m < a.n) {
        const int lo = max(i0, base), hi = min(i1, base + a.m[m].rows);
        seg[m] = Seg{m, max(lo - base, 0), max(hi - lo, 0)};
        base += a.m[m].rows;
      }
    nseg = a.n;
  }
  const uint32_t wrow = uint32_t(K / 2), srow = uint32_t(G * sbytes);
  {
    uint32_t p = wbase;
#pragma unroll
    for (int i = 0; i < kMax; ++i)
      if (i < nseg) {
        seg[i].w = p;
        p += seg[i].n * wrow;
        seg[i].s = p;
        p += (seg[i].n * srow + 15) / 16 * 16;
        seg[i].b = p;
        p += (seg[i].n * srow + 15) / 16 * 16;
      }
  }
  // trigger (launch_project_resident): when the next kernel may launch. Its blocks' weight
  // copies go out as soon as they are resident, and on an SM where this kernel still runs they
  // slow it: 0 at the start, 1 after x's phase, 2 after the rows, 3 once x has arrived.
  // The kernel lab's SM records: tag 1 started, 2 released, 3 done, + 10 * epilogue + 40 when normalised.
  [[maybe_unused]] const unsigned sm_tag = 10u * unsigned(a.epi) + (a.norm ? 40u : 0u);
  DQ_SM(sm_tag + 1);
  if (trigger == 0) pdl_trigger();
  // Nothing here depends on earlier kernels: the weight copies start, and the RMSNorm weight
  // of this thread's unit comes into registers, before the wait.
#pragma unroll
  for (int i = 0; i < kMax; ++i)
    if (i < nseg && seg[i].n > 0 && !(skip & 1)) {
      const MatDev& m = a.m[seg[i].m];
      const size_t r0 = size_t(seg[i].r0);
      stage_copy(smem + seg[i].w, static_cast<const unsigned char*>(m.w) + r0 * wrow, seg[i].n * wrow);
      stage_copy(smem + seg[i].s, static_cast<const unsigned char*>(m.s) + r0 * srow, seg[i].n * srow);
      stage_copy(smem + seg[i].b, static_cast<const unsigned char*>(m.b) + r0 * srow, seg[i].n * srow);
    }
  const int u_own = threadIdx.x;  // the unit this thread stages (when U <= threads)
  const bool own = U <= int(blockDim.x);
  float4 nw0 = make_float4(0, 0, 0, 0), nw1 = nw0;
  if (a.norm && own && u_own < U) {
    nw0 = reinterpret_cast<const float4*>(a.norm)[2 * u_own];
    nw1 = reinterpret_cast<const float4*>(a.norm)[2 * u_own + 1];
  }
  if (skip & 64) async_wait_all();  // the lab: the copies landed before the wait (see "waited")
  pdl_wait();
  DQ_SM(sm_tag + 2);
  if (skip & 32) {  // the lab: the launch, the wait and the exit alone
    if (threadIdx.x == 0) a.m[seg[0].m].y[seg[0].r0] = 0.0f;
    if (!(skip & 1)) async_wait_all();
    return;
  }
  // Residual rows (ProjectAdd): this warp's first pair, loaded now (lane 0 the first row,
  // lane 16 the second, the lanes that write them), used after the products.
  float y_first = 0.0f;
  const int r_first = 2 * warp + (lane >> 4);
  if (a.epi == Epilogue::Add && (lane & 15) == 0 && r_first < seg[0].n) y_first = a.m[seg[0].m].y[seg[0].r0 + r_first];

  for (int t = 0; t < a.T; ++t) {
    const float4* x4 = reinterpret_cast<const float4*>(a.x + size_t(t) * K);
    // FAST: a group's gs / 8 <= 32 units lie on consecutive lanes of one warp (unit u is
    // thread u mod blockDim, blockDim a multiple of 32), so its sum is made here from the lanes'
    // unit sums, in the canonical chain, by shuffles: no pass over shared memory after the
    // barrier. (Warp-uniform: U is a multiple of 32 on this path.)
    auto lane_group_sum = [&](int u, float p) {
      constexpr int kN = GSHIFT >= 3 ? 1 << (GSHIFT - 3) : 0;  // units per group when compiled in
      const int n = kN ? kN : 1 << (gs_shift - 3);
      const int first = lane & ~(n - 1);
      float s = 0.0f;
      if constexpr (kN > 0) {
        float v[kN > 0 ? kN : 1];
#pragma unroll
        for (int k = 0; k < kN; ++k) v[k] = __shfl_sync(0xffffffffu, p, first + k);
#pragma unroll
        for (int k = 0; k < kN; ++k) s = s + v[k];
      } else {
        for (int k = 0; k < n; ++k) s = s + __shfl_sync(0xffffffffu, p, first + k);
      }
      if (lane == first) xg[u >> (gs_shift - 3)] = s;
    };
    // x in (one trip to L2 per thread), normalised when asked, in the split layout; unit sums.
    auto finish_unit = [&](int u, float4 v0, float4 v1) {
      if (skip & 8) {
        xa[u] = make_uint4(0, 0, 0, 0);
        xb[u] = xa[u];
      } else {
        make_unit_q4(v0, v1, xa[u], xb[u]);
      }
      const float p = unit_sum(v0, v1);
      if constexpr (FAST) {
        if (!(skip & 16)) lane_group_sum(u, p);
      } else {
        pu[u] = p;
      }
    };
    if (a.norm) {
      float4 v0 = make_float4(0, 0, 0, 0), v1 = v0;
      if (own && u_own < U) {
        v0 = x4[2 * u_own];
        v1 = x4[2 * u_own + 1];
        reinterpret_cast<float4*>(raw)[2 * u_own] = v0;
        reinterpret_cast<float4*>(raw)[2 * u_own + 1] = v1;
      } else if (!own) {
        for (int e = threadIdx.x; e < K / 4; e += blockDim.x) reinterpret_cast<float4*>(raw)[e] = x4[e];
      }
      __syncthreads();
      if (t == 0 && trigger == 3) pdl_trigger();  // x has arrived (it is in shared memory)
      // One warp computes the canonical sum of squares (lane = index mod 32, then the
      // butterfly) and hands it over in shared memory (pu[0] when FAST, where pu is unused and
      // the group sums are written next; else xg[0], free until the group sums): with every
      // warp reading all of x for it, the shared-memory reads took longer than the chain.
      float* handover = FAST ? pu : xg;
      if (warp == 0) {
        const float ss = warp_sum_squares(raw, K, lane);
        if (lane == 0) handover[0] = ss;
      }
      __syncthreads();
      const float r = (skip & 4) ? 1.0f : num::rms_inv(handover[0], K, a.eps);
      auto scale = [r](float4 v, float4 w) {
        return make_float4((v.x * r) * w.x, (v.y * r) * w.y, (v.z * r) * w.z, (v.w * r) * w.w);
      };
      if (own) {
        if (u_own < U) finish_unit(u_own, scale(v0, nw0), scale(v1, nw1));
      } else {
        const float4* raw4 = reinterpret_cast<const float4*>(raw);
        const float4* w4 = reinterpret_cast<const float4*>(a.norm);
        for (int u = threadIdx.x; u < U; u += blockDim.x)
          finish_unit(u, scale(raw4[2 * u], w4[2 * u]), scale(raw4[2 * u + 1], w4[2 * u + 1]));
      }
    } else {  // up to three units per thread loaded at once (one trip to L2: K = 6144 on 256
              // threads is three), then any rest
      float4 v[3][2];
#pragma unroll
      for (int k = 0; k < 3; ++k) {
        const int u = threadIdx.x + k * blockDim.x;
        if (u < U) {
          v[k][0] = x4[2 * u];
          v[k][1] = x4[2 * u + 1];
        }
      }
#pragma unroll
      for (int k = 0; k < 3; ++k) {
        const int u = threadIdx.x + k * blockDim.x;
        if (u < U) finish_unit(u, v[k][0], v[k][1]);
      }
      for (int u = threadIdx.x + 3 * blockDim.x; u < U; u += blockDim.x) finish_unit(u, x4[2 * u], x4[2 * u + 1]);
      if (t == 0 && trigger == 3) pdl_trigger();  // x has arrived (its units are made)
    }
    if (t == 0) DQ_MARK();  // (the first token only: prefill would fill the records)
    if (t == 0) async_wait_all();  // this thread's weight copies have landed
    __syncthreads();
    if (t == 0) DQ_MARK();
    if (t == 0 && trigger == 1) pdl_trigger();
    if (!FAST) {
      for (int g = threadIdx.x; g < G && !(skip & 16); g += blockDim.x) {  // group sums: chain of unit sums
        float s = 0.0f;
        for (int u = g * gs / 8; u < (g + 1) * gs / 8; ++u) s = s + pu[u];
        xg[g] = s;
      }
      __syncthreads();
    }
    if (t == 0) DQ_MARK();

    if (skip & 2) {
      if (threadIdx.x == 0) a.m[seg[0].m].y[seg[0].r0] = 0.0f;
    } else if (swiglu) {
      const uint32_t* wg = reinterpret_cast<const uint32_t*>(smem + seg[0].w);
      const uint32_t* wu = reinterpret_cast<const uint32_t*>(smem + seg[1].w);
      // The SwiGLU of a warp's rows waits until its dots are done: lane k keeps the k-th pair's
      // gate and up values, and the lanes then make their silu(g) * u side by side, instead of
      // lane 0 making each one (a dependent chain: exp, a division) while the warp's next dot waits.
      float* ys = a.m[0].y + size_t(t) * a.m[0].rows + seg[0].r0;
      float keep_g = 0.0f, keep_u = 0.0f;
      int kept = 0, j0 = warp;  // pair k of the window is row j0 + k * WARPS
      auto flush = [&] {
        if (lane < kept) ys[j0 + lane * WARPS] = num::silu(keep_g) * keep_u;
      };
      auto keep = [&](float gv, int j) {
        const float g0 = __shfl_sync(0xffffffffu, gv, 0);   // gate's row is in lanes 0-15
        const float uv = __shfl_sync(0xffffffffu, gv, 16);  // up's row is in lanes 16-31
        if (lane == kept) keep_g = g0, keep_u = uv;
        if (++kept == 32) {
          flush();
          kept = 0;
          j0 = j + WARPS;
        }
      };
      if constexpr (FAST && LANES && GSHIFT >= 3) {
        // Two items a step (j and j + WARPS; the last one twice when the count is odd, its
        // second result dropped), x's unit read once for their four rows (q4.cuh dot4_lanes).
        using S = const unsigned short*;
        auto sc = [&](int i, int j) { return S(smem + seg[i].s + j * srow); };
        auto bi = [&](int i, int j) { return S(smem + seg[i].b + j * srow); };
        for (int j = warp; j < seg[0].n; j += 2 * WARPS) {
          const int j2 = j + WARPS < seg[0].n ? j + WARPS : j;
          const uint32_t* const w4[4] = {wg + size_t(j) * U, wu + size_t(j) * U, wg + size_t(j2) * U,
                                         wu + size_t(j2) * U};
          const S s4[4] = {sc(0, j), sc(1, j), sc(0, j2), sc(1, j2)};
          const S b4[4] = {bi(0, j), bi(1, j), bi(0, j2), bi(1, j2)};
          float gv, gv2;
          dot4_lanes<GSHIFT>(w4, s4, b4, U, G, xa, xb, xg, lane, gv, gv2);
          keep(gv, j);
          if (j2 != j) keep(gv2, j2);
        }
      } else {
        for (int j = warp; j < seg[0].n; j += WARPS)
          keep(dot_pair<FAST, GSHIFT, LANES>(wg + size_t(j) * U, smem + seg[0].s + j * srow, smem + seg[0].b + j * srow,
                                             wu + size_t(j) * U, smem + seg[1].s + j * srow,
                                             smem + seg[1].b + j * srow, true, U, G, gs_shift, gs, sdt, xa, xb, xg,
                                             lane),
               j);
      }
      flush();
    } else {
#pragma unroll 1
      for (int i = 0; i < kMax; ++i) {
        if (i >= nseg) break;
        const Seg sg = seg[i];
        const MatDev& m = a.m[sg.m];
        float* y = m.y + size_t(t) * m.rows + sg.r0;
        const uint32_t* w = reinterpret_cast<const uint32_t*>(smem + sg.w);
        // Lane 0 has row j, lane 16 row k (when there are two).
        auto store = [&](float v, int j, int k, bool two) {
          const int r = lane == 0 ? j : k;
          if (lane == 0 || (lane == 16 && two)) {
            if (a.epi == Epilogue::Add) {
              const bool pre = t == 0 && i == 0 && j == 2 * warp;
              v = (pre ? y_first : y[r]) + v;
            }
            y[r] = v;
          }
        };
        int j = 2 * warp;
        if constexpr (FAST && LANES && GSHIFT >= 3) {
          // Two pairs a step while a warp has two (j and j + 2 WARPS), x's unit read once for
          // their four rows (q4.cuh dot4_lanes); a last single pair below.
          using S = const unsigned short*;
          for (; j + 2 * WARPS < sg.n; j += 4 * WARPS) {
            const int j2 = j + 2 * WARPS, k2 = j2 + 1 < sg.n ? j2 + 1 : j2;  // (j + 1 < j2 < sg.n)
            const int r4[4] = {j, j + 1, j2, k2};
            const uint32_t* const w4[4] = {w + size_t(r4[0]) * U, w + size_t(r4[1]) * U, w + size_t(r4[2]) * U,
                                           w + size_t(r4[3]) * U};
            const S s4[4] = {S(smem + sg.s + r4[0] * srow), S(smem + sg.s + r4[1] * srow),
                             S(smem + sg.s + r4[2] * srow), S(smem + sg.s + r4[3] * srow)};
            const S b4[4] = {S(smem + sg.b + r4[0] * srow), S(smem + sg.b + r4[1] * srow),
                             S(smem + sg.b + r4[2] * srow), S(smem + sg.b + r4[3] * srow)};
            float v01, v23;
            dot4_lanes<GSHIFT>(w4, s4, b4, U, G, xa, xb, xg, lane, v01, v23);
            store(v01, j, j + 1, true);
            store(v23, j2, k2, j2 + 1 < sg.n);
          }
        }
        for (; j < sg.n; j += 2 * WARPS) {
          const bool two = j + 1 < sg.n;
          const int k = two ? j + 1 : j;
          store(dot_pair<FAST, GSHIFT, LANES>(w + size_t(j) * U, smem + sg.s + j * srow, smem + sg.b + j * srow,
                                              w + size_t(k) * U, smem + sg.s + k * srow, smem + sg.b + k * srow, two,
                                              U, G, gs_shift, gs, sdt, xa, xb, xg, lane),
                j, k, two);
        }
      }
    }
    __syncthreads();  // the next token overwrites x
    if (t == 0) DQ_MARK();
    if (t == 0 && trigger == 2) pdl_trigger();
  }
  DQ_SM(sm_tag + 3);
}

}  // namespace

bool launch_project_resident(const ProjectArgs& a, int gs, int num_sms, cudaStream_t s, bool fast_only) {
  static const char* env = std::getenv("DELTAQ_MV_RESIDENT");
  static const bool enabled = !(env && env[0] == '0');
  static const int budget_kb = env_int("DELTAQ_MV_RESIDENT_KB", 200);
  if (!enabled || a.n < 1 || gs <= 0 || a.K % 32 != 0 || gs % 8 != 0 || a.K % gs != 0) return false;
  const MatDev& m0 = a.m[0];
  for (int i = 0; i < a.n; ++i) {
    const MatDev& m = a.m[i];
    if (m.fmt != WFmt::Affine || m.bits != 4 || m.gs != gs || m.sdt != m0.sdt || m.cols != a.K || m.lanes != m0.lanes)
      return false;
    if (reinterpret_cast<uintptr_t>(m.w) % 16 || reinterpret_cast<uintptr_t>(m.s) % 4 ||
        reinterpret_cast<uintptr_t>(m.b) % 4)
      return false;
  }
  if (reinterpret_cast<uintptr_t>(a.x) % 16 || (a.norm && reinterpret_cast<uintptr_t>(a.norm) % 16)) return false;
  const bool swiglu = a.epi == Epilogue::SwiGLU;
  if (swiglu && (a.n != 2 || a.m[1].rows != m0.rows)) return false;
  int items = 0;
  if (swiglu) items = m0.rows;
  else
    for (int i = 0; i < a.n; ++i) items += a.m[i].rows;
  const int G = a.K / gs, sbytes = m0.sdt == SDt::F32 ? 4 : 2;
  const size_t srow = size_t(G) * sbytes;
  // DELTAQ_MV_SWIGLU_BLOCKS / DELTAQ_MV_BLOCKS (the kernel lab): fewer blocks than SMs, so
  // that no block waits for an SM still full at the release.
  static const int cap_swiglu = env_int("DELTAQ_MV_SWIGLU_BLOCKS", 0);
  static const int cap_other = env_int("DELTAQ_MV_BLOCKS", 0);
  const int cap = swiglu ? cap_swiglu : cap_other;
  const int blocks = std::min(items, cap > 0 ? std::min(cap, num_sms) : num_sms);
  // The last L blocks take W / 16 of a block's share of the rows (first_item): gate/up's last
  // blocks find an SM only when the out-projection leaves (session 13, SM records: blocks
  // 108-131, mostly 126-131), so its last 8 take half a share (H200: +0.3%, session 13 runs 2
  // and 5, with 4; session 15 run 7: 1166 tok/s with 8 against 1162 with 6 and 1160 with 4).
  // DELTAQ_MV_SWIGLU_TAIL=L,W / DELTAQ_MV_TAIL=L,W override (results never depend on it).
  auto tail_of = [](const char* name, const char* dflt) {
    const char* e = std::getenv(name);
    if (!e) e = dflt;
    int late = 0, w = 16;
    if (e && std::sscanf(e, "%d,%d", &late, &w) == 2 && late > 0 && late < 128 && w >= 0 && w <= 16) return late * 256 + w;
    return 0;
  };
  static const int tail_swiglu = tail_of("DELTAQ_MV_SWIGLU_TAIL", "8,8"), tail_other = tail_of("DELTAQ_MV_TAIL", "0,16");
  const int tail = (swiglu ? tail_swiglu : tail_other) >> 8 < blocks ? (swiglu ? tail_swiglu : tail_other) : 0;
  int per_block = 0;
  for (int b = 0; b < blocks; ++b)
    per_block = std::max(per_block, first_item(b + 1, blocks, items, tail >> 8, tail & 255) -
                                        first_item(b, blocks, items, tail >> 8, tail & 255));
  const int segs = swiglu ? 2 : a.n;
  const size_t row_bytes = size_t(a.K / 2) + 2 * ((srow + 15) / 16 * 16);
  const size_t x_bytes = size_t(a.K) * 4 + 2 * size_t(a.K / 8) * 4 + (a.norm ? size_t(a.K) * 4 : 0);
  const size_t smem = x_bytes + 16 + size_t(per_block) * row_bytes * (swiglu ? 2 : 1) + size_t(segs) * 2 * 16;
  if (smem > size_t(budget_kb) * 1024 || smem > 225 * 1024) return false;
  // The fast path: the lane layout's widths (K = 1024: the 0.8B's, one half chunk), and in the row
  // layout any K a multiple of 256 (q4.cuh dot2_fast: a last part of 1-7 units a lane) where the
  // block's shared memory leaves room for the next kernel's block beside it (the 0.8B's down, K =
  // 3584: else the pipelined product). DELTAQ_MV_RES_TAIL_KB sets that room (0: no such K).
  static const int tail_kb = env_int("DELTAQ_MV_RES_TAIL_KB", 112);
  const bool width_ok = m0.lanes ? lane_width(a.K)
                                 : a.K % 2048 == 0 || a.K == 1024 || (a.K % 256 == 0 && smem <= size_t(tail_kb) * 1024);
  const bool fast = m0.sdt == SDt::BF16 && width_ok && m0.gs_shift >= 0 && m0.gs_shift <= 8;
  if (fast_only && !fast) return false;
  if (m0.lanes && !fast) return false;  // (product_matrix makes only fast-path matrices lanes)
  // Variants (warps per block, blocks per SM the registers are capped for); results never
  // depend on them. DELTAQ_MV_RES_VARIANT picks one (the kernel lab), default measured best.
  static const int variant = env_int("DELTAQ_MV_RES_VARIANT", 3);
  using Kernel = void (*)(ProjectArgs, int, int, int, int, int);
  static const Kernel table[4][2] = {{resident_kernel<16, 2, false>, resident_kernel<16, 2, true>},
                                     {resident_kernel<12, 2, false>, resident_kernel<12, 2, true>},
                                     {resident_kernel<16, 1, false>, resident_kernel<16, 1, true>},
                                     {resident_kernel<8, 2, false>, resident_kernel<8, 2, true>}};
  static const int warps[4] = {16, 12, 16, 8};
  const int v = variant >= 0 && variant < 4 ? variant : 3;
  // MLX's usual group size compiled in for the default variant (DELTAQ_MV_RES_G64=0: not).
  static const Kernel fast_g64 = resident_kernel<8, 2, true, 6>;
  static const bool g64 = !(std::getenv("DELTAQ_MV_RES_G64") && std::getenv("DELTAQ_MV_RES_G64")[0] == '0');
  // The lane layout: the default variant only (another variant leaves such products to the
  // streaming kernels).
  static const Kernel lanes_g64 = resident_kernel<8, 2, true, 6, true>;
  static const Kernel lanes_any = resident_kernel<8, 2, true, -1, true>;
  // The 2B step's two widths compiled in (KC), and the 0.8B's 1024; DELTAQ_MV_RES_KC: bit 1
  // K = 2048, bit 2 K = 6144, bit 4 K = 1024 (default all; results never depend on it).
  static const Kernel lanes_g64_2048 = resident_kernel<8, 2, true, 6, true, 2048>;
  static const Kernel lanes_g64_6144 = resident_kernel<8, 2, true, 6, true, 6144>;
  static const Kernel lanes_g64_1024 = resident_kernel<8, 2, true, 6, true, 1024>;
  static const int kc = env_int("DELTAQ_MV_RES_KC", 7);
  if (m0.lanes && v != 3) return false;
  static bool attr_set = false;
  if (!attr_set) {
    for (auto& row : table)
      for (Kernel k : row) DQ_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 225 * 1024));
    for (Kernel k : {fast_g64, lanes_g64, lanes_any, lanes_g64_2048, lanes_g64_6144, lanes_g64_1024})
      DQ_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 225 * 1024));
    attr_set = true;
  }
  // DELTAQ_MV_RES_SKIP (the kernel lab only; results are then wrong): bits 1 skip the weight
  // copies, 2 the row products, 4 the RMSNorm's scaling (r = 1; warp 0 still makes the sum),
  // 8 x's unit integers, 16 the group sums, 32 everything after the wait, 64 wait for the
  // weight copies before the programmatic wait (its "waited" then tells whether they landed
  // before the release; results stay right); to see where a launch's time goes.
  static const int skip = env_int("DELTAQ_MV_RES_SKIP", 0);
  const Kernel k = m0.lanes ? (g64 && m0.gs_shift == 6 ? (a.K == 2048 && (kc & 1)   ? lanes_g64_2048
                                                          : a.K == 6144 && (kc & 2) ? lanes_g64_6144
                                                          : a.K == 1024 && (kc & 4) ? lanes_g64_1024
                                                                                    : lanes_g64)
                                                      : lanes_any)
                  : fast && g64 && v == 3 && m0.gs_shift == 6 ? fast_g64
                                                              : table[v][fast ? 1 : 0];
  // Where the next kernel may launch: 0 at the start (its weight copies then overlap this
  // kernel's wait), 1 after x's phase, 2 after the rows, 3 once x has arrived. SwiGLU (gate/up)
  // lets its successor (down, 86 KB of copies a block) launch once x has arrived (in shared
  // memory, before its sum of squares): since gate/up's rows take two items a step (session 21)
  // they end sooner, and down's copies need the earlier start (H200, session 21 run 12: 1279.9
  // against 1269.2 tok/s after x's phase, every round; sessions 12-15 measured after x's phase
  // best with the slower rows: 1074 vs 1054 at the start; after the rows: 1021).
  // DELTAQ_MV_TRIGGER_SWIGLU / DELTAQ_MV_TRIGGER (the others) override (results never depend on it).
  static const int trig_swiglu = env_int("DELTAQ_MV_TRIGGER_SWIGLU", 3);
  static const int trig_other = env_int("DELTAQ_MV_TRIGGER", 0);
  // Down (the other products wider than 2048 inputs) lets its successor launch once x has
  // arrived: the next layer's in-projections (9.5 MB of copies for a GDN layer's mixer) then
  // stay out of its x phase, which reads x from L2 under that stream (H200, session 15 runs 2-4:
  // 1155 tok/s against 1143 at the start and 1152 after the x phase; after the rows 1114).
  // DELTAQ_MV_TRIGGER_WIDE overrides.
  static const int trig_wide = env_int("DELTAQ_MV_TRIGGER_WIDE", 3);
  // Attention's in-projections (the stored products) let the scores kernel launch after x's
  // phase (its early reads of the K cache then stay out of it: H200, session 15 run 5: 1160
  // against 1155 tok/s at the start, 1156 once x has arrived). DELTAQ_MV_TRIGGER_STORE overrides.
  static const int trig_store = env_int("DELTAQ_MV_TRIGGER_STORE", 1);
  const int trig = swiglu ? trig_swiglu : a.K > 2048 ? trig_wide : a.epi == Epilogue::Store ? trig_store : trig_other;
  launch_kernel(k, blocks, warps[v] * 32, smem, s, a, gs, items, skip, trig % 4, tail);
  return true;
}

}  // namespace dq::cuda
