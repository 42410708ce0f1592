// Every op on every CPU kernel set (generic, AVX2, AVX-512: whichever this CPU runs) with 1, 2
// and 3 threads, against the scalar reference: bit-identical results (the numerics contract).
#include <cstring>

#include "backend/cpu/cpu_runner.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/unit_limbs.h"
#include "ops/reference.h"
#include "parity_cases.h"

using namespace dq;
using namespace parity;

namespace {

std::vector<Target> cpu_targets() {
  std::vector<Target> out;
  for (CpuKernels k : {CpuKernels::Generic, CpuKernels::Avx2, CpuKernels::Avx512}) {
    try {
      resolve_cpu_kernels(k);
    } catch (const std::exception&) {
      continue;
    }
    for (int t : {1, 2, 3}) {
      std::shared_ptr<Backend> be = make_cpu_backend(k, t);
      std::shared_ptr<Queue> q = be->make_queue();
      out.push_back({std::string(cpu_kernels_name(k)) + "/" + std::to_string(t) + "t", be, q, {}, {}});
    }
  }
  return out;
}

}  // namespace

TEST(OpsParity, ProjectAllFormatsShapesAndTokenCounts) {
  auto t = cpu_targets();
  project_cases(t);
}
TEST(OpsParity, LargeProject) {
  auto t = cpu_targets();
  large_project_cases(t);
}
TEST(OpsParity, ProjectMixedOutputsAndSwiGLU) {
  auto t = cpu_targets();
  mixed_and_swiglu_cases(t);
  swiglu_product_cases(t);
}
TEST(OpsParity, Embed) {
  auto t = cpu_targets();
  embed_cases(t);
}
TEST(OpsParity, GatedDeltaNet) {
  auto t = cpu_targets();
  gdn_cases(t);
  gdn_two_steps_case(t);
  gdn_mixer_cases(t);
}
TEST(OpsParity, GatedAttention) {
  auto t = cpu_targets();
  attn_cases(t);
  attn_two_steps_case(t);
}
TEST(OpsParity, ArgmaxTiesTakeTheLowestIndex) {
  auto t = cpu_targets();
  argmax_cases(t);
}
TEST(OpsParity, TopKOrdersByValueThenIndex) {
  auto t = cpu_targets();
  top_k_cases(t);
}
TEST(OpsParity, SampleDraw) {
  auto t = cpu_targets();
  sample_draw_cases(t);
}
// The draw follows the softmax: over many uniforms, each id's share of the draws is its
// probability (double precision), and the declining rows give -1.
TEST(OpsParity, SampleDrawFollowsTheSoftmax) {
  std::vector<float> x = {1.0f, -0.5f, 2.0f, NAN, 0.25f, -INFINITY, 1.5f};
  for (int i = 0; i < 100; ++i) x.push_back(-3.0f + 0.01f * i);  // a second chunk, small weights
  const int n = int(x.size());
  for (float T : {0.7f, 1.3f})
    for (float min_p : {0.0f, 0.2f}) {
      std::vector<double> p(size_t(n), 0.0);
      double z = 0;
      for (int i = 0; i < n; ++i) {
        const double w = x[i] > -INFINITY ? std::exp((double(x[i]) - 2.0) / T) : 0.0;
        p[size_t(i)] = min_p > 0 && w < min_p ? 0.0 : w;
        z += p[size_t(i)];
      }
      const int draws = 200000;
      std::vector<int> count(size_t(n), 0);
      for (int k = 0; k < draws; ++k) {
        const int id = ref::draw_plain(x.data(), n, T, min_p, (k + 0.5) / draws);  // stratified uniforms
        ASSERT_GE(id, 0);
        ++count[size_t(id)];
      }
      for (int i = 0; i < n; ++i) EXPECT_NEAR(count[size_t(i)] / double(draws), p[size_t(i)] / z, 2e-5) << i << " T " << T;
    }
  const float none[3] = {NAN, -INFINITY, NAN}, inf[3] = {1.0f, INFINITY, 2.0f};
  EXPECT_EQ(ref::draw_plain(none, 3, 1.0f, 0.0f, 0.3), -1);
  EXPECT_EQ(ref::draw_plain(inf, 3, 1.0f, 0.0f, 0.3), -1);
}
// A declined draw leaves its next-input slot (out2) as it was (the engine's pipelined draw
// then feeds the argmax written there and takes the step back); a drawn id is written there.
TEST(OpsParity, SampleDrawWritesTheNextInputOnlyWhenItDraws) {
  for (CpuKernels k : {CpuKernels::Reference, CpuKernels::Auto}) {
    std::shared_ptr<Backend> be = make_cpu_backend(k, 2);
    auto q = be->make_queue();
    const float inf[3] = {1.0f, INFINITY, 2.0f}, fine[3] = {1.0f, 3.0f, 2.0f};
    const int32_t seven = 7;
    for (const float* row : {inf, fine}) {
      Ref x{be->upload(row, 12, "x")}, out{be->upload(&seven, 4, "out")}, next{be->upload(&seven, 4, "next")};
      q->go(op::SampleDraw{x, 3, 1.0f, 0.0f, 0.25, out, next, Ref{}});
      q->wait();
      if (row == inf) {
        EXPECT_EQ(out.as<int32_t>()[0], -1);
        EXPECT_EQ(next.as<int32_t>()[0], 7);
      } else {
        EXPECT_GE(out.as<int32_t>()[0], 0);
        EXPECT_EQ(next.as<int32_t>()[0], out.as<int32_t>()[0]);
      }
    }
  }
}
TEST(OpsParity, SampleDrawRejectsBadParameters) {
  Rig rig;
  std::vector<float> x(10, 1.0f);
  Ref xr{rig.ref->upload(x.data(), x.size() * 4, "x")}, out = rig.zeros(4);
  struct Bad {
    int n;
    float T, min_p;
    double u;
    const char* what;
  };
  for (Bad b : {Bad{0, 1, 0, 0.5, "empty row"}, Bad{10, 0, 0, 0.5, "temperature"}, Bad{10, INFINITY, 0, 0.5, "temperature"},
                Bad{10, 1, 1.5f, 0.5, "min_p"}, Bad{10, 1, 0, 1.0, "u 1"}, Bad{10, 1, 0, -0.1, "u -0.1"}}) {
    rig.ref_q->go(op::SampleDraw{xr, b.n, b.T, b.min_p, b.u, out, Ref{}, Ref{}});
    try {
      rig.ref_q->wait();
      ADD_FAILURE() << b.what << " was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(b.what), std::string::npos) << e.what();
    }
  }
}
// op::TopDraw: the id from op::TopK's pairs, -1 (and the next input left as it was) when they do
// not decide it: a top value of +inf, or no number past the top_k (the row has at most top_k).
TEST(OpsParity, TopDrawDecidesOnlyFromEnoughPairs) {
  for (CpuKernels k : {CpuKernels::Reference, CpuKernels::Auto}) {
    std::shared_ptr<Backend> be = make_cpu_backend(k, 2);
    auto q = be->make_queue();
    const int32_t ids[4] = {4, 1, 7, 2}, seven = 7;
    const float fine[4] = {3.0f, 2.0f, 1.0f, 0.5f}, inf[4] = {INFINITY, 2.0f, 1.0f, 0.5f},
                short_row[4] = {3.0f, 2.0f, -INFINITY, NAN};
    for (const float* row : {fine, inf, short_row}) {
      Ref ir{be->upload(ids, 16, "ids")}, vr{be->upload(row, 16, "vals")};
      Ref out{be->upload(&seven, 4, "out")}, next{be->upload(&seven, 4, "next")};
      q->go(op::TopDraw{ir, vr, Ref{}, 4, 3, 1.0f, 1.0f, 0.0f, 0.999, out, next});
      q->wait();
      if (row == fine) {
        EXPECT_EQ(out.as<int32_t>()[0], 7);  // u near 1: the last of the top 3
        EXPECT_EQ(next.as<int32_t>()[0], 7);
      } else {
        EXPECT_EQ(out.as<int32_t>()[0], -1);
        EXPECT_EQ(next.as<int32_t>()[0], 7);
      }
    }
  }
}
TEST(OpsParity, TopDrawRejectsBadParameters) {
  Rig rig;
  const int32_t ids[4] = {0, 1, 2, 3};
  const float vals[4] = {3.0f, 2.0f, 1.0f, 0.5f};
  Ref ir{rig.ref->upload(ids, 16, "ids")}, vr{rig.ref->upload(vals, 16, "vals")}, out = rig.zeros(4);
  struct Bad {
    int k, top_k;
    float T, top_p, min_p;
    double u;
    const char* what;
  };
  for (Bad b : {Bad{0, 0, 1, 1, 0, 0.5, "k = 0"}, Bad{300, 3, 1, 1, 0, 0.5, "k = 300"}, Bad{4, 4, 1, 1, 0, 0.5, "top_k = 4"},
                Bad{4, 0, 1, 0.5f, 0, 0.5, "total"}, Bad{4, 3, 0, 1, 0, 0.5, "temperature"},
                Bad{4, 3, 1, 0, 0, 0.5, "top_p"}, Bad{4, 3, 1, 1, 2, 0.5, "min_p"}, Bad{4, 3, 1, 1, 0, 1.0, "u 1"}}) {
    rig.ref_q->go(op::TopDraw{ir, vr, Ref{}, b.k, b.top_k, b.T, b.top_p, b.min_p, b.u, out, Ref{}});
    try {
      rig.ref_q->wait();
      ADD_FAILURE() << b.what << " was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(b.what), std::string::npos) << e.what();
    }
  }
}
TEST(OpsParity, TopKRejectsAnOutOfRangeK) {
  Rig rig;
  std::vector<float> x(300, 1.0f);
  Ref xr{rig.ref->upload(x.data(), x.size() * 4, "x")}, ids = rig.zeros(2048), vals = rig.zeros(2048);
  for (int k : {0, 257, 301}) {
    rig.ref_q->go(op::TopK{xr, 300, k, ids, vals});
    try {
      rig.ref_q->wait();
      ADD_FAILURE() << "k = " << k << " was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("top_k: k = " + std::to_string(k)), std::string::npos) << e.what();
    }
  }
}

