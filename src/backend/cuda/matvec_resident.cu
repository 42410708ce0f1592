// The resident mat-vec: when a product's 4-bit weights fit in shared memory spread over one
// block per SM, each block copies its rows into shared memory with bulk asynchronous copies
// (TMA, cp.async.bulk) *before* it waits for the previous kernel (programmatic dependent
// launch). The weight stream of this product then overlaps the previous kernels, and after the
// wait only the short critical path remains: normalise x, make the group sums, and compute the
// rows from shared memory. Rows are computed in the canonical order of ops/numerics.h
// (affine_dot: lane l takes units l, l+32, ...), so results equal the CPU's bit for bit.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "backend/cuda/kernels.cuh"
#include "backend/cuda/mma_q4.cuh"
#include "backend/cuda/q4.cuh"
#include "ops/numerics.h"

namespace dq::cuda {

DQ_TIMELINE_FILE

namespace {

// Copies bytes from global to shared memory with all threads of the block: 16-byte cp.async
// when both ends are 16-byte aligned and bytes % 16 == 0, else 2-byte loads and stores.
__device__ __forceinline__ void stage_copy(void* dst, const void* src, uint32_t bytes) {
  if ((reinterpret_cast<uintptr_t>(src) | bytes) % 16 == 0 && smem_addr(dst) % 16 == 0) {
    for (uint32_t i = threadIdx.x; i < bytes / 16; i += blockDim.x)
      async_copy16(static_cast<unsigned char*>(dst) + 16 * i, static_cast<const unsigned char*>(src) + 16 * i);
  } else {
    for (uint32_t i = threadIdx.x; i < bytes / 2; i += blockDim.x)
      static_cast<unsigned short*>(dst)[i] = __ldg(static_cast<const unsigned short*>(src) + i);
  }
}

// Copies `rows` rows of `bytes` each (a multiple of 16) to shared memory rows `stride` bytes
// apart (the MMA products' padding, which puts the 8 rows a warp reads at once in different banks).
__device__ __forceinline__ void stage_copy_rows(void* dst, const void* src, uint32_t rows, uint32_t bytes,
                                                uint32_t stride) {
  const uint32_t per_row = bytes / 16;
  const uint32_t magic = uint32_t((0x100000000ull + per_row - 1) / per_row);  // i / per_row = umulhi(i, magic)
  for (uint32_t i = threadIdx.x; i < rows * per_row; i += blockDim.x) {  // (exact while i * per_row < 2^32)
    const uint32_t r = __umulhi(i, magic), c = i - r * per_row;
    async_copy16(static_cast<unsigned char*>(dst) + r * stride + 16 * c,
                 static_cast<const unsigned char*>(src) + r * bytes + 16 * c);
  }
}

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

// Rows (ra of A, rb of B) of a block's segments: the fast or the general dot.
template <bool FAST>
__device__ __forceinline__ void dot_pair(const uint32_t* wa, const void* sa, const void* ba, const uint32_t* wb,
                                         const void* sb, const void* bb, bool two, int U, int G, int gs_shift,
                                         int gs, SDt sdt, const uint4* xa, const uint4* xb, const float* xg,
                                         int lane, float& out_a, float& out_b) {
  if constexpr (FAST) {
    using S = const unsigned short*;
    if (!two) {
      wb = wa;
      sb = sa;
      bb = ba;
    }
    dot2_fast(wa, S(sa), S(ba), wb, S(sb), S(bb), U, G, gs_shift, xa, xb, xg, lane, out_a, out_b);
  } else {
    dot_rows(wa, sa, ba, wb, sb, bb, two, U, G, gs_shift, gs, sdt, xa, xb, xg, lane, out_a, out_b);
  }
}

// The MMA products (MMA = true: 8 warps, the fast path's conditions, groups of >= 32 inputs):
// warp w takes the chunks c = w, w + 8, ... (4 units each: mma_q4.cuh) of every row of the
// block, 16 rows (a tile; SwiGLU: 8 gate rows and their 8 up rows) per pair of mma. Thread
// (g, t) of warp w then carries, for rows g and g+8 of each tile, the chain of lane 4w + t of
// the canonical order (units 4w + t + 32i, i ascending: affine_dot's lane u % 32), and adds its
// bias terms; the 32 lanes of a row meet in shared memory (red), and one thread a row sums them
// in the butterfly's order. Weight and scale rows sit 16 bytes further apart than their size.
constexpr int kMmaTiles = 4;                // tiles per pass over the chunks
constexpr int kMmaChunks = 4;               // chunks a warp has in flight
constexpr int kRedStride = 33;              // floats per row of red (conflict-free row reads)
constexpr int kRedRows = 16 * kMmaTiles;

// Whether the largest block's rows take more than one pass of kMmaTiles tiles (then the lanes'
// table cannot lie over x, which the next pass reads); the host sizes shared memory by it.
__host__ __device__ inline bool mma_red_apart(bool swiglu, int items, int blocks) {
  const int per_block = (items + blocks - 1) / blocks;
  return (per_block + (swiglu ? 7 : 15)) / (swiglu ? 8 : 16) > kMmaTiles;
}

// Shared-memory byte offsets of the weight, scale and bias rows of the thread's row h of tile
// k (SwiGLU: h = 0 gate, 1 up of pair 8k + g; else block row 16k + g + 8h, the segments' rows
// one after another). A row past the block's last reads offset 0 (inside the allocation), and
// its result is dropped.
struct MmaRow {
  uint32_t w = 0, s = 0, b = 0;
};
__device__ __forceinline__ MmaRow mma_row_at(const Seg (&seg)[ProjectArgs::kMax], int nseg, bool swiglu, int rows,
                                             int k, int h, int g, uint32_t wstride, uint32_t sstride) {
  MmaRow o;
  if (swiglu) {
    const int p = 8 * k + g;
    if (p < rows) o = MmaRow{seg[h].w + uint32_t(p) * wstride, seg[h].s + uint32_t(p) * sstride,
                             seg[h].b + uint32_t(p) * sstride};
    return o;
  }
  const int r = 16 * k + g + 8 * h;
  int base = 0;
#pragma unroll
  for (int i = 0; i < ProjectArgs::kMax; ++i)
    if (i < nseg) {
      if (r >= base && r < base + seg[i].n) {
        const uint32_t j = uint32_t(r - base);
        o = MmaRow{seg[i].w + j * wstride, seg[i].s + j * sstride, seg[i].b + j * sstride};
      }
      base += seg[i].n;
    }
  return o;
}

// The MMA products of token t (see above): x's split words, unit sums and group sums are in
// shared memory; writes the block's outputs with the epilogue.
__device__ __forceinline__ void mma_products(const ProjectArgs& a, int t, const Seg (&seg)[ProjectArgs::kMax],
                                             int nseg, bool swiglu, int U, int G, int gs_shift, uint32_t wstride,
                                             uint32_t sstride, const unsigned char* smem, const uint4* xa,
                                             const uint4* xb, const float* xg, float* red, bool red_apart,
                                             int warp, int lane) {
  const int g = lane >> 2, tq = lane & 3;
  const int slot = 4 * warp + tq;  // this thread's lane of the canonical order
  int rows = 0;                    // block rows (SwiGLU: pairs)
#pragma unroll
  for (int i = 0; i < ProjectArgs::kMax; ++i)
    if (i < nseg) rows += seg[i].n;
  if (swiglu) rows = seg[0].n;
  const int per_tile = swiglu ? 8 : 16;
  const int tiles = (rows + per_tile - 1) / per_tile;
  for (int t0 = 0; t0 < tiles; t0 += kMmaTiles) {
    uint32_t wo[kMmaTiles][2], so[kMmaTiles][2];
#pragma unroll
    for (int k = 0; k < kMmaTiles; ++k)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const MmaRow r = mma_row_at(seg, nseg, swiglu, rows, t0 + k, h, g, wstride, sstride);
        wo[k][h] = r.w;
        so[k][h] = r.s;
      }
    float acc[kMmaTiles][2];
#pragma unroll
    for (int k = 0; k < kMmaTiles; ++k) acc[k][0] = acc[k][1] = 0.0f;
    // kMmaChunks chunks of this warp per round (U / 4 is a multiple of 64: the fast path's K),
    // their products independent, then chained into acc in chunk order.
    for (int c0 = warp; c0 < U / 4; c0 += 8 * kMmaChunks) {
      ChunkB b[kMmaChunks];
      uint32_t gr2[kMmaChunks];  // byte offset of each chunk's group in a scale row
#pragma unroll
      for (int j = 0; j < kMmaChunks; ++j) {
        const int c = c0 + 8 * j, u = 4 * c + tq;
        b[j] = chunk_b(xa[u], xb[u], g, tq);
        gr2[j] = uint32_t((c * 32) >> gs_shift) * 2;
      }
#pragma unroll
      for (int k = 0; k < kMmaTiles; ++k)
        if (t0 + k < tiles) {  // (warp-uniform)
          float p0[kMmaChunks], p1[kMmaChunks];
#pragma unroll
          for (int j = 0; j < kMmaChunks; ++j) {
            const uint32_t off = 4 * uint32_t(4 * (c0 + 8 * j) + tq);
            unit_q4_mma(*reinterpret_cast<const uint32_t*>(smem + wo[k][0] + off),
                        *reinterpret_cast<const uint32_t*>(smem + wo[k][1] + off), b[j], p0[j], p1[j]);
          }
#pragma unroll
          for (int j = 0; j < kMmaChunks; ++j) {
            acc[k][0] = fmaf(bf16_lo(*reinterpret_cast<const unsigned short*>(smem + so[k][0] + gr2[j])), p0[j], acc[k][0]);
            acc[k][1] = fmaf(bf16_lo(*reinterpret_cast<const unsigned short*>(smem + so[k][1] + gr2[j])), p1[j], acc[k][1]);
          }
        }
    }
    // The bias terms of this lane (groups slot, slot + 32, ...): the lane's value, then to red
    // (over x once every warp has read it).
#pragma unroll
    for (int k = 0; k < kMmaTiles; ++k)
      if (t0 + k < tiles)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t bo = mma_row_at(seg, nseg, swiglu, rows, t0 + k, h, g, wstride, sstride).b;
          float bias = 0.0f;
          for (int gg = slot; gg < G; gg += 32)
            bias = fmaf(bf16_lo(*reinterpret_cast<const unsigned short*>(smem + bo + 2 * gg)), xg[gg], bias);
          acc[k][h] = acc[k][h] + bias;
        }
    if (!red_apart) __syncthreads();
#pragma unroll
    for (int k = 0; k < kMmaTiles; ++k)
      if (t0 + k < tiles)
#pragma unroll
        for (int h = 0; h < 2; ++h) red[(16 * k + g + 8 * h) * kRedStride + slot] = acc[k][h];
    __syncthreads();
    if (t == 0 && t0 == 0) DQ_MARK();
    // One thread per row (SwiGLU: per pair) sums the row's 32 lanes and writes it.
    const int i = threadIdx.x;
    if (swiglu) {
      const int p = t0 * 8 + i;
      if (i < 8 * kMmaTiles && p < rows) {
        const float* r = red + (16 * (i / 8) + i % 8) * kRedStride;
        const float gv = butterfly_row(r), uv = butterfly_row(r + 8 * kRedStride);
        a.m[0].y[size_t(t) * a.m[0].rows + seg[0].r0 + p] = num::silu(gv) * uv;
      }
    } else {
      const int r = t0 * 16 + i;
      if (i < kRedRows && r < rows) {
        const float v = butterfly_row(red + i * kRedStride);
        int base = 0;
#pragma unroll
        for (int m = 0; m < ProjectArgs::kMax; ++m)
          if (m < nseg) {
            if (r >= base && r < base + seg[m].n) {
              const MatDev& md = a.m[seg[m].m];
              float* y = md.y + size_t(t) * md.rows + seg[m].r0 + (r - base);
              *y = a.epi == Epilogue::Add ? *y + v : v;
            }
            base += seg[m].n;
          }
      }
    }
    __syncthreads();  // red is reused by the next pass
  }
}

