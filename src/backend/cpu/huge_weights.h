// Weight copies in transparent huge pages, for the CPU backend.
//
// Why: the weights are read once per token, 1 GB of them for the 2B model, and page-cache (file)
// pages are 4 KB: on this kind of VM (nested paging) the TLB misses of a 4 KB-page stream cost a
// third of decode. Measured on the 2-core box, `deltaq bench -m M --tokens 48`, alternating runs:
// 15.1-17.8 tok/s from the file mapping, 21.6-24.3 from a copy in transparent huge pages
// (19.2-21.6 from a copy in 4 KB pages). The copy replaces the mapping in this process: each
// source range's pages are dropped right after it is copied, so peak memory stays about the
// checkpoint plus state (the kernel's page cache keeps its own, reclaimable, copy of the file).
// DELTAQ_HUGEPAGES=0 turns it off; without THP (never) nothing is copied.
#pragma once
#include <cstddef>
#include <memory>

namespace dq {

class HugeWeights {
 public:
  // THP enabled ("always" or "madvise") and not turned off by DELTAQ_HUGEPAGES=0.
  static bool enabled();
  // Copies bytes (64-byte aligned in the copy) and drops the source's whole pages from this
  // process. The returned pointer lives as long as `owner` (a 64 MB or larger arena chunk).
  // Returns nullptr (nothing copied) when less than the tensor plus 1 GB of memory is available:
  // the file's clean pages can be evicted under pressure, anonymous copies cannot.
  void* copy(const void* src, size_t bytes, std::shared_ptr<const void>* owner);

 private:
  struct Chunk;
  std::shared_ptr<Chunk> chunk_;
  size_t used_ = 0;
};

}  // namespace dq
