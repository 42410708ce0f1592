// The output head (and any very tall 4-bit product with K <= 2048): hundreds of thousands of
// rows against one x. Here the time goes to the instructions per weight, not to x, so each lane
// keeps its x units in registers for the whole launch (lane l owns units l, l+32, ... of every
// row: the unit's integers, two words of q4.cuh make_unit_q4), and the weight words of the warp's next row are in flight while it
// computes the current one. The first row's words are loaded before the programmatic-launch wait.
// Same canonical order as ops/numerics.h affine_dot (and the other mat-vec kernels):
// acc = chain over the lane's units of fmaf(scale, unit dot, acc), bias = chain over the lane's
// groups of fmaf(bias, group sum, bias), y = butterfly(acc + bias). Bit-identical to the CPU.
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

template <int NU>
bool launch_nu(const ProjectArgs& a, int num_sms, cudaStream_t s) {
  const int G = a.K / a.m[0].gs;
  static const int per_sm = std::getenv("DELTAQ_HEAD_BLOCKS") ? std::atoi(std::getenv("DELTAQ_HEAD_BLOCKS")) : 2;
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
  if (a.K % 256 != 0 || a.K > 2048 || a.K % m.gs != 0) return false;
  // Tall products only: below this the resident or streaming kernels keep more rows per SM busy.
  static const int min_rows = std::getenv("DELTAQ_MV_HEAD_MIN_ROWS") ? std::atoi(std::getenv("DELTAQ_MV_HEAD_MIN_ROWS")) : 32768;
  if (m.rows < min_rows) return false;
  if (reinterpret_cast<uintptr_t>(a.x) % 16 || reinterpret_cast<uintptr_t>(m.w) % 4 ||
      reinterpret_cast<uintptr_t>(m.s) % 2 || reinterpret_cast<uintptr_t>(m.b) % 2)
    return false;
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
