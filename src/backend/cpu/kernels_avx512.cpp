// AVX-512 kernels: the reference evaluation order (ops/numerics.h) with 16-wide vectors.
//
// Affine 4-bit rows. A row's units (8 inputs = one 32-bit word) go to lane u % 32. A block of
// 16 units (64 bytes) fills one zmm of words; its lanes are canonical lanes 0-15 (even block)
// or 16-31 (odd block), so each row keeps two accumulators, lo and hi. The unit dot is the exact
// integer one of numerics.h (unit_dot_q4): prepare() turns x into per-unit integers split into
// three signed-byte limbs, laid out per block as six zmm (limb 1, 2, 3 x even, odd inputs) plus
// the units' steps; the words' low and high nibbles (one AND, one shift + AND) then meet the
// limbs in VNNI dot products (vpdpbusd: four u8 x s8 products into each 32-bit lane), combined
// Horner-style (limb 1, << 8, limb 2, << 8, limb 3; exact in int32), converted once and scaled.
// BF16 rows use the same lanes; four loads are transposed so that vector k holds input k of 16
// units.
#include "backend/cpu/kernels.h"
#include "backend/cpu/unit_limbs.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "ops/numerics.h"
#include "ops/reference_impl.h"

#define DQ_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")))
#define DQ_AVX512_LAMBDA __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2"), always_inline))

namespace dq::cpu {

namespace {

constexpr int kBlockUnits = 16;
constexpr int kBlockFloats = 8 * kBlockUnits;  // 128
constexpr int kMaxGroups = 2048;                 // per row: K <= 65536 at group size 32
// Weights are prefetched into L2 16 KB ahead. On the 2-core VM the hardware prefetcher does
// little, and prefetches into L1 one row group ahead (the kernel's earlier way) were capped by
// the core's L1 misses in flight (about 20 GB/s for two cores). Measured (`deltaq bench -m M
// --tokens 64`, alternating runs): decode 15.7-16.5 tok/s with the L1 prefetch, 25.6-28.9 with the
// L2 one added (8-64 KB ahead: the same within noise), 27.1-28.8 with the L2 one alone.
constexpr size_t kFarWords = 16 * 1024 / 4;

int n_blocks(const Matrix& m) { return (m.cols / 8 + kBlockUnits - 1) / kBlockUnits; }

bool handles(const Matrix& m) {
  if (m.format == WFormat::Affine)
    return m.bits == 4 && m.scale_dtype == DType::BF16 && m.cols / m.group_size <= kMaxGroups &&
           (m.group_size == 32 || m.group_size == 64 || m.group_size == 128);
  return m.format == WFormat::BF16;
}

size_t prepared_size(const Matrix& m) { return size_t(n_blocks(m)) * kBlockFloats; }

// prepare_unit_limbs (unit_limbs.h) for whole blocks of 16 units, lane l = unit l: numerics.h
// quantize_unit's steps as integer vector operations (the largest |x| as bits, its exponent,
// the exact scaling, the rounding conversion: MXCSR's round to nearest even, what rintf does),
// split_limbs' sign-extended bytes, and the slot bytes; the last partial block the scalar way.
// The bytes equal the scalar form's (OpsParity.PreparedLimbsEqualTheScalarForm). Before: 7.5 /
// 22.2 us for K = 2048 / 6144 on the 2-core box, ~1.2 ms of a 2B token's 40 on one thread.
DQ_AVX512 void prepare_unit_limbs_avx512(const float* x, int U, float* xp) {
  const int full = U / kBlockUnits;
  const __m512i idx = _mm512_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120);
  const __m512i low7 = _mm512_set1_epi32(0x7FFFFFFF), byte = _mm512_set1_epi32(0xFF);
  for (int b = 0; b < full; ++b) {
    const float* xb = x + size_t(b) * kBlockFloats;
    __m512 v[8];
    __m512i mbits = _mm512_setzero_si512();
    for (int k = 0; k < 8; ++k) {  // v[k]: input k of the 16 units
      v[k] = _mm512_i32gather_ps(_mm512_add_epi32(idx, _mm512_set1_epi32(k)), xb, 4);
      mbits = _mm512_max_epu32(mbits, _mm512_and_si512(_mm512_castps_si512(v[k]), low7));
    }
    const __mmask16 finite = _mm512_cmplt_epu32_mask(mbits, _mm512_set1_epi32(0x7F800000));
    const __m512i eb = _mm512_srli_epi32(mbits, 23);
    const __mmask16 scaled = finite & _mm512_cmpge_epu32_mask(eb, _mm512_set1_epi32(27));
    const __m512 up = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(275), eb), 23));
    const __m512i step = _mm512_mask_mov_epi32(
        _mm512_maskz_mov_epi32(__mmask16(~finite), _mm512_set1_epi32(0x7FC00000)), scaled,
        _mm512_slli_epi32(_mm512_sub_epi32(eb, _mm512_set1_epi32(21)), 23));
    __m512i slot[6];
    for (int j = 0; j < 6; ++j) slot[j] = _mm512_setzero_si512();
    for (int k = 0; k < 8; ++k) {
      const __m512i xi = _mm512_maskz_cvtps_epi32(scaled, _mm512_mul_ps(v[k], up));
      const __m512i l3 = _mm512_srai_epi32(_mm512_slli_epi32(xi, 24), 24);
      const __m512i r = _mm512_srai_epi32(_mm512_sub_epi32(xi, l3), 8);
      const __m512i l2 = _mm512_srai_epi32(_mm512_slli_epi32(r, 24), 24);
      const __m512i l1 = _mm512_srai_epi32(_mm512_sub_epi32(r, l2), 8);
      const int p = k % 2, sh = 8 * (k / 2);
      slot[p] = _mm512_or_si512(slot[p], _mm512_slli_epi32(_mm512_and_si512(l1, byte), unsigned(sh)));
      slot[2 + p] = _mm512_or_si512(slot[2 + p], _mm512_slli_epi32(_mm512_and_si512(l2, byte), unsigned(sh)));
      slot[4 + p] = _mm512_or_si512(slot[4 + p], _mm512_slli_epi32(_mm512_and_si512(l3, byte), unsigned(sh)));
    }
    float* blk = xp + size_t(b) * kBlockFloats;
    for (int j = 0; j < 6; ++j) _mm512_storeu_si512(blk + j * kBlockUnits, slot[j]);
    _mm512_storeu_si512(blk + kLimbSlotStep * kBlockUnits, step);
    _mm512_storeu_si512(blk + 7 * kBlockUnits, _mm512_setzero_si512());
  }
  if (full * kBlockUnits < U) {
    float* blk = xp + size_t(full) * kBlockFloats;
    std::memset(blk, 0, sizeof(float) * kBlockFloats);
    for (int u = full * kBlockUnits; u < U; ++u) put_unit_limbs(x + 8 * u, kBlockUnits, u % kBlockUnits, blk);
  }
}

