// The output head (and any very tall 4-bit product with K <= 2048, K = 2560 or 4096): hundreds of
// thousands of rows against one x. Each lane keeps its x units in registers for the whole launch
// (lane l owns units l, l+32, ... of every row: the unit's integers, two words of q4.cuh
// make_unit_q4; at K = 4096 each of two warp groups holds half). Two kernels: for one token with
// K = 2048, 1024, 2560 or 4096, head_pipe_kernel
// streams each SM's rows through a ring of shared-memory stages (the default); otherwise
// head_kernel keeps the warp's next row in registers while it computes the current one. Both
// start loading weights before the programmatic-launch wait. Same canonical order as
// ops/numerics.h affine_dot (and the other mat-vec kernels): acc = chain over the lane's units of
// fmaf(scale, unit dot, acc), bias = chain over the lane's groups of fmaf(bias, group sum, bias),
// y = butterfly(acc + bias). Bit-identical to the CPU.
#include <cstdlib>

#include "backend/cuda/kernels.cuh"
#include "backend/cuda/q4.cuh"
#include "ops/numerics.h"

namespace dq::cuda {

DQ_TIMELINE_FILE

namespace {

constexpr int kHeadWarps = 8;

// One row's data for one lane: NU weight words, NU scales (bf16 bits), GL biases.
template <int NU, int GL>
struct RowLoad {
  uint32_t w[NU];
  unsigned short s[NU], b[GL];
};

template <int NU, int GL>
__device__ __forceinline__ void load_row(RowLoad<NU, GL>& d, const MatDev& m, int r, int lane, int gs_shift, int G) {
  const int U = NU * 32;
  const uint32_t* w = static_cast<const uint32_t*>(m.w) + size_t(r) * U;
  const unsigned short* s = static_cast<const unsigned short*>(m.s) + size_t(r) * G;
  const unsigned short* b = static_cast<const unsigned short*>(m.b) + size_t(r) * G;
#pragma unroll
  for (int i = 0; i < NU; ++i) d.w[i] = __ldcs(w + lane + 32 * i);
#pragma unroll
  for (int i = 0; i < NU; ++i) d.s[i] = __ldg(s + (((lane + 32 * i) * 8) >> gs_shift));
#pragma unroll
  for (int i = 0; i < GL; ++i) d.b[i] = lane + 32 * i < G ? __ldg(b + lane + 32 * i) : (unsigned short)0;
}

__device__ __forceinline__ float bf16_bits(unsigned short v) { return __uint_as_float(uint32_t(v) << 16); }

// NU = K / 256 units per lane, GL = ceil(G / 32) groups per lane.
template <int NU, int GL>
__global__ void __launch_bounds__(kHeadWarps * 32, 2) head_kernel(ProjectArgs a) {
  __shared__ __align__(16) float raw[NU * 256];
  const MatDev& m = a.m[0];
  constexpr int K = NU * 256;
  const int G = K / m.gs, gs_shift = m.gs_shift;
  const int lane = threadIdx.x & 31;
  const int warps = gridDim.x * kHeadWarps;
  const int gw = blockIdx.x * kHeadWarps + (threadIdx.x >> 5);
  const int rows = m.rows;

  pdl_trigger();
  RowLoad<NU, GL> cur;  // the weights do not depend on earlier kernels: first row before the wait
  if (gw < rows) load_row(cur, m, gw, lane, gs_shift, G);
  pdl_wait();

  for (int t = 0; t < a.T; ++t) {
    const float4* x4 = reinterpret_cast<const float4*>(a.x + size_t(t) * K);
    for (int e = threadIdx.x; e < K / 4; e += blockDim.x) reinterpret_cast<float4*>(raw)[e] = x4[e];
    __syncthreads();
    // Every warp normalises for itself (the canonical sum of squares: lane = index mod 32, then
    // the butterfly), so no broadcast is needed.
    const float r = a.norm ? num::rms_inv(warp_sum_squares(raw, K, lane), K, a.eps) : 1.0f;
    auto xn = [&](int j) { return a.norm ? (raw[j] * r) * a.norm[j] : raw[j]; };
    uint4 xqa[NU], xqb[NU];  // the lane's units as exact integers (q4.cuh make_unit_q4)
#pragma unroll
    for (int i = 0; i < NU; ++i) {
      const int j = 8 * (lane + 32 * i);
      make_unit_q4(make_float4(xn(j), xn(j + 1), xn(j + 2), xn(j + 3)),
                   make_float4(xn(j + 4), xn(j + 5), xn(j + 6), xn(j + 7)), xqa[i], xqb[i]);
    }
    // Group sums of this lane's groups: per unit the chain of its 8 values, per group the chain
    // of its units (numerics.h group_sums).
    float xg[GL];
#pragma unroll
    for (int i = 0; i < GL; ++i) {
      const int g = lane + 32 * i;
      float s = 0.0f;
      if (g < G)
        for (int u = (g << gs_shift) / 8; u < ((g + 1) << gs_shift) / 8; ++u) {
          float p = 0.0f;
#pragma unroll
          for (int k = 0; k < 8; ++k) p = p + xn(8 * u + k);
          s = s + p;
        }
      xg[i] = s;
    }
    __syncthreads();  // raw is rewritten by the next token

    float* y = m.y + size_t(t) * rows;
    for (int row = gw; row < rows; row += warps) {
      RowLoad<NU, GL> nxt;
      const int next = row + warps < rows ? row + warps : (t + 1 < a.T ? gw : -1);
      if (next >= 0) load_row(nxt, m, next, lane, gs_shift, G);
      float acc = 0.0f;
#pragma unroll
      for (int i = 0; i < NU; ++i) acc = fmaf(bf16_bits(cur.s[i]), unit_q4(cur.w[i], xqa[i], xqb[i]), acc);
      float bias = 0.0f;
#pragma unroll
      for (int i = 0; i < GL; ++i)
        if (lane + 32 * i < G) bias = fmaf(bf16_bits(cur.b[i]), xg[i], bias);
      const float v = warp_butterfly(acc + bias);
      if (lane == 0) y[row] = v;
      if (next >= 0) cur = nxt;
    }
  }
}

// The pipelined head (T = 1): a block per SM streams its contiguous rows through a ring of
// shared-memory stages with cp.async, kPipeRows rows per stage, so the bytes in flight do not
// depend on registers (the register kernel above keeps only one row per warp in flight: about
// 18 KB per SM, short of what the memory's latency needs). x's units and group sums are made in
// shared memory as in the resident kernel, then each lane holds its own in registers (dot2_reg);
// each warp computes two rows of a stage. NU: units a lane (K = 256 NU: 8 for K = 2048, 4 for
// 1024, 10 for 2560; U <= the block's 512 threads, one unit each).
//
// NU = 16 (K = 4096, the 9B's untied head): a lane's 16 units of x do not fit its registers, so
// the row is split between two warp groups. Warps 0-7 (the front) hold units 0-7 of the lane
// (inputs 0..2047) and start the acc chains of tile t's 16 rows; they leave each lane's chain in
// shared memory, and warps 8-15 (the back) hold units 8-15 and carry those chains on one tile
// later, then add the bias chain and reduce. Each chain still runs over the lane's units in
// order, so the bits are the canonical order's. A stage stays in use for two iterations.
constexpr int kPipeWarps = 16, kPipeRows = 2 * kPipeWarps;
constexpr int kSplitRows = 16;  // rows a tile when NU = 16: 2 a warp of each group
template <int NU>
constexpr int head_tile_rows() { return NU > 10 ? kSplitRows : kPipeRows; }

//
// TMA: thread 0 hands each tile to the copy engine as three bulk copies (rows, scales, biases
// are contiguous), counted by the stage's mbarrier, instead of every thread issuing 16-byte
// cp.async (the issue loop is about a sixth of the kernel's instructions).
template <int STAGES, bool TMA, int NU>
__global__ void __launch_bounds__(kPipeWarps * 32, 1) head_pipe_kernel(ProjectArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const MatDev& m = a.m[0];
  constexpr int K = NU * 256, U = K / 8;
  constexpr bool kSplit = NU > 10;          // the row split between two warp groups (above)
  constexpr int kRows = head_tile_rows<NU>(), kLag = kSplit ? 2 : 1;  // kLag: iterations a stage is in use
  const int G = K / m.gs, gs_shift = m.gs_shift;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t wrow = uint32_t(K / 2), srow = uint32_t(G * 2);
  const uint32_t stage_bytes = kRows * (wrow + 2 * srow);
  uint4* xa = reinterpret_cast<uint4*>(smem);
  uint4* xb = xa + U;
  float* xg = reinterpret_cast<float*>(xb + U);
  float* raw = xg + G;  // K floats; then (split) the chains handed over; then the stages (16-byte aligned: G % 8 == 0)
  float* chains = raw + K;  // split: [2 tiles][kRows rows][32 lanes]
  unsigned char* stages = reinterpret_cast<unsigned char*>(chains + (kSplit ? 2 * kRows * 32 : 0));

  const int r0 = int(int64_t(blockIdx.x) * m.rows / gridDim.x);
  const int r1 = int(int64_t(blockIdx.x + 1) * m.rows / gridDim.x);
  const int tiles = (r1 - r0 + kRows - 1) / kRows;
  // Stage layout: kRows weight rows, then their scales, then their biases.
  __shared__ uint64_t full[STAGES];  // TMA: stage s's bytes of its current tile have landed
  auto issue = [&](int tile) {
    if constexpr (TMA) {
      if (threadIdx.x == 0 && tile < tiles) {
        const int s = tile % STAGES;
        unsigned char* st = stages + s * stage_bytes;
        const int row = r0 + tile * kRows, n = min(kRows, r1 - row);
        mbar_arrive_expect(&full[s], uint32_t(n) * (wrow + 2 * srow));
        bulk_copy(st, static_cast<const unsigned char*>(m.w) + size_t(row) * wrow, n * wrow, &full[s]);
        bulk_copy(st + kRows * wrow, static_cast<const unsigned char*>(m.s) + size_t(row) * srow, n * srow, &full[s]);
        bulk_copy(st + kRows * (wrow + srow), static_cast<const unsigned char*>(m.b) + size_t(row) * srow, n * srow,
                  &full[s]);
      }
      return;
    }
    if (tile < tiles) {
      unsigned char* st = stages + (tile % STAGES) * stage_bytes;
      const int row = r0 + tile * kRows, n = min(kRows, r1 - row);
      const unsigned char* w = static_cast<const unsigned char*>(m.w) + size_t(row) * wrow;
      const unsigned char* sc = static_cast<const unsigned char*>(m.s) + size_t(row) * srow;
      const unsigned char* bi = static_cast<const unsigned char*>(m.b) + size_t(row) * srow;
      for (uint32_t i = threadIdx.x; i < n * wrow / 16; i += blockDim.x) async_copy16(st + 16 * i, w + 16 * i);
      st += kRows * wrow;
      for (uint32_t i = threadIdx.x; i < n * srow / 16; i += blockDim.x) async_copy16(st + 16 * i, sc + 16 * i);
      st += kRows * srow;
      for (uint32_t i = threadIdx.x; i < n * srow / 16; i += blockDim.x) async_copy16(st + 16 * i, bi + 16 * i);
    }
    async_commit();  // an empty group past the end keeps the count of groups regular
  };

  pdl_trigger();
  if (TMA && threadIdx.x == 0)
    for (int s = 0; s < STAGES; ++s) mbar_init(&full[s], 1);  // waited on only after the barriers below
  // The weights do not depend on earlier kernels: the first stages stream before the wait.
  for (int t = 0; t < STAGES - kLag; ++t) issue(t);
  float4 nw0 = make_float4(1, 1, 1, 1), nw1 = nw0;
  const bool own = threadIdx.x < U;  // U <= 320 < the block's threads: one unit per thread
  if (a.norm && own) {
    nw0 = reinterpret_cast<const float4*>(a.norm)[2 * threadIdx.x];
    nw1 = reinterpret_cast<const float4*>(a.norm)[2 * threadIdx.x + 1];
  }
  pdl_wait();

  const float4* x4 = reinterpret_cast<const float4*>(a.x);
  float4 v0 = make_float4(0, 0, 0, 0), v1 = v0;
  if (own) {
    v0 = x4[2 * threadIdx.x];
    v1 = x4[2 * threadIdx.x + 1];
    reinterpret_cast<float4*>(raw)[2 * threadIdx.x] = v0;
    reinterpret_cast<float4*>(raw)[2 * threadIdx.x + 1] = v1;
  }
  __syncthreads();
  if (own) {
    // Every warp that owns units computes the canonical sum of squares itself.
    const float r = a.norm ? num::rms_inv(warp_sum_squares(raw, K, lane), K, a.eps) : 1.0f;
    auto scale = [&](float4 v, float4 w) {
      return a.norm ? make_float4((v.x * r) * w.x, (v.y * r) * w.y, (v.z * r) * w.z, (v.w * r) * w.w) : v;
    };
    v0 = scale(v0, nw0);
    v1 = scale(v1, nw1);
    make_unit_q4(v0, v1, xa[threadIdx.x], xb[threadIdx.x]);
  }
  __syncthreads();
  if (own) {  // normalised x back into raw for the group sums (chain of 8 per unit, then of units)
    reinterpret_cast<float4*>(raw)[2 * threadIdx.x] = v0;
    reinterpret_cast<float4*>(raw)[2 * threadIdx.x + 1] = v1;
  }
  __syncthreads();
  for (int g = threadIdx.x; g < G; g += blockDim.x) {
    float s = 0.0f;
    for (int u = (g << gs_shift) / 8; u < ((g + 1) << gs_shift) / 8; ++u) {
      float p = 0.0f;
#pragma unroll
      for (int k = 0; k < 8; ++k) p = p + raw[8 * u + k];
      s = s + p;
    }
    xg[g] = s;
  }
  __syncthreads();
  if constexpr (kSplit) {
    constexpr int NH = NU / 2;  // units a lane in each half
    const bool front = warp < kPipeWarps / 2;
    XRegs<NH> xr;  // this lane's units of its group's half of x
    load_xregs(xr, xa + (front ? 0 : U / 2), xb + (front ? 0 : U / 2), xg, G, lane);
    const int ja = 2 * (warp % (kPipeWarps / 2));
    using S = const unsigned short*;
    for (int it = 0; it <= tiles; ++it) {
      if (it < tiles) {
        if constexpr (TMA) mbar_wait(&full[it % STAGES], unsigned(it / STAGES) & 1u);  // tile it has landed
        else async_wait_group<STAGES - kLag - 1>();  // this thread's copies of tile it have landed
      }
      __syncthreads();  // everyone's have; tile it - 2's stage and tile it - 2's chains are free again
      issue(it + STAGES - kLag);
      const int t = front ? it : it - 1;  // the front starts tile it, the back finishes tile it - 1
      if (t < 0 || t >= tiles) continue;
      const unsigned char* st = stages + (t % STAGES) * stage_bytes;
      const int row = r0 + t * kRows, n = min(kRows, r1 - row);
      if (ja >= n) continue;
      const int jb = min(ja + 1, n - 1);
      const uint32_t* w = reinterpret_cast<const uint32_t*>(st);
      S sc = reinterpret_cast<S>(st + kRows * wrow);
      float* ch = chains + (t & 1) * kRows * 32;
      if (front) {
        float acc_a = 0.0f, acc_b = 0.0f;
        chain2_reg(w + ja * U, sc + ja * G, w + jb * U, sc + jb * G, 0, gs_shift, xr, lane, acc_a, acc_b);
        ch[ja * 32 + lane] = acc_a;
        ch[jb * 32 + lane] = acc_b;  // (jb == ja: the same value twice)
      } else {
        float acc_a = ch[ja * 32 + lane], acc_b = ch[jb * 32 + lane];
        chain2_reg(w + ja * U, sc + ja * G, w + jb * U, sc + jb * G, U / 2, gs_shift, xr, lane, acc_a, acc_b);
        S bi = reinterpret_cast<S>(st + kRows * (wrow + srow));
        float va, vb;
        finish2_reg(bi + ja * G, bi + jb * G, G, xr, lane, acc_a, acc_b, va, vb);
        if (lane == 0) {
          m.y[row + ja] = va;
          if (jb != ja) m.y[row + jb] = vb;
        }
      }
    }
  } else {
    XRegs<NU> xr;  // this lane's units of x
    load_xregs(xr, xa, xb, xg, G, lane);

    for (int t = 0; t < tiles; ++t) {
      if constexpr (TMA) mbar_wait(&full[t % STAGES], unsigned(t / STAGES) & 1u);  // tile t has landed
      else async_wait_group<STAGES - 2>();  // this thread's copies of tile t have landed
      __syncthreads();                      // everyone's have, and tile t - 1's stage is free again
      issue(t + STAGES - 1);
      const unsigned char* st = stages + (t % STAGES) * stage_bytes;
      const int row = r0 + t * kRows, n = min(kRows, r1 - row);
      const int ja = 2 * warp, jb = min(2 * warp + 1, n - 1);
      if (ja < n) {
        using S = const unsigned short*;
        const uint32_t* w = reinterpret_cast<const uint32_t*>(st);
        S sc = reinterpret_cast<S>(st + kRows * wrow);
        S bi = reinterpret_cast<S>(st + kRows * (wrow + srow));
        float va, vb;
        dot2_reg(w + ja * U, sc + ja * G, bi + ja * G, w + jb * U, sc + jb * G, bi + jb * G, G, gs_shift, xr, lane, va,
                 vb);
        if (lane == 0) {
          m.y[row + ja] = va;
          if (jb != ja) m.y[row + jb] = vb;
        }
      }
    }
  }
  async_wait_all();
}

template <int NU>
bool launch_nu(const ProjectArgs& a, int num_sms, cudaStream_t s) {
  const int G = a.K / a.m[0].gs;
  static const int per_sm = env_int("DELTAQ_HEAD_BLOCKS", 2);
  const int need = (a.m[0].rows + kHeadWarps - 1) / kHeadWarps;
  const int blocks = std::max(1, std::min(need, num_sms * std::max(1, per_sm)));
  if (G <= 32) launch_kernel(head_kernel<NU, 1>, blocks, kHeadWarps * 32, 0, s, a);
  else if (G <= 64) launch_kernel(head_kernel<NU, 2>, blocks, kHeadWarps * 32, 0, s, a);
  else return false;
  return true;
}

}  // namespace

bool launch_project_head(const ProjectArgs& a, int num_sms, cudaStream_t s) {
  static const char* env = std::getenv("DELTAQ_MV_HEAD");
  static const bool enabled = !(env && env[0] == '0');
  if (!enabled || a.n != 1 || a.epi != Epilogue::Store) return false;
  const MatDev& m = a.m[0];
  if (m.fmt != WFmt::Affine || m.bits != 4 || m.sdt != SDt::BF16 || m.gs_shift < 3 || m.cols != a.K) return false;
  if (m.lanes) return false;  // (the head keeps the checkpoint's layout)
  if (a.K % 256 != 0 || (a.K > 2048 && a.K != 2560 && a.K != 4096) || a.K % m.gs != 0) return false;
  // Tall products only: below this the resident or streaming kernels keep more rows per SM busy.
  static const int min_rows = env_int("DELTAQ_MV_HEAD_MIN_ROWS", 32768);
  if (m.rows < min_rows) return false;
  if (reinterpret_cast<uintptr_t>(a.x) % 16 || reinterpret_cast<uintptr_t>(m.w) % 4 ||
      reinterpret_cast<uintptr_t>(m.s) % 2 || reinterpret_cast<uintptr_t>(m.b) % 2)
    return false;
  // The pipelined kernel: one token, K = 2048, 1024 or 2560 (the 2B's, 0.8B's and 4B's heads; x
  // in registers), or 4096 (the 9B's; the row split between two warp groups), 16-byte aligned
  // rows and groups; as many of the stages asked for as fit. DELTAQ_HEAD_SPLIT=0 leaves K = 4096
  // to the pipelined product (matvec_pipe.cu), as before.
  static const char* pipe_env = std::getenv("DELTAQ_HEAD_PIPE");
  static const int stages_asked = pipe_env ? std::atoi(pipe_env) : 5;
  static const bool split_on = env_int("DELTAQ_HEAD_SPLIT", 1) != 0;
  const bool split = a.K == 4096;
  if (split && !split_on) return false;
  const int G = a.K / m.gs;
  const size_t stage_bytes = size_t(split ? kSplitRows : kPipeRows) * (a.K / 2 + 4 * G);
  auto smem_of = [&](int st) {
    return size_t(a.K / 8) * 32 + size_t(G) * 4 + size_t(a.K) * 4 + (split ? 2 * kSplitRows * 32 * 4 : 0) +
           st * stage_bytes;
  };
  int stages = stages_asked;
  while (stages > 3 && smem_of(stages) > 225 * 1024) --stages;
  if (stages >= 3 && stages <= 6 && a.T == 1 &&
      (a.K == 2048 || a.K == 1024 || (a.K == 2560 && stages <= 4) || (split && stages <= 5)) &&
      G % 8 == 0 && G <= 64 && m.gs_shift >= 0 && reinterpret_cast<uintptr_t>(m.w) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(m.s) % 16 == 0 && reinterpret_cast<uintptr_t>(m.b) % 16 == 0) {
    const size_t smem = smem_of(stages);
    if (smem <= 225 * 1024) {
      using Kernel = void (*)(ProjectArgs);
      static const Kernel table[4][4][2] = {{{head_pipe_kernel<3, false, 8>, head_pipe_kernel<3, true, 8>},
                                             {head_pipe_kernel<4, false, 8>, head_pipe_kernel<4, true, 8>},
                                             {head_pipe_kernel<5, false, 8>, head_pipe_kernel<5, true, 8>},
                                             {head_pipe_kernel<6, false, 8>, head_pipe_kernel<6, true, 8>}},
                                            {{head_pipe_kernel<3, false, 4>, head_pipe_kernel<3, true, 4>},
                                             {head_pipe_kernel<4, false, 4>, head_pipe_kernel<4, true, 4>},
                                             {head_pipe_kernel<5, false, 4>, head_pipe_kernel<5, true, 4>},
                                             {head_pipe_kernel<6, false, 4>, head_pipe_kernel<6, true, 4>}},
                                            {{head_pipe_kernel<3, false, 10>, head_pipe_kernel<3, true, 10>},
                                             {head_pipe_kernel<4, false, 10>, head_pipe_kernel<4, true, 10>},
                                             {nullptr, nullptr},  // (K = 2560: 5 or 6 stages do not fit)
                                             {nullptr, nullptr}},
                                            {{head_pipe_kernel<3, false, 16>, head_pipe_kernel<3, true, 16>},
                                             {head_pipe_kernel<4, false, 16>, head_pipe_kernel<4, true, 16>},
                                             {head_pipe_kernel<5, false, 16>, head_pipe_kernel<5, true, 16>},
                                             {nullptr, nullptr}}};  // (K = 4096: 6 stages do not fit)
      static bool attr_set = false;
      if (!attr_set) {
        for (auto& width : table)
          for (auto& row : width)
            for (Kernel k : row)
              if (k) DQ_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 225 * 1024));
        attr_set = true;
      }
      // The stages filled by the copy engine (bulk copies; DELTAQ_HEAD_TMA=0: cp.async by every
      // thread): 962.3 vs 953.3 tok/s on the H200, alternating.
      static const bool tma = !(std::getenv("DELTAQ_HEAD_TMA") && std::getenv("DELTAQ_HEAD_TMA")[0] == '0');
      const int by_k = a.K == 2048 ? 0 : a.K == 1024 ? 1 : a.K == 2560 ? 2 : 3;
      launch_kernel(table[by_k][stages - 3][tma ? 1 : 0], std::min(num_sms, m.rows), kPipeWarps * 32, smem, s, a);
      return true;
    }
  }
  switch (a.K / 256) {
    case 1: return launch_nu<1>(a, num_sms, s);
    case 2: return launch_nu<2>(a, num_sms, s);
    case 4: return launch_nu<4>(a, num_sms, s);
    case 6: return launch_nu<6>(a, num_sms, s);
    case 8: return launch_nu<8>(a, num_sms, s);
    default: return false;
  }
}

}  // namespace dq::cuda
