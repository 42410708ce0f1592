#include "runtime/engine.h"

#include <algorithm>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

#if DELTAQ_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace dq {

DeviceSpec parse_device(const std::string& device) {
  if (device == "cpu") return {};
  if (device == "cuda") return {true, 0};
  if (device.starts_with("cuda:")) {
    const std::string n = device.substr(5);
    const bool digits = !n.empty() && n.size() <= 4 && std::all_of(n.begin(), n.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits && std::stoi(n) < 1024) return {true, std::stoi(n)};
  }
  fail("unknown device '{}' (expected cpu, cuda, or cuda:N with N a CUDA device number)", device);
}

bool cuda_available(std::string* why, int device) {
#if DELTAQ_HAVE_CUDA
  return cuda_device_available(why, device);
#else
  (void)device;
  if (why) *why = "this build of deltaq has no CUDA backend (configure with -DDELTAQ_CUDA=ON where nvcc exists)";
  return false;
#endif
}

std::unique_ptr<Backend> make_backend(const EngineOptions& opt) {
  const DeviceSpec d = parse_device(opt.device);
  if (!d.cuda) return make_cpu_backend(opt.cpu_kernels, opt.threads);
  std::string why;
  if (!cuda_available(&why, d.index)) fail("--device {}: {}", opt.device, why);
#if DELTAQ_HAVE_CUDA
  return make_cuda_backend(d.index);
#else
  fail("--device {}: this build has no CUDA backend", opt.device);  // (cuda_available said so)
#endif
}

std::unique_ptr<Engine> Engine::open(const std::string& dir, const EngineOptions& opt) {
  std::unique_ptr<Engine> e(new Engine(Checkpoint::open(dir)));
  e->opt_ = opt;
  if (opt.max_ctx < 1) fail("--ctx must be at least 1, got {}", opt.max_ctx);
  if (opt.prefill_chunk < 0) fail("prefill chunk must be at least 1 (or 0: the backend's), got {}", opt.prefill_chunk);
  const int ctx = std::min(opt.max_ctx, e->config().max_position);
  e->be_ = make_backend(opt);
  if (opt.prefill_chunk == 0) e->opt_.prefill_chunk = e->be_->prefill_chunk();
  // The CPU reads weights in place: map them all now rather than fault them in mid-step.
  if (e->be_->is_cpu())
    for (const auto& f : e->ck_.files()) f->prefault();
  e->model_ = std::make_unique<Qwen35>(e->config(), load_weights(e->ck_, *e->be_), *e->be_, ctx);
  e->q_ = e->be_->make_queue();
  e->state_ = e->model_->new_state(*e->be_);
  e->act_ = e->model_->new_activations(*e->be_, std::min(e->opt_.prefill_chunk, ctx), false);
  e->act1_ = e->model_->new_activations(*e->be_, 1, false);
  e->step_next_[0] = e->act1_.next;
  e->step_next_[1] = Ref{e->be_->alloc_readback(4, "next (second step slot)")};
  if (opt.use_graph)
    for (int slot = 0; slot < 2; ++slot) {
      Activations a = e->act1_;
      a.next = e->step_next_[slot];
      e->step_graph_[slot] = e->q_->capture([&] { e->model_->forward(*e->q_, e->state_, a, 1, false, e->act1_.tokens); });
    }
  e->reset();
  return e;
}

Engine::~Engine() {
  if (q_) {
    try {
      q_->wait();
    } catch (...) {
    }
  }
}

void Engine::reset() {
  ahead_ = fed_ahead_ = false;  // a step issued ahead completes in the wait below, unaccounted
  spare_u_.reset();
  history_ok_ = false;
  model_->reset(*q_, state_);
  q_->wait();
  pos_ = 0;
  history_.clear();
  history_ok_ = true;
}

void Engine::wait_fed(std::span<const int32_t> fed) {
  history_ok_ = false;  // stays false if the wait throws: the state is then unknown
  q_->wait();
  pos_ += int(fed.size());
  history_.insert(history_.end(), fed.begin(), fed.end());
  history_ok_ = true;
}

void Engine::take_step_ahead(uint64_t mark, int slot) {
  history_ok_ = false;  // stays false if the wait throws: the state is then unknown
  try {
    q_->wait_for(mark);
  } catch (...) {
    ahead_ = fed_ahead_ = false;
    throw;
  }
  pos_ += 1;
  history_.push_back(last_next_);
  last_next_ = ahead_next_[slot];
  history_ok_ = true;
}

