#include "text/bpe.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "core/error.h"
#include "text/byte_level.h"
#include "text/utf8.h"

namespace dq::text {
namespace {

inline uint64_t mix(uint64_t h) {
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 32;
  return h;
}

inline uint64_t pair_key(TokenId a, TokenId b) { return uint64_t(uint32_t(a)) << 32 | uint32_t(b); }

}  // namespace

uint64_t hash_bytes(const char* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0x94d049bb133111ebull;
    h ^= h >> 31;
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w) * 0x94d049bb133111ebull;
  }
  return mix(h);
}

// ---- PieceCache ------------------------------------------------------------------------------

const TokenId* PieceCache::find(std::string_view piece, uint64_t hash, size_t& count) const {
  if (slots_.empty()) return nullptr;
  hash |= 1;
  size_t mask = slots_.size() - 1;
  for (size_t i = (hash >> 1) & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.hash == 0) return nullptr;
    if (s.hash != hash || s.key_len != piece.size()) continue;
    const char* key = s.key;
    if (piece.size() > kInline) {
      uint32_t off;
      std::memcpy(&off, s.key, 4);
      key = keys_.data() + off;
    }
    if (std::memcmp(key, piece.data(), piece.size()) != 0) continue;
    count = s.n_ids;
    return s.n_ids == 1 ? &s.ids : ids_.data() + s.ids;
  }
}

void PieceCache::grow() {
  HugeVector<Slot> old;
  old.swap(slots_);
  slots_.resize(old.empty() ? 1024 : old.size() * 2);
  size_t mask = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.hash == 0) continue;
    size_t i = (s.hash >> 1) & mask;
    while (slots_[i].hash != 0) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

void PieceCache::insert(std::string_view piece, uint64_t hash, const TokenId* ids, size_t count) {
  if (piece.size() > kMaxPiece || count == 0 || count > 0xFFFF) return;
  hash |= 1;
  if (entries_ >= kMaxEntries) {  // full: start over (simple, and keeps memory bounded)
    std::fill(slots_.begin(), slots_.end(), Slot{});
    keys_.clear();
    ids_.clear();
    entries_ = 0;
    ++resets_;
  }
  if ((entries_ + 1) * 2 > slots_.size()) grow();
  size_t mask = slots_.size() - 1;
  size_t i = (hash >> 1) & mask;
  while (slots_[i].hash != 0) i = (i + 1) & mask;
  Slot& s = slots_[i];
  s.hash = hash;
  s.key_len = uint16_t(piece.size());
  if (piece.size() <= kInline) {
    std::memcpy(s.key, piece.data(), piece.size());
  } else {
    auto off = uint32_t(keys_.size());
    std::memcpy(s.key, &off, 4);
    keys_.append(piece);
  }
  s.n_ids = uint16_t(count);
  if (count == 1) {
    s.ids = ids[0];
  } else {
    s.ids = TokenId(ids_.size());
    ids_.insert(ids_.end(), ids, ids + count);
  }
  ++entries_;
}

// ---- vocabulary --------------------------------------------------------------------------------
//
// Loading Qwen3 takes ~450k lookups in a 151k-entry table; with the table in DRAM each costs a
// few cache misses, so the bulk paths prefetch kAhead entries ahead.

namespace {
constexpr size_t kAhead = 16;
}

void BpeModel::reserve(size_t json_bytes) {
  arena_.reserve(json_bytes / 2);
  pending_.reserve(json_bytes / 8);  // an entry takes at least 8 bytes of JSON: "a": 1,
  pending_ids_.reserve(json_bytes / 8);
  merge_list_.reserve(json_bytes / 8);
}

void BpeModel::add_token(std::string_view text, TokenId id) {
  pending_.push_back(uint64_t(arena_.size()) << 32 | text.size());
  pending_ids_.push_back(id);
  arena_.append(text);
}

void BpeModel::prefetch(uint64_t h) const {
  if (!table_.empty()) __builtin_prefetch(&table_[uint32_t(h) & (table_.size() - 1)]);
}

