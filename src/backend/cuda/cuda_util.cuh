// Small CUDA helpers shared by the kernel files.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "core/error.h"

#define DQ_CUDA_CHECK(expr)                                                                    \
  do {                                                                                         \
    cudaError_t err_ = (expr);                                                                 \
    if (err_ != cudaSuccess) ::dq::fail("CUDA error in {}: {} ({})", #expr, cudaGetErrorString(err_), int(err_)); \
  } while (0)

namespace dq::cuda {

// Device-side input errors (a token id out of range, ...) are recorded here by the kernels and
// turned into a dq::Error naming the op at the next wait.
struct DeviceError {
  int code;  // 0 = none
  int a, b;
};
enum : int { kErrNone = 0, kErrTokenRange = 1, kErrContextFull = 2 };

__device__ __forceinline__ void report_error(DeviceError* e, int code, int a, int b) {
  if (atomicCAS(&e->code, 0, code) == 0) {
    e->a = a;
    e->b = b;
  }
}

// Programmatic dependent launch (sm_90): every kernel lets the next one start at once
// (pdl_trigger), does only work that needs no earlier result (weight prefetches), then waits for
// the previous kernel's results (pdl_wait) before reading or writing anything else.
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// The kernel lab's ablation switch: DELTAQ_LAB_SKIP=gdn,attn makes those kernels return right
// after their wait (results are then wrong), to see what they cost inside the decode step.
bool lab_skip(const char* what);

// Launches a kernel with the programmatic-serialization attribute (DELTAQ_PDL=0 turns it off).
bool pdl_enabled();
template <class... KArgs, class... Args>
void launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  DQ_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// cp.async: 16-byte copies from global to shared memory, many in flight per thread, with no
// registers held; commit groups them, wait_group<N> waits until at most N groups are pending.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void async_copy16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void async_wait_group() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
__device__ __forceinline__ void async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

__device__ __forceinline__ float warp_butterfly(float v) {
  // The canonical 32-lane butterfly (numerics.h butterfly32): lane l adds lane l ^ m.
  for (int m = 16; m >= 1; m >>= 1) v = v + __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

// Sum of squares of x[0..n) in the canonical lane order (lane = index mod 32, then the
// butterfly), by warp 0; every thread of the block gets the result. x may be shared memory.
__device__ __forceinline__ float block_sum_squares(const float* x, int n, float* slot) {
  if (threadIdx.x < 32) {
    float ss = 0.0f;
    for (int j = threadIdx.x; j < n; j += 32) ss = fmaf(x[j], x[j], ss);
    ss = warp_butterfly(ss);
    if (threadIdx.x == 0) *slot = ss;
  }
  __syncthreads();
  float v = *slot;
  __syncthreads();
  return v;
}

}  // namespace dq::cuda
