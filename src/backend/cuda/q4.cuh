// The 4-bit (and 8-bit) weight unit of the canonical affine dot (ops/numerics.h affine_dot),
// shared by the streaming, the resident and the head mat-vec kernels.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "backend/cuda/kernels.cuh"
#include "ops/numerics.h"

namespace dq::cuda {

__device__ __forceinline__ float load_scale(const void* p, int i, SDt t) {
  if (t == SDt::BF16) return __uint_as_float(uint32_t(__ldg(static_cast<const unsigned short*>(p) + i)) << 16);
  if (t == SDt::F16) return __half2float(static_cast<const __half*>(p)[i]);
  return __ldg(static_cast<const float*>(p) + i);
}

// Group of unit u (8 inputs): u * 8 / gs, a shift for power-of-two group sizes.
__device__ __forceinline__ int group_of(const MatDev& m, int u) {
  return m.gs_shift >= 0 ? (u * 8) >> m.gs_shift : u * 8 / m.gs;
}

// The two bf16 halves of a word as floats (exact).
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

// The lane layout (WLayout::Lanes; 4-bit, K a multiple of 2048 or K = 1024, power-of-two
// groups of 8 to 256, bf16 scales), per row and per chunk of 256 units (2048 inputs), the
// chunk's order kept:
// - unit lane + 32 i (i < 8) at word (i / 4) * 128 + lane * 4 + i % 4: a lane's 8 words of the
//   chunk are two 16-byte loads, and each load of the warp reads 512 contiguous bytes;
// - group g of the chunk (gstep = 256 / gs groups between units u and u + 32) at
//   (g % gstep) * 8 + g / gstep: a lane's 8 scales of the chunk are one 16-byte load.
// A final half chunk (128 units: K = 1024, the 0.8B's width) has 4 units a lane: its words at
// lane * 4 + i (the same formula) and its groups at (g % gstep) * 4 + g / gstep, so a lane's
// 4 words are one 16-byte load and its 4 scales one 8-byte load.
// The biases keep the row order (the bias terms go over groups lane, lane + 32, ...).
__host__ __device__ __forceinline__ int lane_word(int u) {
  const int lane = u & 31, i = (u >> 5) & 7;
  return (u & ~255) + (i >> 2) * 128 + lane * 4 + (i & 3);
}
// G: the row's groups (K >> gs_shift), which tells a whole chunk from a final half one.
__host__ __device__ __forceinline__ int lane_scale(int g, int gs_shift, int G) {
  const int per_chunk = 2048 >> gs_shift, gstep = 256 >> gs_shift, gl = g & (per_chunk - 1), first = g - gl;
  const int per_lane = first + per_chunk <= G ? 8 : 4;
  return first + (gl & (gstep - 1)) * per_lane + gl / gstep;
}
__device__ __forceinline__ int word_at(const MatDev& m, int u) { return m.lanes ? lane_word(u) : u; }
__device__ __forceinline__ int scale_at_group(const MatDev& m, int g) {
  return m.lanes ? lane_scale(g, m.gs_shift, m.cols >> m.gs_shift) : g;
}

// One lane's words and scale words of a chunk in the lane layout (w, s: the chunk's first word
// and scale): N = 8 units a lane for a whole chunk (two 16-byte loads of words, one of scales),
// 4 for the half chunk of K = 1024 (one 16-byte load, one 8-byte). Unit i's scale is
// lane_chunk_scale(sw, i).
template <int N>
__device__ __forceinline__ void lane_chunk_words(const uint32_t* w, int lane, uint32_t (&v)[8]) {
  static_assert(N == 8 || N == 4, "a whole chunk or a half one");
  const uint4* w4 = reinterpret_cast<const uint4*>(w) + lane;
  const uint4 a0 = w4[0];
  v[0] = a0.x, v[1] = a0.y, v[2] = a0.z, v[3] = a0.w;
  if constexpr (N == 8) {
    const uint4 a1 = w4[32];
    v[4] = a1.x, v[5] = a1.y, v[6] = a1.z, v[7] = a1.w;
  }
}
template <int N>
__device__ __forceinline__ void lane_chunk_scales(const unsigned short* s, int shift, int lane, uint32_t (&sw)[4]) {
  if constexpr (N == 8) {
    const uint4 sr = reinterpret_cast<const uint4*>(s)[lane >> (shift - 3)];
    sw[0] = sr.x, sw[1] = sr.y, sw[2] = sr.z, sw[3] = sr.w;
  } else {
    const uint2 sr = reinterpret_cast<const uint2*>(s)[lane >> (shift - 3)];
    sw[0] = sr.x, sw[1] = sr.y, sw[2] = sw[3] = 0u;
  }
}
__device__ __forceinline__ float lane_chunk_scale(const uint32_t (&sw)[4], int i) {
  return i & 1 ? bf16_hi(sw[i >> 1]) : bf16_lo(sw[i >> 1]);
}

// The sum of a unit's 8 inputs, their chain from 0 in order: the first step of a group sum
// (numerics.h group sums: per unit this chain, per group the chain of its units).
__device__ __forceinline__ float unit_sum(float4 v0, float4 v1) {
  float p = 0.0f;
  p = p + v0.x;
  p = p + v0.y;
  p = p + v0.z;
  p = p + v0.w;
  p = p + v1.x;
  p = p + v1.y;
  p = p + v1.z;
  p = p + v1.w;
  return p;
}

// The 4-bit unit of numerics.h (quantize_unit / unit_dot_q4): x's exact integers split as
// xi = h * 2^8 + l, l a signed byte and h a signed 16-bit number (|xi| <= 2^22: |h| <= 2^14 + 1),
// in the two words the dot reads per unit:
//   a = {h of inputs 0,2 | h of 4,6 | h of 1,3 | h of 5,7} (two 16-bit halves each, lower first),
//   b = {l of inputs 0,2,4,6 | l of 1,3,5,7 | step (float bits) | 0}.
__device__ __forceinline__ void make_unit_q4(float4 v0, float4 v1, uint4& a, uint4& b) {
  const float x[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
  const num::UnitInts q = num::quantize_unit(x);
  uint32_t h[4] = {0, 0, 0, 0}, l[2] = {0, 0};
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int32_t lo = int32_t(int8_t(uint8_t(q.xi[k] & 0xFF)));
    const int32_t hi = (q.xi[k] - lo) >> 8;  // exact: a multiple of 256
    h[(k & 1) * 2 + (k >> 2)] |= (uint32_t(hi) & 0xFFFFu) << (16 * ((k >> 1) & 1));
    l[k & 1] |= (uint32_t(lo) & 0xFFu) << (8 * (k >> 1));
  }
  a = make_uint4(h[0], h[1], h[2], h[3]);
  b = make_uint4(l[0], l[1], __float_as_uint(q.step), 0u);
}

// p = float(Σ_k q_k xi_k) * step for one 4-bit word: the low and high nibbles (0..15, so they are
// the same as signed bytes) against h in dp2a (two 16-bit by 8-bit products each) and against l
// in dp4a, then h's sum * 2^8 + l's sum: exact in int32 (|Σ| < 2^29), so any grouping gives the
// same integer. Then one rounding to float and an exact scaling. unit_q4_nibbles takes the word's
// nibbles already split (lo = w & 0x0F0F0F0F, hi = (w >> 4) & 0x0F0F0F0F): the prefill kernel
// splits a word once for several tokens.
__device__ __forceinline__ float unit_q4_nibbles(int lo, int hi, uint4 a, uint4 b) {
  const int sh = __dp2a_hi(int(a.w), hi, __dp2a_lo(int(a.z), hi, __dp2a_hi(int(a.y), lo, __dp2a_lo(int(a.x), lo, 0))));
  const int sl = __dp4a(hi, int(b.y), __dp4a(lo, int(b.x), 0));
  return __int2float_rn(sh * 256 + sl) * __uint_as_float(b.z);
}
__device__ __forceinline__ float unit_q4(uint32_t w, uint4 a, uint4 b) {
  return unit_q4_nibbles(int(w & 0x0F0F0F0Fu), int((w >> 4) & 0x0F0F0F0Fu), a, b);
}

// The 8-bit unit keeps the float chain: q value of byte I of t as an exact float (PRMT places
// the byte under the exponent of 2^23, then 2^23 is subtracted). The bits of 2^23 come from
// constant memory so that the compiler holds them in a register (with a literal, every PRMT
// needs an extra instruction for its selector).
static __constant__ uint32_t kTwo23Bits = 0x4B000000u;

template <int I>
__device__ __forceinline__ float q_byte(uint32_t t, uint32_t magic) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(t), "r"(magic), "n"(0x7540 | I));
  return __uint_as_float(r) - 8388608.0f;
}

