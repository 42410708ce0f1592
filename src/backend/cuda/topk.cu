// op::TopK on the device: rounds of one block per 4096 values, each sorting its (value, index)
// keys (ops/numerics.h top_key) with a bitonic network in shared memory and keeping the top k;
// the last round (one block) writes ids and values. The order is the reference's, since the
// key order is total.
#include "backend/cuda/kernels.cuh"
#include "ops/numerics.h"

namespace dq::cuda {

DQ_TIMELINE_FILE

namespace {

constexpr int kChunk = 4096, kThreads = 1024;

__global__ void __launch_bounds__(kThreads) top_k_kernel(const float* x, const unsigned long long* keys_in, int count,
                                                         int k, unsigned long long* keys_out, int32_t* ids,
                                                         float* vals) {
  pdl_trigger();
  pdl_wait();
  __shared__ unsigned long long s[kChunk];
  const int base = blockIdx.x * kChunk;
  for (int i = threadIdx.x; i < kChunk; i += blockDim.x) {
    const int j = base + i;
    s[i] = j < count ? (keys_in ? keys_in[j] : num::top_key(x[j], j)) : 0ull;  // 0: below every key
  }
  __syncthreads();
  for (int size = 2; size <= kChunk; size <<= 1)  // bitonic sort, descending
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < kChunk; i += blockDim.x) {
        const int j = i ^ stride;
        if (j > i) {
          const unsigned long long a = s[i], b = s[j];
          if ((i & size) == 0 ? a < b : a > b) {
            s[i] = b;
            s[j] = a;
          }
        }
      }
      __syncthreads();
    }
  for (int i = threadIdx.x; i < k; i += blockDim.x) {
    if (ids) {
      const int id = num::top_key_index(s[i]);
      ids[i] = id;
      vals[i] = x[id];
    } else {
      keys_out[size_t(blockIdx.x) * k + i] = s[i];
    }
  }
}

}  // namespace

size_t top_k_scratch_keys(int n, int k) { return size_t((n + kChunk - 1) / kChunk) * size_t(k); }

void launch_top_k(const float* x, int n, int k, int32_t* ids, float* vals, unsigned long long* scratch,
                  cudaStream_t s) {
  // scratch: two buffers of top_k_scratch_keys(n, k) keys, used in turn by the rounds.
  unsigned long long* buf[2] = {scratch, scratch + top_k_scratch_keys(n, k)};
  const unsigned long long* in = nullptr;
  int count = n, turn = 0;
  for (;;) {
    const int blocks = (count + kChunk - 1) / kChunk;
    if (blocks == 1) {
      launch_kernel(top_k_kernel, 1, kThreads, 0, s, x, in, count, k, nullptr, ids, vals);
      return;
    }
    launch_kernel(top_k_kernel, blocks, kThreads, 0, s, x, in, count, k, buf[turn], nullptr, nullptr);
    in = buf[turn];
    count = blocks * k;
    turn ^= 1;
  }
}

}  // namespace dq::cuda
