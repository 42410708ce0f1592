// Weight products: Project (up to four matrices sharing x, with the RMSNorm of x fused in),
// ProjectAdd (residual add) and SwiGLU (gate and up rows together). One warp per row; lane l
// takes units (8 inputs) u = l, l+32, ... exactly as ops/numerics.h orders them, so the result
// is bit-identical to the CPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>

#include "backend/cuda/kernels.cuh"
#include "backend/cuda/q4.cuh"
#include "ops/numerics.h"

namespace dq::cuda {

DQ_TIMELINE_FILE

namespace {

// x of one token in shared memory, split so that lane reads are conflict-free:
// xa[u] = x[8u .. 8u+3], xb[u] = x[8u+4 .. 8u+7]; qa[u], qb[u] = unit u's exact integers for
// the 4-bit dot (q4.cuh make_unit_q4); xg[g] = group sums.
struct SharedX {
  const float4* xa;
  const float4* xb;
  const uint4* qa;
  const uint4* qb;
  const float* xg;
};

// The canonical dot of row r of m with x (numerics.h affine_dot / dense_dot), for one warp.
__device__ float row_dot(const MatDev& m, int r, const SharedX& sx, int lane) {
  const int K = m.cols, U = K / 8;
  float acc = 0.0f;
  if (m.fmt == WFmt::Affine) {
    const int G = K / m.gs;
    if (m.bits == 4) {
      const uint32_t* w = static_cast<const uint32_t*>(m.w) + size_t(r) * U;
      int u = lane;
      // Four units in flight per lane (loads first), accumulated in order of u.
      // (word_at / scale_at_group: the lane layout's positions when the matrix has it.)
      auto scale = [&](int uu) { return load_scale(m.s, r * G + scale_at_group(m, group_of(m, uu)), m.sdt); };
      for (; u + 96 < U; u += 128) {
        uint32_t w0 = __ldg(w + word_at(m, u)), w1 = __ldg(w + word_at(m, u + 32)), w2 = __ldg(w + word_at(m, u + 64)),
                 w3 = __ldg(w + word_at(m, u + 96));
        acc = fmaf(scale(u), unit_q4(w0, sx.qa[u], sx.qb[u]), acc);
        acc = fmaf(scale(u + 32), unit_q4(w1, sx.qa[u + 32], sx.qb[u + 32]), acc);
        acc = fmaf(scale(u + 64), unit_q4(w2, sx.qa[u + 64], sx.qb[u + 64]), acc);
        acc = fmaf(scale(u + 96), unit_q4(w3, sx.qa[u + 96], sx.qb[u + 96]), acc);
      }
      for (; u < U; u += 32) acc = fmaf(scale(u), unit_q4(__ldg(w + word_at(m, u)), sx.qa[u], sx.qb[u]), acc);
    } else {  // 8 bits: two words per unit
      const uint32_t* w = static_cast<const uint32_t*>(m.w) + size_t(r) * U * 2;
      for (int u = lane; u < U; u += 32)
        acc = fmaf(load_scale(m.s, r * G + group_of(m, u), m.sdt),
                   unit_q8(__ldg(w + 2 * u), __ldg(w + 2 * u + 1), sx.xa[u], sx.xb[u]), acc);
    }
    float bacc = 0.0f;
    for (int g = lane; g < G; g += 32) bacc = fmaf(load_scale(m.b, r * G + g, m.sdt), sx.xg[g], bacc);
    acc = acc + bacc;
  } else if (m.fmt == WFmt::BF16) {
    const uint4* w = static_cast<const uint4*>(m.w) + size_t(r) * U;
    for (int u = lane; u < U; u += 32) {
      uint4 v = __ldg(w + u);
      float4 xa = sx.xa[u], xb = sx.xb[u];
      float p = 0.0f;
      p = fmaf(bf16_lo(v.x), xa.x, p);
      p = fmaf(bf16_hi(v.x), xa.y, p);
      p = fmaf(bf16_lo(v.y), xa.z, p);
      p = fmaf(bf16_hi(v.y), xa.w, p);
      p = fmaf(bf16_lo(v.z), xb.x, p);
      p = fmaf(bf16_hi(v.z), xb.y, p);
      p = fmaf(bf16_lo(v.w), xb.z, p);
      p = fmaf(bf16_hi(v.w), xb.w, p);
      acc = acc + p;
    }
  } else if (m.fmt == WFmt::F16) {
    const __half* w = static_cast<const __half*>(m.w) + size_t(r) * K;
    for (int u = lane; u < U; u += 32) {
      const float xs[8] = {sx.xa[u].x, sx.xa[u].y, sx.xa[u].z, sx.xa[u].w, sx.xb[u].x, sx.xb[u].y, sx.xb[u].z, sx.xb[u].w};
      float p = 0.0f;
      for (int k = 0; k < 8; ++k) p = fmaf(__half2float(w[8 * u + k]), xs[k], p);
      acc = acc + p;
    }
  } else {
    const float4* w = static_cast<const float4*>(m.w) + size_t(r) * U * 2;
    for (int u = lane; u < U; u += 32) {
      float4 a = __ldg(w + 2 * u), b = __ldg(w + 2 * u + 1), xa = sx.xa[u], xb = sx.xb[u];
      float p = 0.0f;
      p = fmaf(a.x, xa.x, p);
      p = fmaf(a.y, xa.y, p);
      p = fmaf(a.z, xa.z, p);
      p = fmaf(a.w, xa.w, p);
      p = fmaf(b.x, xb.x, p);
      p = fmaf(b.y, xb.y, p);
      p = fmaf(b.z, xb.z, p);
      p = fmaf(b.w, xb.w, p);
      acc = acc + p;
    }
  }
  return warp_butterfly(acc);
}

// Two 4-bit rows at once (row ra of ma, row rb of mb; same width and group size), sharing the
// x reads, chunk by chunk: each lane first loads its 8 words of the chunk for both rows (16
// loads in flight), then computes. The per-lane order (units u = lane + 32 i, i increasing) is
// the canonical one. rb < 0: one row.
__device__ void rows_q4_pair(const MatDev& ma, int ra, const MatDev& mb, int rb, const SharedX& sx, int lane,
                             float* out_a, float* out_b) {
  const MatDev& m = ma;
  const int K = m.cols, U = K / 8, G = K / m.gs;
  const bool two = rb >= 0;
  const uint32_t* wa = static_cast<const uint32_t*>(ma.w) + size_t(ra) * U;
  const uint32_t* wb = static_cast<const uint32_t*>(mb.w) + size_t(two ? rb : 0) * U;
  float acc_a = 0.0f, acc_b = 0.0f;
  for (int base = 0; base < U; base += 256) {
    uint32_t va[8], vb[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int u = base + lane + 32 * i;
      va[i] = u < U ? __ldg(wa + word_at(ma, u)) : 0u;
      vb[i] = (two && u < U) ? __ldg(wb + word_at(mb, u)) : 0u;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int u = base + lane + 32 * i;
      if (u < U) {
        const uint4 xa = sx.qa[u], xb = sx.qb[u];
        const int g = group_of(m, u);
        acc_a = fmaf(load_scale(ma.s, ra * G + scale_at_group(ma, g), ma.sdt), unit_q4(va[i], xa, xb), acc_a);
        if (two) acc_b = fmaf(load_scale(mb.s, rb * G + scale_at_group(mb, g), mb.sdt), unit_q4(vb[i], xa, xb), acc_b);
      }
    }
  }
  float ba = 0.0f, bb = 0.0f;
  for (int g = lane; g < G; g += 32) {
    ba = fmaf(load_scale(ma.b, ra * G + g, ma.sdt), sx.xg[g], ba);
    if (two) bb = fmaf(load_scale(mb.b, rb * G + g, mb.sdt), sx.xg[g], bb);
  }
  *out_a = warp_butterfly(acc_a + ba);
  if (two) *out_b = warp_butterfly(acc_b + bb);
}

__device__ __forceinline__ bool is_q4(const MatDev& m) { return m.fmt == WFmt::Affine && m.bits == 4; }

__device__ __forceinline__ void rows_pair(const MatDev& ma, int ra, const MatDev& mb, int rb, const SharedX& sx,
                                          int lane, float* va, float* vb) {
  if (is_q4(ma) && (rb < 0 || (is_q4(mb) && mb.gs == ma.gs && mb.sdt == ma.sdt)))
    return rows_q4_pair(ma, ra, mb, rb, sx, lane, va, vb);
  *va = row_dot(ma, ra, sx, lane);
  if (rb >= 0) *vb = row_dot(mb, rb, sx, lane);
}

// Grid-stride over pairs of rows of all matrices (SwiGLU: the gate row and the up row); per
// token the block first normalises x into shared memory (the canonical rmsnorm: warp 0 sums
// squares in lane order) and makes the group sums.
// Work items are row pairs when the launch has rows enough to keep every SM busy with pairs
// (`pair`), else single rows (more warps in flight for small matrices).
// Variants (the kernel lab): WARPS per block and MINB blocks per SM for the register budget
// (launch bounds). Every variant computes the same bits.
template <int WARPS, int MINB>
__global__ void __launch_bounds__(WARPS * 32, MINB) project_kernel(ProjectArgs a, int gs, int pair) {
  constexpr int kWarps = WARPS;
  extern __shared__ float4 smem4[];
  const int K = a.K, U = K / 8;
  float4* xa = smem4;
  float4* xb = smem4 + U;
  uint4* qa = reinterpret_cast<uint4*>(smem4 + 2 * U);
  uint4* qb = qa + U;
  float* xg = reinterpret_cast<float*>(smem4 + 4 * U);
  __shared__ float s_r;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int per = pair ? 2 : 1;  // rows per work item
  int pairs = 0;
  if (a.epi == Epilogue::SwiGLU) pairs = a.m[0].rows;
  else
    for (int i = 0; i < a.n; ++i) pairs += (a.m[i].rows + per - 1) / per;

  pdl_trigger();
  // Before waiting for the previous kernel, pull this warp's first rows into L2.
  if (a.epi != Epilogue::SwiGLU && lane < 16) {
    int p = blockIdx.x * kWarps + warp, i = 0;
    if (p < pairs) {
      while (p >= (a.m[i].rows + per - 1) / per) p -= (a.m[i++].rows + per - 1) / per;
      const MatDev& m = a.m[i];
      if (is_q4(m)) {
        const char* base = static_cast<const char*>(m.w) + size_t(per * p) * (m.cols / 2);
        const size_t bytes = size_t(min(per, m.rows - per * p)) * (m.cols / 2);
        for (size_t off = size_t(lane) * 128; off < bytes; off += 16 * 128)
          asm volatile("prefetch.global.L2 [%0];" ::"l"(base + off));
      }
    }
  }
  pdl_wait();
  float* raw = xg + (K / 8 + 4);  // [K] x as given
  for (int t = 0; t < a.T; ++t) {
    // x -> shared memory with wide loads (all independent), then the canonical sum of squares
    // from shared memory, then the normalised values in the split layout.
    const float4* x4 = reinterpret_cast<const float4*>(a.x + size_t(t) * K);
    for (int e = threadIdx.x; e < K / 4; e += blockDim.x) reinterpret_cast<float4*>(raw)[e] = x4[e];
    __syncthreads();
    float r = 1.0f;
    if (a.norm) {
      if (warp == 0) {
        const float ss = warp_sum_squares(raw, K, lane);
        if (lane == 0) s_r = num::rms_inv(ss, K, a.eps);
      }
      __syncthreads();
      r = s_r;
    }
    float* xs = reinterpret_cast<float*>(smem4);
#pragma unroll 4
    for (int j = threadIdx.x; j < K; j += blockDim.x) {
      float v = a.norm ? (raw[j] * r) * a.norm[j] : raw[j];
      int u = j / 8, k = j % 8;
      xs[(k < 4 ? 4 * u : 4 * (U + u)) + (k & 3)] = v;
    }
    __syncthreads();
    if (gs) {
      for (int u = threadIdx.x; u < U; u += blockDim.x) make_unit_q4(xa[u], xb[u], qa[u], qb[u]);
      for (int g = threadIdx.x; g < K / gs; g += blockDim.x) {
        float s = 0.0f;
        for (int u = g * gs / 8; u < (g + 1) * gs / 8; ++u) {
          float4 p0 = xa[u], p1 = xb[u];
          const float p = unit_sum(p0, p1);
          s = s + p;
        }
        xg[g] = s;
      }
      __syncthreads();
    }
    const SharedX sx{xa, xb, qa, qb, xg};
    for (int pr = blockIdx.x * kWarps + warp; pr < pairs; pr += gridDim.x * kWarps) {
      if (a.epi == Epilogue::SwiGLU) {
        float g = 0.0f, u = 0.0f;
        rows_pair(a.m[0], pr, a.m[1], pr, sx, lane, &g, &u);
        if (lane == 0) a.m[0].y[size_t(t) * a.m[0].rows + pr] = num::silu(g) * u;
        continue;
      }
      int i = 0, p = pr;
      while (p >= (a.m[i].rows + per - 1) / per) p -= (a.m[i++].rows + per - 1) / per;
      const MatDev& m = a.m[i];
      const int ra = per * p, rb = pair && 2 * p + 1 < m.rows ? 2 * p + 1 : -1;
      {  // the warp's next item (same matrix in the common case) into L2 while this one computes
        const int nr = ra + per * gridDim.x * kWarps;
        if (is_q4(m) && nr < m.rows && lane < 16) {
          const char* base = static_cast<const char*>(m.w) + size_t(nr) * (m.cols / 2);
          const size_t bytes = size_t(min(per, m.rows - nr)) * (m.cols / 2);
          for (size_t off = size_t(lane) * 128; off < bytes; off += 16 * 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(base + off));
        }
      }
      float va = 0.0f, vb = 0.0f;
      rows_pair(m, ra, m, rb, sx, lane, &va, &vb);
      if (lane == 0) {
        float* y = m.y + size_t(t) * m.rows;
        y[ra] = a.epi == Epilogue::Add ? y[ra] + va : va;
        if (rb >= 0) y[rb] = a.epi == Epilogue::Add ? y[rb] + vb : vb;
      }
    }
    __syncthreads();  // the next token overwrites shared memory
  }
}

}  // namespace

void launch_project(const ProjectArgs& a, int num_sms, cudaStream_t s) {
  DQ_CHECK(reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && a.K % 8 == 0, "project: x must be 16-byte aligned, K % 8 == 0");
  int gs = 0;
  for (int i = 0; i < a.n; ++i)
    if (a.m[i].fmt == WFmt::Affine) {
      if (gs && a.m[i].gs != gs) {  // group sums are per group size: split the launch
        ProjectArgs first = a, rest = a;
        first.n = i;
        rest.n = a.n - i;
        for (int j = 0; j < rest.n; ++j) rest.m[j] = a.m[i + j];
        launch_project(first, num_sms, s);
        launch_project(rest, num_sms, s);
        return;
      }
      gs = a.m[i].gs;
    }
  // In order: prefill chunks (T >= 2: the tensor-core kernel from 128 tokens, then the prefill
  // kernel from 8 tokens); tall heads with K <= 2048 (x in registers); products whose weights fit in
  // shared memory (the resident kernel's fast path); the rest of the one-token 4-bit products,
  // streamed through shared memory (the pipelined product: bigger models, widths not a multiple
  // of 2048; on the 0.8B's layers it also beat the resident kernel's general path, 941 against
  // 912 tok/s, and lost to the register head kernel, docs/bench.md session 27); then the general
  // kernels.
  // DELTAQ_MV_PIPE=2 puts the pipelined product first (tests).
  if (gs && a.T >= 2 && launch_project_mma(a, num_sms, s)) return;      // a prefill chunk
  if (gs && a.T >= 2 && launch_project_prefill(a, num_sms, s)) return;  // a prefill chunk
  if (gs && project_pipe_mode() == 2 && launch_project_pipe(a, num_sms, s)) return;
  if (gs && launch_project_head(a, num_sms, s)) return;          // tall 4-bit head, x in registers
  if (launch_project_resident(a, gs, num_sms, s, true)) return;  // weights fit in shared memory
  if (gs && launch_project_pipe(a, num_sms, s)) return;          // the rest, streamed
  if (launch_project_resident(a, gs, num_sms, s)) return;
  // Launch knobs (the kernel lab's sweep; results never depend on them): blocks per SM for the
  // grid cap, and the warps per SM below which rows are not paired.
  static const int blocks_per_sm = env_int("DELTAQ_MV_BLOCKS_PER_SM", 0);
  static const int pair_warps = env_int("DELTAQ_MV_PAIR_WARPS", 24);
  int rows = 0;
  for (int i = 0; i < a.n; ++i) rows += a.m[i].rows;
  // Pairs share x reads but halve the warps: only when there are rows for enough warps per SM.
  const int pair = a.epi != Epilogue::SwiGLU && rows >= 2 * num_sms * pair_warps;
  int total = 0;  // warps' work items
  for (int i = 0; i < a.n; ++i) total += pair ? (a.m[i].rows + 1) / 2 : a.m[i].rows;
  if (a.epi == Epilogue::SwiGLU) total = a.m[0].rows;
  // split x [K] | unit integers [K/8][2 words of 16 bytes] | group sums [K/8 + 4, enough for any
  // group size] | raw x [K]
  const size_t smem = size_t(a.K) * 4 + size_t(a.K / 8) * 32 + size_t(a.K / 8 + 4) * 4 + size_t(a.K) * 4;
  // DELTAQ_MV_VARIANT: 0 = 8 warps, no register cap; 1 = 8 warps, registers for 4 blocks/SM;
  // 2 = 4 warps per block; 3 = 8 warps, registers for 3 blocks/SM. Default (measured, docs/bench.md):
  // 0 for ordinary products, 1 for the huge output head (more warps in flight on a long stream).
  static const int forced = env_int("DELTAQ_MV_VARIANT", -1);
  static bool attr_set = false;
  if (!attr_set) {
    DQ_CUDA_CHECK(cudaFuncSetAttribute(project_kernel<8, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    DQ_CUDA_CHECK(cudaFuncSetAttribute(project_kernel<8, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    DQ_CUDA_CHECK(cudaFuncSetAttribute(project_kernel<4, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    DQ_CUDA_CHECK(cudaFuncSetAttribute(project_kernel<8, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    attr_set = true;
  }
  int rows_all = 0;
  for (int i = 0; i < a.n; ++i) rows_all += a.m[i].rows;
  const bool huge = rows_all > 2 * 64 * num_sms * 8;
  const int variant = forced >= 0 ? forced : huge ? 1 : 0;
  const int kWarps = variant == 2 ? 4 : 8;
  // One wave of blocks (up to 3 fit per SM) for ordinary sizes; the huge head takes 8 per SM.
  const int bps = blocks_per_sm > 0 ? blocks_per_sm : (total > 64 * num_sms * kWarps ? 8 : 2);
  const int blocks = std::max(1, std::min((total + kWarps - 1) / kWarps, num_sms * bps));
  if (variant == 1) launch_kernel(project_kernel<8, 4>, blocks, 8 * 32, smem, s, a, gs, pair);
  else if (variant == 2) launch_kernel(project_kernel<4, 1>, blocks, 4 * 32, smem, s, a, gs, pair);
  else if (variant == 3) launch_kernel(project_kernel<8, 3>, blocks, 8 * 32, smem, s, a, gs, pair);
  else launch_kernel(project_kernel<8, 1>, blocks, 8 * 32, smem, s, a, gs, pair);
}

}  // namespace dq::cuda
