// AVX2 + FMA kernels: the reference evaluation order (ops/numerics.h) with 8-wide vectors, for
// CPUs without AVX-512. Same scheme as kernels_avx512.cpp: a row's units (8 inputs) go to lane
// u % 32; a block of 8 units (32 bytes) fills one ymm of words, whose lanes are canonical lanes
// 8(b % 4) .. 8(b % 4) + 7, so a row keeps four accumulators. The 4-bit unit dot is numerics.h's
// exact integer one: x is prepared as three signed-byte limbs per input (kernels_avx512.cpp has
// the layout), and each limb meets the low and high nibbles in vpmaddubsw (u8 x s8 pairs into
// 16 bits, no saturation at these sizes) + vpmaddwd (into 32 bits), combined Horner-style.
// BF16 rows gather the weight pairs of 8 units with four 32-bit gathers per block.
#include "backend/cpu/kernels.h"
#include "backend/cpu/unit_limbs.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/numerics.h"
#include "ops/reference_impl.h"

#define DQ_AVX2 __attribute__((target("avx2,fma,f16c,bmi2")))
#define DQ_AVX2_LAMBDA __attribute__((target("avx2,fma,f16c,bmi2"), always_inline))

namespace dq::cpu {

namespace {

constexpr int kBlockUnits = 8;
constexpr int kBlockFloats = 8 * kBlockUnits;  // 64
constexpr int kMaxGroups = 2048;

int n_blocks(const Matrix& m) { return (m.cols / 8 + kBlockUnits - 1) / kBlockUnits; }

bool handles(const Matrix& m) {
  if (m.format == WFormat::Affine)
    return m.bits == 4 && m.scale_dtype == DType::BF16 && m.cols / m.group_size <= kMaxGroups &&
           (m.group_size == 32 || m.group_size == 64 || m.group_size == 128);
  return m.format == WFormat::BF16;
}

size_t prepared_size(const Matrix& m) { return size_t(n_blocks(m)) * kBlockFloats; }

// Affine 4-bit: per unit the exact integers of numerics.h quantize_unit, as limbs
// (unit_limbs.h); zero past the row. BF16: xp[b][k][m] = x[8(8b + m) + k]; zero past the row.
// prepare_unit_limbs for whole blocks of 8 units, as kernels_avx512.cpp's
// prepare_unit_limbs_avx512 does with 16 (the same steps; the bits are non-negative after the
// sign is cleared, so signed compares and maxima order them). The bytes equal the scalar form's
// (OpsParity.PreparedLimbsEqualTheScalarForm).
DQ_AVX2 void prepare_unit_limbs_avx2(const float* x, int U, float* xp) {
  const int full = U / kBlockUnits;
  const __m256i idx = _mm256_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56);
  const __m256i low7 = _mm256_set1_epi32(0x7FFFFFFF), byte = _mm256_set1_epi32(0xFF);
  for (int b = 0; b < full; ++b) {
    const float* xb = x + size_t(b) * kBlockFloats;
    __m256 v[8];
    __m256i mbits = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {  // v[k]: input k of the 8 units
      v[k] = _mm256_i32gather_ps(xb + k, idx, 4);
      mbits = _mm256_max_epi32(mbits, _mm256_and_si256(_mm256_castps_si256(v[k]), low7));
    }
    const __m256i finite = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x7F800000), mbits);
    const __m256i eb = _mm256_srli_epi32(mbits, 23);
    const __m256i scaled = _mm256_and_si256(finite, _mm256_cmpgt_epi32(eb, _mm256_set1_epi32(26)));
    const __m256 up = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(_mm256_set1_epi32(275), eb), 23));
    const __m256i pow = _mm256_slli_epi32(_mm256_sub_epi32(eb, _mm256_set1_epi32(21)), 23);
    const __m256i step = _mm256_or_si256(_mm256_and_si256(scaled, pow),
                                         _mm256_andnot_si256(finite, _mm256_set1_epi32(0x7FC00000)));
    __m256i slot[6];
    for (int j = 0; j < 6; ++j) slot[j] = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
      const __m256i xi = _mm256_and_si256(scaled, _mm256_cvtps_epi32(_mm256_mul_ps(v[k], up)));
      const __m256i l3 = _mm256_srai_epi32(_mm256_slli_epi32(xi, 24), 24);
      const __m256i r = _mm256_srai_epi32(_mm256_sub_epi32(xi, l3), 8);
      const __m256i l2 = _mm256_srai_epi32(_mm256_slli_epi32(r, 24), 24);
      const __m256i l1 = _mm256_srai_epi32(_mm256_sub_epi32(r, l2), 8);
      const int p = k % 2, sh = 8 * (k / 2);
      slot[p] = _mm256_or_si256(slot[p], _mm256_slli_epi32(_mm256_and_si256(l1, byte), sh));
      slot[2 + p] = _mm256_or_si256(slot[2 + p], _mm256_slli_epi32(_mm256_and_si256(l2, byte), sh));
      slot[4 + p] = _mm256_or_si256(slot[4 + p], _mm256_slli_epi32(_mm256_and_si256(l3, byte), sh));
    }
    float* blk = xp + size_t(b) * kBlockFloats;
    for (int j = 0; j < 6; ++j) _mm256_storeu_si256(reinterpret_cast<__m256i*>(blk + j * kBlockUnits), slot[j]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(blk + kLimbSlotStep * kBlockUnits), step);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(blk + 7 * kBlockUnits), _mm256_setzero_si256());
  }
  if (full * kBlockUnits < U) {
    float* blk = xp + size_t(full) * kBlockFloats;
    std::memset(blk, 0, sizeof(float) * kBlockFloats);
    for (int u = full * kBlockUnits; u < U; ++u) put_unit_limbs(x + 8 * u, kBlockUnits, u % kBlockUnits, blk);
  }
}