// The kernel sets' draw weights (their vector exp) against numerics.h's scalar draw_weight, bit
// for bit, over arguments from -200 to +100 (zero, the two-step scaling below 2^-126, the
// normal range, overflow), the range checks' edges, NaN and infinities, with and without min-p.
TEST(OpsParity, DrawWeightsEqualTheScalarOnEveryKernelSet) {
  std::vector<float> x;
  for (int i = 0; i <= 30000; ++i) x.push_back(-200.0f + 0.01f * float(i));
  for (float v : {88.72283935546875f, 88.7228317f, 88.7228470f, -103.97208404541015625f, -103.972076f,
                  -103.972092f, -87.3365479f, -87.3365402f, 0.0f, -0.0f, NAN, INFINITY, -INFINITY, 1e-30f})
    x.push_back(v);
  x.push_back(-5.0f);  // n not a multiple of 8 or 16: the scalar tail
  for (CpuKernels k : {CpuKernels::Generic, CpuKernels::Avx2, CpuKernels::Avx512}) {
    try {
      resolve_cpu_kernels(k);
    } catch (const std::exception&) {
      continue;
    }
    const cpu::KernelSet* ks = k == CpuKernels::Generic ? cpu::generic_kernels()
                               : k == CpuKernels::Avx2  ? cpu::avx2_kernels()
                                                        : cpu::avx512_kernels();
    ASSERT_NE(ks, nullptr);
    for (float T : {1.0f, 0.3f, 2.5f})
      for (float min_p : {0.0f, 0.05f}) {
        std::vector<float> w(x.size());
        ks->draw_weights(x.data(), int(x.size()), 0.0f, T, min_p, w.data());
        for (size_t i = 0; i < x.size(); ++i) {
          const float want = num::draw_weight(x[i], 0.0f, T, min_p);
          uint32_t a, b;
          std::memcpy(&a, &w[i], 4);
          std::memcpy(&b, &want, 4);
          ASSERT_EQ(a, b) << ks->name << " x=" << x[i] << " T=" << T << " min_p=" << min_p;
        }
      }
  }
}

