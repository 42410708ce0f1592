// gate/up's row loop alone (the resident kernel's SwiGLU rows: K = 2048, groups of 64, the lane
// layout, 8 warps a block, 48 items a block as in the 2B step), from shared memory, on every SM,
// in cycles: what the rows cost without the launch, the wait, x's phase or the copies, and what
// each candidate change to them would give. Variants that keep the bits are checked against the
// kernel's own form (variant 0, a copy of matvec_resident.cu's SwiGLU loop over q4.cuh's
// dot2_fast); probes (marked) drop work to show what it costs and give other numbers.
// usage: deltaq-bench-rows [--items N] [--reps R]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/q4.cuh"
#include "ops/numerics.h"

#define CK(e)                                                                                               \
  do {                                                                                                      \
    cudaError_t r_ = (e);                                                                                   \
    if (r_ != cudaSuccess) {                                                                                \
      std::fprintf(stderr, "deltaq-bench-rows: %s at %s:%d\n", cudaGetErrorString(r_), __FILE__, __LINE__); \
      std::exit(1);                                                                                         \
    }                                                                                                       \
  } while (0)

namespace {
using namespace dq::cuda;

constexpr int kK = 2048, kU = kK / 8, kG = kK / 64;
constexpr int kRowBytes = kK / 2 + 2 * kG * 2;  // words, scales, biases

// The variants (V):
//   0 the kernel's loop: dot2_fast, the paired butterfly, lane k keeps pair k, SwiGLU at the end
//   1 the butterflies deferred over groups of 2 items and reduced transposed (same bits)
//   2 the same over groups of 4 items (same bits)
//   3 probe: no butterfly (each lane's partial sum taken as the row's)
//   4 probe: no integer-to-float conversion in the unit (the int's bits taken as a float)
//   5 x in registers (units lane + 32 i, as the head kernel does), lane layout (same bits)
//   6 probe: only the weight and scale loads and one fmaf a unit (no x, no integer dot)
//   7 the kernel's loop with U and G known only at run time (as matvec_resident.cu has them)
//   8 two items a step, their chains side by side (same bits)
//   9 two items a step with x's unit read once for the four rows (same bits)
//  10 four items a step, x's unit read once for the eight rows, weights by half chunks (same bits)
//  11 two items a step as 9, weights by half chunks (same bits)
//  12 three items a step, x read once for six rows, weights by half chunks (same bits)
//  13 probe: the unit's six dp2a / dp4a replaced by three-input integer adds (IADD3, the ALU)
//  14 probe: the unit's six dp2a / dp4a replaced by six IMADs (the FMA pipe's integer path)
//  15 probe: a numerics-contract change, two items a step: lane l takes group l (8 units), the
//     group's integer dot products chained in int32 and converted, scaled and accumulated once a
//     group instead of once a unit (x quantized per group; other numbers, same loads)
constexpr const char* kNames[] = {
    "kernel's loop (dot2_fast, paired butterfly)", "butterflies deferred, groups of 2 items",
    "butterflies deferred, groups of 4 items",      "probe: no butterfly",
    "probe: no int-to-float conversion",            "x in registers",
    "probe: weight loads + one fmaf a unit only",   "kernel's loop, U and G at run time",
    "two items a step",                             "two items a step, x read once for 4 rows",
    "four items a step, x once for 8 rows, halves",  "two items a step, x once for 4 rows, halves",
    "three items a step, x once for 6 rows, halves", "probe: dp2a/dp4a as IADD3",
    "probe: dp2a/dp4a as IMAD",                     "probe: integers summed a group, 2 items a step"};
constexpr bool kSameBits[] = {true, true, true, false, false, true, false, true, true, true, true, true, true, false, false, false};

// The unit without its conversion (probe 4).
__device__ __forceinline__ float unit_q4_noconv(uint32_t w, uint4 a, uint4 b) {
  const int lo = int(w & 0x0F0F0F0Fu), hi = int((w >> 4) & 0x0F0F0F0Fu);
  const int sh = __dp2a_hi(int(a.w), hi, __dp2a_lo(int(a.z), hi, __dp2a_hi(int(a.y), lo, __dp2a_lo(int(a.x), lo, 0))));
  const int sl = __dp4a(hi, int(b.y), __dp4a(lo, int(b.x), 0));
  return __int_as_float(sh * 256 + sl) * __uint_as_float(b.z);
}

// The unit with its integer dot products replaced (probes 13 and 14): the same operands and a
// dependency chain of the same shape, on other instructions.
template <int PROBE>
__device__ __forceinline__ float unit_q4_alt(uint32_t w, uint4 a, uint4 b) {
  const int lo = int(w & 0x0F0F0F0Fu), hi = int((w >> 4) & 0x0F0F0F0Fu);
  int sh, sl;
  if constexpr (PROBE == 13) {
    sh = int(a.x) + lo + int(a.y);
    sh = sh + hi + int(a.z);
    sh = sh + hi + int(a.w);
    sl = lo + int(b.x) + hi;
    sl = sl + int(b.y);
  } else {
    sh = int(a.x) * lo + int(a.y);
    sh = sh * lo + int(a.z);
    sh = sh * hi + int(a.w);
    sh = sh * hi;
    sl = lo * int(b.x) + hi;
    sl = sl * int(b.y);
  }
  return __int2float_rn(sh * 256 + sl) * __uint_as_float(b.z);
}

// One item's two rows (gate row j, up row j) to their lanes' partial sums (before the butterfly),
// in dot2_fast's order; PROBE 4 drops the conversion, 6 the integer dot, 13 / 14 swap the integer
// dot products; 5 takes x from registers (xr) instead of shared memory.
template <int PROBE>
__device__ __forceinline__ void partials(const uint32_t* wa, const unsigned short* sa, const unsigned short* ba,
                                         const uint32_t* wb, const unsigned short* sb, const unsigned short* bb,
                                         const uint4* xa, const uint4* xb, const float* xg, int lane, float& pa,
                                         float& pb, const XRegs<>* xr = nullptr) {
  const uint4* wa4 = reinterpret_cast<const uint4*>(wa) + lane;
  const uint4* wb4 = reinterpret_cast<const uint4*>(wb) + lane;
  const uint4 a0 = wa4[0], a1 = wa4[32], b0 = wb4[0], b1 = wb4[32];
  const uint4 s_a = reinterpret_cast<const uint4*>(sa)[lane >> 3];
  const uint4 s_b = reinterpret_cast<const uint4*>(sb)[lane >> 3];
  const uint32_t va[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
  const uint32_t vb[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
  const uint32_t swa[4] = {s_a.x, s_a.y, s_a.z, s_a.w}, swb[4] = {s_b.x, s_b.y, s_b.z, s_b.w};
  float acc_a = 0.0f, acc_b = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float fa = i & 1 ? bf16_hi(swa[i >> 1]) : bf16_lo(swa[i >> 1]);
    const float fb = i & 1 ? bf16_hi(swb[i >> 1]) : bf16_lo(swb[i >> 1]);
    if constexpr (PROBE == 6) {
      acc_a = fmaf(fa, __uint_as_float(va[i]), acc_a);
      acc_b = fmaf(fb, __uint_as_float(vb[i]), acc_b);
    } else {
      const uint4 x0 = PROBE == 5 ? xr->a[i] : xa[lane + 32 * i];
      const uint4 x1 = PROBE == 5 ? make_uint4(xr->b0[i], xr->b1[i], xr->step[i], 0u) : xb[lane + 32 * i];
      if constexpr (PROBE == 4) {
        acc_a = fmaf(fa, unit_q4_noconv(va[i], x0, x1), acc_a);
        acc_b = fmaf(fb, unit_q4_noconv(vb[i], x0, x1), acc_b);
      } else if constexpr (PROBE == 13 || PROBE == 14) {
        acc_a = fmaf(fa, unit_q4_alt<PROBE>(va[i], x0, x1), acc_a);
        acc_b = fmaf(fb, unit_q4_alt<PROBE>(vb[i], x0, x1), acc_b);
      } else {
        acc_a = fmaf(fa, unit_q4(va[i], x0, x1), acc_a);
        acc_b = fmaf(fb, unit_q4(vb[i], x0, x1), acc_b);
      }
    }
  }
  const float bias_a = fmaf(__uint_as_float(uint32_t(ba[lane]) << 16), xg[lane], 0.0f);
  const float bias_b = fmaf(__uint_as_float(uint32_t(bb[lane]) << 16), xg[lane], 0.0f);
  pa = acc_a + bias_a;
  pb = acc_b + bias_b;
}

// Two items (rows a, b and c, d) with x's unit read once for the four (variant 9).
__device__ __forceinline__ void partials4(const uint32_t* const (&w)[4], const unsigned short* const (&sc)[4],
                                          const unsigned short* const (&bi)[4], const uint4* xa, const uint4* xb,
                                          const float* xg, int lane, float (&p)[4]) {
  uint32_t v[4][8];
  uint32_t sw[4][4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const uint4* w4 = reinterpret_cast<const uint4*>(w[r]) + lane;
    const uint4 a0 = w4[0], a1 = w4[32];
    const uint4 sr = reinterpret_cast<const uint4*>(sc[r])[lane >> 3];
    v[r][0] = a0.x, v[r][1] = a0.y, v[r][2] = a0.z, v[r][3] = a0.w;
    v[r][4] = a1.x, v[r][5] = a1.y, v[r][6] = a1.z, v[r][7] = a1.w;
    sw[r][0] = sr.x, sw[r][1] = sr.y, sw[r][2] = sr.z, sw[r][3] = sr.w;
  }
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint4 x0 = xa[lane + 32 * i], x1 = xb[lane + 32 * i];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float f = i & 1 ? bf16_hi(sw[r][i >> 1]) : bf16_lo(sw[r][i >> 1]);
      acc[r] = fmaf(f, unit_q4(v[r][i], x0, x1), acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) p[r] = acc[r] + fmaf(__uint_as_float(uint32_t(bi[r][lane]) << 16), xg[lane], 0.0f);
}

// Probe 15: four rows, lane l one group of 64 inputs (8 units; K 2048 has 32 groups): the
// group's six integer dot products a unit chain on in int32 across its 8 units, then one
// conversion, one scaling by x's step and one fmaf by the group's scale. x's units are read
// at k * 32 + lane (a group-interleaved layout; which unit does not matter to the timing).
__device__ __forceinline__ void partials4_group(const uint32_t* const (&w)[4], const unsigned short* const (&sc)[4],
                                                const unsigned short* const (&bi)[4], const uint4* xa, const uint4* xb,
                                                const float* xg, int lane, float (&p)[4]) {
  uint32_t v[4][8];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const uint4* w4 = reinterpret_cast<const uint4*>(w[r]) + lane;
    const uint4 a0 = w4[0], a1 = w4[32];
    v[r][0] = a0.x, v[r][1] = a0.y, v[r][2] = a0.z, v[r][3] = a0.w;
    v[r][4] = a1.x, v[r][5] = a1.y, v[r][6] = a1.z, v[r][7] = a1.w;
  }
  int sh[4] = {0, 0, 0, 0}, sl[4] = {0, 0, 0, 0};
  float step = 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const uint4 a = xa[k * 32 + lane], b = xb[k * 32 + lane];
    if (k == 0) step = __uint_as_float(b.z);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int lo = int(v[r][k] & 0x0F0F0F0Fu), hi = int((v[r][k] >> 4) & 0x0F0F0F0Fu);
      sh[r] = __dp2a_hi(int(a.w), hi, __dp2a_lo(int(a.z), hi, __dp2a_hi(int(a.y), lo, __dp2a_lo(int(a.x), lo, sh[r]))));
      sl[r] = __dp4a(hi, int(b.y), __dp4a(lo, int(b.x), sl[r]));
    }
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const float f = __uint_as_float(uint32_t(sc[r][lane]) << 16);
    const float acc = fmaf(f, __int2float_rn(sh[r] * 256 + sl[r]) * step, 0.0f);
    p[r] = acc + fmaf(__uint_as_float(uint32_t(bi[r][lane]) << 16), xg[lane], 0.0f);
  }
}

