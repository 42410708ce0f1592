#include "runtime/prompt_cache.h"

#include <algorithm>

namespace dq {

static bool same(std::span<const int32_t> a, std::span<const int32_t> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

std::shared_ptr<const StateSnapshot> PromptCache::find(std::span<const int32_t> prompt) {
  auto best = items_.end();
  for (auto it = items_.begin(); it != items_.end(); ++it) {
    const auto& t = (*it)->tokens;
    if (t.empty() || t.size() >= prompt.size()) continue;
    if (best != items_.end() && t.size() <= (*best)->tokens.size()) continue;
    if (std::equal(t.begin(), t.end(), prompt.begin())) best = it;
  }
  if (best == items_.end()) return nullptr;
  items_.splice(items_.begin(), items_, best);
  return items_.front();
}

bool PromptCache::contains(std::span<const int32_t> tokens) const {
  return std::any_of(items_.begin(), items_.end(), [&](const auto& s) { return same(s->tokens, tokens); });
}

void PromptCache::drop(std::list<std::shared_ptr<const StateSnapshot>>::iterator it) {
  bytes_ -= (*it)->size();
  // Only the cache held it (a snapshot being restored is held by its caller too): its storage
  // may be reused. The const is the cache's promise to callers, who no longer see it.
  if (it->use_count() == 1 && (*it)->bytes.capacity() > spare_.capacity())
    spare_ = std::move(const_cast<StateSnapshot&>(**it).bytes);
  items_.erase(it);
}

bool PromptCache::put(std::shared_ptr<const StateSnapshot> s) {
  if (!s || !fits(s->size())) return false;
  for (auto it = items_.begin(); it != items_.end(); ++it)
    if (same((*it)->tokens, s->tokens)) {
      drop(it);
      break;
    }
  bytes_ += s->size();
  items_.push_front(std::move(s));
  while (bytes_ > budget_ || items_.size() > max_entries_) drop(std::prev(items_.end()));
  return true;
}

void PromptCache::clear() {
  items_.clear();
  bytes_ = 0;
  spare_ = {};
}

int chat_messages_end(std::span<const int32_t> prompt, std::span<const int32_t> messages) {
  if (messages.empty() || messages.size() >= prompt.size()) return -1;
  return std::equal(messages.begin(), messages.end(), prompt.begin()) ? int(messages.size()) : -1;
}

}  // namespace dq
