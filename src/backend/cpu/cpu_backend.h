#pragma once
#include <memory>

#include "backend/backend.h"
#include "backend/cpu/cpu_runner.h"

namespace dq {

// threads <= 0: ThreadPool::default_threads().
std::unique_ptr<Backend> make_cpu_backend(CpuKernels kernels = CpuKernels::Auto, int threads = 0);

// Best-of-`repeats` streaming read bandwidth over `bytes` of host memory with `threads` threads (GB/s).
double measure_host_read_bandwidth(size_t bytes, int threads, int repeats = 5);

}  // namespace dq
