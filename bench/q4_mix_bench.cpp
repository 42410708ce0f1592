// deltaq-bench-q4-mix: the ceiling of the 4-bit dot's instruction mix on one core (AVX-512):
// R rows x 16 units per step. The kernel's mix now (VNNI): the words' low and high nibbles
// against x's three signed-byte limbs in six vpdpbusd, Horner shifts, one conversion and scaling,
// then the scale fma. The float mixes it replaced: each nibble made an exact float (AND +
// conversion, or a 16-entry table), one fma per weight into a chain, then the scale fma -- the
// work of the real kernel
// (src/backend/cpu/kernels_avx512.cpp) with everything in registers and L1 (no x layout, no
// scales from memory, no epilogue). Compare with deltaq-bench-matvec's in-cache figure.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <vector>

namespace {

// TABLE: the nibble becomes a float through a 16-entry table (vpermps reads the low 4 bits of
// each word, then the words shift right by 4; x unscaled), as the kernel does now. Otherwise
// nibble k is isolated with AND and converted exactly (q * 2^(4k) against x * 2^(-4k)).
template <int R, bool TABLE>
__attribute__((target("avx512f"), noinline)) float run(const uint32_t* W, const float* X, int blocks, int reps) {
  const __m512 lut = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512 acc[R];
  for (int i = 0; i < R; ++i) acc[i] = _mm512_setzero_ps();
  for (int rep = 0; rep < reps; ++rep)
    for (int b = 0; b < blocks; ++b) {
      __m512i w[R];
      __m512 p[R];
      for (int i = 0; i < R; ++i) {
        w[i] = _mm512_loadu_si512(W + (b * R + i) * 16);
        p[i] = _mm512_setzero_ps();
      }
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        const __m512 xv = _mm512_loadu_ps(X + (b % 16) * 128 + k * 16);
        for (int i = 0; i < R; ++i) {
          __m512 q;
          if (TABLE) {
            q = _mm512_permutexvar_ps(w[i], lut);
            w[i] = _mm512_srli_epi32(w[i], 4);
          } else {
            q = _mm512_cvtepu32_ps(_mm512_and_si512(w[i], _mm512_set1_epi32(int(0xFu << (4 * k)))));
          }
          p[i] = _mm512_fmadd_ps(q, xv, p[i]);
        }
      }
      for (int i = 0; i < R; ++i) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(0.5f), p[i], acc[i]);
    }
  __m512 s = acc[0];
  for (int i = 1; i < R; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

template <int R>
__attribute__((target("avx512f,avx512vnni"), noinline)) float run_vnni(const uint32_t* W, const float* X, int blocks,
                                                                         int reps) {
  const __m512i nib = _mm512_set1_epi32(0x0F0F0F0F);
  __m512 acc[R];
  for (int i = 0; i < R; ++i) acc[i] = _mm512_setzero_ps();
  for (int rep = 0; rep < reps; ++rep)
    for (int b = 0; b < blocks; ++b) {
      const float* xb = X + (b % 16) * 128;
      __m512i xl[6];
      for (int s = 0; s < 6; ++s) xl[s] = _mm512_loadu_si512(xb + 16 * s);
      const __m512 step = _mm512_loadu_ps(xb + 96);
      for (int i = 0; i < R; ++i) {
        const __m512i w = _mm512_loadu_si512(W + (b * R + i) * 16);
        const __m512i lo = _mm512_and_si512(w, nib), hi = _mm512_and_si512(_mm512_srli_epi32(w, 4), nib);
        __m512i P = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xl[0]);
        P = _mm512_dpbusd_epi32(P, hi, xl[1]);
        P = _mm512_slli_epi32(P, 8);
        P = _mm512_dpbusd_epi32(P, lo, xl[2]);
        P = _mm512_dpbusd_epi32(P, hi, xl[3]);
        P = _mm512_slli_epi32(P, 8);
        P = _mm512_dpbusd_epi32(P, lo, xl[4]);
        P = _mm512_dpbusd_epi32(P, hi, xl[5]);
        acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(0.5f), _mm512_mul_ps(_mm512_cvtepi32_ps(P), step), acc[i]);
      }
    }
  __m512 s = acc[0];
  for (int i = 1; i < R; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

template <int R, bool PERMUTE = false, bool VNNI = false>
void measure() {
  // Q4MIX_BLOCKS: blocks of weights cycled through (64: in L1; 2048 x 4 rows: L2; 32768: L3).
  static const int blocks = std::max(1, std::getenv("Q4MIX_BLOCKS") ? std::atoi(std::getenv("Q4MIX_BLOCKS")) : 64);
  const int reps = 20000 * 64 / blocks;
  std::vector<uint32_t> W(size_t(blocks) * R * 16);
  for (size_t i = 0; i < W.size(); ++i) W[i] = uint32_t(i * 2654435761u);
  std::vector<float> X(16 * 128, 1e-3f);
  double best = 0;
  float sink = 0;
  for (int t = 0; t < 3; ++t) {
    const auto t0 = std::chrono::steady_clock::now();
    sink += VNNI ? run_vnni<R>(W.data(), X.data(), blocks, reps) : run<R, PERMUTE>(W.data(), X.data(), blocks, reps);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double gw = double(reps) * blocks * R * 128 / s / 1e9;
    if (gw > best) best = gw;
  }
  std::printf("%s%d rows per step: %6.2f G weights/s on one core = %5.2f GB/s of 4-bit weights (%g)\n", VNNI ? "VNNI (the kernel's mix), " : PERMUTE ? "table (vpermps + shift), " : "", R, best, best / 2,
              double(sink) * 0);
}

}  // namespace

int main() {
  if (!__builtin_cpu_supports("avx512f")) {
    std::printf("deltaq-bench-q4-mix: this CPU has no AVX-512\n");
    return 0;
  }
  measure<1>();
  measure<2>();
  measure<4>();
  measure<8>();
  measure<4, true>();
  measure<8, true>();
  if (__builtin_cpu_supports("avx512vnni")) {
    measure<2, false, true>();
    measure<4, false, true>();
    measure<8, false, true>();
  }
  return 0;
}
