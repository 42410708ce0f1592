// Several sequences decoded together on one engine's model: each slot has its own sequence state
// (GDN state, K/V cache, position) and history, and one step feeds one token to each of the
// slots it is given, reading every weight matrix once for all of them (Qwen35::forward_batch).
// Decode is bound by reading the weights, so n sequences cost far less than n steps. A slot's
// logits are the same bits as a lone sequence's, on every backend (the products are per token;
// the token mixers run per slot), so a batched server answers what a one-at-a-time server does.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/qwen35.h"
#include "runtime/engine.h"
#include "runtime/prompt_cache.h"

namespace dq {

// Empty when `slots` sequence states of per_slot bytes each (at the full context) fit the
// available memory (0: unknown, no check); else the error, with the numbers.
std::string slots_unfit_reason(int slots, int ctx, size_t per_slot, size_t available);

class Batcher {
 public:
  // Uses engine's backend, model and queue (the engine's own sequence is left alone: use one or
  // the other). Allocates `slots` sequence states (Engine::state_bytes() of memory each, about).
  Batcher(Engine& engine, int slots);
  ~Batcher();

  static constexpr size_t kMaxGraphs = 64;

  int slots() const { return int(slots_.size()); }
  int max_ctx() const { return model_.max_ctx(); }
  // The tokens slot s holds, in order; its position is their count.
  const std::vector<int32_t>& history(int s) const { return slot(s).history; }
  int position(int s) const { return int(slot(s).history.size()); }
  // Bytes of device (or host) memory the slots and the step's working memory take.
  size_t bytes() const { return bytes_; }

  // Empties slot s (a new sequence).
  void reset(int s);
  // As Engine::reuse_prefix for slot s: keeps its state and returns its history's length when
  // ids extends the history by at least one token, else resets it and returns 0.
  int reuse_prefix(int s, std::span<const int32_t> ids);
  // As Engine::snapshot / restore, for slot s.
  std::shared_ptr<StateSnapshot> snapshot(int s, std::vector<uint8_t> storage = {});
  void restore(int s, const StateSnapshot& snap);
  // Feeds ids to slot s in prefill chunks; returns the argmax after the last one and, if asked,
  // its logits.
  int32_t feed(int s, std::span<const int32_t> ids, std::vector<float>* last_logits = nullptr);
  // One decode step: tokens[i] is fed to slot which[i] (distinct slots). next[i] receives the
  // argmax of that slot's next logits; logits, when set, every row ([n][vocab]). With the
  // engine's graphs on (EngineOptions::use_graph), the step of each list of slots is recorded once
  // and replayed (the last kMaxGraphs lists used are kept): a list lasts as long as the requests
  // in it, and on CUDA a replay saves the launch of each of its hundreds of ops.
  void step(std::span<const int> which, std::span<const int32_t> tokens, std::vector<int32_t>* next,
            std::vector<float>* logits = nullptr);
  // A sample for row i of a step, drawn on the backend as Engine::step_draw does (only the id
  // comes back; -1 when the draw declines and the row decides: read_row).
  struct Draw {
    bool on = false;
    DrawParams params;
    double u = 0;  // the sampler's uniform for this draw
  };
  // The same step with draws: draws[i] for slot which[i]; drawn[i] receives its id (-1 where the
  // draw declined or draws[i] is off).
  void step(std::span<const int> which, std::span<const int32_t> tokens, std::vector<int32_t>* next,
            std::span<const Draw> draws, std::vector<int32_t>* drawn);
  // Row i's logits of the last step (valid until the next step).
  void read_row(size_t i, std::vector<float>* row);

 private:
  struct Slot {
    SequenceState state;
    std::vector<int32_t> history;
    bool ok = true;  // false after a call that changed the state failed: its contents are unknown
  };
  Slot& slot(int s);
  const Slot& slot(int s) const;
  void check_ids(const Slot& sl, std::span<const int32_t> ids) const;
  void write_tokens(const Activations& a, std::span<const int32_t> ids);
  void run_step(std::span<const int> which, std::span<const int32_t> tokens, std::vector<int32_t>* next,
                std::vector<float>* logits, std::span<const Draw> draws, std::vector<int32_t>* drawn);

  const Qwen35& model_;
  Queue& q_;
  std::vector<Slot> slots_;
  Activations chunk_;  // prefill chunks of one slot
  Activations batch_;  // a step of up to slots() tokens, every row's logits
  Ref next_;           // i32 [slots] argmaxes (host-readable)
  Ref drawn_;          // i32 [slots] drawn ids (host-readable)
  Ref top_ids_, top_vals_;  // op::TopK's pairs of one row's draw
  size_t last_n_ = 0;       // rows of the last step
  size_t bytes_ = 0;
  struct Recorded {
    std::unique_ptr<Graph> graph;
    uint64_t used = 0;
  };
  bool use_graph_ = false;
  std::map<std::vector<int>, Recorded> graphs_;  // by the step's list of slots
  uint64_t steps_ = 0;
  const Graph& graph_for(std::span<const int> which, std::span<SequenceState* const> seqs);
};

}  // namespace dq