// NR rows with x's unit read once for all, a lane's words and scales loaded by half chunks
// (units lane + 32 i, i < 4, then i >= 4) to keep the registers for NR rows (variants 10-12).
template <int NR>
__device__ __forceinline__ void partials_n(const uint32_t* const (&w)[NR], const unsigned short* const (&sc)[NR],
                                           const unsigned short* const (&bi)[NR], const uint4* xa, const uint4* xb,
                                           const float* xg, int lane, float (&p)[NR]) {
  float acc[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) acc[r] = 0.0f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t v[NR][4], sw[NR][2];
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      const uint4 a = reinterpret_cast<const uint4*>(w[r])[lane + 32 * h];
      const uint2 s2 = reinterpret_cast<const uint2*>(sc[r])[(lane >> 3) * 2 + h];
      v[r][0] = a.x, v[r][1] = a.y, v[r][2] = a.z, v[r][3] = a.w;
      sw[r][0] = s2.x, sw[r][1] = s2.y;
    }
#pragma unroll
    for (int ii = 0; ii < 4; ++ii) {
      const int i = 4 * h + ii;
      const uint4 x0 = xa[lane + 32 * i], x1 = xb[lane + 32 * i];
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        const float f = ii & 1 ? bf16_hi(sw[r][ii >> 1]) : bf16_lo(sw[r][ii >> 1]);
        acc[r] = fmaf(f, unit_q4(v[r][ii], x0, x1), acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < NR; ++r) p[r] = acc[r] + fmaf(__uint_as_float(uint32_t(bi[r][lane]) << 16), xg[lane], 0.0f);
}

