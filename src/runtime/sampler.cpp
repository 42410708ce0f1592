#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "ops/numerics.h"
#include "ops/reference.h"

namespace dq {

namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t random_seed() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ uint64_t(rd());
}

}  // namespace

Rng::Rng(uint64_t seed) {
  for (auto& s : s_) s = splitmix64(seed);
}

uint64_t Rng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

Sampler::Sampler(const SamplingParams& params) : p_(params), rng_(params.seed ? *params.seed : random_seed()) {}

int32_t Sampler::argmax(std::span<const float> x) {
  int32_t best = -1;
  float bv = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float v = x[i];
    if (std::isnan(v)) continue;
    if (best < 0 || v > bv) {
      best = int32_t(i);
      bv = v;
    }
  }
  return best < 0 ? 0 : best;
}

void Sampler::apply_penalties(std::span<const int32_t> history, size_t prompt_len) {
  const int64_t V = int64_t(work_.size());
  if (counts_.size() != work_.size()) counts_.assign(work_.size(), 0);
  auto valid = [&](int32_t id) { return id >= 0 && id < V; };
  prompt_len = std::min(prompt_len, history.size());
  if (p_.repetition_penalty != 1) {
    // HF RepetitionPenaltyLogitsProcessor: once per distinct id of the whole sequence.
    // counts_ marks the ids already penalized (-1), then is cleared again.
    const float rp = p_.repetition_penalty;
    for (int32_t id : history) {
      if (!valid(id) || counts_[id] < 0) continue;
      counts_[id] = -1;
      float& l = work_[id];
      l = l > 0 ? l / rp : l * rp;
    }
    for (int32_t id : history)
      if (valid(id)) counts_[id] = 0;
  }
  if (p_.presence_penalty != 0 || p_.frequency_penalty != 0) {
    auto gen = history.subspan(prompt_len);
    for (int32_t id : gen)
      if (valid(id)) ++counts_[id];
    for (int32_t id : gen) {
      if (!valid(id) || counts_[id] == 0) continue;
      work_[id] -= p_.frequency_penalty * float(counts_[id]) + p_.presence_penalty;
      counts_[id] = 0;
    }
  }
}

int32_t Sampler::sample_with(std::span<const float> logits, double u) {
  given_u_ = u;
  const int32_t id = sample(logits, {}, 0);
  given_u_.reset();
  return id;
}

double Sampler::uniform() {
  if (!given_u_) return rng_.uniform();
  const double u = *given_u_;
  given_u_.reset();
  return u;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history, size_t prompt_len) {
  if (logits.empty()) return 0;
  std::span<const float> x = logits;
  if (p_.has_penalties()) {
    work_.assign(logits.begin(), logits.end());
    apply_penalties(history, prompt_len);
    x = work_;
  }
  if (p_.greedy()) return argmax(x);
  if (plain()) {
    const double u = uniform();
    const int32_t id = ref::draw_plain(x.data(), int(x.size()), p_.temperature, p_.min_p, u);
    return id >= 0 ? id : sample_declined(x, u);
  }

  // Candidates: every id whose logit is a number above -inf; +inf ones alone if there are any.
  const int32_t V = int32_t(x.size());
  float m = -INFINITY;
  for (int32_t i = 0; i < V; ++i)
    if (!std::isnan(x[i]) && x[i] > m) m = x[i];
  if (m == -INFINITY) return argmax(x);
  cand_.clear();
  w_.clear();
  if (m == INFINITY) {
    for (int32_t i = 0; i < V; ++i)
      if (x[i] == INFINITY) cand_.push_back(i);
    return cand_[size_t(uniform() * double(cand_.size()))];
  }
  for (int32_t i = 0; i < V; ++i)
    if (x[i] > -INFINITY) cand_.push_back(i);  // NaN compares false

  // Descending logit, ties by the lower id: the one order every truncation uses.
  auto before = [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
  bool sorted = false;
  if (p_.top_k > 0 && size_t(p_.top_k) < cand_.size()) {
    std::nth_element(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), before);
    cand_.resize(size_t(p_.top_k));
    std::sort(cand_.begin(), cand_.end(), before);
    sorted = true;
  }

  const float T = p_.temperature;
  auto weight = [&](int32_t id) { return double(num::draw_weight(x[id], m, T, 0.0f)); };
  w_.resize(cand_.size());
  if (sorted)
    for (size_t i = 0; i < cand_.size(); ++i) w_[i] = weight(cand_[i]);

  if (p_.top_p < 1) {
    // The mass top_p measures against: over the top_k (in their order), or over the whole row in
    // the draw's fixed chunks (ref::draw_total), which a backend computes too (op::SampleDraw).
    double z = 0;
    if (sorted)
      for (double w : w_) z += w;
    else
      z = ref::draw_total(x.data(), V, T);
    const double target = double(p_.top_p) * z;
    // Sort a growing prefix until it holds the top_p mass (usually a few hundred ids of a large vocab).
    size_t n = cand_.size(), c = sorted ? n : std::min<size_t>(n, 256);
    for (;;) {
      if (!sorted) {
        std::partial_sort(cand_.begin(), cand_.begin() + c, cand_.end(), before);
        for (size_t i = 0; i < c; ++i) w_[i] = weight(cand_[i]);
      }
      double cum = 0;
      size_t keep = 0;
      while (keep < c && cum < target) cum += w_[keep++];
      if (cum >= target || c == n) {
        cand_.resize(std::max<size_t>(keep, 1));
        w_.resize(cand_.size());
        break;
      }
      c = std::min(n, c * 4);
    }
  }

  if (!sorted && !(p_.top_p < 1))  // top_k at least the candidates: every one, in id order
    for (size_t i = 0; i < cand_.size(); ++i) w_[i] = weight(cand_[i]);
  cut_min_p();
  if (cand_.empty()) return argmax(x);
  return draw();
}