DQ_AVX2 void prepare(const Matrix& m, const float* x, float* xp) {
  const int U = m.cols / 8, NB = n_blocks(m);
  static_assert(kBlockFloats == 8 * kBlockUnits && kLimbSlotStep == 6, "block: six limb slots, the steps, one zero slot");
  if (m.format == WFormat::Affine) {
    prepare_unit_limbs_avx2(x, U, xp);
    return;
  }
  for (int b = 0; b < NB; ++b)
    for (int k = 0; k < 8; ++k)
      for (int l = 0; l < kBlockUnits; ++l) {
        int u = b * kBlockUnits + l;
        xp[size_t(b) * kBlockFloats + k * kBlockUnits + l] = u < U ? x[8 * u + k] : 0.0f;
      }
}

DQ_AVX2 inline __m256i lane_mask(int valid) {  // all ones in lanes < valid
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), idx);
}

// lanes 0..31 in four vectors; the canonical butterfly.
DQ_AVX2 inline float butterfly(__m256 a, __m256 b, __m256 c, __m256 d) {
  __m256 lo = _mm256_add_ps(a, c);  // lanes 0-7 + 16-23
  __m256 hi = _mm256_add_ps(b, d);  // lanes 8-15 + 24-31
  __m256 s = _mm256_add_ps(lo, hi); // m = 8
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));  // m = 4
  __m128 r = _mm_add_ps(q, _mm_movehl_ps(q, q));                                   // m = 2
  return _mm_cvtss_f32(_mm_add_ss(r, _mm_shuffle_ps(r, r, 1)));                   // m = 1
}

