// The shared elementary functions and conversions (ops/numerics.h, core/dtype.h), checked
// against double precision and against the CPU's own F16C conversions.
#include <gtest/gtest.h>
#include <immintrin.h>

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
