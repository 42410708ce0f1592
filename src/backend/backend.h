// A backend owns memory and runs the op set through its Queue. The model never knows which.
#pragma once
#include <memory>
#include <string>

#include "backend/buffer.h"
#include "backend/queue.h"

namespace dq {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu (avx512, 2 threads)", "cuda (NVIDIA H200)"

  // Zero-filled working memory.
  virtual Buffer alloc(size_t bytes, const std::string& name) = 0;
  // A small zero-filled buffer that ops write and the host reads back often (a step's token id):
  // on CUDA mapped pinned host memory, so that a Read of it needs no copy in the stream (a copy
  // between two decode steps delays the next one). Such a Read copies at the wait that completes
  // it, not in stream order: no op issued after the Read may write the buffer before that wait.
  virtual Buffer alloc_readback(size_t bytes, const std::string& name) { return alloc(bytes, name); }
  // A copy of host bytes in backend memory.
  virtual Buffer upload(const void* host, size_t bytes, const std::string& name) = 0;
  // Weights: used in place where the backend can read host memory (the CPU: no second copy;
  // `keep` keeps the mapping alive), otherwise copied once.
  virtual Buffer weights(const void* host, size_t bytes, std::shared_ptr<const void> keep,
                         const std::string& name) = 0;

  virtual std::unique_ptr<Queue> make_queue() = 0;

  // A matrix that only the products (Project, ProjectAdd, SwiGLU) read: the backend may store
  // it in its own layout (CUDA: WLayout::Lanes for the 4-bit fast path). Default: as given.
  virtual Matrix product_matrix(const Matrix& m) { return m; }

  // Bytes of backend memory allocated by alloc/upload (and weights when copied).
  virtual size_t allocated_bytes() const = 0;
  virtual bool is_cpu() const { return true; }
  // Prompt tokens per prefill forward when the user names none (--prefill-chunk 0).
  virtual int prefill_chunk() const { return 64; }
  // The memory read bandwidth this backend's weights stream from, measured now (GB/s):
  // host memory for the CPU, device memory (a large device-to-device copy) for CUDA.
  virtual double measure_bandwidth_gbps() = 0;
};

}  // namespace dq
