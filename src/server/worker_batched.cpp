// The worker with several requests running at once (Worker::Options::parallel > 1): each in a
// slot of a Batcher. One iteration admits queued jobs into free slots, feeds one prefill chunk of
// the oldest prompt still being fed, then runs one batched decode step for every sequence past its
// prompt, so a long prompt delays the others' tokens by one chunk at a time, not by its whole
// prefill. Each slot's logits are the bits a lone sequence gets, so every reply is the one the
// one-at-a-time worker gives (the same seed, the same text).
#include <algorithm>
#include <limits>
#include <optional>

#include "core/error.h"
#include "runtime/batcher.h"
#include "server/worker.h"

namespace dq::server {

namespace {

// A job in a slot: its sequence and how far its prompt has been fed.
struct Active {
  std::shared_ptr<Job> job;
  std::unique_ptr<Sequence> seq;
  size_t fed = 0;                   // prompt tokens the slot holds
  size_t save = kNoSave;            // where the state is saved for the prompt cache
  bool decoding = false;            // the prompt is fed; `next` is the next input
  int32_t next = 0;
  Clock::time_point t0, t1;         // admitted, prompt done
  static constexpr size_t kNoSave = std::numeric_limits<size_t>::max();
};

}  // namespace

void Worker::run_batched(PromptCache& cache) {
  Engine& engine = *model_->engine;
  Batcher& b = *model_->batcher;
  PromptCache* pc = opt_.prompt_cache_bytes ? &cache : nullptr;
  const int chunk = std::max(1, engine.prefill_chunk());
  const int V = engine.config().vocab_size;
  std::vector<std::optional<Active>> slots(size_t(b.slots()));
  std::vector<uint64_t> last_use(slots.size(), 0);  // for choosing which free slot's state to give up
  uint64_t tick = 0;
  std::vector<float> logits;

  auto end_job = [&](int s, GenerateResult r) {
    Active& a = *slots[size_t(s)];
    if (a.decoding) {
      r.prompt_seconds = std::chrono::duration<double>(a.t1 - a.t0).count();
      r.gen_seconds = std::chrono::duration<double>(Clock::now() - a.t1).count();
    } else {
      r.prompt_seconds = std::chrono::duration<double>(Clock::now() - a.t0).count();
    }
    std::shared_ptr<Job> job = std::move(a.job);
    slots[size_t(s)].reset();
    last_use[size_t(s)] = ++tick;
    --running_;
    finish(*job, std::move(r), cache);
  };
  auto end_failed = [&](int s, const std::exception& e) {
    std::shared_ptr<Job> job = std::move(slots[size_t(s)]->job);
    slots[size_t(s)].reset();
    last_use[size_t(s)] = ++tick;
    --running_;
    try {
      b.reset(s);  // its state is unknown now
    } catch (...) {
    }
    fail(*job, ApiError{500, std::string("generation failed: ") + e.what(), "server_error", "", "generation_failed"});
  };

  // Puts a job into a free slot: the one holding the longest prefix of its prompt, or a saved
  // state's when that is longer, else the least recently used. Jobs that end before any token
  // (cancelled, max_tokens 0, a bad prompt) end here.
  auto admit = [&](std::shared_ptr<Job> job) {
    Job& j = *job;
    {
      std::lock_guard<std::mutex> lk(j.mu);
      j.started = true;
    }
    auto seq = std::make_unique<Sequence>(model_->text, j.req, [this, &j](std::string_view piece) {
      {
        std::lock_guard<std::mutex> lk(j.mu);
        j.pieces.emplace_back(piece);
      }
      j.cv.notify_all();
      return keep_going(j);
    });
    const std::vector<int32_t>& prompt = j.req.prompt;
    try {
      if (prompt.empty()) dq::fail("the prompt is empty: at least one token is needed");
      if (int64_t(prompt.size()) > b.max_ctx())
        dq::fail("the prompt has {} tokens, more than the context of {} tokens", prompt.size(), b.max_ctx());
    } catch (const std::exception& e) {
      --running_;
      fail(j, ApiError{500, std::string("generation failed: ") + e.what(), "server_error", "", "generation_failed"});
      return;
    }
    if (j.req.max_tokens <= 0 || !keep_going(j)) {
      --running_;
      seq->finish(j.req.max_tokens <= 0 ? "length" : "cancelled");
      finish(j, std::move(seq->result()), cache);
      return;
    }
    int best = -1, lru = -1;
    size_t best_len = 0;
    for (int s = 0; s < b.slots(); ++s) {
      if (slots[size_t(s)]) continue;
      if (lru < 0 || last_use[size_t(s)] < last_use[size_t(lru)]) lru = s;
      const auto& h = b.history(s);
      if (h.size() > best_len && h.size() < prompt.size() && std::equal(h.begin(), h.end(), prompt.begin()))
        best = s, best_len = h.size();
    }
    Active a;
    a.job = std::move(job);
    a.seq = std::move(seq);
    a.t0 = Clock::now();
    int s = best >= 0 ? best : lru;
    try {
      std::shared_ptr<const StateSnapshot> snap = pc ? pc->find(prompt) : nullptr;
      if (snap && snap->tokens.size() > best_len) {
        s = lru;
        b.restore(s, *snap);
        a.seq->result().cache_restored = true;
      } else if (b.reuse_prefix(s, prompt) == 0) {
        best_len = 0;
      }
      a.fed = size_t(b.position(s));
      a.seq->result().cached_tokens = int(a.fed);
      const size_t save = j.req.save_at < 0 ? prompt.size() : std::min(size_t(j.req.save_at), prompt.size());
      if (pc && save > a.fed && pc->fits(engine.model().state_bytes_at(int(save))) &&
          !pc->contains(std::span(prompt).first(save)))
        a.save = save;
    } catch (const std::exception& e) {
      last_use[size_t(s)] = ++tick;
      --running_;
      try {
        b.reset(s);
      } catch (...) {
      }
      fail(j, ApiError{500, std::string("generation failed: ") + e.what(), "server_error", "", "generation_failed"});
      return;
    }
    slots[size_t(s)] = std::move(a);
    last_use[size_t(s)] = ++tick;
  };

  // One prefill chunk of slot s's prompt (up to the save point first); at the prompt's end, the
  // first token.
  auto prefill = [&](int s) {
    Active& a = *slots[size_t(s)];
    const std::vector<int32_t>& prompt = a.job->req.prompt;
    const size_t end = a.save != Active::kNoSave && a.fed < a.save ? a.save : prompt.size();
    const size_t n = std::min(size_t(chunk), end - a.fed);
    const bool last = a.fed + n == prompt.size();
    const bool greedy = a.seq->uses_engine_argmax();
    int32_t tok = b.feed(s, std::span(prompt).subspan(a.fed, n), last && !greedy ? &logits : nullptr);
    a.fed += n;
    if (a.fed == a.save) a.seq->result().cache_saved = cache.put(b.snapshot(s, cache.take_spare()));
    if (!last) return;
    if (!greedy) tok = a.seq->choose(logits);
    a.t1 = Clock::now();
    a.decoding = true;
    a.next = tok;
    if (a.seq->accept(tok)) end_job(s, std::move(a.seq->result()));
  };

  for (;;) {
    // Admit while a slot is free; wait for work only when nothing runs.
    for (;;) {
      const bool any_free = std::any_of(slots.begin(), slots.end(), [](const auto& a) { return !a; });
      const bool any_running = std::any_of(slots.begin(), slots.end(), [](const auto& a) { return bool(a); });
      if (!any_free) break;
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        if (!any_running) cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
        if (stopping_ || queue_.empty()) break;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      ++running_;  // from here, as in the one-at-a-time worker (admit gives it back if the job ends)
      if (opt_.before_job) opt_.before_job();
      admit(std::move(job));
    }
    if (stopping_) {
      for (int s = 0; s < b.slots(); ++s)
        if (slots[size_t(s)]) {
          slots[size_t(s)]->seq->finish("cancelled");
          end_job(s, std::move(slots[size_t(s)]->seq->result()));
        }
      return;
    }

    // Jobs that were cancelled, timed out or reached the context's end stop before the step.
    for (int s = 0; s < b.slots(); ++s) {
      auto& a = slots[size_t(s)];
      if (!a) continue;
      if (!keep_going(*a->job)) {
        a->seq->finish("cancelled");
        end_job(s, std::move(a->seq->result()));
      } else if (a->decoding && b.position(s) >= b.max_ctx()) {
        a->seq->finish("length");
        end_job(s, std::move(a->seq->result()));
      }
    }

    // The oldest prompt still being fed gets one chunk.
    int feeding = -1;
    for (int s = 0; s < b.slots(); ++s)
      if (slots[size_t(s)] && !slots[size_t(s)]->decoding &&
          (feeding < 0 || slots[size_t(s)]->t0 < slots[size_t(feeding)]->t0))
        feeding = s;
    if (feeding >= 0) {
      try {
        prefill(feeding);
      } catch (const std::exception& e) {
        end_failed(feeding, e);
      }
    }

    // One decode step for every sequence past its prompt. As in the one-at-a-time worker: greedy
    // takes the argmax, temperature alone or with top_k a draw on the backend (only the id comes
    // back; a declined draw reads its row), anything else the whole row.
    std::vector<int> which;
    std::vector<int32_t> tokens, next, drawn;
    std::vector<Batcher::Draw> draws;
    for (int s = 0; s < b.slots(); ++s) {
      if (!slots[size_t(s)] || !slots[size_t(s)]->decoding) continue;
      Sequence& seq = *slots[size_t(s)]->seq;
      which.push_back(s);
      tokens.push_back(slots[size_t(s)]->next);
      Batcher::Draw d;
      if (const auto p = seq.backend_draw(V)) d = {true, *p, seq.take_uniform()};
      draws.push_back(d);
    }
    if (which.empty()) continue;
    try {
      b.step(which, tokens, &next, draws, &drawn);
      for (size_t i = 0; i < which.size(); ++i) {
        Active& a = *slots[size_t(which[i])];
        Sequence& seq = *a.seq;
        int32_t tok = next[i];
        if (draws[i].on && drawn[i] >= 0) {
          tok = drawn[i];
        } else if (draws[i].on) {  // declined: the row decides, with the draw's uniform
          b.read_row(i, &logits);
          tok = seq.choose_declined_draw(logits, draws[i].params, draws[i].u);
        } else if (!seq.uses_engine_argmax()) {
          b.read_row(i, &logits);
          tok = seq.choose(logits);
        }
        a.next = tok;
      }
    } catch (const std::exception& e) {
      for (int s : which)
        if (slots[size_t(s)]) end_failed(s, e);
      continue;
    }
    for (size_t i = 0; i < which.size(); ++i) {
      Active& a = *slots[size_t(which[i])];
      if (a.seq->accept(a.next)) end_job(which[i], std::move(a.seq->result()));
    }
  }
}

}  // namespace dq::server
