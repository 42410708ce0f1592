// op::TopK on the device, over (value, index) keys (ops/numerics.h top_key) whose order is total,
// so that the result is the reference's: for rows of up to 256K values the selection path below
// (sub-chunk maxima, then one block), else rounds of one block per 4096 values, each sorting its
// keys with a bitonic network in shared memory and keeping the top k, the last round (one block)
// writing ids and values.
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/kernels.cuh"
#include "ops/numerics.h"
#include "ops/ops.h"

namespace dq::cuda {

DQ_TIMELINE_FILE

namespace {

constexpr int kChunk = 4096, kThreads = 1024;
constexpr int TopKMax = op::TopK::kMax;

// Descending bitonic sort of s[0..P), P a power of two, by the whole block.
__device__ void bitonic_desc(unsigned long long* s, int P) {
  for (int size = 2; size <= P; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < P; i += blockDim.x) {
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
}

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
  bitonic_desc(s, kChunk);
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

// The selection path (n <= 32 * kSel, k <= 256): the k largest keys lie in the k sub-chunks of
// 32 whose maxima are the k largest maxima (every other sub-chunk's keys are below the k-th of
// those, t). So: every sub-chunk's maximum (a warp each); the top k maxima of each 1,024 (a
// block each); then one block sorts those, takes t and the k sub-chunks, keeps their keys >= t
// (about k for real logits, at most 32 k) and sorts them. A block's bitonic sort costs about a
// microsecond per step at 1,024 threads, so every sort here is of a few thousand keys at most.
constexpr int kSub = 32, kSel = 8192, kSelThreads = 1024, kTopBlock = 1024;

__global__ void __launch_bounds__(256) sub_max_kernel(const float* x, int n, unsigned long long* maxima) {
  pdl_trigger();
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int nsub = (n + kSub - 1) / kSub, warps = int(gridDim.x * blockDim.x / 32);
  for (int c = int(blockIdx.x * blockDim.x + threadIdx.x) / 32; c < nsub; c += warps) {
    const int j = c * kSub + lane;
    unsigned long long key = j < n ? num::top_key(x[j], j) : 0ull;
    for (int m = 16; m >= 1; m >>= 1) key = max(key, __shfl_xor_sync(0xffffffffu, key, m));
    if (lane == 0) maxima[c] = key;
  }
}

__device__ int pow2_at_least(int v) {
  int p = 2;
  while (p < v) p <<= 1;
  return p;
}

// Block b: the k largest of keys[b * 1024 .. + 1024) (0 past count) into out[b * k ..].
__global__ void __launch_bounds__(kTopBlock) block_top_kernel(const unsigned long long* keys, int count, int k,
                                                              unsigned long long* out) {
  pdl_trigger();
  pdl_wait();
  __shared__ unsigned long long s[kTopBlock];
  const int i = blockIdx.x * kTopBlock + threadIdx.x;
  s[threadIdx.x] = i < count ? keys[i] : 0ull;
  __syncthreads();
  bitonic_desc(s, kTopBlock);
  if (threadIdx.x < k) out[size_t(blockIdx.x) * k + threadIdx.x] = s[threadIdx.x];
}

__global__ void __launch_bounds__(kSelThreads) select_kernel(const float* x, int n, int k,
                                                             const unsigned long long* tops, int ntops, int32_t* ids,
                                                             float* vals) {
  pdl_trigger();
  pdl_wait();
  extern __shared__ unsigned long long s[];  // kSel keys
  __shared__ int sub[TopKMax], count;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int P1 = pow2_at_least(max(ntops, k));  // s[k - 1] exists (0 when there are fewer sub-chunks)
  for (int i = threadIdx.x; i < P1; i += blockDim.x) s[i] = i < ntops ? tops[i] : 0ull;
  __syncthreads();
  bitonic_desc(s, P1);
  const unsigned long long t = s[k - 1];  // 0 when there are fewer sub-chunks than k: all keys qualify
  if (threadIdx.x < k) sub[threadIdx.x] = s[threadIdx.x] ? num::top_key_index(s[threadIdx.x]) / kSub : -1;
  if (threadIdx.x == 0) count = 0;
  __syncthreads();
  for (int i = warp; i < k; i += blockDim.x / 32) {  // one warp per chosen sub-chunk
    const int c = sub[i];
    if (c < 0) continue;
    const int j = c * kSub + lane;
    const unsigned long long key = j < n ? num::top_key(x[j], j) : 0ull;
    const bool keep = key != 0ull && key >= t;
    const unsigned bal = __ballot_sync(0xffffffffu, keep);
    int base = 0;
    if (lane == 0) base = atomicAdd(&count, __popc(bal));
    base = __shfl_sync(0xffffffffu, base, 0);
    if (keep) s[base + __popc(bal & ((1u << lane) - 1u))] = key;
  }
  __syncthreads();
  const int m = count, P2 = pow2_at_least(m);
  for (int i = m + int(threadIdx.x); i < P2; i += blockDim.x) s[i] = 0ull;
  __syncthreads();
  bitonic_desc(s, P2);
  for (int i = threadIdx.x; i < k; i += blockDim.x) {
    const int id = num::top_key_index(s[i]);
    ids[i] = id;
    vals[i] = x[id];
  }
}

}  // namespace

size_t top_k_scratch_keys(int n, int k) {
  // The rounds' key buffers, or the selection's sub-chunk maxima (in the first).
  return std::max(size_t((n + kChunk - 1) / kChunk) * size_t(k), size_t((n + kSub - 1) / kSub) + kSel / 4);
}

void launch_top_k(const float* x, int n, int k, int32_t* ids, float* vals, unsigned long long* scratch,
                  cudaStream_t s) {
  // scratch: two buffers of top_k_scratch_keys(n, k) keys, used in turn by the rounds.
  // DELTAQ_TOPK_SELECT=0: always the rounds of sorts.
  static const bool select_on = !(std::getenv("DELTAQ_TOPK_SELECT") && std::getenv("DELTAQ_TOPK_SELECT")[0] == '0');
  if (select_on && k <= TopKMax && (n + kSub - 1) / kSub <= kSel) {
    static bool attr_set = false;
    if (!attr_set) {
      DQ_CUDA_CHECK(cudaFuncSetAttribute(select_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSel * 8));
      attr_set = true;
    }
    // scratch: the sub-chunk maxima, then each 1,024's top k (at most kSel / 1024 * 256 keys).
    const int nsub = (n + kSub - 1) / kSub, nb = (nsub + kTopBlock - 1) / kTopBlock;
    unsigned long long* tops = scratch + nsub;
    launch_kernel(sub_max_kernel, std::max(1, std::min((nsub + 7) / 8, 1024)), 256, 0, s, x, n, scratch);
    launch_kernel(block_top_kernel, nb, kTopBlock, 0, s, static_cast<const unsigned long long*>(scratch), nsub, k, tops);
    launch_kernel(select_kernel, 1, kSelThreads, size_t(kSel) * 8, s, x, n, k,
                  static_cast<const unsigned long long*>(tops), nb * k, ids, vals);
    return;
  }
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