DQ_AVX2 inline __m256 bf16x8_to_ps(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

DQ_AVX2 inline __m128i load_u16x8(const uint16_t* p, int n) {  // n of 8 values, zero past
  if (n >= 8) return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  alignas(16) uint16_t t[8] = {};
  std::memcpy(t, p, sizeof(uint16_t) * std::max(n, 0));
  return _mm_load_si128(reinterpret_cast<const __m128i*>(t));
}

template <int GS>
DQ_AVX2 inline __m256i group_index() {  // lane -> group offset within a block: 8m / GS
  return _mm256_setr_epi32(0, 8 / GS, 16 / GS, 24 / GS, 32 / GS, 40 / GS, 48 / GS, 56 / GS);
}

// One bias step of the canonical order: a += b_g * X_g on the lanes of groups g .. g+7 that exist.
DQ_AVX2 inline __m256 bias_step(__m256 a, const uint16_t* B, const float* xg, int g, int G) {
  if (g >= G) return a;
  const __m256 keep = _mm256_castsi256_ps(lane_mask(G - g));
  const __m256 bv = bf16x8_to_ps(load_u16x8(B + g, G - g));
  const __m256 x = G - g >= 8 ? _mm256_loadu_ps(xg + g) : _mm256_maskload_ps(xg + g, lane_mask(G - g));
  return _mm256_blendv_ps(a, _mm256_fmadd_ps(bv, x, a), keep);
}

template <int R, int NT, int GS>
DQ_AVX2 void affine4_rows(const MatTask& t, int r0, int r1, bool add) {
  const Matrix& m = *t.m;
  const int K = m.cols, U = K / 8, NB = n_blocks(m), G = K / GS;
  const __m256i idx = group_index<GS>();
  const auto* W0 = static_cast<const uint32_t*>(m.w->ptr);
  const auto* S0 = static_cast<const uint16_t*>(m.scales->ptr);
  const auto* B0 = static_cast<const uint16_t*>(m.biases->ptr);
  alignas(32) float sbuf[R][kMaxGroups + 8];
  const __m256i nib = _mm256_set1_epi32(0x0F0F0F0F), ones16 = _mm256_set1_epi16(1);
  for (int r = r0; r + R <= r1; r += R) {
    const uint32_t* W[R];
    for (int i = 0; i < R; ++i) {
      W[i] = W0 + size_t(r + i) * U;
      const uint16_t* S = S0 + size_t(r + i) * G;
      for (int g = 0; g < G; g += 8) _mm256_store_ps(&sbuf[i][g], bf16x8_to_ps(load_u16x8(S + g, G - g)));
    }
    __m256 acc[4][R][NT];
    for (int h = 0; h < 4; ++h)
      for (int i = 0; i < R; ++i)
        for (int j = 0; j < NT; ++j) acc[h][i][j] = _mm256_setzero_ps();
    // Four blocks at a time (one per accumulator), interleaved for independent chains.
    for (int b0 = 0; b0 < NB; b0 += 4) {
      const int nb = std::min(4, NB - b0);
#pragma GCC unroll 4
      for (int h = 0; h < 4; ++h) {
        if (h >= nb) break;
        const int b = b0 + h;
        const int valid = U - b * kBlockUnits;
        const __m256i mk = lane_mask(valid);
        __m256i w[R];
        __m256 p[R][NT];
        for (int i = 0; i < R; ++i) {
          // vpmaskmovd is slow on some CPUs (AMD): a plain load for every full block.
          w[i] = valid >= kBlockUnits ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(W[i] + b * kBlockUnits))
                                      : _mm256_maskload_epi32(reinterpret_cast<const int*>(W[i] + b * kBlockUnits), mk);
          // Into L2 16 KB ahead, one 64-byte line per two blocks (kernels_avx512.cpp says why).
          if (h % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(W[i] + b * kBlockUnits + 4096), _MM_HINT_T1);
          for (int j = 0; j < NT; ++j) p[i][j] = _mm256_setzero_ps();
        }
        for (int j = 0; j < NT; ++j) {
          const float* xb = t.x[j] + size_t(b) * kBlockFloats;
          __m256i xl[6];
          for (int sl = 0; sl < 6; ++sl) xl[sl] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + sl * kBlockUnits));
          const __m256 step = _mm256_loadu_ps(xb + kLimbSlotStep * kBlockUnits);
          for (int i = 0; i < R; ++i) {
            const __m256i lo = _mm256_and_si256(w[i], nib), hi = _mm256_and_si256(_mm256_srli_epi32(w[i], 4), nib);
            auto limb = [&](int l) DQ_AVX2_LAMBDA {  // Σ over the unit's 8 inputs of q * limb l
              const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl[2 * l]), _mm256_maddubs_epi16(hi, xl[2 * l + 1]));
              return _mm256_madd_epi16(s16, ones16);
            };
            __m256i P = limb(0);
            P = _mm256_add_epi32(_mm256_slli_epi32(P, 8), limb(1));
            P = _mm256_add_epi32(_mm256_slli_epi32(P, 8), limb(2));
            p[i][j] = _mm256_mul_ps(_mm256_cvtepi32_ps(P), step);
          }
        }
        const __m256 keep = _mm256_castsi256_ps(mk);
        for (int i = 0; i < R; ++i) {
          const __m256 sv = GS >= 64 ? _mm256_set1_ps(sbuf[i][b * kBlockFloats / GS])
                                     : _mm256_permutevar8x32_ps(_mm256_loadu_ps(&sbuf[i][b * kBlockFloats / GS]), idx);
          for (int j = 0; j < NT; ++j)
            acc[h][i][j] = _mm256_blendv_ps(acc[h][i][j], _mm256_fmadd_ps(sv, p[i][j], acc[h][i][j]), keep);
        }
      }
    }
    for (int i = 0; i < R; ++i) {
      const uint16_t* B = B0 + size_t(r + i) * G;
      for (int j = 0; j < NT; ++j) {
        // Groups g, g+8, g+16, g+24 go to canonical lanes 0-7, 8-15, 16-23, 24-31: four named
        // accumulators (an array indexed by g / 8 stayed in memory, a store-to-load chain).
        __m256 b0 = _mm256_setzero_ps(), b1 = b0, b2 = b0, b3 = b0;
        for (int g = 0; g < G; g += 32) {
          b0 = bias_step(b0, B, t.xg[j], g, G);
          b1 = bias_step(b1, B, t.xg[j], g + 8, G);
          b2 = bias_step(b2, B, t.xg[j], g + 16, G);
          b3 = bias_step(b3, B, t.xg[j], g + 24, G);
        }
        float v = butterfly(_mm256_add_ps(acc[0][i][j], b0), _mm256_add_ps(acc[1][i][j], b1),
                            _mm256_add_ps(acc[2][i][j], b2), _mm256_add_ps(acc[3][i][j], b3));
        float* y = t.y[j] + r + i;
        *y = add ? *y + v : v;
      }
    }
  }
}