// NV = 2^P values per lane reduced by the canonical butterfly, transposed: at step m a lane keeps
// the half of its values its bit m selects and adds the partner's copy of that half (the same adds
// as the butterfly of each value: every add commutes). Afterwards lane l holds value l >> (5 - P).
template <int NV>
__device__ __forceinline__ float reduce_transposed(float (&v)[NV], int lane) {
  int n = NV;
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) {
    if (n > 1) {
      const bool upper = lane & m;
      const int h = n / 2;
#pragma unroll
      for (int i = 0; i < NV / 2; ++i)
        if (i < h) {
          const float keep = upper ? v[h + i] : v[i], send = upper ? v[i] : v[h + i];
          v[i] = keep + __shfl_xor_sync(0xffffffffu, send, m);
        }
      n = h;
    } else {
      v[0] = v[0] + __shfl_xor_sync(0xffffffffu, v[0], m);
    }
  }
  return v[0];
}

struct Smem {
  const uint4* xa;
  const uint4* xb;
  const float* xg;
  const unsigned char* w;  // item j: gate row (words, scales, biases), then up row
};

__device__ __forceinline__ const uint32_t* row_w(const Smem& s, int j, int which) {
  return reinterpret_cast<const uint32_t*>(s.w + (2 * size_t(j) + which) * kRowBytes);
}
__device__ __forceinline__ const unsigned short* row_s(const Smem& s, int j, int which) {
  return reinterpret_cast<const unsigned short*>(s.w + (2 * size_t(j) + which) * kRowBytes + kK / 2);
}
__device__ __forceinline__ const unsigned short* row_b(const Smem& s, int j, int which) {
  return row_s(s, j, which) + kG;
}

