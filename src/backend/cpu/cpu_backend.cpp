#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
#include <exception>
#include <vector>

#include "backend/cpu/huge_weights.h"
#include "core/error.h"

namespace dq {

namespace {

using Clock = std::chrono::steady_clock;

struct HostStorage : BufferStorage {
  size_t mapped = 0;  // > 0: an mmap of that many bytes (huge pages), else malloc'ed
  void* base = nullptr;
  ~HostStorage() override {
    if (mapped) munmap(base, mapped);
    else std::free(ptr);
  }
};
struct WrappedStorage : BufferStorage {
  std::shared_ptr<const void> keep;
};

class CpuGraph : public Graph {
 public:
  std::vector<Op> ops;
  int n_ops() const override { return int(ops.size()); }
};

// go() records the op and returns; wait() runs the stage's ops in order on the calling thread,
// which drives the thread pool inside the kernels. (An extra executor thread would make one
// more runnable thread than cores and let spin-waits stall on descheduled threads.) Ops are
// kept until the wait, so every buffer they touch stays alive; the first error is rethrown
// with the op's name and the rest of the stage is skipped.
class CpuQueue : public Queue {
 public:
  CpuQueue(std::shared_ptr<CpuRunner> runner, std::string name)
      : runner_(std::move(runner)), trace_(std::move(name)),
        overlap_(std::getenv("DELTAQ_CPU_OVERLAP") && std::getenv("DELTAQ_CPU_OVERLAP")[0] == '1') {}
  ~CpuQueue() override {
    if (profile_.enabled()) profile_.print();
  }

  // DELTAQ_CPU_OVERLAP=1 (for tests): report overlap, so that the engine issues decode steps
  // ahead as it does on CUDA. Nothing runs earlier for it (ops run at the waits, in order), so
  // the pipelined paths can be checked on a machine without a GPU.
  bool overlaps() const override { return overlap_; }

  void go(Op op) override {
    if (capture_) {
      capture_->ops.push_back(std::move(op));
      return;
    }
    if (pending_.empty()) stage_start_ = Clock::now();
    pending_.push_back(std::move(op));
    ++issued_;
  }

  void replay(const Graph& g) override {
    for (const Op& op : static_cast<const CpuGraph&>(g).ops) go(op);
  }

  std::unique_ptr<Graph> capture(const std::function<void()>& issue) override {
    auto g = std::make_unique<CpuGraph>();
    capture_ = g.get();
    try {
      issue();
    } catch (...) {
      capture_ = nullptr;
      throw;
    }
    capture_ = nullptr;
    return g;
  }

  void wait() override { wait_for(issued_); }

  // Ops are numbered in issue order; mark m is the point after op m - 1.
  uint64_t mark() override { return issued_; }

  // Runs the pending ops issued before mark m (the rest stay pending).
  void wait_for(uint64_t m) override {
    const uint64_t first = issued_ - pending_.size();
    if (m <= first) return;
    const size_t count = size_t(std::min(m, issued_) - first);
    std::vector<Op> ops(std::make_move_iterator(pending_.begin()),
                        std::make_move_iterator(pending_.begin() + ptrdiff_t(count)));
    pending_.erase(pending_.begin(), pending_.begin() + ptrdiff_t(count));
    std::exception_ptr err;
    const int n = int(ops.size());
    auto t0 = Clock::now();
    for (const Op& op : ops) {
      try {
        if (profile_.enabled()) {
          const auto a = Clock::now();
          runner_->run(op);
          profile_.add(OpProfile::row_name(op), std::chrono::duration<double, std::milli>(Clock::now() - a).count(),
                       OpProfile::bytes(op));
        } else {
          runner_->run(op);
        }
      } catch (const std::exception& e) {
        err = std::make_exception_ptr(Error(std::string(op_name(op)) + ": " + e.what()));
        break;
      }
    }
    auto t1 = Clock::now();
    ops.clear();
    if (trace_.enabled())
      trace_.report(n, std::chrono::duration<double, std::milli>(t1 - t0).count(),
                    std::chrono::duration<double, std::milli>(t1 - stage_start_).count());
    stage_start_ = t1;
    if (err) {
      pending_.clear();  // the rest of the stage is skipped, as a whole wait would
      std::rethrow_exception(err);
    }
  }

 private:
  std::shared_ptr<CpuRunner> runner_;
  WaitTrace trace_;
  OpProfile profile_;  // DELTAQ_PROFILE=1
  std::vector<Op> pending_;  // the last pending_.size() of the issued_ ops
  uint64_t issued_ = 0;
  Clock::time_point stage_start_{};
  CpuGraph* capture_ = nullptr;
  bool overlap_;  // DELTAQ_CPU_OVERLAP=1 when the queue was made
};

class CpuBackend : public Backend {
 public:
  CpuBackend(CpuKernels kernels, int threads) {
    kernels_ = resolve_cpu_kernels(kernels);
    threads_ = kernels_ == CpuKernels::Reference ? 1 : threads > 0 ? threads : ThreadPool::default_threads();
  }
  std::string name() const override {
    return fmt::format("cpu ({}, {} thread{})", cpu_kernels_name(kernels_), threads_, threads_ == 1 ? "" : "s");
  }

