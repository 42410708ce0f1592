// A fixed pool of worker threads for data-parallel loops. The calling thread takes part.
// Work is cut into contiguous chunks that threads claim one by one (a descheduled worker
// delays nobody); results never depend on who computes which chunk (every op computes each
// output element in one fixed order; see docs/numerics.md).
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
  // Calls fn(begin, end, thread) over [0, n) in contiguous chunks of whole multiples of
  // `grain` (about 4 per thread). Blocks until every chunk is done. Not reentrant.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t grain = 1);

  static int default_threads();  // hardware threads, or DELTAQ_THREADS

 private:
  void worker(int idx);
  int n_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_n_ = 0, job_chunk_ = 1;
  std::atomic<int64_t> next_{0};  // next unclaimed index
  std::atomic<int> active_{0};    // threads inside the current job
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> sleepers_{0};  // workers blocked on cv_: only then is a wake-up (a syscall) needed
  bool stop_ = false;
};

}  // namespace dq