// Affine 4-bit: per unit the exact integers of numerics.h quantize_unit, as limbs (unit_limbs.h);
// zero past the row. BF16: xp[b][k][m] = x[8(16b + m) + k]; zero past the row.
DQ_AVX512 void prepare(const Matrix& m, const float* x, float* xp) {
  const int U = m.cols / 8, NB = n_blocks(m);
  static_assert(kBlockFloats == 8 * kBlockUnits && kLimbSlotStep == 6, "block: six limb slots, the steps, one zero slot");
  if (m.format == WFormat::Affine) {
    prepare_unit_limbs_avx512(x, U, xp);
    return;
  }
  for (int b = 0; b < NB; ++b)
    for (int k = 0; k < 8; ++k)
      for (int l = 0; l < kBlockUnits; ++l) {
        int u = b * kBlockUnits + l;
        xp[size_t(b) * kBlockFloats + k * kBlockUnits + l] = u < U ? x[8 * u + k] : 0.0f;
      }
}

DQ_AVX512 inline float butterfly(__m512 lo, __m512 hi) {
  __m512 s = _mm512_add_ps(lo, hi);  // lane l + lane l+16
  __m256 a = _mm256_add_ps(_mm512_castps512_ps256(s), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
  __m128 c = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 d = _mm_add_ps(c, _mm_movehl_ps(c, c));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps(d, d, 1)));
}

DQ_AVX512 inline __m512 bf16x16_to_ps(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Lane -> group offset within a block of 16 units: 8m / GS.
template <int GS>
DQ_AVX512 inline __m512i group_index() {
  return _mm512_set_epi32(120 / GS, 112 / GS, 104 / GS, 96 / GS, 88 / GS, 80 / GS, 72 / GS, 64 / GS, 56 / GS, 48 / GS,
                          40 / GS, 32 / GS, 24 / GS, 16 / GS, 8 / GS, 0);
}

// One bias step of the canonical order: a += b_g * X_g on the lanes of groups g .. g+15 that exist.
DQ_AVX512 inline __m512 bias_step(__m512 a, const uint16_t* B, const float* xg, int g, int G) {
  if (g >= G) return a;
  const __mmask16 mk = G - g >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (G - g)) - 1);
  return _mm512_mask3_fmadd_ps(bf16x16_to_ps(_mm256_maskz_loadu_epi16(mk, B + g)), _mm512_maskz_loadu_ps(mk, xg + g), a, mk);
}