template <int V, int kWarps>
__device__ __forceinline__ void rows(const Smem& s, int items, float* ys, int lane, int warp, int U, int G) {
  float keep_g = 0.0f, keep_u = 0.0f;
  int kept = 0, j0 = warp;
  auto flush = [&] {
    if (lane < kept) ys[j0 + lane * kWarps] = dq::num::silu(keep_g) * keep_u;
  };
  auto keep = [&](float g0, float uv, int j) {
    if (lane == kept) keep_g = g0, keep_u = uv;
    if (++kept == 32) {
      flush();
      kept = 0;
      j0 = j + kWarps;
    }
  };
  if constexpr (V >= 10 && V <= 12) {
    constexpr int IPS = V == 10 ? 4 : V == 11 ? 2 : 3, NR = 2 * IPS;
    for (int j = warp; j < items; j += IPS * kWarps) {
      int jj[IPS];
#pragma unroll
      for (int k = 0; k < IPS; ++k) jj[k] = j + k * kWarps < items ? j + k * kWarps : j;
      const uint32_t* w[NR];
      const unsigned short* sc[NR];
      const unsigned short* bi[NR];
#pragma unroll
      for (int r = 0; r < NR; ++r) w[r] = row_w(s, jj[r / 2], r % 2), sc[r] = row_s(s, jj[r / 2], r % 2), bi[r] = row_b(s, jj[r / 2], r % 2);
      float p[NR];
      partials_n<NR>(reinterpret_cast<const uint32_t* const(&)[NR]>(w), reinterpret_cast<const unsigned short* const(&)[NR]>(sc),
                     reinterpret_cast<const unsigned short* const(&)[NR]>(bi), s.xa, s.xb, s.xg, lane, p);
      float gv[IPS];
#pragma unroll
      for (int k = 0; k < IPS; ++k) gv[k] = warp_butterfly2(p[2 * k], p[2 * k + 1], lane);
#pragma unroll
      for (int k = 0; k < IPS; ++k)
        if (k == 0 || jj[k] != j) keep(__shfl_sync(0xffffffffu, gv[k], 0), __shfl_sync(0xffffffffu, gv[k], 16), jj[k]);
    }
    flush();
  } else if constexpr (V == 8 || V == 9 || V == 15) {
    for (int j = warp; j < items; j += 2 * kWarps) {
      const int j2 = j + kWarps < items ? j + kWarps : j;  // (the last item twice when odd)
      float p[4];
      if constexpr (V == 8) {
        partials<0>(row_w(s, j, 0), row_s(s, j, 0), row_b(s, j, 0), row_w(s, j, 1), row_s(s, j, 1), row_b(s, j, 1),
                    s.xa, s.xb, s.xg, lane, p[0], p[1]);
        partials<0>(row_w(s, j2, 0), row_s(s, j2, 0), row_b(s, j2, 0), row_w(s, j2, 1), row_s(s, j2, 1),
                    row_b(s, j2, 1), s.xa, s.xb, s.xg, lane, p[2], p[3]);
      } else {
        const uint32_t* const w[4] = {row_w(s, j, 0), row_w(s, j, 1), row_w(s, j2, 0), row_w(s, j2, 1)};
        const unsigned short* const sc[4] = {row_s(s, j, 0), row_s(s, j, 1), row_s(s, j2, 0), row_s(s, j2, 1)};
        const unsigned short* const bi[4] = {row_b(s, j, 0), row_b(s, j, 1), row_b(s, j2, 0), row_b(s, j2, 1)};
        if constexpr (V == 15) partials4_group(w, sc, bi, s.xa, s.xb, s.xg, lane, p);
        else partials4(w, sc, bi, s.xa, s.xb, s.xg, lane, p);
      }
      const float gv = warp_butterfly2(p[0], p[1], lane), gv2 = warp_butterfly2(p[2], p[3], lane);
      const float g0 = __shfl_sync(0xffffffffu, gv, 0), uv = __shfl_sync(0xffffffffu, gv, 16);
      const float g2 = __shfl_sync(0xffffffffu, gv2, 0), u2 = __shfl_sync(0xffffffffu, gv2, 16);
      keep(g0, uv, j);
      if (j2 != j) keep(g2, u2, j2);
    }
    flush();
  } else if constexpr (V == 0 || V == 3 || V == 4 || V == 6 || V == 5 || V == 7 || V == 13 || V == 14) {
    XRegs<> xr;
    if constexpr (V == 5) load_xregs(xr, s.xa, s.xb, s.xg, kG, lane);
    for (int j = warp; j < items; j += kWarps) {
      float gv;
      if constexpr (V == 0 || V == 7) {
        gv = dot2_fast<6, true>(row_w(s, j, 0), row_s(s, j, 0), row_b(s, j, 0), row_w(s, j, 1), row_s(s, j, 1),
                                row_b(s, j, 1), V == 7 ? U : kU, V == 7 ? G : kG, 6, s.xa, s.xb, s.xg, lane);
      } else {
        float pa, pb;
        partials<V>(row_w(s, j, 0), row_s(s, j, 0), row_b(s, j, 0), row_w(s, j, 1), row_s(s, j, 1), row_b(s, j, 1),
                    s.xa, s.xb, s.xg, lane, pa, pb, &xr);
        gv = V == 3 ? (lane & 16 ? pb : pa) : warp_butterfly2(pa, pb, lane);
      }
      const float g0 = __shfl_sync(0xffffffffu, gv, 0);
      const float uv = __shfl_sync(0xffffffffu, gv, 16);
      if (lane == kept) keep_g = g0, keep_u = uv;
      if (++kept == 32) {
        flush();
        kept = 0;
        j0 = j + kWarps;
      }
    }
    flush();
  } else {
    // Groups of NG items: the partials of NG items, then one transposed reduction. Value k is
    // item k's gate, NG + k its up; after the reduction lane l holds value l >> (5 - P) (P =
    // log2(2 NG)), so item k's gate sits in lane k << (5 - P) and its up 16 lanes higher.
    constexpr int NG = V == 1 ? 2 : 4, NV = 2 * NG, SH = NV == 4 ? 3 : 2;
    for (int j = warp; j < items; j += NG * kWarps) {
      float v[NV];
#pragma unroll
      for (int k = 0; k < NG; ++k) {
        const int jk = j + k * kWarps;
        if (jk < items)
          partials<0>(row_w(s, jk, 0), row_s(s, jk, 0), row_b(s, jk, 0), row_w(s, jk, 1), row_s(s, jk, 1),
                      row_b(s, jk, 1), s.xa, s.xb, s.xg, lane, v[k], v[NG + k]);
        else
          v[k] = v[NG + k] = 0.0f;
      }
      const float r = reduce_transposed<NV>(v, lane);
      const float up = __shfl_xor_sync(0xffffffffu, r, 16);  // lanes below 16: the item's up
#pragma unroll
      for (int k = 0; k < NG; ++k) {
        const float g0 = __shfl_sync(0xffffffffu, r, k << SH), u0 = __shfl_sync(0xffffffffu, up, k << SH);
        if (j + k * kWarps < items) {
          if (lane == kept) keep_g = g0, keep_u = u0;
          if (++kept == 32) {
            flush();
            kept = 0;
            j0 = j + (k + 1) * kWarps;
          }
        }
      }
    }
    flush();
  }
}