__device__ __forceinline__ float unit_q8(uint32_t w0, uint32_t w1, float4 xa, float4 xb) {
  const uint32_t magic = kTwo23Bits;
  float p = 0.0f;
  p = fmaf(q_byte<0>(w0, magic), xa.x, p);
  p = fmaf(q_byte<1>(w0, magic), xa.y, p);
  p = fmaf(q_byte<2>(w0, magic), xa.z, p);
  p = fmaf(q_byte<3>(w0, magic), xa.w, p);
  p = fmaf(q_byte<0>(w1, magic), xb.x, p);
  p = fmaf(q_byte<1>(w1, magic), xb.y, p);
  p = fmaf(q_byte<2>(w1, magic), xb.z, p);
  p = fmaf(q_byte<3>(w1, magic), xb.w, p);
  return p;
}

// The canonical sum of squares of x[0..n) (the RMSNorm of x) by one warp: lane = index mod 32,
// a chain per lane, then the butterfly.
__device__ __forceinline__ float warp_sum_squares(const float* x, int n, int lane) {
  float ss = 0.0f;
#pragma unroll 16
  for (int j = lane; j < n; j += 32) ss = fmaf(x[j], x[j], ss);
  return warp_butterfly(ss);
}

// Two rows against x, everything in shared memory (the resident kernels): bf16 scales, K a
// multiple of 2048 or K = 1024 in the lane layout (whole chunks of 8 units a lane, or the half
// chunk of 4), K a multiple of 256 in the row layout (a last part of 1-7 units a lane),
// power-of-two groups of at most 256 inputs, always two rows (the caller may pass the same row
// twice). x is in make_unit_q4's split layout (xa, xb: one uint4 each per unit), xg its group
// sums. Canonical order: lane l chains units l, l+32, ..., then its groups' bias terms, then the
// butterfly.
// GSHIFT: log2(gs) when known at compile time (the scales' offsets are then immediates), else
// -1 and gs_shift is used. Returns row a's result in lanes 0-15 and row b's in lanes 16-31
// (warp_butterfly2). LANES: the matrices are in the lane layout (lane_word, lane_scale).
template <int GSHIFT = -1, bool LANES = false>
__device__ __forceinline__ float dot2_fast(const uint32_t* wa, const unsigned short* sa, const unsigned short* ba,
                                           const uint32_t* wb, const unsigned short* sb, const unsigned short* bb,
                                           int U, int G, int gs_shift, const uint4* xa, const uint4* xb,
                                           const float* xg, int lane) {
  const int shift = GSHIFT >= 0 ? GSHIFT : gs_shift;
  const int gstep = 256 >> shift;  // groups between units u and u + 32 (gs <= 256)
  float acc_a = 0.0f, acc_b = 0.0f;
  // The chunk at unit `base`: N = 8 units a lane (a whole chunk) or 4 (K = 1024's half chunk).
  auto chunk = [&](auto n_units, int base) {
    constexpr int N = decltype(n_units)::value;
    uint32_t va[8], vb[8];
    float fa[8], fb[8];  // the scales of units base + lane + 32 i
    if constexpr (LANES) {
      uint32_t sw_a[4], sw_b[4];
      lane_chunk_words<N>(wa + base, lane, va);
      lane_chunk_words<N>(wb + base, lane, vb);
      lane_chunk_scales<N>(sa + ((base * 8) >> shift), shift, lane, sw_a);
      lane_chunk_scales<N>(sb + ((base * 8) >> shift), shift, lane, sw_b);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        fa[i] = lane_chunk_scale(sw_a, i);
        fb[i] = lane_chunk_scale(sw_b, i);
      }
    } else {
      // Unit base + lane + 32 i is in group g0 + i * gstep: adding 256 i inputs adds whole groups.
      const int g0 = ((base + lane) * 8) >> shift;
#pragma unroll
      for (int i = 0; i < N; ++i) {
        va[i] = wa[base + lane + 32 * i];
        vb[i] = wb[base + lane + 32 * i];
      }
#pragma unroll
      for (int i = 0; i < N; ++i) {
        fa[i] = __uint_as_float(uint32_t(sa[g0 + i * gstep]) << 16);
        fb[i] = __uint_as_float(uint32_t(sb[g0 + i * gstep]) << 16);
      }
    }
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int u = base + lane + 32 * i;
      const uint4 x0 = xa[u], x1 = xb[u];
      acc_a = fmaf(fa[i], unit_q4(va[i], x0, x1), acc_a);
      acc_b = fmaf(fb[i], unit_q4(vb[i], x0, x1), acc_b);
    }
  };
  int base = 0;
  for (; base + 256 <= U; base += 256) chunk(std::integral_constant<int, 8>{}, base);
  if (base < U) {
    if constexpr (LANES) {
      chunk(std::integral_constant<int, 4>{}, base);
    } else {  // a last part of nt = 1..7 units a lane (U a multiple of 32: e.g. the 0.8B's down, K = 3584)
      const int nt = (U - base) >> 5, g0 = ((base + lane) * 8) >> shift;
#pragma unroll
      for (int i = 0; i < 7; ++i)
        if (i < nt) {
          const int u = base + lane + 32 * i;
          const uint4 x0 = xa[u], x1 = xb[u];
          acc_a = fmaf(__uint_as_float(uint32_t(sa[g0 + i * gstep]) << 16), unit_q4(wa[u], x0, x1), acc_a);
          acc_b = fmaf(__uint_as_float(uint32_t(sb[g0 + i * gstep]) << 16), unit_q4(wb[u], x0, x1), acc_b);
        }
    }
  }
  float bias_a = 0.0f, bias_b = 0.0f;
  for (int g = lane; g < G; g += 32) {
    bias_a = fmaf(__uint_as_float(uint32_t(ba[g]) << 16), xg[g], bias_a);
    bias_b = fmaf(__uint_as_float(uint32_t(bb[g]) << 16), xg[g], bias_b);
  }
  return warp_butterfly2(acc_a + bias_a, acc_b + bias_b, lane);
}