// Affine 4-bit, group size GS: rows [r0, r1) in groups of R rows, NT tokens each.
template <int R, int NT, int GS>
DQ_AVX512 void affine4_rows(const MatTask& t, int r0, int r1, bool add) {
  const Matrix& m = *t.m;
  const int K = m.cols, U = K / 8, NB = n_blocks(m), G = K / GS;
  constexpr int GPB = kBlockFloats / GS;  // groups per block: 4, 2, 1
  const __m512i idx = group_index<GS>();
  const __m512i nib = _mm512_set1_epi32(0x0F0F0F0F);
  const auto* W0 = static_cast<const uint32_t*>(m.w->ptr);
  const auto* S0 = static_cast<const uint16_t*>(m.scales->ptr);
  const auto* B0 = static_cast<const uint16_t*>(m.biases->ptr);
  alignas(64) float sbuf[R][kMaxGroups + 16];  // the rows' scales as fp32
  for (int r = r0; r + R <= r1; r += R) {
    // The scales and biases of the row group after next into cache (the hardware prefetcher
    // misses these short strided streams; the weights are prefetched in the block loop).
    if (r + 3 * R <= r1)
      for (int i = 2 * R; i < 3 * R; ++i)
        for (int off = 0; off < G * 2; off += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(S0 + size_t(r + i) * G) + off, _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(B0 + size_t(r + i) * G) + off, _MM_HINT_T0);
        }
    const uint32_t* W[R];
    for (int i = 0; i < R; ++i) {
      W[i] = W0 + size_t(r + i) * U;
      const uint16_t* S = S0 + size_t(r + i) * G;
      for (int g = 0; g < G; g += 16) {
        __mmask16 mk = G - g >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (G - g)) - 1);
        _mm512_store_ps(&sbuf[i][g], bf16x16_to_ps(_mm256_maskz_loadu_epi16(mk, S + g)));
      }
    }
    __m512 acc0[R][NT], acc1[R][NT];  // canonical lanes 0-15 and 16-31
    #pragma GCC unroll 16
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < NT; ++j) acc0[i][j] = acc1[i][j] = _mm512_setzero_ps();

    // Blocks b (canonical lanes 0-15, acc0) and b+1 (lanes 16-31, acc1) interleaved, so that
    // 2R independent dot-product chains hide their latency. Written as a macro, not a lambda: the
    // accumulators must stay in registers (capturing them by reference made GCC spill them).
    // NBLK = 1 for a final odd block.
