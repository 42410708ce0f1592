// Saved sequence states, so that a prompt that starts with a token sequence seen before feeds
// only the rest. The Gated DeltaNet state cannot be rewound, so a state is reusable only at the
// exact prefix it was saved at; the generator saves one at the end of every prompt. That is the
// point a chat's next turn starts from when its template drops the last reply's reasoning (Qwen's
// do), and the point another user's conversation left off when several interleave.
#pragma once
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <vector>

namespace dq {

// A copy of a sequence state in host memory (Engine::snapshot): the tokens it holds and the
// bytes of its buffers (Qwen35::read_state).
struct StateSnapshot {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> bytes;
  // What it holds in memory (the storage may be larger than the bytes: a reused one's).
  size_t size() const { return bytes.capacity() + tokens.capacity() * sizeof(int32_t); }
};

// Snapshots kept up to a byte budget, the least recently used dropped first.
class PromptCache {
 public:
  // At most budget_bytes of snapshots and max_entries of them.
  explicit PromptCache(size_t budget_bytes, size_t max_entries = SIZE_MAX)
      : budget_(budget_bytes), max_entries_(max_entries) {}

  // The longest snapshot whose tokens are a proper prefix of `prompt` (at least one token of it
  // is left to feed), or null. A hit counts as a use.
  std::shared_ptr<const StateSnapshot> find(std::span<const int32_t> prompt);
  // Whether a snapshot of exactly these tokens is kept.
  bool contains(std::span<const int32_t> tokens) const;
  // Keeps s (replacing one of the same tokens) and drops the least recently used beyond the
  // budget or the count; a snapshot larger than the whole budget is not kept (returns false).
  bool put(std::shared_ptr<const StateSnapshot> s);
  // Whether a snapshot of this many bytes could be kept at all.
  bool fits(size_t bytes) const { return max_entries_ > 0 && bytes <= budget_; }
  void clear();
  // The storage of the last snapshot dropped (when nothing else held it), for the next save:
  // fresh pages cost more than the copy into them (first touches, ~0.4 GB/s on the 2-core VM
  // against ~14 GB/s into touched ones; docs/bench.md). Empty when there is none.
  std::vector<uint8_t> take_spare() { return std::move(spare_); }

  size_t budget() const { return budget_; }
  size_t bytes() const { return bytes_; }
  size_t count() const { return items_.size(); }

 private:
  void drop(std::list<std::shared_ptr<const StateSnapshot>>::iterator it);

  size_t budget_, max_entries_;
  size_t bytes_ = 0;
  std::list<std::shared_ptr<const StateSnapshot>> items_;  // most recently used first
  std::vector<uint8_t> spare_;  // not counted in bytes_: at most one snapshot's
};

// Where a chat prompt's messages end, in tokens: the length of `messages` (the conversation
// rendered without the generation prompt, tokenized) when it is a proper prefix of `prompt`,
// else -1. The next turn's prompt starts with the messages, not with the generation prompt.
int chat_messages_end(std::span<const int32_t> prompt, std::span<const int32_t> messages);

}  // namespace dq
