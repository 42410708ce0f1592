// Sampler: exact greedy, seeds, and chi-square tests of the sampled distribution against a plain
// reference computation of what temperature / top_k / top_p / min_p / penalties should give.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "ops/reference.h"
#include "runtime/sampler.h"

using dq::Sampler;
using dq::SamplingParams;

namespace {

// The distribution the parameters define, computed the plain way (full sort, double softmax).
std::vector<double> expected_probs(std::vector<float> l, const SamplingParams& p) {
  const size_t V = l.size();
  std::vector<int> ids;
  for (size_t i = 0; i < V; ++i)
    if (!std::isnan(l[i]) && l[i] > -INFINITY) ids.push_back(int(i));
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return l[a] > l[b]; });
  if (p.top_k > 0 && size_t(p.top_k) < ids.size()) ids.resize(size_t(p.top_k));
  double m = l[ids[0]];
  std::vector<double> w;
  double z = 0;
  for (int i : ids) {
    w.push_back(std::exp((l[i] - m) / p.temperature));
    z += w.back();
  }
  if (p.top_p < 1) {
    double cum = 0;
    size_t keep = 0;
    while (keep < ids.size() && cum < p.top_p * z) cum += w[keep++];
    ids.resize(keep);
    w.resize(keep);
  }
  std::vector<double> out(V, 0.0);
  double total = 0;
  for (size_t j = 0; j < ids.size(); ++j)
    if (w[j] >= p.min_p * w[0]) total += w[j];
  for (size_t j = 0; j < ids.size(); ++j)
    if (w[j] >= p.min_p * w[0]) out[ids[j]] = w[j] / total;
  return out;
}

// Upper critical value of chi-square with df degrees of freedom at z standard deviations
// (Wilson-Hilferty); z = 3.72 is a one-sided p of 1e-4.
double chi2_critical(int df, double z = 3.72) {
  double a = 2.0 / (9.0 * df);
  return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

struct Chi2 {
  double stat = 0;
  int df = 0;
  bool impossible_seen = false;
};

Chi2 chi_square(const std::vector<float>& logits, const SamplingParams& p, int n,
                const std::vector<double>& expect, std::span<const int32_t> history = {},
                size_t prompt_len = 0) {
  Sampler s(p);
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < n; ++i) ++counts[size_t(s.sample(logits, history, prompt_len))];
  Chi2 c;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (expect[i] == 0) {
      if (counts[i]) c.impossible_seen = true;
      continue;
    }
    double e = expect[i] * n;
    c.stat += (counts[i] - e) * (counts[i] - e) / e;
    ++c.df;
  }
  c.df -= 1;
  return c;
}

const std::vector<float> kLogits = {2.0f, 1.5f, 1.5f, 0.3f, 0.0f, -0.5f, -1.0f, -2.0f, NAN, -INFINITY, 0.7f, -3.0f};

SamplingParams params(float t, int k, float top_p, float min_p, uint64_t seed) {
  SamplingParams p;
  p.temperature = t;
  p.top_k = k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.seed = seed;
  return p;
}

}  // namespace

TEST(Sampler, ChiSquareMatchesExpectedDistribution) {
  const std::vector<SamplingParams> cases = {
      params(1.0f, 0, 1.0f, 0.0f, 1),  params(0.7f, 0, 1.0f, 0.0f, 2),  params(1.5f, 4, 1.0f, 0.0f, 3),
      params(1.0f, 0, 0.8f, 0.0f, 4),  params(1.0f, 0, 1.0f, 0.2f, 5),  params(0.8f, 6, 0.9f, 0.05f, 6),
      params(2.0f, 0, 0.95f, 0.0f, 7), params(1.0f, 3, 1.0f, 0.0f, 8),
  };
  const int n = 40000;
  for (const auto& p : cases) {
    auto expect = expected_probs(kLogits, p);
    Chi2 c = chi_square(kLogits, p, n, expect);
    SCOPED_TRACE(::testing::Message() << "T=" << p.temperature << " top_k=" << p.top_k << " top_p=" << p.top_p
                                      << " min_p=" << p.min_p);
    EXPECT_FALSE(c.impossible_seen) << "an id outside the kept set was drawn";
    ASSERT_GT(c.df, 0);
    EXPECT_LT(c.stat, chi2_critical(c.df)) << "chi-square " << c.stat << " with " << c.df << " df";
  }
}