#define DQ_AFFINE4_BLOCKS(b_, NBLK)                                                                  \
  {                                                                                                \
    const int b = (b_);                                                                            \
    __mmask16 mk[2];                                                                               \
    __m512 p[2][R][NT];                                                                            \
    for (int h = 0; h < NBLK; ++h) {                                                               \
      const int valid = U - (b + h) * kBlockUnits;                                                 \
      mk[h] = valid >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1);                      \
      __m512i xl[NT][6];                                                                           \
      __m512 step[NT];                                                                             \
      for (int j = 0; j < NT; ++j) {                                                               \
        const float* xb = t.x[j] + size_t(b + h) * kBlockFloats;                                   \
        for (int s = 0; s < 6; ++s) xl[j][s] = _mm512_loadu_si512(xb + (s) * kBlockUnits); \
        step[j] = _mm512_loadu_ps(xb + kLimbSlotStep * kBlockUnits);                                   \
      }                                                                                            \
      for (int i = 0; i < R; ++i) {                                                                \
        _mm_prefetch(reinterpret_cast<const char*>(W[i] + (b + h) * kBlockUnits + kFarWords), _MM_HINT_T1); \
        const __m512i w = valid >= 16 ? _mm512_loadu_si512(W[i] + (b + h) * kBlockUnits)           \
                                      : _mm512_maskz_loadu_epi32(mk[h], W[i] + (b + h) * kBlockUnits); \
        const __m512i lo = _mm512_and_si512(w, nib);                      /* nibbles 0, 2, 4, 6 */ \
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(w, 4), nib); /* nibbles 1, 3, 5, 7 */ \
        for (int j = 0; j < NT; ++j) {                                                             \
          __m512i P = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xl[j][0]);                  \
          P = _mm512_dpbusd_epi32(P, hi, xl[j][1]);                                                \
          P = _mm512_slli_epi32(P, 8);                                                             \
          P = _mm512_dpbusd_epi32(P, lo, xl[j][2]);                                                \
          P = _mm512_dpbusd_epi32(P, hi, xl[j][3]);                                                \
          P = _mm512_slli_epi32(P, 8);                                                             \
          P = _mm512_dpbusd_epi32(P, lo, xl[j][4]);                                                \
          P = _mm512_dpbusd_epi32(P, hi, xl[j][5]);                                                \
          p[h][i][j] = _mm512_mul_ps(_mm512_cvtepi32_ps(P), step[j]);                              \
        }                                                                                          \
      }                                                                                            \
    }                                                                                              \
    for (int i = 0; i < R; ++i) {                                                                  \
      __m512 sv0 = GPB == 1 ? _mm512_set1_ps(sbuf[i][b])                                           \
                            : _mm512_permutexvar_ps(idx, _mm512_loadu_ps(&sbuf[i][b * GPB]));      \
      for (int j = 0; j < NT; ++j) /* lanes past the row are zero in p: a plain fma keeps them 0 */ \
        acc0[i][j] = _mm512_fmadd_ps(sv0, p[0][i][j], acc0[i][j]);                                 \
      if (NBLK == 2) {                                                                             \
        __m512 sv1 = GPB == 1 ? _mm512_set1_ps(sbuf[i][b + 1])                                     \
                              : _mm512_permutexvar_ps(idx, _mm512_loadu_ps(&sbuf[i][(b + 1) * GPB])); \
        for (int j = 0; j < NT; ++j) acc1[i][j] = _mm512_fmadd_ps(sv1, p[1][i][j], acc1[i][j]);    \
      }                                                                                            \
    }                                                                                              \
  }
    int b2 = 0;
    for (; b2 + 2 <= NB; b2 += 2) DQ_AFFINE4_BLOCKS(b2, 2)
    if (b2 < NB) DQ_AFFINE4_BLOCKS(b2, 1)
#undef DQ_AFFINE4_BLOCKS

    // Bias term: group g -> lane g % 32, then lane + blane and the butterfly.
    #pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      const uint16_t* B = B0 + size_t(r + i) * G;
      #pragma GCC unroll 16
      for (int j = 0; j < NT; ++j) {
        // Groups g and g + 16 go to canonical lanes 0-15 and 16-31 (two named accumulators:
        // indexing an array by g / 16 kept it in memory, a store-to-load chain per group).
        __m512 bacc0 = _mm512_setzero_ps(), bacc1 = _mm512_setzero_ps();
        for (int g = 0; g < G; g += 32) {
          bacc0 = bias_step(bacc0, B, t.xg[j], g, G);
          bacc1 = bias_step(bacc1, B, t.xg[j], g + 16, G);
        }
        float v = butterfly(_mm512_add_ps(acc0[i][j], bacc0), _mm512_add_ps(acc1[i][j], bacc1));
        float* y = t.y[j] + r + i;
        *y = add ? *y + v : v;
      }
    }
  }
}

template <int R, int NT>
DQ_AVX512 void affine4_dispatch(const MatTask& t, int r0, int r1, bool add) {
  switch (t.m->group_size) {
    case 32: return affine4_rows<R, NT, 32>(t, r0, r1, add);
    case 64: return affine4_rows<R, NT, 64>(t, r0, r1, add);
    default: return affine4_rows<R, NT, 128>(t, r0, r1, add);
  }
}

// BF16 weights: R rows x NT tokens.
template <int R, int NT>
DQ_AVX512 void bf16_rows_at(const MatTask& t, int r0, bool add);

template <int R, int NT>
DQ_AVX512 void bf16_rows(const MatTask& t, int r0, int r1, bool add) {
  for (int r = r0; r + R <= r1; r += R) bf16_rows_at<R, NT>(t, r, add);
}