template <int V, int kWarps>
__global__ void __launch_bounds__(kWarps * 32, 16 / kWarps)
    rows_kernel(const float* x, const unsigned char* w, int items, int reps, float* y, long long* cyc, int U, int G) {
  extern __shared__ __align__(128) unsigned char smem[];
  uint4* xa = reinterpret_cast<uint4*>(smem);
  uint4* xb = xa + kU;
  float* xg = reinterpret_cast<float*>(xb + kU);
  unsigned char* ws = reinterpret_cast<unsigned char*>(xg + kG);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int u = threadIdx.x; u < kU; u += blockDim.x) {
    const float4* x4 = reinterpret_cast<const float4*>(x) + 2 * u;
    make_unit_q4(x4[0], x4[1], xa[u], xb[u]);
  }
  for (int g = threadIdx.x; g < kG; g += blockDim.x) {
    float sg = 0.0f;
    for (int u = 8 * g; u < 8 * g + 8; ++u) {
      float p = 0.0f;
      for (int k = 0; k < 8; ++k) p = p + x[8 * u + k];
      sg = sg + p;
    }
    xg[g] = sg;
  }
  const size_t bytes = size_t(items) * 2 * kRowBytes;
  for (size_t i = threadIdx.x * 16; i < bytes; i += blockDim.x * 16)
    *reinterpret_cast<uint4*>(ws + i) = *reinterpret_cast<const uint4*>(w + i);
  __syncthreads();
  const Smem s{xa, xb, xg, ws};
  float* ys = y + size_t(blockIdx.x) * items;
  for (int r = 0; r < reps; ++r) {
    __syncthreads();
    const long long t0 = clock64();
    rows<V, kWarps>(s, items, ys, lane, warp, U, G);
    __syncthreads();
    if (threadIdx.x == 0) cyc[size_t(blockIdx.x) * reps + r] = clock64() - t0;
  }
}

