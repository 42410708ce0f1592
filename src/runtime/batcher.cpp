#include "runtime/batcher.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/host_memory.h"

namespace dq {

std::string slots_unfit_reason(int slots, int ctx, size_t per_slot, size_t available) {
  if (!available || per_slot * size_t(slots) <= available) return {};
  return fmt::format(
      "{} parallel sequences at a context of {} tokens need {:.2f} GB of sequence state ({:.1f} MB each); {:.2f} GB "
      "of memory is available (lower --parallel or --ctx)",
      slots, ctx, double(per_slot) * slots / 1e9, double(per_slot) / 1e6, double(available) / 1e9);
}

Batcher::Batcher(Engine& engine, int slots)
    : model_(engine.model()), q_(engine.queue()), use_graph_(engine.uses_graph()) {
  if (slots < 1) fail("the number of parallel sequences must be at least 1, got {}", slots);
  engine.sync();  // nothing of the engine's own in flight from here on
  Backend& be = engine.backend();
  // The CPU backend's state pages fill as the slots' contexts do: refuse up front what would end
  // with the process killed for memory later (the GPU's allocations fail at once, by name).
  const std::string unfit = slots_unfit_reason(slots, model_.max_ctx(), model_.state_bytes_at(model_.max_ctx()),
                                               be.is_cpu() ? host_memory_available() : 0);
  if (!unfit.empty()) fail("{}", unfit);
  slots_.resize(size_t(slots));
  for (Slot& sl : slots_) {
    sl.state = model_.new_state(be);
    bytes_ += sl.state.bytes;
    model_.reset(q_, sl.state);
  }
  chunk_ = model_.new_activations(be, std::min(engine.prefill_chunk(), model_.max_ctx()), false);
  batch_ = model_.new_activations(be, slots, true);
  next_ = Ref{be.alloc_readback(4 * size_t(slots), "batch next")};
  drawn_ = Ref{be.alloc_readback(4 * size_t(slots), "batch drawn")};
  top_ids_ = Ref{be.alloc(op::TopK::kMax * 4, "batch top_ids")};
  top_vals_ = Ref{be.alloc(op::TopK::kMax * 4, "batch top_vals")};
  bytes_ += chunk_.bytes + batch_.bytes + 8 * size_t(slots) + 8 * op::TopK::kMax;
  q_.wait();
}

Batcher::~Batcher() {
  try {
    q_.wait();
  } catch (...) {
  }
}

Batcher::Slot& Batcher::slot(int s) {
  if (s < 0 || s >= slots()) fail("sequence slot {} does not exist (there are {})", s, slots());
  return slots_[size_t(s)];
}
const Batcher::Slot& Batcher::slot(int s) const { return const_cast<Batcher*>(this)->slot(s); }

void Batcher::reset(int s) {
  Slot& sl = slot(s);
  sl.ok = false;
  model_.reset(q_, sl.state);
  q_.wait();
  sl.history.clear();
  sl.ok = true;
}

int Batcher::reuse_prefix(int s, std::span<const int32_t> ids) {
  const Slot& sl = slot(s);
  const size_t h = sl.history.size();
  if (sl.ok && h > 0 && h < ids.size() && std::equal(sl.history.begin(), sl.history.end(), ids.begin())) return int(h);
  reset(s);
  return 0;
}

std::shared_ptr<StateSnapshot> Batcher::snapshot(int s, std::vector<uint8_t> storage) {
  const Slot& sl = slot(s);
  if (!sl.ok) fail("the sequence state is unknown after a failed call: there is nothing to save");
  auto snap = std::make_shared<StateSnapshot>();
  snap->tokens = sl.history;
  snap->bytes = std::move(storage);
  snap->bytes.resize(model_.state_bytes_at(position(s)));
  model_.read_state(q_, sl.state, position(s), snap->bytes.data());
  q_.wait();
  return snap;
}

void Batcher::restore(int s, const StateSnapshot& snap) {
  Slot& sl = slot(s);
  if (int64_t(snap.tokens.size()) > max_ctx())
    fail("a saved state of {} tokens does not fit the context of {} tokens", snap.tokens.size(), max_ctx());
  const int V = model_.config().vocab_size;
  for (size_t i = 0; i < snap.tokens.size(); ++i)
    if (snap.tokens[i] < 0 || snap.tokens[i] >= V)
      fail("a saved state's token {} (position {}) is out of range [0, {})", snap.tokens[i], i, V);
  const int n = int(snap.tokens.size());
  if (snap.bytes.size() != model_.state_bytes_at(n))
    fail("a saved state of {} tokens has {} bytes; this model's state there has {} (saved from another model?)", n,
         snap.bytes.size(), model_.state_bytes_at(n));
  sl.ok = false;
  model_.write_state(q_, sl.state, n, snap.bytes);
  q_.wait();
  sl.history = snap.tokens;
  sl.ok = true;
}

void Batcher::check_ids(const Slot& sl, std::span<const int32_t> ids) const {
  const int V = model_.config().vocab_size;
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= V) fail("token id {} (position {}) is out of range [0, {})", ids[i], i, V);
  if (int64_t(sl.history.size()) + int64_t(ids.size()) > max_ctx())
    fail("context is full: {} tokens + {} new exceed the context of {} tokens (raise --ctx)", sl.history.size(),
         ids.size(), max_ctx());
}

void Batcher::write_tokens(const Activations& a, std::span<const int32_t> ids) {
  op::Write w{a.tokens.buf, 0, std::vector<uint8_t>(ids.size() * 4)};
  std::memcpy(w.bytes.data(), ids.data(), ids.size() * 4);
  q_.go(std::move(w));
}