TEST(Sampler, ChiSquareDetectsAWrongDistribution) {
  // The test has power: the T=1 samples do not pass as T=0.7.
  auto expect = expected_probs(kLogits, params(0.7f, 0, 1, 0, 0));
  Chi2 c = chi_square(kLogits, params(1.0f, 0, 1, 0, 11), 40000, expect);
  EXPECT_GT(c.stat, chi2_critical(c.df));
}

TEST(Sampler, ChiSquareWithPenalties) {
  // Penalties change the logits first; the draw then follows the penalized distribution.
  SamplingParams p = params(1.0f, 0, 1, 0, 21);
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  p.repetition_penalty = 1.3f;
  const std::vector<int32_t> history = {3, 0, 0, 1, 6, 6, 6};  // the first 2 are the prompt
  std::vector<float> pen = kLogits;
  for (int id : {3, 0, 1, 6}) pen[size_t(id)] = pen[size_t(id)] > 0 ? pen[size_t(id)] / 1.3f : pen[size_t(id)] * 1.3f;
  pen[0] -= 0.25f * 1 + 0.5f;  // generated: 0 once, 1 once, 6 three times (3 only in the prompt)
  pen[1] -= 0.25f * 1 + 0.5f;
  pen[6] -= 0.25f * 3 + 0.5f;
  auto expect = expected_probs(pen, p);
  Chi2 c = chi_square(kLogits, p, 40000, expect, history, 2);
  EXPECT_FALSE(c.impossible_seen);
  EXPECT_LT(c.stat, chi2_critical(c.df));
}

TEST(Sampler, TopPOnALargeVocabularyKeepsTheLowestIdsOnTies) {
  // 3000 equal logits: top_p = 0.5 keeps exactly ids 0..1499 (ties go to the lower id); this also
  // runs the growing partial sort past its first 256 ids.
  std::vector<float> l(3000, 0.25f);
  Sampler s(params(1.0f, 0, 0.5f, 0, 5));
  std::vector<int> bins(10, 0);
  const int n = 6000;
  for (int i = 0; i < n; ++i) {
    int id = s.sample(l, {});
    ASSERT_LT(id, 1500);
    ++bins[size_t(id / 150)];
  }
  double stat = 0;
  for (int b : bins) stat += (b - n / 10.0) * (b - n / 10.0) / (n / 10.0);
  EXPECT_LT(stat, chi2_critical(9));
}

TEST(Sampler, GreedyIsArgmaxLowestIndexNanNeverWins) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> l(64);
    for (auto& v : l) v = float(int(rng() % 7)) - 3.0f;  // many ties
    if (trial % 3 == 0) l[rng() % 64] = NAN;
    if (trial % 5 == 0) l[0] = NAN;
    int32_t want = -1;
    for (size_t i = 0; i < l.size(); ++i)
      if (!std::isnan(l[i]) && (want < 0 || l[i] > l[size_t(want)])) want = int32_t(i);
    SamplingParams t0 = params(0.0f, 0, 1, 0, 1);
    SamplingParams k1 = params(1.0f, 1, 0.5f, 0.1f, 2);
    EXPECT_EQ(Sampler(t0).sample(l, {}), want);
    EXPECT_EQ(Sampler(k1).sample(l, {}), want);
    EXPECT_EQ(Sampler::argmax(l), want);
  }
  std::vector<float> all_nan(5, NAN);
  EXPECT_EQ(Sampler::argmax(all_nan), 0);
  EXPECT_EQ(Sampler(params(1.0f, 0, 1, 0, 1)).sample(all_nan, {}), 0);
  std::vector<float> neg_inf(5, -INFINITY);
  EXPECT_EQ(Sampler(params(1.0f, 0, 1, 0, 1)).sample(neg_inf, {}), 0);
}

TEST(Sampler, TopK1EqualsGreedyWithPenalties) {
  SamplingParams a = params(0.0f, 0, 1, 0, 1), b = params(0.9f, 1, 1, 0, 9);
  a.presence_penalty = b.presence_penalty = 0.6f;
  a.repetition_penalty = b.repetition_penalty = 1.2f;
  std::mt19937 rng(5);
  for (int trial = 0; trial < 100; ++trial) {
    std::vector<float> l(50);
    for (auto& v : l) v = float(rng() % 1000) / 250.0f - 2.0f;
    std::vector<int32_t> h = {int32_t(rng() % 50), int32_t(rng() % 50), int32_t(rng() % 50)};
    EXPECT_EQ(Sampler(a).sample(l, h), Sampler(b).sample(l, h));
  }
}