void Engine::settle() {
  if (!ahead_) return;
  ahead_ = false;
  take_step_ahead(ahead_mark_, ahead_slot_);
}

bool Engine::consume_ahead(int32_t token) {
  settle();
  if (!fed_ahead_) return false;
  if (history_.back() == token) {
    fed_ahead_ = false;
    return true;
  }
  drop_ahead();  // another token than the one fed ahead
  return false;
}

void Engine::drop_ahead() {
  if (!fed_ahead_) return;
  fed_ahead_ = false;
  // A draw issued ahead is taken back with its token: its uniform goes to the next draw.
  const std::optional<double> u = ahead_draw_ ? std::optional<double>(ahead_u_[ahead_slot_]) : std::nullopt;
  std::vector<int32_t> h(history_.begin(), history_.end() - 1);
  reset();
  if (!h.empty()) feed(h);
  spare_u_ = u;
}

void Engine::replay_step(int slot) {
  if (step_graph_[slot]) {
    q_->replay(*step_graph_[slot]);
  } else {
    Activations a = act1_;
    a.next = step_next_[slot];
    model_->forward(*q_, state_, a, 1, false, act1_.tokens);
  }
  last_slot_ = slot;
  logits_in_chunk_ = false;
}

void Engine::issue_ahead() {
  ahead_slot_ ^= 1;
  replay_step(ahead_slot_);
  q_->go(op::Read{step_next_[ahead_slot_].buf, 0, 4, &ahead_next_[ahead_slot_]});
  ahead_mark_ = q_->mark();
  ahead_ = fed_ahead_ = true;
  ahead_draw_ = false;
}

void enqueue_draw(Queue& q, Ref logits, int vocab, const DrawParams& d, double u, Ref top_ids, Ref top_vals,
                  Ref drawn, Ref out2) {
  if (d.plain()) {
    q.go(op::SampleDraw{logits, vocab, d.temperature, d.min_p, u, drawn, out2, Ref{}});
    return;
  }
  const int k = d.top_k + 1;  // (top_k >= 1: the caller checked, Engine::check_draw)
  q.go(op::TopK{logits, vocab, k, top_ids, top_vals});
  q.go(op::TopDraw{top_ids, top_vals, Ref{}, k, d.top_k, d.temperature, d.top_p, d.min_p, u, drawn, out2});
}

void Engine::issue_draw(const DrawParams& d, double u, bool feed, int slot) {
  if (!drawn_[slot]) drawn_[slot] = be_->alloc_readback(4, "drawn");
  if (!d.plain() && !top_ids_) {
    top_ids_ = be_->alloc(op::TopK::kMax * 4, "top_ids");
    top_vals_ = be_->alloc(op::TopK::kMax * 4, "top_vals");
  }
  // feed: the drawn id becomes the next step's input (act1_.tokens) unless the draw declines;
  // then the input is the argmax the graph wrote there.
  enqueue_draw(*q_, act1_.logits, config().vocab_size, d, u, Ref{top_ids_}, Ref{top_vals_}, Ref{drawn_[slot]},
               feed ? Ref{act1_.tokens} : Ref{});
}

void check_draw(const DrawParams& d, int vocab) {
  if (!d.plain() && (d.top_k < 1 || d.top_k + 1 > std::min(op::TopK::kMax, vocab)))
    fail("a draw on the backend takes top_k in [1, {}] (or none, with top_p 1); got top_k = {}, top_p = {}",
         std::min(op::TopK::kMax, vocab) - 1, d.top_k, d.top_p);
}

void Engine::check_draw(const DrawParams& d) const { dq::check_draw(d, config().vocab_size); }

void Engine::issue_draw_ahead(const DrawParams& d, double u) {
  ahead_slot_ ^= 1;
  replay_step(ahead_slot_);
  issue_draw(d, u, true, ahead_slot_);
  q_->go(op::Read{drawn_[ahead_slot_], 0, 4, &ahead_next_[ahead_slot_]});
  ahead_mark_ = q_->mark();
  ahead_ = fed_ahead_ = true;
  ahead_draw_ = true;
  ahead_params_ = d;
  ahead_u_[ahead_slot_] = u;
}

void Engine::sync() {
  settle();
  fed_ahead_ = false;
  spare_u_.reset();
}

int Engine::reuse_prefix(std::span<const int32_t> ids) {
  sync();  // the history (with any token fed ahead) is what the caller matches
  const size_t h = history_.size();
  if (history_ok_ && h > 0 && h < ids.size() && int(h) == pos_ && std::equal(history_.begin(), history_.end(), ids.begin()))
    return int(h);
  reset();
  return 0;
}

