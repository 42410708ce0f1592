// An allocator for the tokenizer's big tables (1-8 MB each): blocks of 1 MB or more are
// 2 MB-aligned and marked MADV_HUGEPAGE, so the kernel backs them with huge pages.
// Why: loading Qwen3's tokenizer.json first-touches ~15 MB of tables; with 4 KB pages that
// was ~3,250 page faults per load, each expensive in our VMs (measured on the 2-core dev VM:
// 95 ms -> 51 ms CPU per load, ~3,250 -> ~600 faults).
#pragma once
#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

namespace dq::text {

template <class T>
struct HugeAlloc {
  using value_type = T;
  static constexpr size_t kHuge = size_t(2) << 20;
  static constexpr size_t kMin = size_t(1) << 20;

  HugeAlloc() = default;
  template <class U>
  HugeAlloc(const HugeAlloc<U>&) noexcept {}

  T* allocate(size_t n) {
    if (n > size_t(-1) / sizeof(T)) throw std::bad_alloc();
    size_t bytes = n * sizeof(T);
    if (bytes < kMin) {
      void* p = std::malloc(bytes ? bytes : 1);
      if (!p) throw std::bad_alloc();
      return static_cast<T*>(p);
    }
    size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
    void* p = std::aligned_alloc(kHuge, rounded);
    if (!p) throw std::bad_alloc();
    madvise(p, rounded, MADV_HUGEPAGE);  // advisory; fine if the kernel declines
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) noexcept { std::free(p); }

  template <class U>
  bool operator==(const HugeAlloc<U>&) const noexcept {
    return true;
  }
};

template <class T>
using HugeVector = std::vector<T, HugeAlloc<T>>;
using HugeString = std::basic_string<char, std::char_traits<char>, HugeAlloc<char>>;

}  // namespace dq::text
