#include "core/thread_pool.h"

#include <chrono>

#include <cstdlib>
#include <algorithm>
#include <exception>

#include "core/error.h"

namespace dq {

ThreadPool::ThreadPool(int n_threads) : n_(n_threads < 1 ? 1 : n_threads) {
  for (int i = 1; i < n_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

int ThreadPool::default_threads() {
  if (const char* s = std::getenv("DELTAQ_THREADS")) {
    int v = std::atoi(s);
    if (v >= 1) return v;
  }
  unsigned h = std::thread::hardware_concurrency();
  return h ? int(h) : 1;
}

void ThreadPool::worker(int idx) {
  uint64_t seen = 0;
  for (;;) {
    // Spin for up to ~0.5 ms: during a decode step ops come back to back, and sleeping would
    // cost a wake-up syscall per op. (No pause instruction: in a VM it can trap.)
    uint64_t g = generation_.load(std::memory_order_acquire);
    if (g == seen) {
      auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(500);
      for (int spin = 1; g == seen; ++spin) {
        g = generation_.load(std::memory_order_acquire);
        if ((spin & 1023) == 0 && std::chrono::steady_clock::now() > until) break;
      }
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lk(mu_);
      sleepers_.fetch_add(1);
      cv_.wait(lk, [&] { return generation_.load() != seen; });
      sleepers_.fetch_sub(1);
      g = generation_.load();
    }
    seen = g;
    const std::function<void(int64_t, int64_t, int)>* job;
    int64_t n, chunk;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stop_) return;
      job = job_;
      n = job_n_;
      chunk = job_chunk_;
      active_.fetch_add(1);  // under the lock: the caller cannot retire the job meanwhile
    }
    if (job) {
      for (;;) {
        int64_t b = next_.fetch_add(chunk);
        if (b >= n) break;
        try {
          (*job)(b, std::min(n, b + chunk), idx);
        } catch (...) {
          std::terminate();  // kernels validate their inputs up front and never throw here
        }
      }
    }
    active_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t grain) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  if (n_ == 1 || n <= grain) {
    fn(0, n, 0);
    return;
  }
  // About four chunks per thread, in whole multiples of grain.
  int64_t units = (n + grain - 1) / grain;
  int64_t chunk = std::max<int64_t>(1, units / (4 * n_)) * grain;
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    next_.store(0, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  if (sleepers_.load() > 0) cv_.notify_all();
  std::exception_ptr err;
  for (;;) {
    int64_t b = next_.fetch_add(chunk);
    if (b >= n) break;
    try {
      fn(b, std::min(n, b + chunk), 0);
    } catch (...) {
      if (!err) err = std::current_exception();
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = nullptr;  // late workers find no job
  }
  while (active_.load(std::memory_order_acquire) != 0) {
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace dq