std::optional<TokenId> BpeModel::find(std::string_view text, uint64_t h) const {
  if (table_.empty()) return std::nullopt;
  size_t mask = table_.size() - 1;
  uint32_t h32 = uint32_t(h);
  for (size_t i = h32 & mask;; i = (i + 1) & mask) {
    const VocabSlot& s = table_[i];
    if (s.id < 0) return std::nullopt;
    if (s.hash32 == h32 && s.len == text.size() &&
        std::memcmp(arena_.data() + s.off, text.data(), s.len) == 0)
      return s.id;
  }
}

std::optional<TokenId> BpeModel::find(std::string_view text) const { return find(text, hash(text)); }

bool BpeModel::finish_vocab(std::string& duplicate) {
  size_t n = pending_.size();
  size_t size = 1024;
  while (size * 2 < n * 3) size <<= 1;  // load under 2/3
  table_.assign(size, VocabSlot{});
  size_t mask = size - 1;
  std::vector<uint32_t> hashes(n);
  for (size_t k = 0; k < n; ++k) {
    hashes[k] = uint32_t(hash(std::string_view(arena_).substr(size_t(pending_[k] >> 32), uint32_t(pending_[k]))));
  }
  TokenId max_id = -1;
  for (size_t k = 0; k < n; ++k) {
    if (k + kAhead < n) __builtin_prefetch(&table_[hashes[k + kAhead] & mask]);
    uint32_t off = uint32_t(pending_[k] >> 32), len = uint32_t(pending_[k]);
    size_t i = hashes[k] & mask;
    for (; table_[i].id >= 0; i = (i + 1) & mask) {
      const VocabSlot& s = table_[i];
      if (s.hash32 == hashes[k] && s.len == len && std::memcmp(arena_.data() + s.off, arena_.data() + off, len) == 0) {
        duplicate.assign(arena_.data() + off, len);
        return false;
      }
    }
    table_[i] = {hashes[k], pending_ids_[k], off, len};
    max_id = std::max(max_id, pending_ids_[k]);
  }
  spans_.assign(size_t(max_id + 1), ~uint64_t(0));
  for (size_t k = 0; k < n; ++k) spans_[size_t(pending_ids_[k])] = pending_[k];
  n_tokens_ = n;
  HugeVector<uint64_t>().swap(pending_);
  HugeVector<TokenId>().swap(pending_ids_);
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    append_utf8(ch, byte_to_char(uint8_t(b)));
    auto id = find(ch);
    byte_ids_[size_t(b)] = id ? *id : -1;
  }
  return true;
}

std::optional<std::string_view> BpeModel::text(TokenId id) const {
  if (id < 0 || size_t(id) >= spans_.size() || spans_[size_t(id)] == ~uint64_t(0)) return std::nullopt;
  uint64_t s = spans_[size_t(id)];
  return std::string_view(arena_).substr(size_t(s >> 32), size_t(uint32_t(s)));
}

// ---- merges --------------------------------------------------------------------------------------

void BpeModel::add_merge(TokenId left, TokenId right, TokenId merged) {
  // The rank is the position in the list, counting duplicates (HF's enumerate()).
  merge_list_.push_back({pair_key(left, right), uint32_t(merge_list_.size()), merged});
}

const BpeModel::MergeSlot* BpeModel::find_merge(TokenId left, TokenId right) const {
  if (merges_.empty()) return nullptr;
  uint64_t key = pair_key(left, right);
  size_t mask = merges_.size() - 1;
  for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
    const MergeSlot& s = merges_[i];
    if (s.key == key) return &s;
    if (s.key == ~uint64_t(0)) return nullptr;
  }
}

void BpeModel::finish(bool ignore_merges, TokenId unk_id, bool fuse_unk) {
  size_t n = merge_list_.size();
  size_t size = 1024;
  while (size * 2 < n * 3) size <<= 1;  // load under 2/3
  merges_.assign(size, MergeSlot{});
  size_t mask = size - 1;
  n_merges_ = 0;
  for (size_t k = 0; k < n; ++k) {
    if (k + kAhead < n) __builtin_prefetch(&merges_[mix(merge_list_[k + kAhead].key) & mask]);
    const MergeSlot& m = merge_list_[k];
    size_t i = mix(m.key) & mask;
    while (merges_[i].key != ~uint64_t(0) && merges_[i].key != m.key) i = (i + 1) & mask;
    if (merges_[i].key == ~uint64_t(0)) ++n_merges_;
    merges_[i] = m;  // a later duplicate overrides
  }
  HugeVector<MergeSlot>().swap(merge_list_);
  ignore_merges_ = ignore_merges;
  unk_id_ = unk_id;
  fuse_unk_ = fuse_unk;
}

