// The numerics contract (docs/numerics.md): every op's floating-point evaluation order, written
// once as scalar code usable from the host and from CUDA kernels. The fast CPU kernels and the
// CUDA kernels reproduce these functions bit for bit. Rules:
//   - every fused multiply-add is spelled fmaf; plain a*b+c stays two roundings
//     (compile with -ffp-contract=off / nvcc -fmad=false);
//   - reductions use the 32-lane order below (lane = index mod 32, sequential per lane, then
//     a fixed butterfly), which maps to a CUDA warp and to 16/8-wide CPU SIMD;
//   - exp/log are our own (library expf differs between glibc and CUDA); sqrtf and '/' are
//     IEEE correctly rounded on both sides.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/dtype.h"

namespace dq::num {

constexpr int kLanes = 32;

// ---- elementary functions -------------------------------------------------------------------

DQ_HD float pow2i(int n) {  // 2^n for n in [-126, 127], exact
  return bits_to_f32(uint32_t(n + 127) << 23);
}

// exp(x), about 1 ulp (Cephes-style reduction and polynomial), deterministic.
DQ_HD float exp(float x) {
  if (x != x) return x;
  if (x > 88.72283935546875f) return INFINITY;
  if (x < -103.97208404541015625f) return 0.0f;
  float n = rintf(x * 1.44269502162933349609375f);
  float r = fmaf(n, -0.693359375f, x);
  r = fmaf(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fmaf(p, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  float r2 = r * r;
  p = fmaf(p, r2, r);
  p = p + 1.0f;
  int e = int(n);
  // Scale by 2^e in two exact steps so that results near the subnormal range stay right.
  if (e > 127) return (p * pow2i(127)) * pow2i(e - 127);
  if (e < -126) return (p * pow2i(-126)) * pow2i(e + 126);
  return p * pow2i(e);
}

// log(x) for x > 0 finite (Cephes-style), deterministic. log(0) = -inf, log(<0 or NaN) = NaN.
DQ_HD float log(float x) {
  if (!(x > 0.0f)) return x == 0.0f ? -INFINITY : NAN;
  if (x == INFINITY) return x;
  uint32_t u = f32_to_bits(x);
  int e = 0;
  if (u < 0x00800000u) {  // subnormal: normalise
    x = x * 16777216.0f;
    u = f32_to_bits(x);
    e = -24;
  }
  e += int((u >> 23) & 0xff) - 126;
  float m = bits_to_f32((u & 0x007fffffu) | 0x3f000000u);  // [0.5, 1)
  if (m < 0.70710678118654752440f) {
    e -= 1;
    m = m + m - 1.0f;
  } else {
    m = m - 1.0f;
  }
  float z = m * m;
  float y = 7.0376836292e-2f;
  y = fmaf(y, m, -1.1514610310e-1f);
  y = fmaf(y, m, 1.1676998740e-1f);
  y = fmaf(y, m, -1.2420140846e-1f);
  y = fmaf(y, m, 1.4249322787e-1f);
  y = fmaf(y, m, -1.6668057665e-1f);
  y = fmaf(y, m, 2.0000714765e-1f);
  y = fmaf(y, m, -2.4999993993e-1f);
  y = fmaf(y, m, 3.3333331174e-1f);
  y = (y * m) * z;
  float fe = float(e);
  y = fmaf(fe, -2.12194440e-4f, y);
  y = fmaf(z, -0.5f, y);
  return fmaf(fe, 0.693359375f, m + y);
}

// log(1 + x) for x >= 0, accurate for tiny x.
DQ_HD float log1p(float x) {
  float u = 1.0f + x;
  if (u == 1.0f) return x;
  if (u == INFINITY) return num::log(u);
  return num::log(u) * (x / (u - 1.0f));
}

DQ_HD float sigmoid(float x) { return 1.0f / (1.0f + num::exp(-x)); }
DQ_HD float silu(float x) { return x / (1.0f + num::exp(-x)); }
// PyTorch's softplus (beta 1, threshold 20).
DQ_HD float softplus(float x) { return x > 20.0f ? x : num::log1p(num::exp(x)); }
// 1/sqrt(mean + eps) for a sum of squares over n values.
// Sort key of (value, index) for TopK: a larger key is a larger value, then a lower index.
// Values that are not > -inf (NaN, -inf) all get value key 0, below every number; -0 == +0.
DQ_HD uint64_t top_key(float v, int i) {
  uint32_t b = 0;
  if (v > -INFINITY) {
    b = f32_to_bits(v == 0.0f ? 0.0f : v);
    b ^= (b >> 31) ? 0xFFFFFFFFu : 0x80000000u;
  }
  return (uint64_t(b) << 32) | (0xFFFFFFFFu - uint32_t(i));
}
DQ_HD int top_key_index(uint64_t key) { return int(0xFFFFFFFFu - uint32_t(key)); }

DQ_HD float rms_inv(float sum_sq, int n, float eps) { return 1.0f / sqrtf(sum_sq / float(n) + eps); }

// ---- the 32-lane reduction order ----------------------------------------------------------------

// Sums lane[0..31] in the butterfly order a warp's xor-shuffles produce. Overwrites lane.
DQ_HD float butterfly32(float* lane) {
  for (int m = 16; m >= 1; m >>= 1)
    for (int l = 0; l < m; ++l) lane[l] = lane[l] + lane[l + m];
  return lane[0];
}

// butterfly32 of values that arrive one lane at a time, lanes rev5(0), rev5(1), ..., rev5(31)
// (bit 4 of a lane, its first partner's, is bit 0 of its arrival): a binary counter of pending
// sums, level k holding the first half of a level-k sum, so that every addition is one of
// butterfly32's, operands in its order. CUDA's tensor-core prefill runs the lanes' chains one
// after another and combines them this way.
DQ_HD constexpr int rev5(int s) {
  return ((s & 1) << 4) | ((s & 2) << 2) | (s & 4) | ((s & 8) >> 2) | ((s & 16) >> 4);
}
struct LaneTree {
  float pend[5];
  // Arrival s (0..31) with lane rev5(s)'s value: true after the last, with the sum in *out.
  DQ_HD bool push(int s, float v, float* out) {
    int k = 0;
    for (; k < 5 && ((s >> k) & 1); ++k) v = pend[k] + v;
    if (k < 5) {
      pend[k] = v;
      return false;
    }
    *out = v;
    return true;
  }
};

// Written block by block so a compiler can vectorise the 32 independent lanes.
DQ_HD float sum_squares(const float* x, int n) {
  float lane[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] = fmaf(x[j + l], x[j + l], lane[l]);
  for (int l = 0; j + l < n; ++l) lane[l] = fmaf(x[j + l], x[j + l], lane[l]);
  return butterfly32(lane);
}

DQ_HD float dot(const float* a, const float* b, int n) {
  float lane[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] = fmaf(a[j + l], b[j + l], lane[l]);
  for (int l = 0; j + l < n; ++l) lane[l] = fmaf(a[j + l], b[j + l], lane[l]);
  return butterfly32(lane);
}

DQ_HD float sum(const float* x, int n) {
  float lane[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] = lane[l] + x[j + l];
  for (int l = 0; j + l < n; ++l) lane[l] = lane[l] + x[j + l];
  return butterfly32(lane);
}

// ---- weight rows --------------------------------------------------------------------------------
// A weight row of K inputs is read in units of 8 consecutive inputs; unit u belongs to lane u % 32.
// Dense (bf16/f16/f32) row:   p_u = chain_k fmaf(w_k, x_k, p) from 0;  lane += p_u.
// Affine-quantized row (MLX: W = s*q + b per group of gs inputs):
//   p_u = the unit dot Σ_k q_k x_k: 4-bit, exact integers (unit_dot_q4 below);
//         8-bit, chain_k fmaf(q_k, x_k, p) from 0;
//   lane[u % 32] = fmaf(s_g(u), p_u, lane);
//   bias: blane[g % 32] = fmaf(b_g, X_g, blane)  with X_g the group sum of x (group_sums);
//   y = butterfly32(lane + blane).

// The 4-bit unit dot in exact integers. A unit's 8 inputs share one scale 2^(E-21), where E is
// the exponent of their largest magnitude M (2^E <= M < 2^(E+1)): xi_k = rint(x_k * 2^(21-E))
// (exact scaling, one rounding to an integer, |xi_k| <= 2^22), so Σ_k q_k xi_k with q_k < 16 is
// exact in int32 whatever the order, and p_u = float(Σ_k q_k xi_k) * 2^(E-21) (one rounding, then
// an exact scaling). x keeps 22 bits below its unit's largest value: about fp32's own rounding of
// the old fmaf chain (docs/numerics.md has the measured accuracy). Why integers: the unit becomes
// a few int8 dot-product instructions (VNNI vpdpbusd on the CPU, dp4a on CUDA) instead of eight
// int->float conversions and a dependent chain of eight fmaf. A unit whose M is below 2^-100 is
// zero; a unit with a non-finite input is NaN.
struct UnitInts {
  int32_t xi[8];
  float step;  // 2^(E-21); 0 for a zero unit, NaN for a non-finite one
};

// rint(v) for |v| <= 2^22 (to nearest, ties to even, as rintf) without a float-to-integer
// conversion (on CUDA a quarter-rate instruction with a long latency, eight a unit): v + 1.5 * 2^23
// lies in [2^23, 2^24], where a float's step is 1, so the sum's rounding is rint's and its low
// mantissa bits are the integer plus 2^22. v is x * 2^(21-E), exact (a power of two) unless it
// is far below 1/2, so a fused multiply-add gives the same sum.
DQ_HD int32_t rint_unit_int(float v) {
  return int32_t(f32_to_bits(v + 12582912.0f)) - 0x4B400000;
}

DQ_HD UnitInts quantize_unit(const float* x) {
  UnitInts q{};
  uint32_t mbits = 0;  // bits of |x| order like the values
  bool finite = true;
  for (int k = 0; k < 8; ++k) {
    const uint32_t b = f32_to_bits(x[k]) & 0x7FFFFFFFu;
    finite = finite && b < 0x7F800000u;
    mbits = b > mbits ? b : mbits;
  }
  const uint32_t eb = mbits >> 23;  // biased exponent of M
  if (!finite) {
    q.step = NAN;
  } else if (eb < 27) {  // M < 2^-100 (and zero)
    q.step = 0.0f;
  } else {
    const float up = bits_to_f32((275u - eb) << 23);  // 2^(21-E)
    for (int k = 0; k < 8; ++k) q.xi[k] = rint_unit_int(x[k] * up);
    q.step = bits_to_f32((eb - 21u) << 23);  // 2^(E-21)
  }
  return q;
}

// xi = l1 * 2^16 + l2 * 2^8 + l3 with every limb a signed byte (|xi| <= 2^22: |l1| <= 64); the
// form the int8 dot-product instructions take.
DQ_HD void split_limbs(int32_t xi, int32_t* l1, int32_t* l2, int32_t* l3) {
  const int32_t a = int32_t(int8_t(uint8_t(xi & 0xFF)));
  const int32_t r = (xi - a) / 256;
  const int32_t b = int32_t(int8_t(uint8_t(r & 0xFF)));
  *l3 = a;
  *l2 = b;
  *l1 = (r - b) / 256;
}

// xi = h * 2^11 + l with |h| <= 2048 and -1024 <= l < 1024 (|xi| <= 2^22): both exact in f16, the
// form CUDA's tensor-core prefill takes (8 products q h, or q l, sum below 2^18: exact in f32).
DQ_HD void split_halves(int32_t xi, int32_t* h, int32_t* l) {
  *h = (xi + 1024) >> 11;  // floor
  *l = xi - *h * 2048;
}

// p = float(Σ_k q_k xi_k) * step, q_k the nibbles of `word` (LSB first).
DQ_HD float unit_dot_q4(uint32_t word, const UnitInts& q) {
  int32_t t = 0;
  for (int k = 0; k < 8; ++k) t += int32_t((word >> (4 * k)) & 15u) * q.xi[k];
  return float(t) * q.step;
}

// Storage types of weights and scales: bf16 as uint16_t, f16 as f16_t, f32 as float.
struct f16_t { uint16_t bits; };
DQ_HD float load_f32(const uint16_t* p, int64_t i) { return bf16_to_f32(p[i]); }
DQ_HD float load_f32(const f16_t* p, int64_t i) { return f16_to_f32(p[i].bits); }
DQ_HD float load_f32(const float* p, int64_t i) { return p[i]; }

template <class W>
DQ_HD float dense_dot(const W* w, const float* x, int K) {
  float lane[kLanes] = {};
  for (int u = 0; u < K / 8; ++u) {
    float p = 0.0f;
    for (int k = 0; k < 8; ++k) p = fmaf(load_f32(w, 8 * u + k), x[8 * u + k], p);
    lane[u & 31] = lane[u & 31] + p;
  }
  return butterfly32(lane);
}

// X_g: per unit, the chain sum of its 8 inputs; per group, the chain sum of its units.
DQ_HD void group_sums(const float* x, int K, int gs, float* xg) {
  for (int g = 0; g < K / gs; ++g) {
    float s = 0.0f;
    for (int u = g * gs / 8; u < (g + 1) * gs / 8; ++u) {
      float p = 0.0f;
      for (int k = 0; k < 8; ++k) p = p + x[8 * u + k];
      s = s + p;
    }
    xg[g] = s;
  }
}

// q value k (0..7) of unit u of a row packed LSB-first in 32-bit words.
template <int BITS>
DQ_HD uint32_t unpack_q(const uint32_t* wrow, int u, int k) {
  constexpr int per_word = 32 / BITS;
  int j = 8 * u + k;
  return (wrow[j / per_word] >> (BITS * (j % per_word))) & ((1u << BITS) - 1u);
}

// The row's lanes for any unit dot: unit(u) returns p_u.
template <class S, class UnitDot>
DQ_HD float affine_lanes(const S* srow, const S* brow, const float* xg, int K, int gs, const UnitDot& unit) {
  float lane[kLanes] = {};
  float blane[kLanes] = {};
  for (int u = 0; u < K / 8; ++u) lane[u & 31] = fmaf(load_f32(srow, u * 8 / gs), unit(u), lane[u & 31]);
  for (int g = 0; g < K / gs; ++g) blane[g & 31] = fmaf(load_f32(brow, g), xg[g], blane[g & 31]);
  for (int l = 0; l < kLanes; ++l) lane[l] = lane[l] + blane[l];
  return butterfly32(lane);
}

template <int BITS, class S>
DQ_HD float affine_dot(const uint32_t* wrow, const S* srow, const S* brow, const float* x, const float* xg, int K,
                       int gs) {
  return affine_lanes(srow, brow, xg, K, gs, [&](int u) {
    if constexpr (BITS == 4) {
      return unit_dot_q4(wrow[u], quantize_unit(x + 8 * u));
    } else {
      float p = 0.0f;
      for (int k = 0; k < 8; ++k) p = fmaf(float(unpack_q<BITS>(wrow, u, k)), x[8 * u + k], p);
      return p;
    }
  });
}

// The same row for 4-bit weights when x's units were quantized once for all rows.
template <class S>
DQ_HD float affine_dot_q4(const uint32_t* wrow, const S* srow, const S* brow, const UnitInts* units, const float* xg,
                          int K, int gs) {
  return affine_lanes(srow, brow, xg, K, gs, [&](int u) { return unit_dot_q4(wrow[u], units[u]); });
}

// One dequantized weight (embedding rows): s*q + b, rounded once.
template <int BITS, class S>
DQ_HD float affine_weight(const uint32_t* wrow, const S* srow, const S* brow, int j, int gs) {
  constexpr int per_word = 32 / BITS;
  uint32_t q = (wrow[j / per_word] >> (BITS * (j % per_word))) & ((1u << BITS) - 1u);
  return fmaf(load_f32(srow, j / gs), float(q), load_f32(brow, j / gs));
}

// ---- sampling: the plain temperature draw ---------------------------------------------------------
// Sampling with a temperature and nothing else (no penalties, top-k or top-p; min-p allowed) draws
// from the whole row, so its numbers are defined here, for the host and the device alike:
//   w_i = exp((x_i - m) / T) in fp32 with our exp (m the largest number of the row); 0 for NaN and
//         -inf, and with min-p for w_i < min_p (w is relative to the top, whose weight is 1);
//   sums in double: a chunk of 32 consecutive ids sequentially, a block of 32 chunks sequentially
//         over the chunk sums, the row sequentially over the block sums (Z);
//   the draw: t = u * Z for a uniform u in [0, 1); the first block whose running sum exceeds t,
//         then in it the first chunk (running from the block's start), then the first id
//         (running from the chunk's start). A level where rounding leaves t past the end takes its
//         last part with a positive weight.
// A device computes the chunk sums in parallel and walks the rest in one thread, with the same bits.
constexpr int kDrawChunk = 32;   // ids per chunk
constexpr int kDrawChunks = 32;  // chunks per block

DQ_HD float draw_weight(float x, float m, float T, float min_p) {
  if (!(x > -INFINITY)) return 0.0f;
  const float w = num::exp((x - m) / T);
  return min_p > 0.0f && !(w >= min_p) ? 0.0f : w;
}

// Over v[0..k) from *base: the first j with v[j] > 0 and t < *base + v[j] (the v before it added
// to *base), else the last j with v[j] > 0 (*base at its start); -1 when every v is 0.
DQ_HD int draw_walk(const double* v, int k, double t, double* base) {
  int last = -1;
  double at_last = *base, b = *base;
  for (int j = 0; j < k; ++j) {
    if (!(v[j] > 0.0)) continue;
    const double nb = b + v[j];
    if (t < nb) {
      *base = b;
      return j;
    }
    last = j;
    at_last = b;
    b = nb;
  }
  *base = at_last;
  return last;
}

// The top-k / top-p choice (the sampler's, src/runtime/sampler.cpp) from op::TopK's k pairs,
// descending, with the uniform u; -1 when those pairs do not decide it (the caller then draws
// from the whole row with the same u).
// - top_k >= 1 (k = top_k + 1 pairs): decided when vals[0] is finite and vals[top_k] > -inf (the
//   row has more than top_k numbers); the candidates are the first top_k numbers; with top_p < 1
//   the shortest prefix whose weight reaches top_p times theirs (at least one).
// - top_k <= 0 (top-p alone, k pairs; `total` = the row's weight sum, op::SampleDraw's Z): the
//   shortest prefix whose weight reaches top_p * total, decided when it lies within the k pairs
//   (or the row has fewer than k numbers).
// Weights draw_weight(v, vals[0], T, 0) as doubles, summed in order; min_p keeps w >= min_p;
// then t = u * (their sum) and the first candidate (w > 0) at which the running sum exceeds t,
// else the last one with w > 0.
DQ_HD int32_t top_draw(const int32_t* ids, const float* vals, int k, int top_k, float T, float top_p, float min_p,
                       double total, double u) {
  if (!(vals[0] > -INFINITY && vals[0] < INFINITY)) return -1;
  const float m = vals[0];
  auto w = [&](int i) { return double(draw_weight(vals[i], m, T, 0.0f)); };
  int n = 0;  // candidates: ids[0..n)
  if (top_k >= 1) {
    if (k < top_k + 1 || !(vals[top_k] > -INFINITY)) return -1;
    for (int i = 0; i < top_k; ++i)
      if (vals[i] > -INFINITY) n = i + 1;  // (the numbers come first)
    if (top_p < 1.0f) {
      double z = 0;
      for (int i = 0; i < n; ++i) z += w(i);
      const double target = double(top_p) * z;
      double cum = 0;
      int keep = 0;
      while (keep < n && cum < target) cum += w(keep++);
      n = keep > 1 ? keep : 1;
    }
  } else {
    if (!(total > 0)) return -1;
    const double target = double(top_p) * total;
    double cum = 0;
    for (int i = 0; i < k && cum < target && vals[i] > -INFINITY; ++i) {
      cum += w(i);
      n = i + 1;
    }
    if (cum < target && vals[k - 1] > -INFINITY) return -1;  // the prefix runs past the k pairs
  }
  auto kept = [&](int i) { return !(min_p > 0.0f) || w(i) >= double(min_p); };
  double sum = 0;
  int first = -1;
  for (int i = 0; i < n; ++i)
    if (kept(i)) {
      sum += w(i);
      if (first < 0) first = i;
    }
  if (first < 0) return ids[0];
  const double t = u * sum;
  double cum = 0;
  int last = first;
  for (int i = 0; i < n; ++i) {
    if (!kept(i) || w(i) <= 0) continue;
    cum += w(i);
    last = i;
    if (t < cum) return ids[i];
  }
  return ids[last];
}

// ---- norms --------------------------------------------------------------------------------------

// out = (x * r) * w with r = rms_inv(sum_squares(x)); w may be null (no weight).
DQ_HD void rmsnorm(const float* x, const float* w, int n, float eps, float* out) {
  float r = rms_inv(sum_squares(x, n), n, eps);
  for (int j = 0; j < n; ++j) out[j] = w ? (x[j] * r) * w[j] : x[j] * r;
}

// ---- rotary embedding ---------------------------------------------------------------------------
// rotate-half on the first `rot` dims: for j < rot/2, (x_j, x_{j+rot/2}) rotated by angle i=j.
DQ_HD void rope(float* x, int rot, const float* cos_row, const float* sin_row) {
  int h = rot / 2;
  for (int j = 0; j < h; ++j) {
    float a = x[j], b = x[j + h], c = cos_row[j], s = sin_row[j];
    x[j] = a * c - b * s;
    x[j + h] = b * c + a * s;
  }
}

}  // namespace dq::num
