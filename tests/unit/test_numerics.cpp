// The shared elementary functions and conversions (ops/numerics.h, core/dtype.h), checked
// against double precision and against the CPU's own F16C conversions.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "core/dtype.h"
#include "ops/numerics.h"

using namespace dq;

namespace {
double ulp_error(float got, double want) {
  if (std::isnan(want)) return std::isnan(got) ? 0 : 1e9;
  if (std::isinf(want)) return got == float(want) ? 0 : 1e9;
  float w = float(want);
  double ulp = std::fabs(double(std::nextafter(w, INFINITY)) - double(w));
  if (ulp == 0 || std::isinf(ulp)) ulp = std::ldexp(1.0, -149);
  return std::fabs(double(got) - want) / ulp;
}
}  // namespace

TEST(Numerics, ExpIsWithinTwoUlp) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-104.f, 89.f);
  double worst = 0;
  for (int i = 0; i < 200000; ++i) {
    float x = d(rng);
    worst = std::max(worst, ulp_error(num::exp(x), std::exp(double(x))));
  }
  for (float x : {0.f, -0.f, 1.f, -1.f, 88.72f, -87.3f, -100.f, -103.9f, 1e-8f, -1e-8f})
    worst = std::max(worst, ulp_error(num::exp(x), std::exp(double(x))));
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(num::exp(89.f), INFINITY);
  EXPECT_EQ(num::exp(-104.f), 0.f);
  EXPECT_TRUE(std::isnan(num::exp(NAN)));
  EXPECT_EQ(num::exp(0.f), 1.f);
}

TEST(Numerics, LogAndLog1p) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> e(-140.f, 127.f);
  double worst = 0;
  for (int i = 0; i < 200000; ++i) {
    float x = std::exp2(e(rng));
    worst = std::max(worst, ulp_error(num::log(x), std::log(double(x))));
  }
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(num::log(0.f), -INFINITY);
  EXPECT_TRUE(std::isnan(num::log(-1.f)));
  worst = 0;
  std::uniform_real_distribution<float> e2(-30.f, 30.f);
  for (int i = 0; i < 200000; ++i) {
    float x = std::exp2(e2(rng));
    worst = std::max(worst, ulp_error(num::log1p(x), std::log1p(double(x))));
  }
  EXPECT_LE(worst, 4.0);
  EXPECT_EQ(num::log1p(1e-30f), 1e-30f);
}

TEST(Numerics, ActivationsMatchTheirDefinitions) {
  for (float x : {-30.f, -5.f, -0.5f, 0.f, 0.3f, 4.f, 19.f, 21.f, 60.f}) {
    double sig = 1.0 / (1.0 + std::exp(-double(x)));
    EXPECT_NEAR(num::sigmoid(x), sig, 3e-7 * std::max(1.0, sig)) << x;
    EXPECT_NEAR(num::silu(x), x * sig, 3e-7 * std::max(1.0, std::fabs(x * sig))) << x;
    double sp = x > 20 ? x : std::log1p(std::exp(double(x)));
    EXPECT_NEAR(num::softplus(x), sp, 3e-7 * std::max(1.0, sp)) << x;
  }
  EXPECT_EQ(num::softplus(25.f), 25.f);  // PyTorch's threshold
}

TEST(Numerics, ButterflyOrderIsTheWarpOrder) {
  // The butterfly must be the order of xor-shuffles over 32 lanes: emulate the warp.
  std::mt19937 rng(3);
  std::normal_distribution<float> n;
  for (int rep = 0; rep < 1000; ++rep) {
    float lane[32], warp[32];
    for (int l = 0; l < 32; ++l) lane[l] = warp[l] = n(rng) * std::exp2(float(int(rng() % 40) - 20));
    for (int m = 16; m >= 1; m >>= 1) {
      float next[32];
      for (int l = 0; l < 32; ++l) next[l] = warp[l] + warp[l ^ m];
      std::memcpy(warp, next, sizeof warp);
    }
    float b = num::butterfly32(lane);
    for (int l = 0; l < 32; ++l) ASSERT_EQ(std::memcmp(&warp[l], &b, 4), 0);
  }
}