template <int WARPS, int MINB, bool FAST, bool MMA = false>
__global__ void __launch_bounds__(WARPS * 32, MINB) resident_kernel(ProjectArgs a, int gs, int items, int skip) {
  static_assert(!MMA || (WARPS == 8 && FAST), "the MMA products take 8 warps and the fast path's layout");
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kMax = ProjectArgs::kMax;
  const int K = a.K, U = K / 8, G = K / gs;
  const int gs_shift = a.m[0].gs_shift;
  const SDt sdt = a.m[0].sdt;
  const int sbytes = sdt == SDt::F32 ? 4 : 2;
  const bool swiglu = a.epi == Epilogue::SwiGLU;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  // Shared memory: x's unit integers (q4.cuh make_unit_q4: two words per unit, split for
  // conflict-free lane reads), unit sums, group sums, x as given (only when it is normalised
  // here), then the block's weights.
  uint4* xa = reinterpret_cast<uint4*>(smem);
  uint4* xb = xa + U;
  float* pu = reinterpret_cast<float*>(xb + U);
  float* xg = pu + U;
  float* raw = xg + U;
  // MMA: the lanes' table, [kRedRows][kRedStride]. Over x's region (free once the products have
  // read it) when the block's rows take one pass; else a region of its own (mma_red_apart).
  const bool red_apart = MMA && mma_red_apart(swiglu, items, int(gridDim.x));
  float* red = red_apart ? raw + (a.norm ? K : 0) : reinterpret_cast<float*>(smem);
  const uint32_t wbase =
      uint32_t(4 * (4 * U + 4 * U + U + U) + (a.norm ? 4 * K : 0) + (red_apart ? 4 * kRedRows * kRedStride : 0));

  // This block's items: rows of the concatenated matrices (SwiGLU: gate row j with up row j).
  const int i0 = int(int64_t(blockIdx.x) * items / gridDim.x);
  const int i1 = int(int64_t(blockIdx.x + 1) * items / gridDim.x);
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
  // Row strides in shared memory (MMA: padded; srow is then a multiple of 16, see the launch).
  const uint32_t wstride = MMA ? wrow + 16 : wrow, sstride = srow;
  {
    uint32_t p = wbase;
#pragma unroll
    for (int i = 0; i < kMax; ++i)
      if (i < nseg) {
        seg[i].w = p;
        p += seg[i].n * wstride;
        seg[i].s = p;
        p += (seg[i].n * sstride + 15) / 16 * 16;
        seg[i].b = p;
        p += (seg[i].n * sstride + 15) / 16 * 16;
      }
  }

  pdl_trigger();
  // Nothing here depends on earlier kernels: the weight copies start, and the RMSNorm weight
  // of this thread's unit comes into registers, before the wait.
#pragma unroll
  for (int i = 0; i < kMax; ++i)
    if (i < nseg && seg[i].n > 0 && !(skip & 1)) {
      const MatDev& m = a.m[seg[i].m];
      const size_t r0 = size_t(seg[i].r0);
      const unsigned char* w = static_cast<const unsigned char*>(m.w) + r0 * wrow;
      const unsigned char* sc = static_cast<const unsigned char*>(m.s) + r0 * srow;
      const unsigned char* bi = static_cast<const unsigned char*>(m.b) + r0 * srow;
      if constexpr (MMA) {
        stage_copy_rows(smem + seg[i].w, w, seg[i].n, wrow, wstride);
      } else {
        stage_copy(smem + seg[i].w, w, seg[i].n * wrow);
      }
      stage_copy(smem + seg[i].s, sc, seg[i].n * srow);
      stage_copy(smem + seg[i].b, bi, seg[i].n * srow);
    }
  const int u_own = threadIdx.x;  // the unit this thread stages (when U <= threads)
  const bool own = U <= int(blockDim.x);
  float4 nw0 = make_float4(0, 0, 0, 0), nw1 = nw0;
  if (a.norm && own && u_own < U) {
    nw0 = reinterpret_cast<const float4*>(a.norm)[2 * u_own];
    nw1 = reinterpret_cast<const float4*>(a.norm)[2 * u_own + 1];
  }
  pdl_wait();
  if (skip & 32) {  // the lab: the launch, the wait and the exit alone
    if (threadIdx.x == 0) a.m[seg[0].m].y[seg[0].r0] = 0.0f;
    if (!(skip & 1)) async_wait_all();
    return;
  }
  // Residual rows (ProjectAdd): this warp's first pair, loaded now, used after the products.
  float y_first[2] = {0.0f, 0.0f};
  if (a.epi == Epilogue::Add && lane == 0 && 2 * warp < seg[0].n) {
    const float* y = a.m[seg[0].m].y + seg[0].r0;
    y_first[0] = y[2 * warp];
    if (2 * warp + 1 < seg[0].n) y_first[1] = y[2 * warp + 1];
  }

  for (int t = 0; t < a.T; ++t) {
    const float4* x4 = reinterpret_cast<const float4*>(a.x + size_t(t) * K);
    // x in (one trip to L2 per thread), normalised when asked, in the split layout; unit sums.
    auto finish_unit = [&](int u, float4 v0, float4 v1) {
      if (skip & 8) {
        xa[u] = make_uint4(0, 0, 0, 0);
        xb[u] = xa[u];
      } else {
        make_unit_q4(v0, v1, xa[u], xb[u]);
      }
      float p = 0.0f;  // chain of the 8 inputs from 0
      p = p + v0.x;
      p = p + v0.y;
      p = p + v0.z;
      p = p + v0.w;
      p = p + v1.x;
      p = p + v1.y;
      p = p + v1.z;
      p = p + v1.w;
      pu[u] = p;
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
      // Every warp computes the canonical sum of squares itself (lane = index mod 32, then
      // the butterfly): no broadcast and no extra barrier.
      const float r = (skip & 4) ? 1.0f : num::rms_inv(warp_sum_squares(raw, K, lane), K, a.eps);
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
    } else {  // up to two units per thread loaded at once, then any rest
      float4 v[2][2];
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int u = threadIdx.x + k * blockDim.x;
        if (u < U) {
          v[k][0] = x4[2 * u];
          v[k][1] = x4[2 * u + 1];
        }
      }
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int u = threadIdx.x + k * blockDim.x;
        if (u < U) finish_unit(u, v[k][0], v[k][1]);
      }
      for (int u = threadIdx.x + 2 * blockDim.x; u < U; u += blockDim.x) finish_unit(u, x4[2 * u], x4[2 * u + 1]);
    }
    if (t == 0) DQ_MARK();  // (the first token only: prefill would fill the records)
    if (t == 0) async_wait_all();  // this thread's weight copies have landed
    __syncthreads();
    if (t == 0) DQ_MARK();
    for (int g = threadIdx.x; g < G && !(skip & 16); g += blockDim.x) {  // group sums: chain of unit sums
      float s = 0.0f;
      for (int u = g * gs / 8; u < (g + 1) * gs / 8; ++u) s = s + pu[u];
      xg[g] = s;
    }
    __syncthreads();
    if (t == 0) DQ_MARK();

    if (skip & 2) {
      if (threadIdx.x == 0) a.m[seg[0].m].y[seg[0].r0] = 0.0f;
    } else if constexpr (MMA) {
      mma_products(a, t, seg, nseg, swiglu, U, G, gs_shift, wstride, sstride, smem, xa, xb, xg, red, red_apart, warp,
                   lane);
    } else if (swiglu) {
      const uint32_t* wg = reinterpret_cast<const uint32_t*>(smem + seg[0].w);
      const uint32_t* wu = reinterpret_cast<const uint32_t*>(smem + seg[1].w);
      for (int j = warp; j < seg[0].n; j += WARPS) {
        float gv = 0.0f, uv = 0.0f;
        dot_pair<FAST>(wg + size_t(j) * U, smem + seg[0].s + j * srow, smem + seg[0].b + j * srow,
                       wu + size_t(j) * U, smem + seg[1].s + j * srow, smem + seg[1].b + j * srow, true, U, G,
                       gs_shift, gs, sdt, xa, xb, xg, lane, gv, uv);
        if (lane == 0) a.m[0].y[size_t(t) * a.m[0].rows + seg[0].r0 + j] = num::silu(gv) * uv;
      }
    } else {
#pragma unroll 1
      for (int i = 0; i < kMax; ++i) {
        if (i >= nseg) break;
        const Seg sg = seg[i];
        const MatDev& m = a.m[sg.m];
        float* y = m.y + size_t(t) * m.rows + sg.r0;
        const uint32_t* w = reinterpret_cast<const uint32_t*>(smem + sg.w);
        for (int j = 2 * warp; j < sg.n; j += 2 * WARPS) {
          const bool two = j + 1 < sg.n;
          const int k = two ? j + 1 : j;
          float va = 0.0f, vb = 0.0f;
          dot_pair<FAST>(w + size_t(j) * U, smem + sg.s + j * srow, smem + sg.b + j * srow, w + size_t(k) * U,
                         smem + sg.s + k * srow, smem + sg.b + k * srow, two, U, G, gs_shift, gs, sdt, xa, xb, xg,
                         lane, va, vb);
          if (lane == 0) {
            if (a.epi == Epilogue::Add) {
              const bool pre = t == 0 && i == 0 && j == 2 * warp;
              va = (pre ? y_first[0] : y[j]) + va;
              if (two) vb = (pre ? y_first[1] : y[k]) + vb;
            }
            y[j] = va;
            if (two) y[k] = vb;
          }
        }
      }
    }
    __syncthreads();  // the next token overwrites x
    if (t == 0) DQ_MARK();
  }
}

}  // namespace