std::optional<int32_t> Sampler::sample_top_p(std::span<const int32_t> ids, std::span<const float> vals, double total) {
  const int k = top_p_needed();
  if (k == 0 || ids.size() < size_t(k) || vals.size() < size_t(k)) return std::nullopt;
  // sample() sorts a prefix of the row (descending, ties by the lower id: op::TopK's order) until
  // it holds top_p * total; decided here when that prefix lies within the top k, or when the row
  // has fewer than k numbers (vals[k - 1] is not one), so that the prefix is all of them.
  return top_choice(ids, vals, k, total);
}

std::optional<int32_t> Sampler::top_choice(std::span<const int32_t> ids, std::span<const float> vals, int k,
                                           double total) {
  Rng r = rng_;  // the draw's uniform is taken only when these numbers decide it
  const int32_t id = num::top_draw(ids.data(), vals.data(), k, p_.top_k, p_.temperature, p_.top_p, p_.min_p, total,
                                   r.uniform());
  if (id < 0) return std::nullopt;
  rng_ = r;
  return id;
}

int32_t Sampler::sample_declined(std::span<const float> x, double u) {
  cand_.clear();
  for (int32_t i = 0; i < int32_t(x.size()); ++i)
    if (x[i] == INFINITY) cand_.push_back(i);
  if (cand_.empty()) return argmax(x);  // no number above -inf
  return cand_[std::min(cand_.size() - 1, size_t(u * double(cand_.size())))];
}

void Sampler::cut_min_p() {
  if (p_.min_p <= 0) return;
  // The top candidate has weight exp(0) = 1, so p_i / p_max = w_i.
  size_t j = 0;
  for (size_t i = 0; i < cand_.size(); ++i)
    if (w_[i] >= double(p_.min_p)) {
      cand_[j] = cand_[i];
      w_[j++] = w_[i];
    }
  cand_.resize(j);
  w_.resize(j);
}

int32_t Sampler::draw() {
  double total = 0;
  for (double w : w_) total += w;
  const double u = uniform() * total;
  double cum = 0;
  size_t last = 0;
  for (size_t i = 0; i < cand_.size(); ++i) {
    if (w_[i] <= 0) continue;
    cum += w_[i];
    last = i;
    if (u < cum) return cand_[i];
  }
  return cand_[last];  // rounding: u landed on the total
}

std::optional<int32_t> Sampler::sample_top(std::span<const int32_t> ids, std::span<const float> vals) {
  const int need = top_needed();
  if (need == 0 || ids.size() < size_t(need) || vals.size() < size_t(need)) return std::nullopt;
  // vals[0] is the largest number of the row (NaN and -inf rank below every number) and must be
  // finite; vals[top_k] > -inf shows the row has more than top_k numbers, so sample() truncates and
  // sorts: its candidates are the first top_k here, in the same order, with the same weights.
  return top_choice(ids, vals, need, 0.0);
}

}  // namespace dq
