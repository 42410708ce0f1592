// The byte-level BPE model: vocabulary, merge ranks, the merge loop, and a cache of results
// per pre-token piece.
//
// The merge loop is HF's (models/bpe/word.rs): a min-heap of (rank, position) over adjacent
// pairs, lowest rank first and leftmost on ties; stale entries are skipped when popped. That is
// O(n log n) per piece: a 1 MB piece without spaces takes ~0.3-0.4 s here, not hours.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/added_tokens.h"  // TokenId
#include "text/huge_alloc.h"

namespace dq::text {

uint64_t hash_bytes(const char* p, size_t n);

// Results of merging, keyed by the piece's bytes. Bounded: it grows to kMaxEntries and is then
// cleared and refilled. A slot is one 32-byte line with the key inline (pieces of up to 16
// bytes: nearly all) and the id inline when the piece is one token (most), so a hit usually
// touches one cache line.
class PieceCache {
 public:
  static constexpr size_t kMaxPiece = 256;  // longer pieces (CJK runs) rarely repeat
  static constexpr size_t kMaxEntries = size_t(1) << 16;

  // Returns the cached ids (pointer and count) or nullptr.
  const TokenId* find(std::string_view piece, uint64_t hash, size_t& count) const;
  void insert(std::string_view piece, uint64_t hash, const TokenId* ids, size_t count);
  size_t size() const { return entries_; }
  size_t resets() const { return resets_; }

 private:
  static constexpr size_t kInline = 16;
  struct Slot {
    uint64_t hash = 0;  // 0: empty (real hashes are forced non-zero)
    char key[kInline];  // the piece, or its offset in keys_ when longer than kInline
    TokenId ids;        // the id when n_ids == 1, else the offset in ids_
    uint16_t key_len = 0, n_ids = 0;
  };
  static_assert(sizeof(Slot) == 32);
  void grow();
  HugeVector<Slot> slots_;
  std::string keys_;
  std::vector<TokenId> ids_;
  size_t entries_ = 0, resets_ = 0;
};

// A direct-mapped cache of merge-table lookups (hits and misses) in front of the big merge
// table: the same few thousand pairs (byte pairs of CJK characters, common suffixes) come up
// again and again, and the table itself (4 MB for Qwen3) does not stay in cache.
struct PairCache {
  static constexpr size_t kSize = 4096;  // 64 KB
  struct Entry {
    uint64_t key = ~uint64_t(0);
    uint32_t rank = 0;  // UINT32_MAX: no merge for this pair
    int32_t merged = 0;
  };
  Entry entries[kSize];
};

// What an encode call caches; one shared copy per model, or one per call when it is busy.
struct EncodeCaches {
  PieceCache pieces;
  PairCache pairs;
};

class BpeModel {
 public:
  // ---- building (see tokenizer_json.cpp) ----
  // Reserves for a file of `json_bytes` (address space only: untouched pages cost nothing,
  // while growing vectors re-fault and copy megabytes).
  void reserve(size_t json_bytes);
  // Appends a vocabulary entry (the byte-level text as in the file; ids are unique).
  void add_token(std::string_view text, TokenId id);
  // Builds the lookup tables after the last add_token. Returns false and sets `duplicate`
  // when a text appears twice.
  bool finish_vocab(std::string& duplicate);
  // Merges in rank order; a later duplicate pair overrides the earlier one (as in HF).
  void add_merge(TokenId left, TokenId right, TokenId merged);
  void finish(bool ignore_merges, TokenId unk_id, bool fuse_unk);

  // Bulk lookups during loading: hash, prefetch the slot, then find.
  static uint64_t hash(std::string_view text) { return hash_bytes(text.data(), text.size()); }
  void prefetch(uint64_t hash) const;
  std::optional<TokenId> find(std::string_view text, uint64_t hash) const;

  // ---- queries ----
  std::optional<TokenId> find(std::string_view text) const;
  size_t id_limit() const { return spans_.size(); }  // max id + 1
  size_t size() const { return n_tokens_; }
  size_t merge_count() const { return n_merges_; }
  // The byte-level text of id, or nullopt when the vocabulary has no such id.
  std::optional<std::string_view> text(TokenId id) const;

  // Encodes pieces of one call; holds the shared cache for its lifetime when it is free, and
  // otherwise uses a cache of its own, so concurrent callers never wait on each other.
  class Encoder {
   public:
    explicit Encoder(const BpeModel& m);
    ~Encoder();
    Encoder(const Encoder&) = delete;
    Encoder& operator=(const Encoder&) = delete;
    // Appends the ids of one pre-token piece (raw bytes, non-empty).
    void encode(std::string_view piece, std::vector<TokenId>& out);

   private:
    void merge(std::string_view piece, std::vector<TokenId>& out);
    static constexpr int kSmall = 16;  // pieces of up to this many bytes skip the heap
    void merge_small(std::vector<TokenId>& out);
    struct Symbol {
      TokenId id;  // -1 once merged into its left neighbour
      int32_t prev, next;
    };
    // Heap entries: rank << 32 | position (lowest first: leftmost among equal ranks).
    using Candidate = uint64_t;
    // The merge for (left, right) through the pair cache: false when there is none.
    bool lookup(TokenId left, TokenId right, uint32_t& rank, TokenId& merged);
    const BpeModel& m_;
    EncodeCaches* caches_;
    std::unique_lock<std::mutex> lock_;
    std::unique_ptr<EncodeCaches> own_caches_;
    std::vector<Symbol> symbols_;
    std::vector<Candidate> heap_;
    std::string scratch_;
  };

  // The plain version of the merge loop: repeatedly merge the lowest-ranked adjacent pair,
  // leftmost first, rescanning the whole piece each time (O(n^2); the reference for tests).
  void encode_reference(std::string_view piece, std::vector<TokenId>& out) const;

 private:
  struct MergeSlot {
    uint64_t key = ~uint64_t(0);  // left << 32 | right
    uint32_t rank = 0;
    TokenId merged = 0;
  };
  const MergeSlot* find_merge(TokenId left, TokenId right) const;
  struct VocabSlot {
    uint32_t hash32 = 0;
    TokenId id = -1;  // -1: empty
    uint32_t off = 0, len = 0;  // the text in arena_
  };

  // Vocabulary: texts in one arena; an open-addressing table of VocabSlot.
  HugeString arena_;
  HugeVector<uint64_t> pending_;  // while building: offset << 32 | length, in add order
  HugeVector<TokenId> pending_ids_;
  HugeVector<uint64_t> spans_;  // [id]: offset << 32 | length, or ~0 when absent
  HugeVector<VocabSlot> table_;
  size_t n_tokens_ = 0;
  HugeVector<MergeSlot> merge_list_;  // while building, in rank order
  HugeVector<MergeSlot> merges_;      // open addressing, power-of-two size
  size_t n_merges_ = 0;
  std::array<TokenId, 256> byte_ids_{};  // token of each single byte, -1 when absent
  bool ignore_merges_ = false;
  TokenId unk_id_ = -1;  // used for bytes without a token when the file names an unk_token
  bool fuse_unk_ = false;

  mutable std::mutex cache_mutex_;
  mutable std::unique_ptr<EncodeCaches> caches_;  // made by the first encode
};

}  // namespace dq::text