// Two pairs of rows (0, 1 and 2, 3: gate/up's two items, or two pairs of a stored product)
// against x in the lane layout, x's unit read once for the four rows: each row's chain is dot2_fast's (units lane, lane + 32, ... chunk by
// chunk, then its groups' bias terms, then the paired butterfly), so the results are the same
// bits. Their four chains side by side give a warp twice the independent work between its
// shared-memory loads (gate/up's rows alone: 5686 against 6771 cycles a block,
// deltaq-bench-rows variants 9 and 0). r01: rows 0 / 1 in lanes 0-15 / 16-31; r23 likewise.
template <int GSHIFT>
__device__ __forceinline__ void dot4_lanes(const uint32_t* const (&w)[4], const unsigned short* const (&sc)[4],
                                           const unsigned short* const (&bi)[4], int U, int G, const uint4* xa,
                                           const uint4* xb, const float* xg, int lane, float& r01, float& r23) {
  static_assert(GSHIFT >= 3 && GSHIFT <= 8, "dot4_lanes: groups of 8 to 256 compiled in");
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  auto chunk = [&](auto n_units, int base) {  // as dot2_fast's
    constexpr int N = decltype(n_units)::value;
    uint32_t v[4][8], sw[4][4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      lane_chunk_words<N>(w[r] + base, lane, v[r]);
      lane_chunk_scales<N>(sc[r] + ((base * 8) >> GSHIFT), GSHIFT, lane, sw[r]);
    }
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int u = base + lane + 32 * i;
      const uint4 x0 = xa[u], x1 = xb[u];
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[r] = fmaf(lane_chunk_scale(sw[r], i), unit_q4(v[r][i], x0, x1), acc[r]);
    }
  };
  int base = 0;
  for (; base + 256 <= U; base += 256) chunk(std::integral_constant<int, 8>{}, base);
  if (base < U) chunk(std::integral_constant<int, 4>{}, base);
  float bias[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int g = lane; g < G; g += 32) {
    const float xgv = xg[g];
#pragma unroll
    for (int r = 0; r < 4; ++r) bias[r] = fmaf(__uint_as_float(uint32_t(bi[r][g]) << 16), xgv, bias[r]);
  }
  r01 = warp_butterfly2(acc[0] + bias[0], acc[1] + bias[1], lane);
  r23 = warp_butterfly2(acc[2] + bias[2], acc[3] + bias[3], lane);
}