// The 4-bit unit dot in integers (numerics.h quantize_unit / unit_dot_q4): the integers stay
// within the bounds that make the sums exact, the limbs rebuild them, and the result is within
// the rounding the scheme allows of the exact dot (double precision).
// CUDA's tensor-core prefill (matvec_mma.cu) takes the unit's integer from two f16 products:
// sum_k q_k h_k and sum_k q_k l_k in f32, then fmaf(sh, 2^11, sl). That must be the one rounding of
// the exact integer that unit_dot_q4 makes: h and l exact halves, each sum exact in f32.
TEST(Numerics, UnitDotFromHalvesEqualsTheIntegerUnit) {
  std::mt19937 rng(11);
  std::normal_distribution<float> n;
  auto half_exact = [](int32_t v) { return v >= -2048 && v <= 2048; };  // every integer of f16's range here
  int edge = 0;
  for (int rep = 0; rep < 200000; ++rep) {
    float x[8];
    for (float& v : x) v = n(rng) * std::exp2(float(int(rng() % 60) - 30));
    if (rep % 7 == 0) {  // the largest just below 2^11 (and above the rest): its integer rounds up to 2^22
      for (float& v : x) v = std::fmod(v, 1024.0f);
      x[rng() % 8] = (rng() & 1 ? 1.0f : -1.0f) * std::nextafter(2048.0f, 0.0f);
    }
    const num::UnitInts q = num::quantize_unit(x);
    const uint32_t word = rep % 5 == 0 ? 0xFFFFFFFFu : uint32_t(rng());
    int64_t sh = 0, sl = 0;
    if (rep % 7 == 0) edge += std::find(q.xi, q.xi + 8, 1 << 22) != q.xi + 8 || std::find(q.xi, q.xi + 8, -(1 << 22)) != q.xi + 8;
    for (int k = 0; k < 8; ++k) {
      int32_t h, l;
      num::split_halves(q.xi[k], &h, &l);
      ASSERT_EQ(h * 2048 + l, q.xi[k]);
      ASSERT_TRUE(half_exact(h) && l >= -1024 && l < 1024) << q.xi[k];
      const int qk = int((word >> (4 * k)) & 15u);
      sh += int64_t(qk) * h;
      sl += int64_t(qk) * l;
    }
    ASSERT_LT(std::llabs(sh), int64_t(1) << 24);  // exact in f32 whatever the order of the sum
    ASSERT_LT(std::llabs(sl), int64_t(1) << 24);
    const float p = std::fmaf(float(sh), 2048.0f, float(sl)) * q.step;
    const float want = num::unit_dot_q4(word, q);
    ASSERT_EQ(std::memcmp(&p, &want, 4), 0) << rep << ": " << p << " vs " << want;
  }
  EXPECT_GT(edge, 20000);  // units whose integer reached +-2^22 (h = +-2048) were among them
  for (int32_t v : {1 << 22, -(1 << 22), (1 << 22) - 1, -(1 << 22) + 1, 1023, 1024, -1024, -1025, 0, 2047, -2049}) {
    int32_t h, l;
    num::split_halves(v, &h, &l);
    EXPECT_EQ(h * 2048 + l, v);
    EXPECT_TRUE(half_exact(h) && l >= -1024 && l < 1024) << v;
  }
}

// The lanes' values arriving one lane at a time (num::LaneTree, CUDA's tensor-core prefill) sum to
// butterfly32's bits: values of mixed magnitudes and signs (rounding in every addition), inf, NaN.
TEST(Numerics, LaneTreeIsTheButterfly) {
  std::mt19937 rng(3);
  std::normal_distribution<float> n;
  int lanes_seen = 0;
  for (int rep = 0; rep < 20000; ++rep) {
    float v[32];
    for (float& x : v) x = n(rng) * std::exp2(float(int(rng() % 40) - 20));
    if (rep % 97 == 0) v[rng() % 32] = INFINITY;
    if (rep % 89 == 0) v[rng() % 32] = NAN;
    float lanes[32];
    std::copy(v, v + 32, lanes);
    const float want = num::butterfly32(lanes);
    num::LaneTree tree;
    float got = 0.0f;
    uint32_t seen = 0;
    for (int s = 0; s < 32; ++s) {
      const int l = num::rev5(s);
      seen |= 1u << l;
      ASSERT_EQ(tree.push(s, v[l], &got), s == 31) << s;
    }
    lanes_seen += seen == 0xFFFFFFFFu;
    ASSERT_EQ(std::memcmp(&got, &want, 4), 0) << rep << ": " << got << " vs " << want;
    // Split in two (the tensor-core kernel's two warps an m-tile): arrivals 0-15 and 16-31 each
    // into a tree of their own, then the butterfly's last level over the halves' sums.
    num::LaneTree half[2];
    for (int q = 0; q < 2; ++q)
      for (int i = 0; i < 16; ++i) ASSERT_FALSE(half[q].push(i, v[num::rev5(16 * q + i)], &got));
    const float split2 = half[0].pend[4] + half[1].pend[4];
    ASSERT_EQ(std::memcmp(&split2, &want, 4), 0) << rep << ": " << split2 << " vs " << want;
  }
  EXPECT_EQ(lanes_seen, 20000);  // rev5 visits every lane once
}