template <int R, int NT>
DQ_AVX2 void affine4_dispatch(const MatTask& t, int r0, int r1, bool add) {
  switch (t.m->group_size) {
    case 32: return affine4_rows<R, NT, 32>(t, r0, r1, add);
    case 64: return affine4_rows<R, NT, 64>(t, r0, r1, add);
    default: return affine4_rows<R, NT, 128>(t, r0, r1, add);
  }
}

// BF16 weights: for each block of 8 units, four gathers of 32-bit pairs (inputs 2p, 2p+1 of
// every unit), split into the low and high halves.
template <int NT>
DQ_AVX2 void bf16_rows(const MatTask& t, int r0, int r1, bool add) {
  const Matrix& m = *t.m;
  const int K = m.cols, U = K / 8, NB = n_blocks(m);
  const __m256i hi_mask = _mm256_set1_epi32(int32_t(0xFFFF0000u));
  for (int r = r0; r < r1; ++r) {
    const uint16_t* wrow = static_cast<const uint16_t*>(m.w->ptr) + size_t(r) * K;
    __m256 acc[4][NT];
    for (int h = 0; h < 4; ++h)
      for (int j = 0; j < NT; ++j) acc[h][j] = _mm256_setzero_ps();
    for (int b = 0; b < NB; ++b) {
      const int valid = U - b * kBlockUnits;
      const __m256i mk = lane_mask(valid);
      const int* base = reinterpret_cast<const int*>(wrow + size_t(b) * kBlockFloats);
      __m256 p[NT];
      for (int j = 0; j < NT; ++j) p[j] = _mm256_setzero_ps();
      for (int pr = 0; pr < 4; ++pr) {
        const __m256i gidx = _mm256_add_epi32(_mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28), _mm256_set1_epi32(pr));
        const __m256i d = valid >= kBlockUnits ? _mm256_i32gather_epi32(base, gidx, 4)
                                               : _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), base, gidx, mk, 4);
        const __m256 lo = _mm256_castsi256_ps(_mm256_slli_epi32(d, 16));
        const __m256 hi = _mm256_castsi256_ps(_mm256_and_si256(d, hi_mask));
        for (int j = 0; j < NT; ++j) {
          p[j] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(t.x[j] + size_t(b) * kBlockFloats + (2 * pr) * kBlockUnits), p[j]);
          p[j] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(t.x[j] + size_t(b) * kBlockFloats + (2 * pr + 1) * kBlockUnits), p[j]);
        }
      }
      const __m256 keep = _mm256_castsi256_ps(mk);
      for (int j = 0; j < NT; ++j) acc[b & 3][j] = _mm256_blendv_ps(acc[b & 3][j], _mm256_add_ps(acc[b & 3][j], p[j]), keep);
    }
    for (int j = 0; j < NT; ++j) {
      float v = butterfly(acc[0][j], acc[1][j], acc[2][j], acc[3][j]);
      float* y = t.y[j] + r;
      *y = add ? *y + v : v;
    }
  }
}

