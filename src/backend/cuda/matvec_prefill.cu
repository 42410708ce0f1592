// The 4-bit products of a prefill chunk (T >= 2 tokens). The one-token kernels run a chunk token
// by token, so a weight word loaded into registers serves one token and the unit's nibbles are
// split again for each; here a warp carries four rows against a tile of TT tokens: each word is
// loaded and split once for TT tokens, and each x unit read from shared memory serves four rows.
// Every (row, token) keeps its canonical chain (numerics.h affine rows): lane l chains units
// l, l + 32, ... in order, then its groups' bias terms, then the butterfly; x is normalised and
// made into units as in the other kernels. So the bits are those of the token-by-token kernels.
#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/q4.cuh"

namespace dq::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kRows = 4;                  // rows a warp carries (SwiGLU: two gate/up pairs)
constexpr size_t kSmemCap = 200 * 1024;   // one block an SM (its registers: 8 warps of up to 255)

// The four rows of work item `item`: SwiGLU, pairs 2 item and 2 item + 1 as (gate, up, gate,
// up); otherwise rows 4 item .. 4 item + 3 of the launch's matrices in order. A row past the end
// repeats a valid one and is not written.
struct RowSet {
  const uint32_t* w[kRows];
  const unsigned short* s[kRows];
  const unsigned short* b[kRows];
  float* y[kRows];  // the output row's first token, or null (not written)
  int stride[kRows];  // floats between tokens of y
};

__device__ __forceinline__ void row_at(const ProjectArgs& a, int flat, int U, int G, RowSet& rs, int k, bool write) {
  int i = 0;
  while (i + 1 < a.n && flat >= a.m[i].rows) flat -= a.m[i++].rows;
  const MatDev& m = a.m[i];
  rs.w[k] = static_cast<const uint32_t*>(m.w) + size_t(flat) * U;
  rs.s[k] = static_cast<const unsigned short*>(m.s) + size_t(flat) * G;
  rs.b[k] = static_cast<const unsigned short*>(m.b) + size_t(flat) * G;
  rs.y[k] = write && m.y ? m.y + flat : nullptr;
  rs.stride[k] = m.rows;
}

__device__ __forceinline__ RowSet rows_of(const ProjectArgs& a, int item, int total, int U, int G) {
  RowSet rs;
  if (a.epi == Epilogue::SwiGLU) {
    const int n = a.m[0].rows;
    const int j = 2 * item, j2 = j + 1 < n ? j + 1 : j;
    for (int k = 0; k < kRows; ++k) {
      const MatDev& m = a.m[k & 1];
      const int r = k < 2 ? j : j2;
      rs.w[k] = static_cast<const uint32_t*>(m.w) + size_t(r) * U;
      rs.s[k] = static_cast<const unsigned short*>(m.s) + size_t(r) * G;
      rs.b[k] = static_cast<const unsigned short*>(m.b) + size_t(r) * G;
      rs.y[k] = (k & 1) == 0 && (k < 2 || j2 != j) ? a.m[0].y + r : nullptr;  // the gate's row holds the output
      rs.stride[k] = n;
    }
    return rs;
  }
  for (int k = 0; k < kRows; ++k) {
    const int f = kRows * item + k;
    row_at(a, f < total ? f : total - 1, U, G, rs, k, f < total);
  }
  return rs;
}