std::shared_ptr<StateSnapshot> Engine::snapshot(std::vector<uint8_t> storage) {
  sync();
  if (!history_ok_) fail("the sequence state is unknown after a failed call: there is nothing to save");
  auto s = std::make_shared<StateSnapshot>();
  s->tokens = history_;
  s->bytes = std::move(storage);
  s->bytes.resize(model_->state_bytes_at(pos_));
  model_->read_state(*q_, state_, pos_, s->bytes.data());
  q_->wait();
  return s;
}

void Engine::restore(const StateSnapshot& s) {
  if (int64_t(s.tokens.size()) > max_ctx())
    fail("a saved state of {} tokens does not fit the context of {} tokens", s.tokens.size(), max_ctx());
  const int n = int(s.tokens.size());
  if (s.bytes.size() != model_->state_bytes_at(n))
    fail("a saved state of {} tokens has {} bytes; this model's state there has {} (saved from another model?)", n,
         s.bytes.size(), model_->state_bytes_at(n));
  const int V = config().vocab_size;
  for (size_t i = 0; i < s.tokens.size(); ++i)
    if (s.tokens[i] < 0 || s.tokens[i] >= V)
      fail("a saved state's token {} (position {}) is out of range [0, {})", s.tokens[i], i, V);
  ahead_ = fed_ahead_ = false;  // a step issued ahead completes in the wait below, unaccounted
  spare_u_.reset();
  history_ok_ = false;  // stays false if the wait throws: the state is then unknown
  model_->write_state(*q_, state_, n, s.bytes);
  q_->wait();
  pos_ = n;
  history_ = s.tokens;
  history_ok_ = true;
}

void Engine::check_ids(std::span<const int32_t> ids) const {
  const int V = config().vocab_size;
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= V) fail("token id {} (position {}) is out of range [0, {})", ids[i], i, V);
  if (pos_ + int64_t(ids.size()) > max_ctx())
    fail("context is full: {} tokens + {} new exceed the context of {} tokens (raise --ctx)", pos_, ids.size(),
         max_ctx());
}

void Engine::write_tokens(const Activations& a, std::span<const int32_t> ids) {
  op::Write w{a.tokens.buf, 0, std::vector<uint8_t>(ids.size() * 4)};
  std::memcpy(w.bytes.data(), ids.data(), ids.size() * 4);
  q_->go(std::move(w));
}

std::vector<float> Engine::score(std::span<const int32_t> ids) {
  reset();
  check_ids(ids);
  const int V = config().vocab_size;
  std::vector<float> out(ids.size() * size_t(V));
  Activations a = model_->new_activations(*be_, std::min<int>(opt_.prefill_chunk, std::max<int>(1, int(ids.size()))), true);
  for (size_t i = 0; i < ids.size(); i += a.max_tokens) {
    int n = int(std::min<size_t>(a.max_tokens, ids.size() - i));
    write_tokens(a, ids.subspan(i, n));
    model_->forward(*q_, state_, a, n, true, act1_.tokens);
    q_->go(op::Read{a.logits.buf, 0, size_t(n) * V * 4, out.data() + i * V});
    wait_fed(ids.subspan(i, n));
  }
  return out;
}

int32_t Engine::feed(std::span<const int32_t> ids, std::vector<float>* last_logits) {
  if (ids.empty()) fail("nothing to feed: the prompt has no tokens");
  spare_u_.reset();  // a new stretch of input: no draw continues
  if (consume_ahead(ids[0])) {  // the first token is in the state already
    ids = ids.subspan(1);
    if (ids.empty()) {
      if (last_logits) read_logits(last_logits);
      return last_next_;
    }
  }
  check_ids(ids);
  int32_t next = 0;
  for (size_t i = 0; i < ids.size(); i += act_.max_tokens) {
    int n = int(std::min<size_t>(act_.max_tokens, ids.size() - i));
    if (n == 1 && i + 1 == ids.size()) return step(ids[i], last_logits);  // the recorded step
    write_tokens(act_, ids.subspan(i, n));
    model_->forward(*q_, state_, act_, n, false, act1_.tokens);
    logits_in_chunk_ = true;
    q_->go(op::Read{act_.next.buf, 0, 4, &next});
    if (last_logits && i + n == ids.size()) {
      last_logits->resize(config().vocab_size);
      q_->go(op::Read{act_.logits.buf, 0, size_t(config().vocab_size) * 4, last_logits->data()});
    }
    wait_fed(ids.subspan(i, n));
    last_next_ = next;
  }
  return next;
}