TEST(Sampler, PenaltiesFollowOpenAIAndHF) {
  SamplingParams p = params(0.0f, 0, 1, 0, 1);
  // presence: 1.0 - 0.2 < 0.9
  p.presence_penalty = 0.2f;
  std::vector<float> l = {1.0f, 0.9f};
  std::vector<int32_t> h = {0};
  EXPECT_EQ(Sampler(p).sample(l, h), 1);
  // ... but not when the token is only in the prompt
  EXPECT_EQ(Sampler(p).sample(l, h, 1), 0);
  // frequency: counts matter (3 x 0.05 = 0.15 > 0.1)
  p.presence_penalty = 0;
  p.frequency_penalty = 0.05f;
  std::vector<int32_t> h3 = {0, 0, 0};
  EXPECT_EQ(Sampler(p).sample(l, h3), 1);
  std::vector<int32_t> h1 = {0};
  EXPECT_EQ(Sampler(p).sample(l, h1), 0);
  // negative presence favours repeats
  p.frequency_penalty = 0;
  p.presence_penalty = -0.5f;
  std::vector<int32_t> h_1 = {1};
  std::vector<float> l2 = {1.0f, 0.6f};
  EXPECT_EQ(Sampler(p).sample(l2, h_1), 1);
  // repetition (HF): positive logits divided, negative multiplied, prompt included, once per id
  p.presence_penalty = 0;
  p.repetition_penalty = 2.0f;
  std::vector<float> l3 = {2.0f, 1.5f};
  std::vector<int32_t> h0 = {0, 0, 0};
  EXPECT_EQ(Sampler(p).sample(l3, h0, 3), 1);  // 2/2 = 1 < 1.5
  std::vector<float> l4 = {-1.0f, -1.5f};
  EXPECT_EQ(Sampler(p).sample(l4, h0), 1);  // -1*2 = -2 < -1.5
  // ids outside the vocabulary in the history are ignored
  std::vector<int32_t> bad = {-5, 99};
  EXPECT_EQ(Sampler(p).sample(l4, bad), 0);
}

TEST(Sampler, SeedsReproduceAndDiffer) {
  std::vector<float> l(200);
  for (size_t i = 0; i < l.size(); ++i) l[i] = float(std::sin(double(i))) * 3;
  auto run = [&](uint64_t seed) {
    Sampler s(params(1.0f, 40, 0.95f, 0.01f, seed));
    std::vector<int32_t> out;
    for (int i = 0; i < 100; ++i) out.push_back(s.sample(l, out));
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
  // The generator itself is pinned: the first outputs of seed 0 never change between builds.
  dq::Rng r(0);
  const uint64_t a = r.next(), b = r.next();
  dq::Rng r2(0);
  EXPECT_EQ(r2.next(), a);
  EXPECT_EQ(r2.next(), b);
  EXPECT_EQ(a, 0x99ec5f36cb75f2b4ull);
}

TEST(Sampler, InfiniteLogitsAreDrawnUniformly) {
  std::vector<float> l = {0.0f, INFINITY, 5.0f, INFINITY};
  Sampler s(params(1.0f, 0, 1, 0, 3));
  int c1 = 0, c3 = 0;
  for (int i = 0; i < 2000; ++i) {
    int id = s.sample(l, {});
    ASSERT_TRUE(id == 1 || id == 3);
    (id == 1 ? c1 : c3)++;
  }
  EXPECT_GT(c1, 850);
  EXPECT_GT(c3, 850);
}

// sample_top (the engine's device top-k path) makes exactly sample()'s choice from the row's top
// values, or declines; checked against sample() with the same seed on rows with ties, NaN,
// -inf and +inf, for many parameter sets.
TEST(Sampler, SampleTopEqualsSampleOrDeclines) {
  std::mt19937 gen(7);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  int decided = 0, declined = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int V = 50 + int(gen() % 400);
    std::vector<float> x(static_cast<size_t>(V), 0.0f);
    for (float& v : x) v = std::round(nd(gen) * 4.0f) / 4.0f;  // coarse values: many ties
    if (trial % 5 == 1)
      for (int i = 0; i < V; i += 3) x[size_t(i)] = NAN;
    if (trial % 5 == 2)  // few numbers left: fewer than top_k + 1 must decline
      for (int i = 5; i < V; ++i) x[size_t(i)] = -INFINITY;
    if (trial % 17 == 3) x[size_t(V / 2)] = INFINITY;
    SamplingParams p;
    p.temperature = 0.3f + float(trial % 7) * 0.2f;
    p.top_k = 1 + int(gen() % 40);
    p.top_p = trial % 3 == 0 ? 1.0f : 0.5f + float(trial % 5) * 0.1f;
    p.min_p = trial % 4 == 0 ? 0.05f : 0.0f;
    p.seed = uint64_t(trial);
    Sampler a(p), b(p);
    const int need = b.top_needed();
    ASSERT_EQ(need, p.top_k == 1 ? 0 : p.top_k + 1);  // top_k == 1 is greedy
    if (need == 0) continue;
    // The top values the way op::TopK orders them: descending, ties by the lower id, NaN and
    // -inf below every number.
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    auto rank = [&](int32_t i) { return x[size_t(i)] > -INFINITY ? x[size_t(i)] : -INFINITY; };
    std::stable_sort(order.begin(), order.end(), [&](int32_t i, int32_t j) {
      const bool fi = x[size_t(i)] > -INFINITY, fj = x[size_t(j)] > -INFINITY;
      if (fi != fj) return fi;
      return fi && rank(i) > rank(j);
    });
    std::vector<int32_t> ids(order.begin(), order.begin() + std::min(need, V));
    std::vector<float> vals;
    for (int32_t i : ids) vals.push_back(x[size_t(i)]);
    for (int step = 0; step < 3; ++step) {
      const int32_t want = a.sample(x, {}, 0);
      const auto got = b.sample_top(ids, vals);
      if (!got) {
        ++declined;
        b.sample(x, {}, 0);  // the caller's fallback keeps the two generators in step
        continue;
      }
      ++decided;
      ASSERT_EQ(*got, want) << "trial " << trial << " step " << step;
    }
  }
  EXPECT_GT(decided, 300);
  EXPECT_GT(declined, 30);
}

