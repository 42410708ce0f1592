#include "runtime/generator.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace dq {

// ---- StopMatcher -------------------------------------------------------------------------------

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopMatcher::push(std::string_view text) {
  if (matched()) return {};
  pending_ += text;
  if (stops_.empty()) return std::exchange(pending_, {});
  // A complete stop string: the earliest one wins.
  size_t best = std::string::npos;
  for (size_t i = 0; i < stops_.size(); ++i) {
    size_t p = pending_.find(stops_[i]);
    if (p < best) {
      best = p;
      matched_ = int(i);
    }
  }
  if (best != std::string::npos) {
    std::string out = pending_.substr(0, best);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail of pending_ that is the start of some stop string. Everything before
  // it can never be part of a match: a match starting there would be a longer such tail.
  size_t hold = 0;
  for (const auto& s : stops_) {
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k) {
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::flush() {
  if (matched()) return {};
  return std::exchange(pending_, {});
}

// ---- Sequence ----------------------------------------------------------------------------------

Sequence::Sequence(const text::TextConfig& text, const GenerateRequest& req, OnText on_text)
    : text_(text),
      req_(req),
      on_text_(std::move(on_text)),
      sampler_(req.sampling),
      decoder_(*text.tokenizer),
      stops_(req.stop) {
  history_ = req_.prompt;
  res_.prompt_tokens = int(req_.prompt.size());
}

int32_t Sequence::choose(std::span<const float> logits) {
  return sampler_.sample(logits, history_, req_.prompt.size());
}

void Sequence::emit(const std::string& s) {
  if (s.empty() || res_.finish_reason == "cancelled") return;
  res_.text += s;
  if (on_text_ && !on_text_(s)) {
    res_.finish_reason = "cancelled";
    done_ = true;
  }
}

bool Sequence::accept(int32_t token) {
  if (done_) return true;
  ++res_.completion_tokens;
  history_.push_back(token);
  const bool stop_id = (req_.stop_at_eos && text_.is_eos(token)) ||
                       std::find(req_.stop_ids.begin(), req_.stop_ids.end(), token) != req_.stop_ids.end();
  if (stop_id) {
    res_.stop_id = token;
    finish("stop");
    return true;
  }
  res_.tokens.push_back(token);
  emit(stops_.push(decoder_.push(token)));
  if (done_) return true;  // cancelled by on_text
  if (stops_.matched()) {
    res_.stop_string = stops_.matched_string();
    finish("stop");
    return true;
  }
  if (res_.completion_tokens >= req_.max_tokens) {
    finish("length");
    return true;
  }
  return false;
}

void Sequence::finish(const std::string& reason) {
  if (done_) return;
  done_ = true;
  if (reason == "cancelled") {
    res_.finish_reason = reason;
    return;
  }
  // An unfinished UTF-8 sequence becomes U+FFFD; it may still complete a stop string.
  std::string out = stops_.push(decoder_.flush());
  std::string why = reason;
  if (stops_.matched()) {
    if (res_.stop_string.empty()) res_.stop_string = stops_.matched_string();
    why = "stop";
  } else {
    out += stops_.flush();
  }
  res_.finish_reason = why;
  emit(out);
}

// ---- Generator ---------------------------------------------------------------------------------

int Generator::resume(std::span<const int32_t> prompt, bool* restored) {
  *restored = false;
  if (cache_) {
    engine_.sync();
    const auto& h = engine_.history();
    const bool extends = h.size() < prompt.size() && std::equal(h.begin(), h.end(), prompt.begin());
    if (auto s = cache_->find(prompt); s && !(extends && h.size() >= s->tokens.size())) {
      engine_.restore(*s);
      *restored = true;
      return int(s->tokens.size());
    }
  }
  return engine_.reuse_prefix(prompt);
}

GenerateResult Generator::generate(const GenerateRequest& req, const OnText& on_text,
                                   const std::function<bool()>& keep_going) {
  using clk = std::chrono::steady_clock;
  Sequence seq(text_, req, on_text);
  if (req.prompt.empty()) fail("the prompt is empty: at least one token is needed");
  if (int64_t(req.prompt.size()) > engine_.max_ctx())
    fail("the prompt has {} tokens, more than the context of {} tokens", req.prompt.size(), engine_.max_ctx());
  if (req.max_tokens <= 0) {
    seq.finish("length");
    return std::move(seq.result());
  }
  if (keep_going && !keep_going()) {
    seq.finish("cancelled");
    return std::move(seq.result());
  }
  const bool greedy = seq.uses_engine_argmax();
  std::vector<float> logits;  // [vocab], only when sampling
  std::vector<int32_t> top_ids;  // the top logits when they decide the sample
  std::vector<float> top_vals;
  auto t0 = clk::now();
  // A prompt that extends what the engine already holds (the previous turn of a chat: its prompt
  // and answer) or a saved state feeds only the new tokens; anything else starts afresh.
  const int cached = resume(req.prompt, &seq.result().cache_restored);
  seq.result().cached_tokens = cached;
  const std::span<const int32_t> prompt(req.prompt);
  const size_t save = req.save_at < 0 ? prompt.size() : std::min(size_t(req.save_at), prompt.size());
  int32_t tok = 0;
  if (cache_ && save > size_t(cached) && cache_->fits(engine_.model().state_bytes_at(int(save))) &&
      !cache_->contains(prompt.first(save))) {
    // Fed in two parts, saved between them (the same logits: prefill in any chunks is exact).
    const auto before = prompt.subspan(size_t(cached), save - size_t(cached)), after = prompt.subspan(save);
    if (after.empty()) {
      tok = engine_.feed(before, greedy ? nullptr : &logits);
      seq.result().cache_saved = cache_->put(engine_.snapshot(cache_->take_spare()));
    } else {
      engine_.feed(before);
      seq.result().cache_saved = cache_->put(engine_.snapshot(cache_->take_spare()));
      tok = engine_.feed(after, greedy ? nullptr : &logits);
    }
  } else {
    tok = engine_.feed(prompt.subspan(size_t(cached)), greedy ? nullptr : &logits);
  }
  if (!greedy) tok = seq.choose(logits);
  auto t1 = clk::now();
  while (!seq.accept(tok)) {
    if (keep_going && !keep_going()) {
      seq.finish("cancelled");
      break;
    }
    if (engine_.position() >= engine_.max_ctx()) {
      seq.finish("length");
      break;
    }
    if (greedy) {
      tok = engine_.step_greedy();
    } else if (const auto d = seq.backend_draw(engine_.config().vocab_size)) {
      // the engine draws: only the id comes back
      double u = 0;
      tok = engine_.step_draw_ahead(tok, *d, [&] { return seq.take_uniform(); }, &u);
      if (tok < 0) {  // declined: the row decides, with the draw's uniform
        engine_.read_logits(&logits);
        tok = seq.choose_declined_draw(logits, *d, u);
      }
    } else if (const int need = seq.top_p_needed(); need && need <= engine_.config().vocab_size) {
      // the top logits and the row's weight sum
      double total = 0;
      engine_.step_top(tok, need, &top_ids, &top_vals, &total, seq.sampling().temperature);
      if (auto t = seq.choose_top_p(top_ids, top_vals, total)) {
        tok = *t;
      } else {
        engine_.read_logits(&logits);
        tok = seq.choose(logits);
      }
    } else {
      engine_.step(tok, &logits);
      tok = seq.choose(logits);
    }
  }
  auto t2 = clk::now();
  GenerateResult r = std::move(seq.result());
  r.prompt_seconds = std::chrono::duration<double>(t1 - t0).count();
  r.gen_seconds = std::chrono::duration<double>(t2 - t1).count();
  return r;
}

}  // namespace dq
