// The 4-bit products of a prefill chunk on the tensor cores (T >= 2 tokens; matrices in the lane
// layout with bf16 scales and power-of-two groups of 8 to 256), bit-identical to the other
// kernels. The unit's integer Σ_k q_k xi_k (numerics.h: |xi_k| <= 2^22) is exact in any order, so
// it may come from mma.m16n8k8 (f16 x f16 -> f32): xi = h * 2^11 + l with |h| <= 2048 and
// |l| <= 1024 are exact halves, q (0..15) too, and each of the two sums Σ q h, Σ q l is an
// integer below 2^18, exact in the f32 accumulator; fmaf(Σqh, 2^11, Σql) is then the one
// rounding of the exact integer to float that __int2float_rn gives. The rest is the canonical
// chain: p_u = that * step, lane (u mod 32) = fmaf(s_g, p_u, lane) over the lane's units in
// order, its bias terms, the butterfly.
//
// One mma takes 16 rows (A: a thread's registers hold rows g and g + 8) against one unit of 8
// tokens (B: x's halves of token g); C gives a thread rows g and g + 8 for tokens 2t and 2t + 1
// (g = lane / 4, t = lane % 4). A thread's k pair (2t, 2t + 1) is the unit's inputs t and t + 4:
// in a weight word those are nibbles t and t + 4, one shift and one mask away.
//
// The 32 lanes' chains run one after another ("passes"), each over its units p, p + 32, ...: a
// thread's accumulators serve every pass. The passes run in bit-reversed order, so the butterfly
// (whose first step adds lanes p and p ^ 16, then p ^ 8, ...) becomes a binary counter of five
// pending sums per (row, token). x's fragments for a pass (made once per product by the prep
// kernel, in the scratch the queue keeps) reach shared memory by cp.async a pass ahead.
#include <cuda_fp16.h>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/q4.cuh"