DQ_AVX2 void rows(const MatTask& t, int r0, int r1, bool add) {
  const bool affine = t.m->format == WFormat::Affine;
  if (t.nt == 1) {
    if (!affine) return bf16_rows<1>(t, r0, r1, add);
    int r4 = r0 + (r1 - r0) / 4 * 4;
    affine4_dispatch<4, 1>(t, r0, r4, add);
    affine4_dispatch<1, 1>(t, r4, r1, add);
    return;
  }
  MatTask one = t;
  int j = 0;
  for (; j + 4 <= t.nt; j += 4) {
    for (int i = 0; i < 4; ++i) one.x[i] = t.x[j + i], one.xg[i] = t.xg[j + i], one.y[i] = t.y[j + i];
    affine ? affine4_dispatch<1, 4>(one, r0, r1, add) : bf16_rows<4>(one, r0, r1, add);
  }
  for (; j < t.nt; ++j) {
    one.x[0] = t.x[j], one.xg[0] = t.xg[j], one.y[0] = t.y[j];
    affine ? affine4_dispatch<1, 1>(one, r0, r1, add) : bf16_rows<1>(one, r0, r1, add);
  }
}

#define DQ_TARGET DQ_AVX2
#include "backend/cpu/kernels_ref_wrappers.inc"
#undef DQ_TARGET

// num::exp for 8 values (as exp16 in kernels_avx512.cpp: the scalar's steps, checks as masks).
DQ_AVX2_LAMBDA inline __m256 exp8(__m256 a) {
  const __m256 nan = _mm256_cmp_ps(a, a, _CMP_UNORD_Q);
  const __m256 big = _mm256_cmp_ps(a, _mm256_set1_ps(88.72283935546875f), _CMP_GT_OQ);
  const __m256 small = _mm256_cmp_ps(a, _mm256_set1_ps(-103.97208404541015625f), _CMP_LT_OQ);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(a, _mm256_set1_ps(1.44269502162933349609375f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693359375f), a);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
  p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_cvtps_epi32(n);  // n is an integer: exact
  const __m256i hi = _mm256_cmpgt_epi32(e, _mm256_set1_epi32(127));
  const __m256i lo = _mm256_cmpgt_epi32(_mm256_set1_epi32(-126), e);
  __m256i e1 = _mm256_blendv_epi8(e, _mm256_set1_epi32(127), hi);
  e1 = _mm256_blendv_epi8(e1, _mm256_set1_epi32(-126), lo);
  __m256i e2 = _mm256_and_si256(hi, _mm256_sub_epi32(e, _mm256_set1_epi32(127)));
  e2 = _mm256_blendv_epi8(e2, _mm256_add_epi32(e, _mm256_set1_epi32(126)), lo);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e2, bias), 23));
  __m256 res = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  res = _mm256_blendv_ps(res, _mm256_setzero_ps(), small);
  res = _mm256_blendv_ps(res, _mm256_set1_ps(INFINITY), big);
  return _mm256_blendv_ps(res, a, nan);
}

DQ_AVX2 void draw_weights(const float* x, int n, float m, float T, float min_p, float* w) {
  const __m256 vm = _mm256_set1_ps(m), vT = _mm256_set1_ps(T), vp = _mm256_set1_ps(min_p);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    __m256 keep = _mm256_cmp_ps(xv, _mm256_set1_ps(-INFINITY), _CMP_GT_OQ);  // NaN: false
    const __m256 e = exp8(_mm256_div_ps(_mm256_sub_ps(xv, vm), vT));
    if (min_p > 0.0f) keep = _mm256_and_ps(keep, _mm256_cmp_ps(e, vp, _CMP_GE_OQ));
    _mm256_storeu_ps(w + i, _mm256_and_ps(keep, e));
  }
  for (; i < n; ++i) w[i] = num::draw_weight(x[i], m, T, min_p);
}

const KernelSet kAvx2 = {"avx2",  handles,  prepared_size, prepare,   rows,       swiglu_rows,
                         rmsnorm, gdn_prep, attn_append,   gdn_heads, attn_heads, draw_weights};

}  // namespace

const KernelSet* avx2_kernels() { return &kAvx2; }

}  // namespace dq::cpu

#else
namespace dq::cpu {
const KernelSet* avx2_kernels() { return nullptr; }
}  // namespace dq::cpu
#endif