template <int R, int NT>
DQ_AVX512 void bf16_rows_at(const MatTask& t, int r0, bool add) {
  const Matrix& m = *t.m;
  const int K = m.cols, U = K / 8, NB = n_blocks(m);
  // Transpose indices: from two zmm of 16 dwords (units 0-3 and 4-7 of a half block; each unit
  // is 4 dwords = bf16 pairs (0,1)(2,3)(4,5)(6,7)), gather dword-pair p of units 0..7.
  alignas(64) int32_t i01[16], i23[16], merge[16];
  for (int l = 0; l < 8; ++l) {
    i01[l] = 4 * l + 0, i01[l + 8] = 4 * l + 1;  // pair 0 / pair 1 of units 0..7
    i23[l] = 4 * l + 2, i23[l + 8] = 4 * l + 3;
  }
  for (int l = 0; l < 8; ++l) merge[l] = l, merge[l + 8] = 16 + l;
  const __m512i I01 = _mm512_load_si512(i01), I23 = _mm512_load_si512(i23), M_lo = _mm512_load_si512(merge);
  for (int l = 0; l < 8; ++l) merge[l] = 8 + l, merge[l + 8] = 24 + l;
  const __m512i M_hi = _mm512_load_si512(merge);
  const __m512i hi_mask = _mm512_set1_epi32(int32_t(0xFFFF0000u));

  __m512 acc[R][NT][2];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NT; ++j) acc[r][j][0] = acc[r][j][1] = _mm512_setzero_ps();
  auto block = [&](int b, auto H) DQ_AVX512_LAMBDA {
    const int valid = U - b * kBlockUnits;
    const __mmask16 mk = valid >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1);
    __m512 p[R][NT];
    __m512i D[R][4];  // D[p][m] = bf16 pair p of unit m
    for (int r = 0; r < R; ++r) {
      const uint16_t* w = static_cast<const uint16_t*>(m.w->ptr) + size_t(r0 + r) * K + size_t(b) * kBlockFloats;
      __m512i z[4];
      for (int q = 0; q < 4; ++q) {
        int v4 = valid - 4 * q;  // units in this load
        __mmask16 lm = v4 >= 4 ? __mmask16(0xFFFF) : v4 <= 0 ? __mmask16(0) : __mmask16((1u << (4 * v4)) - 1);
        z[q] = _mm512_maskz_loadu_epi32(lm, w + 32 * q);
      }
      __m512i a01 = _mm512_permutex2var_epi32(z[0], I01, z[1]);  // [pair0 u0-7 | pair1 u0-7]
      __m512i a23 = _mm512_permutex2var_epi32(z[0], I23, z[1]);
      __m512i b01 = _mm512_permutex2var_epi32(z[2], I01, z[3]);  // units 8-15
      __m512i b23 = _mm512_permutex2var_epi32(z[2], I23, z[3]);
      D[r][0] = _mm512_permutex2var_epi32(a01, M_lo, b01);
      D[r][1] = _mm512_permutex2var_epi32(a01, M_hi, b01);
      D[r][2] = _mm512_permutex2var_epi32(a23, M_lo, b23);
      D[r][3] = _mm512_permutex2var_epi32(a23, M_hi, b23);
      for (int j = 0; j < NT; ++j) p[r][j] = _mm512_setzero_ps();
    }
    for (int k = 0; k < 8; ++k) {
      __m512 xv[NT];
      for (int j = 0; j < NT; ++j) xv[j] = _mm512_loadu_ps(t.x[j] + size_t(b) * kBlockFloats + k * kBlockUnits);
      for (int r = 0; r < R; ++r) {
        __m512i d = D[r][k / 2];
        __m512 wv = _mm512_castsi512_ps(k % 2 == 0 ? _mm512_slli_epi32(d, 16) : _mm512_and_si512(d, hi_mask));
        for (int j = 0; j < NT; ++j) p[r][j] = _mm512_fmadd_ps(wv, xv[j], p[r][j]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < NT; ++j) acc[r][j][H] = _mm512_mask_add_ps(acc[r][j][H], mk, acc[r][j][H], p[r][j]);
  };
  int b = 0;
  for (; b + 2 <= NB; b += 2) {
    block(b, std::integral_constant<int, 0>{});
    block(b + 1, std::integral_constant<int, 1>{});
  }
  if (b < NB) block(b, std::integral_constant<int, 0>{});
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NT; ++j) {
      float v = butterfly(acc[r][j][0], acc[r][j][1]);
      float* y = t.y[j] + r0 + r;
      *y = add ? *y + v : v;
    }
}