namespace dq::cuda {
namespace {

constexpr int kWarps = 8;       // m-tiles (16 matrix rows) a block, one a warp
constexpr int kNT = 2;          // n-tiles (8 tokens) a warp
constexpr int kTok = 8 * kNT;   // tokens a block
constexpr int kMaxUP = 32;      // units a lane (K / 256) at most: K <= 8192

// The scratch (bytes from project_mma_scratch_bytes), for T_pad = T rounded up to kTok tokens
// (8-token tiles tile8 = T_pad / 8) and U = K / 8 units:
//   xf  uint2 [tile8][32 passes][U / 32][32 lanes]  B fragments: {h, l} halves of inputs t, t + 4
//   xs  float [tile8][32][U / 32][8 tokens]         the units' steps
//   xg  float [T][G]                                x's group sums
struct Scratch {
  uint2* xf;
  float* xs;
  float* xg;
};
Scratch scratch_of(void* p, int T, int K) {
  const size_t tp = size_t((T + kTok - 1) / kTok) * kTok, U = size_t(K) / 8;
  Scratch s;
  s.xf = static_cast<uint2*>(p);
  s.xs = reinterpret_cast<float*>(s.xf + tp * U * 4);
  s.xg = s.xs + tp * U;
  return s;
}

__device__ __forceinline__ uint32_t half2_bits(int a, int b) {  // exact: |a|, |b| <= 2048
  return uint32_t(__half_as_ushort(__int2half_rn(a))) | (uint32_t(__half_as_ushort(__int2half_rn(b))) << 16);
}

// Per token (one block each, padded tokens too: zero x): x normalised as the other kernels do,
// made into units (num::quantize_unit), split into halves in the fragments' order; the steps; the
// group sums (per unit the chain of its 8 inputs, per group the chain of its units).
__global__ void __launch_bounds__(128) xprep_kernel(ProjectArgs a, Scratch sc, int gshift) {
  pdl_trigger();
  __shared__ float r_inv;
  const int t = blockIdx.x, K = a.K, U = K / 8, UP = U / 32, G = K >> gshift, upg = 1 << (gshift - 3);
  const int lane = threadIdx.x & 31;
  const bool real = t < a.T;
  pdl_wait();
  if (threadIdx.x < 32) {
    float r = 1.0f;
    if (a.norm && real) r = num::rms_inv(warp_sum_squares(a.x + size_t(t) * K, K, lane), K, a.eps);
    if (lane == 0) r_inv = r;
  }
  __syncthreads();
  const int tile = t >> 3, g8 = t & 7;
  const float r = r_inv;
  for (int g = threadIdx.x; g < G; g += blockDim.x) {
    float s = 0.0f;
    for (int k = 0; k < upg; ++k) {
      const int u = g * upg + k;
      float4 v0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), v1 = v0;
      if (real) {
        const float4* x4 = reinterpret_cast<const float4*>(a.x + size_t(t) * K);
        v0 = x4[2 * u];
        v1 = x4[2 * u + 1];
        if (a.norm) {
          const float4* w4 = reinterpret_cast<const float4*>(a.norm);
          const float4 n0 = w4[2 * u], n1 = w4[2 * u + 1];
          v0 = make_float4((v0.x * r) * n0.x, (v0.y * r) * n0.y, (v0.z * r) * n0.z, (v0.w * r) * n0.w);
          v1 = make_float4((v1.x * r) * n1.x, (v1.y * r) * n1.y, (v1.z * r) * n1.z, (v1.w * r) * n1.w);
        }
      }
      const float xv[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
      const num::UnitInts q = num::quantize_unit(xv);
      int h[8], l[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) num::split_halves(q.xi[j], &h[j], &l[j]);
      const size_t at = (size_t(tile) * 32 + (u & 31)) * UP + (u >> 5);
#pragma unroll
      for (int tt = 0; tt < 4; ++tt)
        sc.xf[at * 32 + g8 * 4 + tt] = make_uint2(half2_bits(h[tt], h[tt + 4]), half2_bits(l[tt], l[tt + 4]));
      sc.xs[at * 8 + g8] = q.step;
      s = s + unit_sum(v0, v1);
    }
    if (real) sc.xg[size_t(t) * G + g] = s;
  }
}

// A weight word's nibbles t and t + 4 (inputs t and t + 4 of the unit) as two exact halves:
// 1024 + q as bits under the exponent of 1024, less 1024.
__device__ __forceinline__ uint32_t nibble_pair(uint32_t w, int t) {
  const uint32_t v = ((w >> (4 * t)) & 0x000F000Fu) | 0x64006400u;
  const __half2 h = __hsub2(*reinterpret_cast<const __half2*>(&v), __half2(__half(1024.0f), __half(1024.0f)));
  return *reinterpret_cast<const uint32_t*>(&h);
}

// d = A (16 x 8 halves) B (8 x 8) from zero, in f32: a0 = A[g][2t..2t+1], a1 = A[g+8][2t..];
// b = B[2t..2t+1][g]; d0, d1 = D[g][2t], D[g][2t+1]; d2, d3 = D[g+8][2t], D[g+8][2t+1].
__device__ __forceinline__ void mma_16x8x8(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
               : "r"(a0), "r"(a1), "r"(b), "f"(0.0f));
}

// The rows a thread carries (slots 0 and 1: m-tile rows g and g + 8).
struct Slot {
  const uint32_t* w;
  const unsigned short* s;
  const unsigned short* b;
  float* y;  // the row's output at token 0 (stride `stride`), or null: not written
  int stride;
};

__device__ __forceinline__ Slot slot_at(const ProjectArgs& a, int flat, int total, int U, int G) {
  const bool write = flat < total;
  if (!write) flat = total - 1;
  int i = 0;
  while (i + 1 < a.n && flat >= a.m[i].rows) flat -= a.m[i++].rows;
  const MatDev& m = a.m[i];
  return Slot{static_cast<const uint32_t*>(m.w) + size_t(flat) * U, static_cast<const unsigned short*>(m.s) + size_t(flat) * G,
              static_cast<const unsigned short*>(m.b) + size_t(flat) * G, write && m.y ? m.y + flat : nullptr, m.rows};
}

// Grid: token blocks (kTok tokens, fastest) x row blocks (kWarps / SPLIT m-tiles). SwiGLU: an
// m-tile is 8 output rows, its gate rows in slot 0 and up rows in slot 1 (a thread has both of
// its output). Otherwise 16 rows of the launch's matrices in order. SPLIT = 2: two warps take an
// m-tile, one the passes of arrivals 0-15 (the even lanes), the other those of 16-31, each
// summing its half as the butterfly's first four levels do; the last level adds the first half's
// sum and the second's (twice the blocks; the default).
template <int N, int SPLIT>  // N: units a lane in a chunk: 8 (K a multiple of 2048), 4 (K = 1024)
__global__ void __launch_bounds__(kWarps * 32) mma_kernel(ProjectArgs a, Scratch sc, int gshift, int mtiles, int total) {
  static_assert(SPLIT == 1 || SPLIT == 2, "passes split in 1 or 2 parts");
  constexpr int kTiles = kWarps / SPLIT, kPasses = 32 / SPLIT;  // m-tiles a block, passes a warp
  extern __shared__ uint4 smem4[];
  const int K = a.K, U = K / 8, UP = U / 32, G = K >> gshift;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int tblocks = gridDim.x / ((mtiles + kTiles - 1) / kTiles);
  const int part = warp / kTiles;  // the warp's passes: arrivals part * kPasses + i
  const int tb = blockIdx.x % tblocks, mt = (blockIdx.x / tblocks) * kTiles + warp % kTiles;
  // Shared memory: two stages of [SPLIT][kNT][UP][32] uint2 fragments, then two of
  // [SPLIT][kNT][UP][8] steps.
  uint2* frag = reinterpret_cast<uint2*>(smem4);
  float* steps = reinterpret_cast<float*>(frag + 2 * SPLIT * kNT * UP * 32);
  Slot sl[2];
  if (a.epi == Epilogue::SwiGLU) {
    const int rows = a.m[0].rows;
    int r = mt * 8 + g;
    const bool write = r < rows;
    if (!write) r = rows - 1;
    for (int k = 0; k < 2; ++k) {
      const MatDev& m = a.m[k];
      sl[k] = Slot{static_cast<const uint32_t*>(m.w) + size_t(r) * U, static_cast<const unsigned short*>(m.s) + size_t(r) * G,
                   static_cast<const unsigned short*>(m.b) + size_t(r) * G, write && k == 0 ? m.y + r : nullptr, rows};
    }
  } else {
    sl[0] = slot_at(a, mt * 16 + g, total, U, G);
    sl[1] = slot_at(a, mt * 16 + g + 8, total, U, G);
  }
  pdl_trigger();
  pdl_wait();

  // Step i's passes (arrival q * kPasses + i for each part q): fragments and steps of the
  // block's tokens.
  auto stage = [&](int i, int buf) {
    for (int q = 0; q < SPLIT; ++q)
      for (int n = 0; n < kNT; ++n) {
        const size_t at = (size_t(tb * kNT + n) * 32 + num::rev5(q * kPasses + i)) * UP;
        const size_t to = (size_t(buf) * SPLIT + q) * kNT + n;
        const uint4* src = reinterpret_cast<const uint4*>(sc.xf + at * 32);
        uint4* dst = reinterpret_cast<uint4*>(frag + to * UP * 32);
        for (int c = threadIdx.x; c < UP * 16; c += blockDim.x) async_copy16(dst + c, src + c);
        const uint4* ssrc = reinterpret_cast<const uint4*>(sc.xs + at * 8);
        uint4* sdst = reinterpret_cast<uint4*>(steps + to * UP * 8);
        for (int c = threadIdx.x; c < UP * 2; c += blockDim.x) async_copy16(sdst + c, ssrc + c);
      }
    async_commit();
  };

  num::LaneTree tree[2][2 * kNT];  // the butterfly of the lanes' values so far: slot, token
  float fin[2][2 * kNT];
  const int tok0 = tb * kTok;
  stage(0, 0);
  for (int s = 0; s < kPasses; ++s) {
    const int p = num::rev5(part * kPasses + s), buf = s & 1;
    if (s + 1 < kPasses) {
      stage(s + 1, buf ^ 1);
      async_wait_group<1>();
    } else {
      async_wait_group<0>();
    }
    __syncthreads();
    float acc[2][2 * kNT];
#pragma unroll
    for (int k = 0; k < 2; ++k)
#pragma unroll
      for (int j = 0; j < 2 * kNT; ++j) acc[k][j] = 0.0f;
    const uint2* fb = frag + (size_t(buf) * SPLIT + part) * kNT * UP * 32;
    const float* sb = steps + (size_t(buf) * SPLIT + part) * kNT * UP * 8;
    // A chunk of 2048 inputs (N = 8 units of lane p; K = 1024: one half chunk, N = 4): the
    // rows' words and scales of lane p in 16-byte loads (q4.cuh's lane layout), then a k-step a unit.
    for (int base = 0; base < U; base += 32 * N) {
      uint32_t w0[8], w1[8], sw0[4], sw1[4];
      lane_chunk_words<N>(sl[0].w + base, p, w0);
      lane_chunk_words<N>(sl[1].w + base, p, w1);
      lane_chunk_scales<N>(sl[0].s + ((base * 8) >> gshift), gshift, p, sw0);
      lane_chunk_scales<N>(sl[1].s + ((base * 8) >> gshift), gshift, p, sw1);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const int ui = base / 32 + i;  // the pass's k-step: unit p + 32 ui
        const uint32_t a0 = nibble_pair(w0[i], t), a1 = nibble_pair(w1[i], t);
        const float s0 = lane_chunk_scale(sw0, i), s1 = lane_chunk_scale(sw1, i);
#pragma unroll
        for (int n = 0; n < kNT; ++n) {
          const uint2 b = fb[(n * UP + ui) * 32 + lane];
          const float2 st = reinterpret_cast<const float2*>(sb + (n * UP + ui) * 8)[t];
          float ch[4], cl[4];
          mma_16x8x8(ch, a0, a1, b.x);
          mma_16x8x8(cl, a0, a1, b.y);
          acc[0][2 * n] = fmaf(s0, fmaf(ch[0], 2048.0f, cl[0]) * st.x, acc[0][2 * n]);
          acc[0][2 * n + 1] = fmaf(s0, fmaf(ch[1], 2048.0f, cl[1]) * st.y, acc[0][2 * n + 1]);
          acc[1][2 * n] = fmaf(s1, fmaf(ch[2], 2048.0f, cl[2]) * st.x, acc[1][2 * n]);
          acc[1][2 * n + 1] = fmaf(s1, fmaf(ch[3], 2048.0f, cl[3]) * st.y, acc[1][2 * n + 1]);
        }
      }
    }
    // Lane p's value: its chain plus its bias terms (groups p, p + 32, ... in order), then into
    // the butterfly (num::LaneTree).
#pragma unroll
    for (int k = 0; k < 2; ++k)
#pragma unroll
      for (int j = 0; j < 2 * kNT; ++j) {
        const int tok = min(tok0 + 8 * (j >> 1) + 2 * t + (j & 1), a.T - 1);
        float bl = 0.0f;
        for (int gg = p; gg < G; gg += 32)
          bl = fmaf(__uint_as_float(uint32_t(__ldg(sl[k].b + gg)) << 16), sc.xg[size_t(tok) * G + gg], bl);
        tree[k][j].push(s, acc[k][j] + bl, &fin[k][j]);
      }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  if constexpr (SPLIT == 2) {  // the last level: the first half's sum + the second's
    float* other = reinterpret_cast<float*>(smem4) + ((warp % kTiles) * 32 + lane) * (4 * kNT);
#pragma unroll
    for (int k = 0; k < 2; ++k)
#pragma unroll
      for (int j = 0; j < 2 * kNT; ++j)
        if (part == 1) other[k * 2 * kNT + j] = tree[k][j].pend[4];
    __syncthreads();
    if (part == 1) return;
#pragma unroll
    for (int k = 0; k < 2; ++k)
#pragma unroll
      for (int j = 0; j < 2 * kNT; ++j) fin[k][j] = tree[k][j].pend[4] + other[k * 2 * kNT + j];
  }

#pragma unroll
  for (int j = 0; j < 2 * kNT; ++j) {
    const int tok = tok0 + 8 * (j >> 1) + 2 * t + (j & 1);
    if (tok >= a.T) continue;
    if (a.epi == Epilogue::SwiGLU) {
      if (sl[0].y) sl[0].y[size_t(tok) * sl[0].stride] = num::silu(fin[0][j]) * fin[1][j];
    } else {
#pragma unroll
      for (int k = 0; k < 2; ++k)
        if (sl[k].y) {
          float* y = sl[k].y + size_t(tok) * sl[k].stride;
          *y = a.epi == Epilogue::Add ? *y + fin[k][j] : fin[k][j];
        }
    }
  }
}

}  // namespace