  Buffer alloc(size_t bytes, const std::string& name) override {
    auto b = std::make_shared<HostStorage>();
    size_t n = (bytes + 63) / 64 * 64;
    constexpr size_t kHuge = size_t(2) << 20;
    if (huge_enabled_ && n >= kHuge) {  // state, KV cache: read every token, so in huge pages too
      b->mapped = (n + kHuge - 1) / kHuge * kHuge + kHuge;
      b->base = mmap(nullptr, b->mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (b->base == MAP_FAILED) {
        b->mapped = 0;
        b->base = nullptr;
        fail("out of memory allocating {} bytes for {}", bytes, name);
      }
      b->ptr = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(b->base) + kHuge - 1) & ~(kHuge - 1));
      madvise(b->ptr, b->mapped - kHuge, MADV_HUGEPAGE);  // fresh anonymous memory reads as zeros
      b->bytes = bytes;
      b->name = name;
      allocated_ += bytes;
      return b;
    }
    b->ptr = std::aligned_alloc(64, n ? n : 64);
    if (!b->ptr) fail("out of memory allocating {} bytes for {}", bytes, name);
    std::memset(b->ptr, 0, n ? n : 64);
    b->bytes = bytes;
    b->name = name;
    allocated_ += bytes;
    return b;
  }
  Buffer upload(const void* host, size_t bytes, const std::string& name) override {
    Buffer b = alloc(bytes, name);
    if (bytes) std::memcpy(b->ptr, host, bytes);
    return b;
  }
  // Large weight tensors are copied into transparent huge pages (huge_weights.h says why and
  // what it measured); the rest are used in place from the mapping.
  Buffer weights(const void* host, size_t bytes, std::shared_ptr<const void> keep, const std::string& name) override {
    auto b = std::make_shared<WrappedStorage>();
    b->bytes = bytes;
    b->name = name;
    if (bytes >= (size_t(1) << 20) && huge_enabled_ && (b->ptr = huge_.copy(host, bytes, &b->keep))) {
      huge_bytes_ += bytes;
    } else {
      b->ptr = const_cast<void*>(host);
      b->keep = std::move(keep);
    }
    return b;
  }
  // Each queue has its own runner (and thread pool): queues never share workers.
  std::unique_ptr<Queue> make_queue() override {
    std::shared_ptr<CpuRunner> r =
        kernels_ == CpuKernels::Reference ? make_reference_runner() : make_fast_runner(kernels_, threads_);
    return std::make_unique<CpuQueue>(std::move(r), "cpu");
  }
  size_t allocated_bytes() const override { return allocated_; }
  double measure_bandwidth_gbps() override { return measure_host_read_bandwidth(size_t(1) << 30, threads_); }

 private:
  CpuKernels kernels_;
  int threads_;
  bool huge_enabled_ = HugeWeights::enabled();
  HugeWeights huge_;
  size_t huge_bytes_ = 0;
  std::atomic<size_t> allocated_{0};
};

}  // namespace

double measure_host_read_bandwidth(size_t bytes, int threads, int repeats) {
  if (threads <= 0) threads = ThreadPool::default_threads();
  const size_t n = bytes / 8;
  // In huge pages when the weights are (the fastest way this machine can stream memory, so the
  // decode's share of it is not flattered by a 4 KB-page baseline).
  struct Unmap {
    size_t len;
    void operator()(void* p) const { munmap(p, len); }
  };
  const size_t len = n * 8 + (size_t(2) << 20);
  void* raw = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return 0;
  std::unique_ptr<void, Unmap> hold(raw, Unmap{len});
  auto* buf = reinterpret_cast<uint64_t*>((reinterpret_cast<uintptr_t>(raw) + (size_t(2) << 20) - 1) &
                                          ~((size_t(2) << 20) - 1));
  if (HugeWeights::enabled()) madvise(buf, n * 8, MADV_HUGEPAGE);
  ThreadPool pool(threads);
  pool.parallel_for(int64_t(n), [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) buf[i] = uint64_t(i) * 0x9E3779B97F4A7C15ull;
  });
  // Three ways of streaming: plain loads (the hardware prefetcher, where it works), and software
  // prefetches into L2 4 KB and 16 KB ahead (on the 2-core VM the hardware prefetcher does little
  // and one core's L1 misses in flight cap a plain stream; the weight kernels prefetch so too).
  // The best of them is the bandwidth, so that a kernel's share of it is not flattered.
  double best = 0;
  std::vector<uint64_t> sink(threads);
  for (int r = 0; r < repeats; ++r)
    for (int64_t ahead : {int64_t(0), int64_t(512), int64_t(2048)}) {  // in 8-byte elements
      auto t0 = Clock::now();
      pool.parallel_for(int64_t(n), [&](int64_t b, int64_t e, int t) {
        // Independent sums keep several loads in flight; the compiler vectorises this.
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        int64_t i = b;
        for (; i + 8 <= e; i += 8) {
          if (ahead && i + ahead < int64_t(n)) __builtin_prefetch(&buf[i + ahead], 0, 2);
          s0 += buf[i] + buf[i + 4];
          s1 += buf[i + 1] + buf[i + 5];
          s2 += buf[i + 2] + buf[i + 6];
          s3 += buf[i + 3] + buf[i + 7];
        }
        for (; i < e; ++i) s0 += buf[i];
        sink[t] += s0 + s1 + s2 + s3;
      }, 4096);
      double s = std::chrono::duration<double>(Clock::now() - t0).count();
      best = std::max(best, double(n * 8) / s / 1e9);
    }
  volatile uint64_t keep = 0;
  for (uint64_t v : sink) keep = keep + v;
  return best;
}

std::unique_ptr<Backend> make_cpu_backend(CpuKernels kernels, int threads) {
  return std::make_unique<CpuBackend>(kernels, threads);
}

}  // namespace dq
