// A fixed pool of worker threads for data-parallel loops. The calling thread takes part.
// Work is split into contiguous, equal chunks by index; results never depend on the split
// (every op computes each output element in one fixed order; see docs/numerics.md).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dq {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads >= 1, including the caller
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_; }
  // Calls fn(begin, end, thread) over [0, n) split into size() contiguous chunks of
  // whole multiples of `grain`. Blocks until every chunk is done. Not reentrant.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t grain = 1);

  static int default_threads();  // hardware threads, or DELTAQ_THREADS

 private:
  void worker(int idx);
  int n_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_n_ = 0, job_grain_ = 1;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  bool stop_ = false;
};

}  // namespace dq