int32_t Engine::step(int32_t token, std::vector<float>* logits) {
  if (consume_ahead(token)) {
    if (logits) read_logits(logits);
    return last_next_;
  }
  const int32_t one[1] = {token};
  check_ids(one);
  write_tokens(act1_, one);
  return run_step(logits, token);
}

int32_t Engine::step_greedy() {
  if (fed_ahead_ && ahead_draw_) sync();  // after step_draw_ahead: its last id is the input on the device
  if (!step_graph_[0] || !q_->overlaps()) {
    settle();
    if (pos_ + 1 > max_ctx())
      fail("context is full: {} tokens + 1 new exceed the context of {} tokens (raise --ctx)", pos_, max_ctx());
    return run_step(nullptr, last_next_);  // the device already holds it as the step's input
  }
  if (!fed_ahead_) {  // the step feeding the last argmax (on the device already) is not issued yet
    if (pos_ + 1 > max_ctx())
      fail("context is full: {} tokens + 1 new exceed the context of {} tokens (raise --ctx)", pos_, max_ctx());
    issue_ahead();
  }
  if (!ahead_) {  // it was issued and another call settled it: its result is last_next_
    fed_ahead_ = false;
    if (pos_ + 1 <= max_ctx()) issue_ahead();
    return last_next_;
  }
  // A step is in flight: the one after it goes in now (its input is that step's argmax, on
  // the device) when the context has room, then the host waits for the first only.
  const uint64_t m = ahead_mark_;
  const int slot = ahead_slot_;
  ahead_ = fed_ahead_ = false;
  if (pos_ + 2 <= max_ctx()) issue_ahead();
  take_step_ahead(m, slot);
  return last_next_;
}

void Engine::step_top(int32_t token, int n, std::vector<int32_t>* ids, std::vector<float>* vals, double* total,
                      float temperature) {
  const int V = config().vocab_size;
  if (n < 1 || n > op::TopK::kMax || n > V) fail("step_top: n = {} must be in [1, {}]", n, std::min(op::TopK::kMax, V));
  if (!top_ids_) {
    top_ids_ = be_->alloc(op::TopK::kMax * 4, "top_ids");
    top_vals_ = be_->alloc(op::TopK::kMax * 4, "top_vals");
  }
  ids->resize(size_t(n));
  vals->resize(size_t(n));
  int32_t next = 0;
  const bool fresh = issue_step(token, &next);
  q_->go(op::TopK{act1_.logits, V, n, Ref{top_ids_}, Ref{top_vals_}});
  q_->go(op::Read{top_ids_, 0, size_t(n) * 4, ids->data()});
  q_->go(op::Read{top_vals_, 0, size_t(n) * 4, vals->data()});
  if (total) {
    if (!total_) total_ = be_->alloc(8, "draw_total");
    q_->go(op::SampleDraw{act1_.logits, V, temperature, 0.0f, 0.0, Ref{}, Ref{}, Ref{total_}});
    q_->go(op::Read{total_, 0, 8, total});
  }
  finish_step(fresh, token);
  last_next_ = next;
}

int32_t Engine::step_draw(int32_t token, float temperature, float min_p, double u) {
  return step_draw(token, DrawParams{temperature, min_p}, u);
}

int32_t Engine::step_draw(int32_t token, const DrawParams& d, double u) {
  check_draw(d);
  int32_t next = 0, id = -1;
  const bool fresh = issue_step(token, &next);
  issue_draw(d, u, false);
  q_->go(op::Read{drawn_[0], 0, 4, &id});
  finish_step(fresh, token);
  last_next_ = next;
  return id;
}

int32_t Engine::step_draw_ahead(int32_t token, float temperature, float min_p, const std::function<double()>& next_u,
                                double* u) {
  return step_draw_ahead(token, DrawParams{temperature, min_p}, next_u, u);
}