// The fewest tokens a chunk for which it runs. Its blocks take 16 tokens, so a short chunk
// leaves SMs idle: on an H100, with two warps an m-tile, it gained from 128 tokens (4,532
// against 4,291 tok/s for the prefill products' kernel; 160: 4,762 against 4,086) and lost at 64
// (3,441 against 4,001; docs/bench.md session 39). DELTAQ_MV_MMA=1: from 2 tokens (tests), =0:
// never.
static int mma_min_tokens() {
  static const int v = [] {
    const int e = env_int("DELTAQ_MV_MMA", -1);
    return e == 0 ? 1 << 30 : e == 1 ? 2 : 128;
  }();
  return v;
}

size_t project_mma_scratch_bytes(int T, int K) {
  if (T < mma_min_tokens() || K > 256 * kMaxUP) return 0;
  const size_t tp = size_t((T + kTok - 1) / kTok) * kTok, U = size_t(K) / 8;
  return tp * U * 32 + tp * U * 4 + size_t(T) * U * 4;
}

bool launch_project_mma(const ProjectArgs& a, int num_sms, cudaStream_t s) {
  (void)num_sms;
  if (a.T < mma_min_tokens() || a.n < 1 || !a.scratch || a.scratch_bytes < project_mma_scratch_bytes(a.T, a.K))
    return false;
  const MatDev& m0 = a.m[0];
  const int K = a.K;
  if (!m0.lanes || !lane_width(K) || K > 256 * kMaxUP) return false;
  for (int i = 0; i < a.n; ++i) {
    const MatDev& m = a.m[i];
    if (m.fmt != WFmt::Affine || m.bits != 4 || m.sdt != SDt::BF16 || m.gs != m0.gs || m.gs_shift < 3 ||
        m.gs_shift > 8 || !m.lanes || m.cols != K || reinterpret_cast<uintptr_t>(m.w) % 16 ||
        reinterpret_cast<uintptr_t>(m.s) % 16 || reinterpret_cast<uintptr_t>(m.b) % 2)
      return false;
  }
  if (a.epi == Epilogue::SwiGLU && (a.n != 2 || a.m[1].rows != m0.rows)) return false;
  if (reinterpret_cast<uintptr_t>(a.x) % 16 || (a.norm && reinterpret_cast<uintptr_t>(a.norm) % 16)) return false;
  const int U = K / 8, UP = U / 32, gshift = m0.gs_shift;
  int total = 0;
  for (int i = 0; i < a.n; ++i) total += a.m[i].rows;
  const int mtiles = a.epi == Epilogue::SwiGLU ? (m0.rows + 7) / 8 : (total + 15) / 16;
  const int tblocks = (a.T + kTok - 1) / kTok;
  const Scratch sc = scratch_of(a.scratch, a.T, K);
  launch_kernel(xprep_kernel, tblocks * kTok, 128, 0, s, a, sc, gshift);
  // Two warps an m-tile: twice the blocks, +2.5% at 256 tokens a chunk and +18% at 160 against
  // one (docs/bench.md session 39). DELTAQ_MV_MMA_SPLIT=1: one warp an m-tile. (Four warps an
  // m-tile, the butterfly's last two levels across them, lost at every chunk of 64-128 tokens on
  // an H100 and were taken back: docs/bench.md session 40.)
  static const int split = env_int("DELTAQ_MV_MMA_SPLIT", 2) == 1 ? 1 : 2;
  const size_t smem = size_t(2) * split * kNT * UP * (32 * sizeof(uint2) + 8 * sizeof(float));
  const int rblocks = (mtiles + kWarps / split - 1) / (kWarps / split);
  static const bool attrs = [] {  // K = 8192 with two parts: 74 KB
    for (auto k : {mma_kernel<4, 1>, mma_kernel<8, 1>, mma_kernel<4, 2>, mma_kernel<8, 2>})
      DQ_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024));
    return true;
  }();
  (void)attrs;
  auto kernel = K == 1024 ? (split == 2 ? mma_kernel<4, 2> : mma_kernel<4, 1>)
                          : (split == 2 ? mma_kernel<8, 2> : mma_kernel<8, 1>);
  launch_kernel(kernel, tblocks * rblocks, kWarps * 32, smem, s, a, sc, gshift, mtiles, total);
  return true;
}

}  // namespace dq::cuda