// ---- encoding ------------------------------------------------------------------------------------

BpeModel::Encoder::Encoder(const BpeModel& m) : m_(m), lock_(m.cache_mutex_, std::try_to_lock) {
  if (lock_.owns_lock()) {
    if (!m.caches_) m.caches_ = std::make_unique<EncodeCaches>();
    caches_ = m.caches_.get();
  } else {
    own_caches_ = std::make_unique<EncodeCaches>();
    caches_ = own_caches_.get();
  }
}

bool BpeModel::Encoder::lookup(TokenId left, TokenId right, uint32_t& rank, TokenId& merged) {
  uint64_t key = pair_key(left, right);
  PairCache::Entry& e = caches_->pairs.entries[mix(key) & (PairCache::kSize - 1)];
  if (e.key != key) {
    const MergeSlot* s = m_.find_merge(left, right);
    e = {key, s ? s->rank : UINT32_MAX, s ? s->merged : 0};
  }
  rank = e.rank;
  merged = e.merged;
  return rank != UINT32_MAX;
}

BpeModel::Encoder::~Encoder() = default;

void BpeModel::Encoder::encode(std::string_view piece, std::vector<TokenId>& out) {
  if (piece.size() == 1) {
    TokenId id = m_.byte_ids_[uint8_t(piece[0])];
    if (id >= 0) out.push_back(id);
    return;
  }
  if (piece.size() > PieceCache::kMaxPiece) {
    merge(piece, out);
    return;
  }
  uint64_t h = hash_bytes(piece.data(), piece.size());
  size_t count = 0;
  if (const TokenId* hit = caches_->pieces.find(piece, h, count)) {
    if (count == 1)
      out.push_back(*hit);
    else
      out.insert(out.end(), hit, hit + count);
    return;
  }
  size_t before = out.size();
  merge(piece, out);
  caches_->pieces.insert(piece, h, out.data() + before, out.size() - before);
}

void BpeModel::Encoder::merge(std::string_view piece, std::vector<TokenId>& out) {
  const BpeModel& m = m_;
  if (m.ignore_merges_) {  // a piece that is itself a token is taken whole
    scratch_.clear();
    for (char c : piece) append_utf8(scratch_, byte_to_char(uint8_t(c)));
    if (auto id = m.find(scratch_)) {
      out.push_back(*id);
      return;
    }
  }
  // symbols_[k]: one per byte that has a token ([n_bytes]); bytes without one are dropped.
  symbols_.clear();
  for (char c : piece) {
    TokenId id = m.byte_ids_[uint8_t(c)];
    if (id < 0) {
      if (m.unk_id_ < 0) continue;
      if (m.fuse_unk_ && !symbols_.empty() && symbols_.back().id == m.unk_id_) continue;
      id = m.unk_id_;
    }
    int32_t k = int32_t(symbols_.size());
    symbols_.push_back({id, k - 1, k + 1});
  }
  if (symbols_.empty()) return;
  int32_t n = int32_t(symbols_.size());
  symbols_.back().next = -1;
  if (n <= kSmall) {
    merge_small(out);
    return;
  }

  auto cmp = std::greater<Candidate>();  // a min-heap
  auto candidate = [](uint32_t rank, int32_t pos) { return Candidate(rank) << 32 | uint32_t(pos); };
  uint32_t rank;
  TokenId merged;
  heap_.clear();
  for (int32_t k = 0; k + 1 < n; ++k) {
    if (lookup(symbols_[size_t(k)].id, symbols_[size_t(k + 1)].id, rank, merged))
      heap_.push_back(candidate(rank, k));
  }
  std::make_heap(heap_.begin(), heap_.end(), cmp);
  while (!heap_.empty()) {
    std::pop_heap(heap_.begin(), heap_.end(), cmp);
    Candidate top = heap_.back();
    heap_.pop_back();
    auto pos = int32_t(uint32_t(top));
    Symbol& cur = symbols_[size_t(pos)];
    // Skip stale entries: the pair at this position changed since it was pushed. Each pair
    // has its own rank (its index in the merge list), so an equal rank means the same pair;
    // HF compares the merged id instead, which is equivalent because spans only grow.
    if (cur.id < 0 || cur.next < 0) continue;
    Symbol& right = symbols_[size_t(cur.next)];
    if (!lookup(cur.id, right.id, rank, merged) || rank != uint32_t(top >> 32)) continue;
    cur.id = merged;
    right.id = -1;
    cur.next = right.next;
    if (cur.next >= 0) symbols_[size_t(cur.next)].prev = pos;
    if (cur.prev >= 0 && lookup(symbols_[size_t(cur.prev)].id, cur.id, rank, merged)) {
      heap_.push_back(candidate(rank, cur.prev));
      std::push_heap(heap_.begin(), heap_.end(), cmp);
    }
    if (cur.next >= 0 && lookup(cur.id, symbols_[size_t(cur.next)].id, rank, merged)) {
      heap_.push_back(candidate(rank, pos));
      std::push_heap(heap_.begin(), heap_.end(), cmp);
    }
  }
  for (int32_t k = 0; k >= 0; k = symbols_[size_t(k)].next) out.push_back(symbols_[size_t(k)].id);
}