int32_t Engine::step_draw_ahead(int32_t token, const DrawParams& d, const std::function<double()>& next_u, double* u) {
  check_draw(d);
  auto take_u = [&] {
    if (!spare_u_) return next_u();
    const double v = *spare_u_;
    spare_u_.reset();
    return v;
  };
  if (!step_graph_[0] || !q_->overlaps()) {
    const double v = take_u();
    if (u) *u = v;
    return step_draw(token, d, v);
  }
  // Is a draw step of these parameters feeding `token` issued (in flight, or settled)?
  const bool pipelined = fed_ahead_ && ahead_draw_ && ahead_params_ == d &&
                         (ahead_ ? last_next_ : history_.back()) == token;
  if (!pipelined) {
    const std::optional<double> keep = spare_u_;
    const bool draw_ahead = fed_ahead_ && ahead_draw_;
    if (consume_ahead(token)) {  // the state holds token, fed ahead by another kind of step: draw once
      if (draw_ahead) spare_u_ = ahead_u_[ahead_slot_];  // a draw of other parameters, taken back
      const double v = take_u();
      if (u) *u = v;
      int32_t id = -1;
      issue_draw(d, v, false);
      q_->go(op::Read{drawn_[0], 0, 4, &id});
      q_->wait();
      last_next_ = id;
      return id;
    }
    if (keep && !spare_u_) spare_u_ = keep;  // (a rebuild keeps the spare of the draw it took back)
    if (pos_ + 1 > max_ctx())
      fail("context is full: {} tokens + 1 new exceed the context of {} tokens (raise --ctx)", pos_, max_ctx());
    const int32_t one[1] = {token};
    check_ids(one);
    write_tokens(act1_, one);
    last_next_ = token;  // the step issued now feeds it, as a step issued ahead would
    issue_draw_ahead(d, take_u());
  }
  if (!ahead_) {  // issued, and another call settled it: its draw is last_next_
    fed_ahead_ = false;
    if (u) *u = ahead_u_[ahead_slot_];
    if (last_next_ < 0) return -1;  // declined (the state holds token; nothing was issued after it)
    if (pos_ + 1 <= max_ctx()) issue_draw_ahead(d, take_u());
    return last_next_;
  }
  // The step feeding `token` is in flight: the one after it goes in now, fed from the device,
  // when the context has room; then the host waits for the first only.
  const uint64_t m = ahead_mark_;
  const int slot = ahead_slot_;
  ahead_ = fed_ahead_ = false;
  const bool more = pos_ + 2 <= max_ctx();
  if (more) issue_draw_ahead(d, take_u());
  take_step_ahead(m, slot);
  if (u) *u = ahead_u_[slot];
  if (last_next_ < 0 && more) {
    // Declined: the step issued after it was fed the argmax instead; take it back (with its
    // draw's uniform) so that the state holds `token` and its logits are the last ones. (Which
    // token it fed does not matter: it leaves the history with it.)
    last_next_ = 0;
    settle();
    drop_ahead();
    last_next_ = -1;
  }
  return last_next_;
}

bool Engine::issue_step(int32_t token, int32_t* next) {
  const bool fed = consume_ahead(token);
  if (!fed) {
    const int32_t one[1] = {token};
    check_ids(one);
    write_tokens(act1_, one);
    replay_step(0);
  }
  // (fed: the step issued ahead wrote its argmax into its slot's buffer)
  q_->go(op::Read{step_next_[last_slot_].buf, 0, 4, next});
  return !fed;
}

void Engine::finish_step(bool fresh, int32_t token) {
  if (fresh) wait_fed(std::span<const int32_t>(&token, 1));
  else q_->wait();
}

void Engine::read_logits(std::vector<float>* logits) {
  settle();
  if (fed_ahead_) fail("read_logits: the last step_greedy() result was already fed ahead (its logits are gone)");
  logits->resize(config().vocab_size);
  // The last forward's row: a prefill chunk's (after feed, or a rebuild that dropped a step
  // issued ahead) or the step's.
  const auto& last = logits_in_chunk_ ? act_.logits : act1_.logits;
  q_->go(op::Read{last.buf, 0, size_t(config().vocab_size) * 4, logits->data()});
  q_->wait();
}

int32_t Engine::run_step(std::vector<float>* logits, int32_t token) {
  replay_step(0);
  int32_t next = 0;
  q_->go(op::Read{step_next_[0].buf, 0, 4, &next});
  if (logits) {
    logits->resize(config().vocab_size);
    q_->go(op::Read{act1_.logits.buf, 0, size_t(config().vocab_size) * 4, logits->data()});
  }
  wait_fed(std::span<const int32_t>(&token, 1));
  last_next_ = next;
  return next;
}

std::vector<std::vector<float>> Engine::layer_outputs(std::span<const int32_t> ids) {
  reset();
  check_ids(ids);
  if (ids.empty()) return {};
  Activations a = model_->new_activations(*be_, int(ids.size()), false);
  std::vector<std::vector<float>> out;
  write_tokens(a, ids);
  model_->forward(*q_, state_, a, int(ids.size()), false, act1_.tokens, &out);
  wait_fed(ids);
  return out;
}

}  // namespace dq