using Kernel = void (*)(const float*, const unsigned char*, int, int, float*, long long*, int, int);
struct Entry {
  int v, warps;
  Kernel k;
};
const Entry kEntries[] = {{0, 8, rows_kernel<0, 8>}, {1, 8, rows_kernel<1, 8>}, {2, 8, rows_kernel<2, 8>},
                          {3, 8, rows_kernel<3, 8>}, {4, 8, rows_kernel<4, 8>}, {5, 8, rows_kernel<5, 8>},
                          {6, 8, rows_kernel<6, 8>}, {7, 8, rows_kernel<7, 8>}, {8, 8, rows_kernel<8, 8>},
                          {9, 8, rows_kernel<9, 8>}, {0, 16, rows_kernel<0, 16>}, {8, 16, rows_kernel<8, 16>},
                          {9, 16, rows_kernel<9, 16>}, {0, 4, rows_kernel<0, 4>}, {9, 4, rows_kernel<9, 4>},
                          {10, 8, rows_kernel<10, 8>}, {11, 8, rows_kernel<11, 8>}, {12, 8, rows_kernel<12, 8>},
                          {10, 4, rows_kernel<10, 4>}, {13, 8, rows_kernel<13, 8>}, {14, 8, rows_kernel<14, 8>},
                          {15, 8, rows_kernel<15, 8>}, {15, 16, rows_kernel<15, 16>}};

}  // namespace

