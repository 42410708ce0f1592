#include "backend/cpu/huge_weights.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "core/error.h"
#include "core/host_memory.h"

namespace dq {

namespace {
constexpr size_t kHuge = size_t(2) << 20;
constexpr size_t kChunk = size_t(64) << 20;

}  // namespace

struct HugeWeights::Chunk {
  void* base = nullptr;  // the mapping (2 MB more than needed, for the alignment)
  size_t mapped = 0;
  unsigned char* data = nullptr;  // 2 MB aligned
  size_t size = 0;
  ~Chunk() {
    if (base) munmap(base, mapped);
  }
};

bool HugeWeights::enabled() {
  if (const char* e = std::getenv("DELTAQ_HUGEPAGES"); e && std::string(e) == "0") return false;
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string s;
  std::getline(f, s);
  return s.find("[always]") != std::string::npos || s.find("[madvise]") != std::string::npos;
}

void* HugeWeights::copy(const void* src, size_t bytes, std::shared_ptr<const void>* owner) {
  // Anonymous memory cannot be evicted like the file's clean pages: on a machine where the model
  // barely fits, stay in place (keep 1 GB beyond the tensor free).
  if (host_memory_available() < bytes + (size_t(1) << 30)) return nullptr;
  const size_t need = (bytes + 63) / 64 * 64;
  if (!chunk_ || used_ + need > chunk_->size) {
    auto c = std::make_shared<Chunk>();
    c->size = std::max(kChunk, (need + kHuge - 1) / kHuge * kHuge);
    c->mapped = c->size + kHuge;
    c->base = mmap(nullptr, c->mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (c->base == MAP_FAILED) {
      c->base = nullptr;
      fail("out of memory: {} MB for weights in huge pages (DELTAQ_HUGEPAGES=0 uses the file in place)",
           c->mapped >> 20);
    }
    c->data = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(c->base) + kHuge - 1) & ~(kHuge - 1));
    madvise(c->data, c->size, MADV_HUGEPAGE);  // advisory: without it the copy is in 4 KB pages
    chunk_ = std::move(c);
    used_ = 0;
  }
  unsigned char* dst = chunk_->data + used_;
  used_ += need;
  std::memcpy(dst, src, bytes);
  // The source's whole pages leave this process (they refault from the page cache if touched).
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(src) + page - 1) & ~(page - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(src) + bytes) & ~(page - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
  *owner = chunk_;
  return dst;
}

}  // namespace dq