// x of one lane in registers, for K = 256 NU (NU = 8: K = 2048, units lane + 32 i, i < NU) and
// up to 64 groups: the rows then read only their weights and scales from shared memory (4 + 2
// bytes per unit and row instead of 32 + 6 with x there too). Used by the pipelined head (83.6 us
// in the 2B step's timeline; NU = 4 for the 0.8B's K = 1024); in the resident kernels it measured
// slower (878 vs 921 tok/s: few rows per warp there, and the loads come first on the critical path).
template <int NU = 8>
struct XRegs {
  uint4 a[NU];
  uint32_t b0[NU], b1[NU], step[NU];
  float g[2];
};

template <int NU>
__device__ __forceinline__ void load_xregs(XRegs<NU>& r, const uint4* xa, const uint4* xb, const float* xg, int G,
                                           int lane) {
#pragma unroll
  for (int i = 0; i < NU; ++i) {
    r.a[i] = xa[lane + 32 * i];
    const uint4 b = xb[lane + 32 * i];
    r.b0[i] = b.x;
    r.b1[i] = b.y;
    r.step[i] = b.z;
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) r.g[i] = lane + 32 * i < G ? xg[lane + 32 * i] : 0.0f;
}

// Carries two rows' acc chains over NU units of x in registers: the lane's units u0 + lane + 32 i
// (the pipelined head at K = 4096 runs a row's two halves in two warps, u0 = 0 and U / 2).
template <int NU>
__device__ __forceinline__ void chain2_reg(const uint32_t* wa, const unsigned short* sa, const uint32_t* wb,
                                           const unsigned short* sb, int u0, int gs_shift, const XRegs<NU>& x,
                                           int lane, float& acc_a, float& acc_b) {
  uint32_t va[NU], vb[NU];
#pragma unroll
  for (int i = 0; i < NU; ++i) {
    va[i] = wa[u0 + lane + 32 * i];
    vb[i] = wb[u0 + lane + 32 * i];
  }
#pragma unroll
  for (int i = 0; i < NU; ++i) {
    const int g = ((u0 + lane + 32 * i) * 8) >> gs_shift;
    const uint4 xb = make_uint4(x.b0[i], x.b1[i], x.step[i], 0u);
    acc_a = fmaf(__uint_as_float(uint32_t(sa[g]) << 16), unit_q4(va[i], x.a[i], xb), acc_a);
    acc_b = fmaf(__uint_as_float(uint32_t(sb[g]) << 16), unit_q4(vb[i], x.a[i], xb), acc_b);
  }
}