TEST(Numerics, UnitIntegersAreBoundedAndCloseToTheInputs) {
  std::mt19937 rng(5);
  std::normal_distribution<float> n;
  double worst_rel = 0;
  for (int rep = 0; rep < 200000; ++rep) {
    float x[8];
    const int spread = int(rng() % 40);  // magnitudes within a unit differ by up to 2^40
    for (float& v : x) v = n(rng) * std::exp2(float(int(rng() % (spread + 1)) - 20 + int(rng() % 60) - 30));
    if (rng() % 5 == 0) x[rng() % 8] = 0.0f;
    const num::UnitInts q = num::quantize_unit(x);
    float mx = 0;
    for (float v : x) mx = std::max(mx, std::fabs(v));
    ASSERT_GT(q.step, 0.0f);
    ASSERT_LE(double(mx) / q.step, 0x1p22);  // the largest input maps into [2^21, 2^22]
    ASSERT_GE(double(mx) / q.step, 0x1p21);
    const uint32_t word = uint32_t(rng());
    double exact = 0, bound = 0;
    for (int k = 0; k < 8; ++k) {
      ASSERT_LE(std::abs(q.xi[k]), 1 << 22);
      ASSERT_LE(std::fabs(double(x[k]) - double(q.xi[k]) * q.step), 0.5 * q.step);  // one rounding
      int32_t l1, l2, l3;
      num::split_limbs(q.xi[k], &l1, &l2, &l3);
      ASSERT_TRUE(l1 >= -128 && l1 <= 127 && l2 >= -128 && l2 <= 127 && l3 >= -128 && l3 <= 127);
      ASSERT_EQ(l1 * 65536 + l2 * 256 + l3, q.xi[k]);
      const int qk = int((word >> (4 * k)) & 15u);
      exact += double(qk) * x[k];
      bound += qk * 0.5 * q.step;
    }
    const double got = num::unit_dot_q4(word, q);
    ASSERT_LE(std::fabs(got - exact), bound + std::fabs(exact) * 0x1p-23 + 1e-300) << rep;
    // Against the scale of the unit (its largest term), the error is about fp32's rounding.
    worst_rel = std::max(worst_rel, std::fabs(got - exact) / (15.0 * mx));
  }
  EXPECT_LT(worst_rel, 8 * 0x1p-22);
  for (int32_t v : {1 << 22, -(1 << 22), (1 << 22) - 1, -(1 << 22) + 1, 127, 128, -128, -129, 0, 32767, -32769}) {
    int32_t l1, l2, l3;
    num::split_limbs(v, &l1, &l2, &l3);
    EXPECT_EQ(l1 * 65536 + l2 * 256 + l3, v);
    EXPECT_TRUE(l1 >= -128 && l1 <= 127 && l2 >= -128 && l2 <= 127 && l3 >= -128 && l3 <= 127) << v;
  }
}

TEST(Numerics, UnitIntegersOfZeroTinyAndNonFiniteUnits) {
  const float zero[8] = {};
  EXPECT_EQ(num::unit_dot_q4(0xFFFFFFFFu, num::quantize_unit(zero)), 0.0f);
  const float tiny[8] = {1e-31f, -5e-32f, 0, 0, 0, 0, 0, 7e-33f};  // all below 2^-100
  EXPECT_EQ(num::unit_dot_q4(0xFFFFFFFFu, num::quantize_unit(tiny)), 0.0f);
  const float small[8] = {1e-30f, 0, 0, 0, 0, 0, 0, 0};  // just above: kept
  EXPECT_NEAR(num::unit_dot_q4(0x0000000Fu, num::quantize_unit(small)), 15e-30, 15e-30 * 1e-6);
  float bad[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  bad[3] = NAN;
  EXPECT_TRUE(std::isnan(num::unit_dot_q4(0x11111111u, num::quantize_unit(bad))));
  bad[3] = INFINITY;
  EXPECT_TRUE(std::isnan(num::unit_dot_q4(0x11111111u, num::quantize_unit(bad))));
  const float big[8] = {3e38f, -3e38f, 1, 0, 0, 0, 0, 0};  // largest normal binade: step stays normal
  const num::UnitInts q = num::quantize_unit(big);
  EXPECT_EQ(q.xi[2], 0);
  EXPECT_NEAR(double(q.xi[0]) * q.step, 3e38, 3e38 * 0x1p-21);
  EXPECT_EQ(num::unit_dot_q4(0x00000011u, q), float(q.xi[0] + q.xi[1]) * q.step);
}

TEST(Dtype, F16RoundTripsMatchTheHardware) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float want = _cvtsh_ss(uint16_t(h));
    float got = f16_to_f32(uint16_t(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got));
      continue;
    }
    ASSERT_EQ(std::memcmp(&want, &got, 4), 0) << h;
  }
  std::mt19937 rng(4);
  for (int i = 0; i < 1000000; ++i) {
    uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)) << f;
  }
}

TEST(Dtype, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  float just_above_half = bits_to_f32(0x3f808000u);  // exactly halfway: ties to even (0x3f80)
  EXPECT_EQ(f32_to_bf16(just_above_half), 0x3f80);
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f818000u)), 0x3f82);  // halfway, rounds up to even
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f808001u)), 0x3f81);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}