// Grid: tiles x row blocks (the tile varies fastest, so the blocks that read the same rows run
// together and share them in L2). Each block makes its tile's x units and group sums in shared
// memory once, then its warps take items (four rows) in turn.
template <int TT, bool LANES>
__global__ void __launch_bounds__(kWarps * 32, 1)
    prefill_kernel(ProjectArgs a, int gshift, int tiles, int items, int total_rows) {
  extern __shared__ uint4 sm[];
  __shared__ float rs_inv[TT];
  const int K = a.K, U = K / 8, G = K >> gshift;
  uint4* xa = sm;                                       // [TT][U]
  uint4* xb = sm + TT * U;                              // [TT][U]
  float* xg = reinterpret_cast<float*>(sm + 2 * TT * U);  // [TT][G]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int tile = blockIdx.x % tiles, rb = blockIdx.x / tiles, rbs = gridDim.x / tiles;
  const int t0 = tile * TT, nt = min(TT, a.T - t0);
  pdl_trigger();
  pdl_wait();

  // The canonical sum of squares of each token's x (lane = index mod 32, then the butterfly).
  if (a.norm)
    for (int tt = warp; tt < nt; tt += kWarps) {
      const float ss = warp_sum_squares(a.x + size_t(t0 + tt) * K, K, lane);
      if (lane == 0) rs_inv[tt] = num::rms_inv(ss, K, a.eps);
    }
  __syncthreads();
  // Units and group sums: a thread per (token, group), its units in order (a group's sum is the
  // chain of its units' sums). Tokens past the chunk's end get zero units (their rows are not
  // written).
  const int upg = 1 << (gshift - 3);
  for (int p = threadIdx.x; p < TT * G; p += blockDim.x) {
    const int tt = p / G, g = p - tt * G;
    const float4* x4 = reinterpret_cast<const float4*>(a.x + size_t(t0 + tt) * K);
    const float4* w4 = reinterpret_cast<const float4*>(a.norm);
    const float r = a.norm && tt < nt ? rs_inv[tt] : 1.0f;
    float s = 0.0f;
    for (int k = 0; k < upg; ++k) {
      const int u = g * upg + k;
      float4 v0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), v1 = v0;
      if (tt < nt) {
        v0 = x4[2 * u];
        v1 = x4[2 * u + 1];
        if (a.norm) {
          const float4 n0 = w4[2 * u], n1 = w4[2 * u + 1];
          v0 = make_float4((v0.x * r) * n0.x, (v0.y * r) * n0.y, (v0.z * r) * n0.z, (v0.w * r) * n0.w);
          v1 = make_float4((v1.x * r) * n1.x, (v1.y * r) * n1.y, (v1.z * r) * n1.z, (v1.w * r) * n1.w);
        }
      }
      make_unit_q4(v0, v1, xa[tt * U + u], xb[tt * U + u]);
      s = s + unit_sum(v0, v1);
    }
    xg[tt * G + g] = s;
  }
  __syncthreads();

  const int shift = gshift, gstep = 256 >> shift;
  for (int item = rb * kWarps + warp; item < items; item += rbs * kWarps) {
    const RowSet rs = rows_of(a, item, total_rows, U, G);
    float acc[kRows][TT];
#pragma unroll
    for (int k = 0; k < kRows; ++k)
#pragma unroll
      for (int tt = 0; tt < TT; ++tt) acc[k][tt] = 0.0f;
    // A chunk of N units a lane (256 units; LANES' half chunk of K = 1024: 128); in the row
    // layout a last part of nt = 1..7 units a lane (K a multiple of 256, not of 2048).
    auto chunk = [&](auto n_units, int base, int nt) {
      constexpr int N = decltype(n_units)::value;
      uint32_t v[kRows][8];
      [[maybe_unused]] uint32_t sw[kRows][4];
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        if constexpr (LANES) {
          lane_chunk_words<N>(rs.w[k] + base, lane, v[k]);
          lane_chunk_scales<N>(rs.s[k] + ((base * 8) >> shift), shift, lane, sw[k]);
        } else {
#pragma unroll
          for (int i = 0; i < N; ++i) v[k][i] = i < nt ? rs.w[k][base + lane + 32 * i] : 0u;
        }
      }
      [[maybe_unused]] const int g0 = ((base + lane) * 8) >> shift;
#pragma unroll
      for (int i = 0; i < N; ++i) {
        if (!LANES && i >= nt) break;
        const int u = base + lane + 32 * i;
        int lo[kRows], hi[kRows];
        float sc[kRows];
#pragma unroll
        for (int k = 0; k < kRows; ++k) {
          lo[k] = int(v[k][i] & 0x0F0F0F0Fu);
          hi[k] = int((v[k][i] >> 4) & 0x0F0F0F0Fu);
          if constexpr (LANES) sc[k] = lane_chunk_scale(sw[k], i);
          else sc[k] = __uint_as_float(uint32_t(rs.s[k][g0 + i * gstep]) << 16);
        }
#pragma unroll
        for (int tt = 0; tt < TT; ++tt) {
          const uint4 x0 = xa[tt * U + u], x1 = xb[tt * U + u];
#pragma unroll
          for (int k = 0; k < kRows; ++k) acc[k][tt] = fmaf(sc[k], unit_q4_nibbles(lo[k], hi[k], x0, x1), acc[k][tt]);
        }
      }
    };
    int base = 0;
    for (; base + 256 <= U; base += 256) chunk(std::integral_constant<int, 8>{}, base, 8);
    if (base < U) {
      if constexpr (LANES) chunk(std::integral_constant<int, 4>{}, base, 4);  // K = 1024's half chunk
      else chunk(std::integral_constant<int, 8>{}, base, (U - base) >> 5);
    }