// The bias chains of two rows over the lane's groups (G <= 64), added to their acc chains, reduced.
template <int NU>
__device__ __forceinline__ void finish2_reg(const unsigned short* ba, const unsigned short* bb, int G,
                                            const XRegs<NU>& x, int lane, float acc_a, float acc_b, float& out_a,
                                            float& out_b) {
  float bias_a = 0.0f, bias_b = 0.0f;
#pragma unroll
  for (int i = 0; i < 2; ++i)
    if (lane + 32 * i < G) {
      bias_a = fmaf(__uint_as_float(uint32_t(ba[lane + 32 * i]) << 16), x.g[i], bias_a);
      bias_b = fmaf(__uint_as_float(uint32_t(bb[lane + 32 * i]) << 16), x.g[i], bias_b);
    }
  out_a = warp_butterfly(acc_a + bias_a);
  out_b = warp_butterfly(acc_b + bias_b);
}

// dot2_fast with x in registers (K = 256 NU, G <= 64): the same chains in the same order.
template <int NU>
__device__ __forceinline__ void dot2_reg(const uint32_t* wa, const unsigned short* sa, const unsigned short* ba,
                                         const uint32_t* wb, const unsigned short* sb, const unsigned short* bb,
                                         int G, int gs_shift, const XRegs<NU>& x, int lane, float& out_a,
                                         float& out_b) {
  float acc_a = 0.0f, acc_b = 0.0f;
  chain2_reg(wa, sa, wb, sb, 0, gs_shift, x, lane, acc_a, acc_b);
  finish2_reg(ba, bb, G, x, lane, acc_a, acc_b, out_a, out_b);
}

}  // namespace dq::cuda