int main(int argc, char** argv) {
  int items = 48, reps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--items")) items = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: deltaq-bench-rows [--items N] [--reps R]\n");
      return 2;
    }
  }
  const size_t smem = 2 * kU * 16 + kG * 4 + size_t(items) * 2 * kRowBytes;
  if (items < 1 || items > 80 || reps < 1 || smem > 200 * 1024) {
    std::fprintf(stderr, "deltaq-bench-rows: --items 1..80 (shared memory), --reps >= 1\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const int blocks = prop.multiProcessorCount;
  int khz = 0;
  CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  // x: values of the size a normalised activation has; weights: random words, scales and
  // biases random bf16 of the size MLX's have. Each block gets its own rows.
  uint64_t st = 0x9E3779B97F4A7C15ull;
  auto next = [&] {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    return uint32_t(st >> 32);
  };
  auto uni = [&] { return (next() >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f; };
  std::vector<float> hx(kK);
  for (float& v : hx) v = uni() * 3.0f;
  std::vector<unsigned char> hw(size_t(blocks) * items * 2 * kRowBytes);
  for (size_t r = 0; r < size_t(blocks) * items * 2; ++r) {
    unsigned char* p = hw.data() + r * kRowBytes;
    for (int i = 0; i < kK / 8; ++i) {
      const uint32_t v = next();
      std::memcpy(p + 4 * i, &v, 4);
    }
    for (int g = 0; g < 2 * kG; ++g) {
      const float f = (g < kG ? 0.02f : -0.15f) * (0.5f + 0.5f * (uni() + 1.0f));
      uint32_t b;
      std::memcpy(&b, &f, 4);
      const uint16_t h = uint16_t(b >> 16);
      std::memcpy(p + kK / 2 + 2 * g, &h, 2);
    }
  }
  float *dx, *dy;
  unsigned char* dw;
  long long* dc;
  CK(cudaMalloc(&dx, hx.size() * 4));
  CK(cudaMalloc(&dw, hw.size()));
  CK(cudaMalloc(&dy, size_t(blocks) * items * 4));
  CK(cudaMalloc(&dc, size_t(blocks) * reps * 8));
  CK(cudaMemcpy(dx, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dw, hw.data(), hw.size(), cudaMemcpyHostToDevice));
  for (const Entry& e : kEntries)
    CK(cudaFuncSetAttribute(e.k, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  std::printf("deltaq-bench-rows on %s (%d SMs, %d MHz): gate/up's rows, K %d, %d items a block (%d a warp at 8 "
              "warps; W: warps a block), one block an SM, from shared memory; cycles of a block's rows (median over %d reps x %d "
              "blocks)\n",
              prop.name, blocks, khz / 1000, kK, items, (items + 7) / 8, reps,
              blocks);
  std::vector<float> y0;
  for (const Entry& e : kEntries) {
    const int v = e.v;
    CK(cudaMemset(dy, 0, size_t(blocks) * items * 4));
    e.k<<<blocks, e.warps * 32, smem>>>(dx, dw, items, reps, dy, dc, kU, kG);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<long long> c(size_t(blocks) * reps);
    CK(cudaMemcpy(c.data(), dc, c.size() * 8, cudaMemcpyDeviceToHost));
    std::vector<float> y(size_t(blocks) * items);
    CK(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));
    // Skip each block's first rep (its code and data come in cold).
    std::vector<long long> warm;
    for (int b = 0; b < blocks; ++b)
      for (int r = reps > 1 ? 1 : 0; r < reps; ++r) warm.push_back(c[size_t(b) * reps + r]);
    std::sort(warm.begin(), warm.end());
    const double med = double(warm[warm.size() / 2]);
    const double first = double(c[0]);
    const int per_warp = (items + e.warps - 1) / e.warps;
    std::string check;
    if (v == 0 && e.warps == 8) {
      y0 = y;
      check = "the reference";
    } else if (kSameBits[v]) {
      check = std::memcmp(y.data(), y0.data(), y.size() * 4) == 0 ? "same bits" : "BITS DIFFER";
    } else {
      check = "(probe: other numbers)";
    }
    std::printf("  %d %2dw %-42s %8.0f cycles (%.2f us), %6.0f a warp's item; first rep %8.0f; %s\n", v, e.warps,
                kNames[v], med, med / (khz / 1000.0), med / per_warp, first, check.c_str());
  }
  return 0;
}
