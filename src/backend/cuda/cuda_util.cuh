// Small CUDA helpers shared by the kernel files.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

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

__device__ __forceinline__ float warp_butterfly(float v) {
  // The canonical 32-lane butterfly (numerics.h butterfly32): lane l adds lane l ^ m.
  for (int m = 16; m >= 1; m >>= 1) v = v + __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

}  // namespace dq::cuda