#pragma unroll
    for (int tt = 0; tt < TT; ++tt) {
      if (tt >= nt) break;
      float bias[kRows] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int g = lane; g < G; g += 32) {
        const float xgv = xg[tt * G + g];
#pragma unroll
        for (int k = 0; k < kRows; ++k) bias[k] = fmaf(__uint_as_float(uint32_t(rs.b[k][g]) << 16), xgv, bias[k]);
      }
      const float v01 = warp_butterfly2(acc[0][tt] + bias[0], acc[1][tt] + bias[1], lane);
      const float v23 = warp_butterfly2(acc[2][tt] + bias[2], acc[3][tt] + bias[3], lane);
      const float r[kRows] = {__shfl_sync(0xffffffffu, v01, 0), __shfl_sync(0xffffffffu, v01, 16),
                              __shfl_sync(0xffffffffu, v23, 0), __shfl_sync(0xffffffffu, v23, 16)};
      if (lane == 0) {
        const size_t t = size_t(t0 + tt);
        if (a.epi == Epilogue::SwiGLU) {
          if (rs.y[0]) rs.y[0][t * rs.stride[0]] = num::silu(r[0]) * r[1];
          if (rs.y[2]) rs.y[2][t * rs.stride[2]] = num::silu(r[2]) * r[3];
        } else {
#pragma unroll
          for (int k = 0; k < kRows; ++k)
            if (rs.y[k]) {
              float* y = rs.y[k] + t * rs.stride[k];
              *y = a.epi == Epilogue::Add ? *y + r[k] : r[k];
            }
        }
      }
    }
  }
}

template <int TT, bool LANES>
void launch_tt(const ProjectArgs& a, int gshift, int num_sms, cudaStream_t s, size_t smem, int items, int total) {
  static bool attr_set = false;
  if (!attr_set) {
    DQ_CUDA_CHECK(cudaFuncSetAttribute(prefill_kernel<TT, LANES>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(kSmemCap)));
    attr_set = true;
  }
  const int tiles = (a.T + TT - 1) / TT;
  // One wave: at most a block an SM (a second wave of a few blocks would double the time), no
  // more row blocks than items need.
  const int rbs = std::max(1, std::min((items + kWarps - 1) / kWarps, num_sms / tiles));
  launch_kernel(prefill_kernel<TT, LANES>, tiles * rbs, kWarps * 32, smem, s, a, gshift, tiles, items, total);
}

}  // namespace

bool launch_project_prefill(const ProjectArgs& a, int num_sms, cudaStream_t s) {
  // On for chunks of 8 tokens or more (with the GDN scan, the 2B's prefill 1.4-1.55x on an H100,
  // session 38; 6 tokens measured 5% slower). DELTAQ_MV_PREFILL=0 turns it off, =1 on from 2 tokens.
  static const int mode = env_int("DELTAQ_MV_PREFILL", -1);
  if (mode == 0 || a.T < (mode == 1 ? 2 : 8) || a.n < 1) return false;
  const MatDev& m0 = a.m[0];
  const int K = a.K;
  for (int i = 0; i < a.n; ++i) {
    const MatDev& m = a.m[i];
    if (m.fmt != WFmt::Affine || m.bits != 4 || m.sdt != SDt::BF16 || m.gs != m0.gs || m.gs_shift < 3 ||
        m.gs_shift > 8 || m.lanes != m0.lanes || m.cols != K || reinterpret_cast<uintptr_t>(m.w) % 16 ||
        reinterpret_cast<uintptr_t>(m.s) % 16 || reinterpret_cast<uintptr_t>(m.b) % 2)
      return false;
  }
  if (m0.lanes ? !lane_width(K) : K % 256 != 0) return false;
  if (a.epi == Epilogue::SwiGLU && (a.n != 2 || a.m[1].rows != m0.rows)) return false;
  if (reinterpret_cast<uintptr_t>(a.x) % 16 || (a.norm && reinterpret_cast<uintptr_t>(a.norm) % 16)) return false;
  const int U = K / 8, G = K >> m0.gs_shift;
  int TT = a.T >= 8 ? 8 : a.T >= 4 ? 4 : 2;
  auto smem_of = [&](int tt) { return size_t(tt) * U * 32 + size_t(tt) * G * 4; };
  while (TT > 2 && smem_of(TT) > kSmemCap) TT /= 2;
  if (smem_of(TT) > kSmemCap) return false;
  int total = 0;
  for (int i = 0; i < a.n; ++i) total += a.m[i].rows;
  const int items = a.epi == Epilogue::SwiGLU ? (m0.rows + 1) / 2 : (total + kRows - 1) / kRows;
  const size_t smem = smem_of(TT);
  const int gshift = m0.gs_shift;
  if (m0.lanes) {
    if (TT == 8) launch_tt<8, true>(a, gshift, num_sms, s, smem, items, total);
    else if (TT == 4) launch_tt<4, true>(a, gshift, num_sms, s, smem, items, total);
    else launch_tt<2, true>(a, gshift, num_sms, s, smem, items, total);
  } else {
    if (TT == 8) launch_tt<8, false>(a, gshift, num_sms, s, smem, items, total);
    else if (TT == 4) launch_tt<4, false>(a, gshift, num_sms, s, smem, items, total);
    else launch_tt<2, false>(a, gshift, num_sms, s, smem, items, total);
  }
  return true;
}

}  // namespace dq::cuda