// Top-p without top_k from the top 256 logits and the row's weight sum (what the engine brings
// back: op::TopK and op::SampleDraw's total): the same choice as sample() on the whole row, or a
// decline when the top_p mass runs past the 256.
TEST(Sampler, SampleTopPEqualsSampleOrDeclines) {
  std::mt19937 gen(11);
  int decided = 0, declined = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int V = 300 + int(gen() % 3000);
    const float spread = 0.5f + float(trial % 5) * 2.0f;  // flat to peaked rows
    std::normal_distribution<float> nd(0.0f, spread);
    std::vector<float> x(static_cast<size_t>(V), 0.0f);
    for (float& v : x) v = std::round(nd(gen) * 8.0f) / 8.0f;  // ties
    if (trial % 7 == 1)
      for (int i = 0; i < V; i += 5) x[size_t(i)] = NAN;
    if (trial % 7 == 2)  // some rows keep fewer than 256 numbers: then the top 256 hold them all
      for (int i = 0; i < V; i += 2) x[size_t(i)] = -INFINITY;
    if (trial % 23 == 3) x[size_t(V / 3)] = INFINITY;
    SamplingParams p;
    p.temperature = 0.4f + float(trial % 4) * 0.3f;
    p.top_p = 0.3f + float(trial % 6) * 0.12f;
    p.min_p = trial % 4 == 0 ? 0.05f : 0.0f;
    p.seed = uint64_t(trial);
    Sampler a(p), b(p);
    ASSERT_EQ(b.top_p_needed(), 256);
    ASSERT_EQ(b.top_needed(), 0);
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t i, int32_t j) {
      const bool fi = x[size_t(i)] > -INFINITY, fj = x[size_t(j)] > -INFINITY;
      if (fi != fj) return fi;
      return fi && x[size_t(i)] > x[size_t(j)];
    });
    std::vector<int32_t> ids(order.begin(), order.begin() + std::min(256, V));
    std::vector<float> vals;
    for (int32_t i : ids) vals.push_back(x[size_t(i)]);
    const double total = dq::ref::draw_total(x.data(), V, p.temperature);
    for (int step = 0; step < 3; ++step) {
      const int32_t want = a.sample(x, {}, 0);
      const auto got = b.sample_top_p(ids, vals, total);
      if (!got) {
        ++declined;
        b.sample(x, {}, 0);
        continue;
      }
      ++decided;
      ASSERT_EQ(*got, want) << "trial " << trial << " step " << step;
    }
  }
  EXPECT_GT(decided, 200);
  EXPECT_GT(declined, 30);
}