DQ_AVX512 void rows(const MatTask& t, int r0, int r1, bool add) {
  const bool affine = t.m->format == WFormat::Affine;
  if (t.nt == 1) {
    int r4 = r0 + (r1 - r0) / 4 * 4;
    affine ? affine4_dispatch<4, 1>(t, r0, r4, add) : bf16_rows<4, 1>(t, r0, r4, add);
    affine ? affine4_dispatch<1, 1>(t, r4, r1, add) : bf16_rows<1, 1>(t, r4, r1, add);
    return;
  }
  // Several tokens: one row at a time, all tokens of the tile (weights decoded once per tile).
  MatTask one = t;
  int j = 0;
  for (; j + 4 <= t.nt; j += 4) {
    for (int i = 0; i < 4; ++i) one.x[i] = t.x[j + i], one.xg[i] = t.xg[j + i], one.y[i] = t.y[j + i];
    affine ? affine4_dispatch<1, 4>(one, r0, r1, add) : bf16_rows<1, 4>(one, r0, r1, add);
  }
  for (; j < t.nt; ++j) {
    one.x[0] = t.x[j], one.xg[0] = t.xg[j], one.y[0] = t.y[j];
    affine ? affine4_dispatch<1, 1>(one, r0, r1, add) : bf16_rows<1, 1>(one, r0, r1, add);
  }
}

#define DQ_TARGET DQ_AVX512
#include "backend/cpu/kernels_ref_wrappers.inc"
#undef DQ_TARGET

// num::exp for 16 values: its steps lane by lane, its range checks as masks, and its two-step
// scaling near the ends as a second factor (1 in the normal range: an exact multiply), so that
// every lane has the scalar's bits.
DQ_AVX512_LAMBDA inline __m512 exp16(__m512 a) {
  const __mmask16 nan = _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
  const __mmask16 big = _mm512_cmp_ps_mask(a, _mm512_set1_ps(88.72283935546875f), _CMP_GT_OQ);
  const __mmask16 small = _mm512_cmp_ps_mask(a, _mm512_set1_ps(-103.97208404541015625f), _CMP_LT_OQ);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(a, _mm512_set1_ps(1.44269502162933349609375f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), a);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
  p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_cvtps_epi32(n);  // n is an integer: exact
  const __mmask16 hi = _mm512_cmpgt_epi32_mask(e, _mm512_set1_epi32(127));
  const __mmask16 lo = _mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(-126));
  __m512i e1 = _mm512_mask_mov_epi32(e, hi, _mm512_set1_epi32(127));
  e1 = _mm512_mask_mov_epi32(e1, lo, _mm512_set1_epi32(-126));
  __m512i e2 = _mm512_maskz_sub_epi32(hi, e, _mm512_set1_epi32(127));
  e2 = _mm512_mask_add_epi32(e2, lo, e, _mm512_set1_epi32(126));
  const __m512i bias = _mm512_set1_epi32(127);
  const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e1, bias), 23));
  const __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e2, bias), 23));
  __m512 res = _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
  res = _mm512_mask_mov_ps(res, small, _mm512_setzero_ps());
  res = _mm512_mask_mov_ps(res, big, _mm512_set1_ps(INFINITY));
  return _mm512_mask_mov_ps(res, nan, a);
}

DQ_AVX512 void draw_weights(const float* x, int n, float m, float T, float min_p, float* w) {
  const __m512 vm = _mm512_set1_ps(m), vT = _mm512_set1_ps(T), vp = _mm512_set1_ps(min_p);
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 xv = _mm512_loadu_ps(x + i);
    const __mmask16 live = _mm512_cmp_ps_mask(xv, _mm512_set1_ps(-INFINITY), _CMP_GT_OQ);  // NaN: false
    __mmask16 keep = live;
    const __m512 e = exp16(_mm512_div_ps(_mm512_sub_ps(xv, vm), vT));
    if (min_p > 0.0f) keep &= _mm512_cmp_ps_mask(e, vp, _CMP_GE_OQ);
    _mm512_storeu_ps(w + i, _mm512_maskz_mov_ps(keep, e));
  }
  for (; i < n; ++i) w[i] = num::draw_weight(x[i], m, T, min_p);
}

const KernelSet kAvx512 = {"avx512",    handles,   prepared_size, prepare,   rows,       swiglu_rows,
                           rmsnorm,     gdn_prep,  attn_append,   gdn_heads, attn_heads, draw_weights};

}  // namespace

const KernelSet* avx512_kernels() { return &kAvx512; }

}  // namespace dq::cpu

#else
namespace dq::cpu {
const KernelSet* avx512_kernels() { return nullptr; }
}  // namespace dq::cpu
#endif