bool launch_project_resident(const ProjectArgs& a, int gs, int num_sms, cudaStream_t s) {
  static const char* env = std::getenv("DELTAQ_MV_RESIDENT");
  static const bool enabled = !(env && env[0] == '0');
  static const int budget_kb = std::getenv("DELTAQ_MV_RESIDENT_KB") ? std::atoi(std::getenv("DELTAQ_MV_RESIDENT_KB")) : 200;
  if (!enabled || a.n < 1 || gs <= 0 || a.K % 32 != 0 || gs % 8 != 0 || a.K % gs != 0) return false;
  const MatDev& m0 = a.m[0];
  for (int i = 0; i < a.n; ++i) {
    const MatDev& m = a.m[i];
    if (m.fmt != WFmt::Affine || m.bits != 4 || m.gs != gs || m.sdt != m0.sdt || m.cols != a.K) return false;
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
  const int blocks = std::min(items, num_sms);
  const int per_block = (items + blocks - 1) / blocks;
  const int segs = swiglu ? 2 : a.n;
  const size_t row_bytes = size_t(a.K / 2) + 2 * ((srow + 15) / 16 * 16);
  const size_t x_bytes = size_t(a.K) * 4 + 2 * size_t(a.K / 8) * 4 + (a.norm ? size_t(a.K) * 4 : 0);
  const size_t smem = x_bytes + 16 + size_t(per_block) * row_bytes * (swiglu ? 2 : 1) + size_t(segs) * 2 * 16;
  if (smem > size_t(budget_kb) * 1024 || smem > 225 * 1024) return false;
  const bool fast = m0.sdt == SDt::BF16 && a.K % 2048 == 0 && m0.gs_shift >= 0;
  // The MMA products (DELTAQ_MV_MMA=1; default the dp4a ones, measured faster): groups of >= 32 inputs, scale rows in
  // whole 16-byte pieces, 16-byte aligned scales; padded weight rows, maybe the lanes' table.
  static const char* mma_env = std::getenv("DELTAQ_MV_MMA");
  bool mma = fast && mma_env && mma_env[0] == '1' && gs >= 32 && srow % 16 == 0;  // measured slower: off
  for (int i = 0; i < a.n && mma; ++i)
    mma = reinterpret_cast<uintptr_t>(a.m[i].s) % 16 == 0 && reinterpret_cast<uintptr_t>(a.m[i].b) % 16 == 0;
  const size_t mma_smem = x_bytes + 16 +
                          (mma_red_apart(swiglu, items, blocks) ? size_t(4 * kRedRows * kRedStride) : 0) +
                          size_t(per_block) * (size_t(a.K / 2) + 16 + 2 * srow) * (swiglu ? 2 : 1) +
                          size_t(segs) * 2 * 16;
  static const int mma_kb = std::getenv("DELTAQ_MV_MMA_KB") ? std::atoi(std::getenv("DELTAQ_MV_MMA_KB")) : 225;
  if (mma_smem > size_t(std::min(budget_kb, mma_kb)) * 1024 || mma_smem > 225 * 1024) mma = false;
  // Variants (warps per block, blocks per SM the registers are capped for); results never
  // depend on them. DELTAQ_MV_RES_VARIANT picks one (the kernel lab), default measured best.
  static const int variant = std::getenv("DELTAQ_MV_RES_VARIANT") ? std::atoi(std::getenv("DELTAQ_MV_RES_VARIANT")) : 3;
  using Kernel = void (*)(ProjectArgs, int, int, int);
  static const Kernel table[4][2] = {{resident_kernel<16, 2, false>, resident_kernel<16, 2, true>},
                                     {resident_kernel<12, 2, false>, resident_kernel<12, 2, true>},
                                     {resident_kernel<16, 1, false>, resident_kernel<16, 1, true>},
                                     {resident_kernel<8, 2, false>, resident_kernel<8, 2, true>}};
  static const int warps[4] = {16, 12, 16, 8};
  const int v = variant >= 0 && variant < 4 ? variant : 3;
  static const Kernel mma_kernel = resident_kernel<8, 2, true, true>;
  static bool attr_set = false;
  if (!attr_set) {
    for (auto& row : table)
      for (Kernel k : row) DQ_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 225 * 1024));
    DQ_CUDA_CHECK(cudaFuncSetAttribute(mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 225 * 1024));
    attr_set = true;
  }
  // DELTAQ_MV_RES_SKIP (the kernel lab only; results are then wrong): bits 1 skip the weight
  // copies, 2 the row products, 4 the RMSNorm's sum of squares, 8 x's unit integers, 16 the
  // group sums, 32 everything after the wait; to see where a launch's time goes.
  static const int skip = std::getenv("DELTAQ_MV_RES_SKIP") ? std::atoi(std::getenv("DELTAQ_MV_RES_SKIP")) : 0;
  if (mma && v == 3) launch_kernel(mma_kernel, blocks, 8 * 32, mma_smem, s, a, gs, items, skip);
  else launch_kernel(table[v][fast ? 1 : 0], blocks, warps[v] * 32, smem, s, a, gs, items, skip);
  return true;
}

}  // namespace dq::cuda