// The SIMD sets' prepared x for 4-bit rows (unit integers as limbs, unit_limbs.h) against the
// scalar form byte for byte: whole blocks and a partial last one, every magnitude of a unit's
// largest input (the scale's exponent), rounding halves, zero and tiny units (below 2^-100),
// subnormals, -0, infinities and NaN.
TEST(OpsParity, PreparedLimbsEqualTheScalarForm) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> expo(-140, 127), kind(0, 15);
  auto unit_value = [&](int e) {
    switch (kind(rng)) {
      case 0: return 0.0f;
      case 1: return -0.0f;
      case 2: return std::ldexp(1.0f, e);                            // a power of two
      case 3: return std::ldexp(1.999999881f, std::min(e, 126));   // just below the next one
      case 4: return std::ldexp(float(int(normal(rng) * 8)) + 0.5f, e - 24);  // a half to round
      case 5: return 1e-40f * normal(rng);                             // subnormal
      default: return std::ldexp(normal(rng), e);
    }
  };
  int sets_checked = 0;
  for (CpuKernels k : {CpuKernels::Avx2, CpuKernels::Avx512}) {
    try {
      resolve_cpu_kernels(k);
    } catch (const std::exception&) {
      continue;
    }
    ++sets_checked;
    const cpu::KernelSet* ks = k == CpuKernels::Avx2 ? cpu::avx2_kernels() : cpu::avx512_kernels();
    ASSERT_NE(ks, nullptr);
    const int L = k == CpuKernels::Avx2 ? 8 : 16;
    for (int U : {1, 7, 8, 15, 16, 17, 31, 32, 33, 256, 257, 768}) {
      Matrix m;
      m.format = WFormat::Affine;
      m.bits = 4;
      m.group_size = 32;
      m.cols = 8 * U;
      m.rows = 1;
      for (int trial = 0; trial < 20; ++trial) {
        std::vector<float> x(size_t(8 * U));
        for (int u = 0; u < U; ++u) {
          const int e = trial == 0 ? -110 + u % 20 : expo(rng);  // trial 0: around the 2^-100 cut
          for (int j = 0; j < 8; ++j) x[size_t(8 * u + j)] = unit_value(e - j % 3);
          if (kind(rng) == 0) x[size_t(8 * u + kind(rng) % 8)] = kind(rng) < 8 ? NAN : (kind(rng) < 8 ? INFINITY : -INFINITY);
        }
        const size_t n = ks->prepared_size(m);
        ASSERT_EQ(n % size_t(8 * L), 0u);
        std::vector<float> got(n, 1.0f), want(n, 2.0f);
        ks->prepare(m, x.data(), got.data());
        cpu::prepare_unit_limbs(x.data(), U, L, size_t(8 * L), n, want.data());
        ASSERT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0) << ks->name << " U=" << U << " trial " << trial;
      }
    }
  }
  if (sets_checked == 0) GTEST_SKIP() << "neither AVX2 nor AVX-512 on this CPU: nothing to compare";
}
