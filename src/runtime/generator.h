// Text generation on an Engine: prompt ids in, streamed UTF-8 text out.
//
// Two layers:
//   Sequence  the per-request, engine-independent part: sampler, incremental UTF-8 decoding, stop
//             strings (matched across token boundaries and never emitted), stop ids, max_tokens,
//             cancellation. It is what a batching worker would keep one of per sequence.
//   Generator drives one Sequence on the engine: reset(), feed(prompt), then one step per token
//             (step_greedy() when the engine's argmax is the answer, so no logits cross to the host;
//             step(token, &logits) otherwise).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/engine.h"
#include "runtime/prompt_cache.h"
#include "runtime/sampler.h"
#include "text/model_text.h"

namespace dq {

struct GenerateRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int max_tokens = 0;
  std::vector<std::string> stop;         // empty strings are ignored
  bool stop_at_eos = true;               // stop on every id of TextConfig::eos_ids
  std::vector<int32_t> stop_ids;         // more ids that end the generation (e.g. <|im_end|>)
  // Where in the prompt the state is saved when the generator has a cache: -1 its end. A chat
  // prompt's is where its messages end (chat_messages_end): the next turn renders the reply in
  // place of the generation prompt, which may differ from it (Qwen3.5's opens "<think>\n").
  int save_at = -1;
};

struct GenerateResult {
  // The generated ids, without a final eos / stop id (so text == decode(tokens) minus any stop
  // string and what followed it).
  std::vector<int32_t> tokens;
  std::string text;           // everything that was passed to on_text, concatenated
  std::string finish_reason;  // "stop" | "length" | "cancelled"
  std::string stop_string;    // the stop string that matched, if any
  std::optional<int32_t> stop_id;  // the eos / stop id that ended it, if any
  int prompt_tokens = 0;
  int cached_tokens = 0;      // prompt tokens the engine already held or restored (not fed again)
  bool cache_restored = false;  // they came from a saved state (PromptCache)
  bool cache_saved = false;     // the state at the prompt's end was saved
  int completion_tokens = 0;  // every id the model produced, a final eos / stop id included
  double prompt_seconds = 0, gen_seconds = 0;
};

// on_text receives each piece of text as soon as it is complete UTF-8 and cannot be part of a stop
// string; returning false cancels the generation (finish_reason "cancelled").
using OnText = std::function<bool(std::string_view piece)>;

// Watches the generated text for stop strings. push() returns the text that can be emitted: text
// that could still turn into a stop string is held back until it cannot.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  // Appends text; returns what may be emitted now. After a match, matched() is set and the text
  // before the stop string is returned; everything after it is dropped.
  std::string push(std::string_view text);
  // The end: returns the held-back text (no stop string can complete any more).
  std::string flush();
  bool matched() const { return matched_ >= 0; }
  const std::string& matched_string() const { return stops_[size_t(matched_)]; }
  size_t held() const { return pending_.size(); }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  int matched_ = -1;
};

class Sequence {
 public:
  Sequence(const text::TextConfig& text, const GenerateRequest& req, OnText on_text);

  // The engine's argmax is the next token: the greedy path without logits.
  bool uses_engine_argmax() const { return sampler_.uses_engine_argmax(); }
  // Chooses the next token from the logits of the last position.
  int32_t choose(std::span<const float> logits);
  // Top logits that decide the next choice (Sampler::top_needed; the engine draws from them).
  int top_needed() const { return sampler_.top_needed(); }
  // Top-p without top_k: the top logits and the row's weight sum (Sampler::top_p_needed).
  int top_p_needed() const { return sampler_.top_p_needed(); }
  std::optional<int32_t> choose_top_p(std::span<const int32_t> ids, std::span<const float> vals, double total) {
    return sampler_.sample_top_p(ids, vals, total);
  }
  // Plain temperature sampling, drawn by the engine (Sampler::plain): its uniform, and the choice
  // from the row when the engine's draw declines.
  bool plain() const { return sampler_.plain(); }
  const SamplingParams& sampling() const { return sampler_.params(); }
  double take_uniform() { return sampler_.take_uniform(); }
  int32_t choose_declined(std::span<const float> logits, double u) { return sampler_.sample_declined(logits, u); }
  // The choice from the row with the uniform u (after the engine's top-k draw declined).
  int32_t choose_with(std::span<const float> logits, double u) { return sampler_.sample_with(logits, u); }
  // The draw the backend makes for the next token when the sampling allows one (temperature
  // alone, or top_k: op::SampleDraw / op::TopK + op::TopDraw), else nullopt (greedy, top_p
  // alone, penalties: the argmax, the top logits or the row decide).
  std::optional<DrawParams> backend_draw(int vocab) const {
    if (uses_engine_argmax() || !(plain() || (top_needed() && top_needed() <= vocab))) return std::nullopt;
    const SamplingParams& sp = sampling();
    return plain() ? DrawParams{sp.temperature, sp.min_p} : DrawParams{sp.temperature, sp.min_p, sp.top_k, sp.top_p};
  }
  // The choice from the row after the backend's draw d with uniform u declined.
  int32_t choose_declined_draw(std::span<const float> logits, const DrawParams& d, double u) {
    return d.plain() ? choose_declined(logits, u) : choose_with(logits, u);
  }
  // Takes the next token (chosen, or the engine's argmax). Returns true when the sequence is done.
  bool accept(int32_t token);
  // Ends the sequence now: "length" (out of context) or "cancelled".
  void finish(const std::string& reason);
  bool done() const { return done_; }

  GenerateResult& result() { return res_; }

 private:
  void emit(const std::string& s);

  const text::TextConfig& text_;
  GenerateRequest req_;
  OnText on_text_;
  Sampler sampler_;
  text::StreamDecoder decoder_;
  StopMatcher stops_;
  std::vector<int32_t> history_;  // prompt + generated (the sampler's penalties read it)
  GenerateResult res_;
  bool done_ = false;
};

class Generator {
 public:
  // With a cache, the state at the end of every prompt is saved in it, and a prompt that starts
  // with a saved one (longer than what the engine holds) continues from that state.
  Generator(Engine& engine, const text::TextConfig& text, PromptCache* cache = nullptr)
      : engine_(engine), text_(text), cache_(cache) {}

  // Runs a sequence to the end: feeds the prompt (only its new part when it extends the engine's
  // history, Engine::reuse_prefix, or a state in the cache; the logits are the same bits either
  // way), then decodes. Throws dq::Error for an empty prompt,
  // invalid ids or a prompt longer than the context; stops with "length" when the context fills up.
  // keep_going (optional) is asked before every decode step; false cancels.
  GenerateResult generate(const GenerateRequest& req, const OnText& on_text,
                          const std::function<bool()>& keep_going = {});

 private:
  // Puts the engine at the longest known prefix of the prompt; returns its length.
  int resume(std::span<const int32_t> prompt, bool* restored);

  Engine& engine_;
  const text::TextConfig& text_;
  PromptCache* cache_;
};

}  // namespace dq
