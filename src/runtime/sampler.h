// The sampler: logits -> next token id, with OpenAI / HF sampling parameters.
//
// Order of the transforms (as HF transformers and vLLM apply them):
//   1. repetition_penalty (HF): for every id in the whole history, logit > 0 ? logit / rp : logit * rp
//   2. presence / frequency penalty (OpenAI): logit -= frequency * count + presence * (count > 0),
//      counted over the generated tokens only (history[prompt_len:])
//   3. greedy (temperature == 0 or top_k == 1): the argmax, lowest index on ties, NaN never wins
//   4. temperature, then top_k, then top_p (the smallest set, taken in descending probability with ties
//      broken by the lower id, whose mass reaches top_p), then min_p (keep p >= min_p * p_max)
//   5. one draw from the kept tokens in proportion to exp((logit - max) / temperature)
//
// The weights are fp32 by our exp (ops/numerics.h draw_weight), their sums doubles; top-p
// without top-k measures against the row's sum in fixed chunks (ref::draw_total).
//
// Plain temperature sampling (no penalties, top-k or top-p; min-p allowed) draws from the whole
// row by the numbers of ops/numerics.h (draw_weight, draw_walk: fp32 weights, double sums in fixed
// chunks), which a backend computes itself (op::SampleDraw): then only the id leaves the device.
//
// NaN logits are never chosen. +inf logits: the draw is uniform among them. When every logit is NaN
// or -inf the result is the lowest id that is not NaN, or 0.
//
// Deterministic given a seed: the generator is xoshiro256** seeded by splitmix64, and every sum and
// scan runs in a fixed order, so a seed gives the same ids on every machine and library version.
// Without a seed the generator is seeded from std::random_device.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace dq {

struct SamplingParams {
  float temperature = 1;
  float top_p = 1;
  int top_k = 0;  // 0 (or negative): no top-k
  float min_p = 0;
  float presence_penalty = 0;
  float frequency_penalty = 0;
  float repetition_penalty = 1;
  std::optional<uint64_t> seed;

  bool greedy() const { return temperature <= 0 || top_k == 1; }
  bool has_penalties() const {
    return presence_penalty != 0 || frequency_penalty != 0 || repetition_penalty != 1;
  }
};

// A small deterministic PRNG: xoshiro256** (Blackman & Vigna), seeded through splitmix64.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t s_[4];
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  const SamplingParams& params() const { return p_; }
  // True when the engine's own argmax is the answer (greedy and no penalties): no logits are needed.
  bool uses_engine_argmax() const { return p_.greedy() && !p_.has_penalties(); }

  // history: the tokens of the sequence so far, the first prompt_len of them the prompt (the
  // repetition penalty looks at all of them, presence and frequency only at the rest).
  // Ids outside [0, logits.size()) in history are ignored.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history, size_t prompt_len = 0);

  // The number of top logits (op::TopK) that decide a sample with these parameters: top_k + 1
  // when top_k is set (< 256), sampled and without penalties; 0 when the whole row is needed.
  // (The extra one shows that more than top_k numbers exist, which sample() needs to know.)
  int top_needed() const {
    return !p_.greedy() && !p_.has_penalties() && p_.top_k >= 1 && p_.top_k < 256 ? p_.top_k + 1 : 0;
  }
  // The same choice as sample() from the row's top values only (ids and vals as op::TopK gives
  // them, at least top_needed() of each). nullopt when they do not decide it (the top value is
  // not a number or is infinite): then read the row and call sample().
  std::optional<int32_t> sample_top(std::span<const int32_t> ids, std::span<const float> vals);

  // Top-p without top_k (and no penalties): the top logits (op::TopK, top_p_needed() of them)
  // and the row's weight sum (op::SampleDraw's total) decide it when the top_p mass lies within
  // them (a peaked distribution); nullopt otherwise: then read the row and call sample().
  int top_p_needed() const {
    return !p_.greedy() && !p_.has_penalties() && p_.top_k <= 0 && p_.top_p < 1 ? 256 : 0;
  }
  std::optional<int32_t> sample_top_p(std::span<const int32_t> ids, std::span<const float> vals, double total);

  // Plain temperature sampling (see above): the engine can draw it (op::SampleDraw) with
  // take_uniform()'s value; when that declines (-1: the row has no number, or +inf), sample_declined.
  bool plain() const { return !p_.greedy() && !p_.has_penalties() && p_.top_k <= 0 && !(p_.top_p < 1); }
  double take_uniform() { return rng_.uniform(); }
  int32_t sample_declined(std::span<const float> logits, double u);
  // sample() (no penalties apply: the engine-drawn modes) with u as its one uniform: the top-k /
  // top-p choice from the whole row when the engine's draw from the top pairs declined.
  int32_t sample_with(std::span<const float> logits, double u);

  // The argmax as the greedy path defines it (lowest index on ties, NaN never wins; 0 if all NaN).
  static int32_t argmax(std::span<const float> logits);

 private:
  void apply_penalties(std::span<const int32_t> history, size_t prompt_len);
  // num::top_draw over the first k pairs with the next uniform, taken only when they decide it.
  std::optional<int32_t> top_choice(std::span<const int32_t> ids, std::span<const float> vals, int k, double total);
  double uniform();  // the given uniform once (sample_with), else the generator's next
  void cut_min_p();  // keeps candidates with w >= min_p (w of the top one is 1)
  int32_t draw();    // one draw from cand_ in proportion to w_

  SamplingParams p_;
  Rng rng_;
  std::optional<double> given_u_;
  std::vector<float> work_;      // [vocab] penalized logits
  std::vector<int32_t> counts_;  // [vocab] occurrences in the generated tokens (zeroed after use)
  std::vector<int32_t> cand_;    // candidate ids
  std::vector<double> w_;        // [cand] unnormalized probabilities
};

}  // namespace dq
