#include "core/thread_pool.h"

#include <chrono>
#include <cstdlib>
#include <exception>

#include "core/error.h"

namespace dq {

namespace {
void chunk(int64_t n, int64_t grain, int parts, int i, int64_t* b, int64_t* e) {
  int64_t units = (n + grain - 1) / grain;
  int64_t per = units / parts, rem = units % parts;
  int64_t ub = i * per + (i < rem ? i : rem);
  int64_t ue = ub + per + (i < rem ? 1 : 0);
  *b = std::min(n, ub * grain);
  *e = std::min(n, ue * grain);
}
}  // namespace

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
    // Spin briefly: ops come back to back during a decode step.
    uint64_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < 20000; ++spin) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return generation_.load() != seen; });
      g = generation_.load();
    }
    seen = g;
    const std::function<void(int64_t, int64_t, int)>* job;
    int64_t n, grain;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stop_) return;
      job = job_;
      n = job_n_;
      grain = job_grain_;
    }
    int64_t b, e;
    chunk(n, grain, n_, idx, &b, &e);
    if (b < e) {
      try {
        (*job)(b, e, idx);
      } catch (...) {
        std::terminate();  // kernels validate their inputs up front and never throw here
      }
    }
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t grain) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  if (n_ == 1 || n <= grain) {
    fn(0, n, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    job_n_ = n;
    job_grain_ = grain;
    pending_.store(n_ - 1, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  cv_.notify_all();
  int64_t b, e;
  chunk(n, grain, n_, 0, &b, &e);
  std::exception_ptr err;
  try {
    if (b < e) fn(b, e, 0);
  } catch (...) {
    err = std::current_exception();  // workers still hold &fn: let them finish first
  }
  while (pending_.load(std::memory_order_acquire) != 0) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace dq