// Short pieces (most of them): rescan an array of pair ranks instead of keeping a heap. The
// choice is the same (lowest rank, leftmost), and for a dozen symbols the scan is cheaper than
// heap upkeep.
void BpeModel::Encoder::merge_small(std::vector<TokenId>& out) {
  TokenId ids[kSmall], mid[kSmall];
  uint32_t rank[kSmall];
  int n = int(symbols_.size());
  for (int k = 0; k < n; ++k) ids[k] = symbols_[size_t(k)].id;
  for (int k = 0; k + 1 < n; ++k) {
    if (!lookup(ids[k], ids[k + 1], rank[k], mid[k])) rank[k] = UINT32_MAX;
  }
  while (n > 1) {
    int b = 0;
    for (int k = 1; k + 1 < n; ++k)
      if (rank[k] < rank[b]) b = k;
    if (rank[b] == UINT32_MAX) break;
    ids[b] = mid[b];
    for (int j = b + 1; j + 1 < n; ++j) ids[j] = ids[j + 1];
    for (int j = b; j + 2 < n; ++j) {
      rank[j] = rank[j + 1];
      mid[j] = mid[j + 1];
    }
    --n;
    if (b > 0 && !lookup(ids[b - 1], ids[b], rank[b - 1], mid[b - 1])) rank[b - 1] = UINT32_MAX;
    if (b + 1 < n && !lookup(ids[b], ids[b + 1], rank[b], mid[b])) rank[b] = UINT32_MAX;
  }
  out.insert(out.end(), ids, ids + n);
}

void BpeModel::encode_reference(std::string_view piece, std::vector<TokenId>& out) const {
  std::vector<TokenId> ids;
  for (char c : piece) {
    TokenId id = byte_ids_[uint8_t(c)];
    if (id < 0) {
      if (unk_id_ < 0) continue;
      if (fuse_unk_ && !ids.empty() && ids.back() == unk_id_) continue;
      id = unk_id_;
    }
    ids.push_back(id);
  }
  while (ids.size() > 1) {
    size_t best = 0;
    const MergeSlot* best_slot = nullptr;
    for (size_t k = 0; k + 1 < ids.size(); ++k) {
      const MergeSlot* s = find_merge(ids[k], ids[k + 1]);
      if (s && (!best_slot || s->rank < best_slot->rank)) {
        best_slot = s;
        best = k;
      }
    }
    if (!best_slot) break;
    ids[best] = best_slot->merged;
    ids.erase(ids.begin() + std::ptrdiff_t(best) + 1);
  }
  out.insert(out.end(), ids.begin(), ids.end());
}

}  // namespace dq::text