int32_t Batcher::feed(int s, std::span<const int32_t> ids, std::vector<float>* last_logits) {
  Slot& sl = slot(s);
  if (ids.empty()) fail("nothing to feed: the prompt has no tokens");
  if (!sl.ok) fail("the sequence state is unknown after a failed call: reset it first");
  check_ids(sl, ids);
  const int V = model_.config().vocab_size;
  int32_t next = 0;
  for (size_t i = 0; i < ids.size(); i += size_t(chunk_.max_tokens)) {
    const int n = int(std::min<size_t>(size_t(chunk_.max_tokens), ids.size() - i));
    write_tokens(chunk_, ids.subspan(i, size_t(n)));
    model_.forward(q_, sl.state, chunk_, n, false);
    q_.go(op::Read{chunk_.next.buf, 0, 4, &next});
    if (last_logits && i + size_t(n) == ids.size()) {
      last_logits->resize(size_t(V));
      q_.go(op::Read{chunk_.logits.buf, 0, size_t(V) * 4, last_logits->data()});
    }
    sl.ok = false;  // stays false if the wait throws
    q_.wait();
    sl.history.insert(sl.history.end(), ids.begin() + std::ptrdiff_t(i), ids.begin() + std::ptrdiff_t(i) + n);
    sl.ok = true;
  }
  return next;
}

void Batcher::step(std::span<const int> which, std::span<const int32_t> tokens, std::vector<int32_t>* next,
                   std::vector<float>* logits) {
  run_step(which, tokens, next, logits, {}, nullptr);
}

void Batcher::step(std::span<const int> which, std::span<const int32_t> tokens, std::vector<int32_t>* next,
                   std::span<const Draw> draws, std::vector<int32_t>* drawn) {
  if (draws.size() != which.size())
    fail("a batched step of {} slots with {} draws (one a slot, on or off)", which.size(), draws.size());
  run_step(which, tokens, next, nullptr, draws, drawn);
}

void Batcher::run_step(std::span<const int> which, std::span<const int32_t> tokens, std::vector<int32_t>* next,
                       std::vector<float>* logits, std::span<const Draw> draws, std::vector<int32_t>* drawn) {
  const size_t n = which.size();
  if (n == 0 || n != tokens.size() || n > slots_.size())
    fail("a batched step of {} slots with {} tokens (at most {} slots)", n, tokens.size(), slots_.size());
  const int V = model_.config().vocab_size;
  std::vector<SequenceState*> seqs(n);
  for (size_t i = 0; i < n; ++i) {
    Slot& sl = slot(which[i]);
    for (size_t j = 0; j < i; ++j)
      if (which[j] == which[i]) fail("slot {} appears twice in one batched step", which[i]);
    if (!sl.ok) fail("the sequence state of slot {} is unknown after a failed call: reset it first", which[i]);
    check_ids(sl, tokens.subspan(i, 1));
    seqs[i] = &sl.state;
    if (!draws.empty() && draws[i].on) check_draw(draws[i].params, V);
  }
  write_tokens(batch_, tokens);
  if (use_graph_)
    q_.replay(graph_for(which, seqs));
  else
    model_.forward_batch(q_, seqs, batch_, next_);
  last_n_ = n;
  next->resize(n);
  q_.go(op::Read{next_.buf, 0, 4 * n, next->data()});
  if (logits) {
    logits->resize(n * size_t(V));
    q_.go(op::Read{batch_.logits.buf, 0, 4 * n * size_t(V), logits->data()});
  }
  if (drawn) {
    drawn->assign(n, -1);
    bool any = false;
    for (size_t i = 0; i < draws.size(); ++i)
      if (draws[i].on) {
        enqueue_draw(q_, batch_.logits.at(i * size_t(V)), V, draws[i].params, draws[i].u, top_ids_, top_vals_,
                     drawn_.at(i), Ref{});
        any = true;
      }
    if (any) q_.go(op::Read{drawn_.buf, 0, 4 * n, drawn->data()});
  }
  for (size_t i = 0; i < n; ++i) slots_[size_t(which[i])].ok = false;
  q_.wait();
  for (size_t i = 0; i < n; ++i) {
    Slot& sl = slots_[size_t(which[i])];
    sl.history.push_back(tokens[i]);
    sl.ok = true;
  }
  if (drawn)
    for (size_t i = 0; i < draws.size(); ++i)
      if (!draws[i].on) (*drawn)[i] = -1;
}

void Batcher::read_row(size_t i, std::vector<float>* row) {
  if (i >= last_n_) fail("row {} of a step of {} rows", i, last_n_);
  const size_t V = size_t(model_.config().vocab_size);
  row->resize(V);
  q_.go(op::Read{batch_.logits.buf, i * V * 4, V * 4, row->data()});
  q_.wait();
}

const Graph& Batcher::graph_for(std::span<const int> which, std::span<SequenceState* const> seqs) {
  ++steps_;
  std::vector<int> key(which.begin(), which.end());
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    if (graphs_.size() >= kMaxGraphs)
      graphs_.erase(std::min_element(graphs_.begin(), graphs_.end(),
                                     [](const auto& a, const auto& b) { return a.second.used < b.second.used; }));
    Recorded r;
    r.graph = q_.capture([&] { model_.forward_batch(q_, seqs, batch_, next_); });
    it = graphs_.emplace(std::move(key), std::move(r)).first;
  }
  it->second.used = steps_;
  return *it->second.graph;
}

}  // namespace dq
