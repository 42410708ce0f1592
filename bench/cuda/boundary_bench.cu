// What a dependent step costs on the GPU, apart from its bytes: a chain of N steps where each
// reads the whole x the previous step wrote (8 KB, as every product of a 2B layer does) and
// writes its slice of the next x. Timed as
//   (a) N kernels in one graph with programmatic dependent launch, with small or large shared
//       memory, with and without the preferred carveout set to all-shared;
//   (b) one persistent kernel whose N steps are separated by a grid barrier (a counter in
//       global memory), one block per SM.
// Each with no work between barriers, or with x's canonical sum of squares by every warp.
// usage: deltaq-bench-boundary [--steps N] [--reps R]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CK(e)                                                                            \
  do {                                                                                   \
    cudaError_t r_ = (e);                                                                \
    if (r_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "%s: %s\n", #e, cudaGetErrorString(r_));                      \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

namespace {

constexpr int kK = 2048;

__device__ __forceinline__ float butterfly(float v) {
  for (int m = 16; m >= 1; m >>= 1) v = v + __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

// One step's body: x (kK floats) into shared memory, every warp's sum of squares (when work),
// then this block's slice of y = x * rms.
__device__ __forceinline__ void step_body(const float* x, float* y, float* sx, bool work) {
  const int lane = threadIdx.x & 31;
  if (work) {
    for (int i = threadIdx.x; i < kK / 4; i += blockDim.x)
      reinterpret_cast<float4*>(sx)[i] = reinterpret_cast<const float4*>(x)[i];
    __syncthreads();
    float ss = 0.0f;
#pragma unroll 16
    for (int j = lane; j < kK; j += 32) ss = fmaf(sx[j], sx[j], ss);
    ss = butterfly(ss);
    const float r = rsqrtf(ss / kK + 1e-6f);
    const int per = (kK + gridDim.x - 1) / gridDim.x;
    const int i = blockIdx.x * per + threadIdx.x;
    if (threadIdx.x < per && i < kK) y[i] = sx[i] * r;
    __syncthreads();
  } else {
    const int per = (kK + gridDim.x - 1) / gridDim.x;
    const int i = blockIdx.x * per + threadIdx.x;
    if (threadIdx.x < per && i < kK) y[i] = x[i] + 1.0f;
  }
}

__global__ void chain_kernel(const float* x, float* y, int work) {
  extern __shared__ float smem[];
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  step_body(x, y, smem, work != 0);
}

// Grid barrier: every block adds one to the counter and waits for steps * blocks arrivals.
__device__ __forceinline__ void grid_barrier(unsigned* counter, unsigned target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counter, 1u);
    unsigned v;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
    } while (v < target);
  }
  __syncthreads();
}

__global__ void persistent_kernel(float* bufs, unsigned* counter, int steps, int work) {
  __shared__ float sx[kK];
  for (int s = 0; s < steps; ++s) {
    const float* x = bufs + size_t(s & 1) * kK;
    float* y = bufs + size_t((s + 1) & 1) * kK;
    step_body(x, y, sx, work != 0);
    grid_barrier(counter, unsigned(s + 1) * gridDim.x);
  }
}

float time_graph(cudaGraphExec_t g, cudaStream_t s, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaGraphLaunch(g, s));
  CK(cudaStreamSynchronize(s));
  CK(cudaEventRecord(a, s));
  for (int r = 0; r < reps; ++r) CK(cudaGraphLaunch(g, s));
  CK(cudaEventRecord(b, s));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  return ms / reps;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 120, reps = 50;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--steps N] [--reps R]\n", argv[0]);
      return 2;
    }
  }
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  const int sms = p.multiProcessorCount;
  std::printf("device %s, %d SMs, %d steps per graph\n", p.name, sms, steps);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float* bufs;
  CK(cudaMalloc(&bufs, 2 * kK * sizeof(float)));
  CK(cudaMemset(bufs, 0, 2 * kK * sizeof(float)));
  unsigned* counter;
  CK(cudaMalloc(&counter, sizeof(unsigned)));
  CK(cudaFuncSetAttribute(chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));

  for (int carve = 0; carve < 2; ++carve) {
    if (carve) CK(cudaFuncSetAttribute(chain_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    for (int threads : {256, 512}) {
      for (size_t smem : {size_t(kK * 4), size_t(100 * 1024), size_t(150 * 1024)}) {
        for (int work = 0; work < 2; ++work) {
          cudaGraph_t g;
          CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
          for (int i = 0; i < steps; ++i) {
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = sms;
            cfg.blockDim = threads;
            cfg.dynamicSmemBytes = smem;
            cfg.stream = s;
            cudaLaunchAttribute at[1];
            at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at[0].val.programmaticStreamSerializationAllowed = 1;
            cfg.attrs = at;
            cfg.numAttrs = 1;
            const float* x = bufs + size_t(i & 1) * kK;
            float* y = bufs + size_t((i + 1) & 1) * kK;
            CK(cudaLaunchKernelEx(&cfg, chain_kernel, x, y, work));
          }
          CK(cudaStreamEndCapture(s, &g));
          cudaGraphExec_t ge;
          CK(cudaGraphInstantiate(&ge, g, 0));
          const float ms = time_graph(ge, s, reps);
          std::printf("kernels+PDL  carveout %-4s threads %3d smem %6zu B  %-7s %7.3f us/step\n",
                      carve ? "max" : "auto", threads, smem, work ? "x+norm" : "empty", 1000.0f * ms / steps);
          CK(cudaGraphExecDestroy(ge));
          CK(cudaGraphDestroy(g));
        }
      }
    }
  }
  for (int threads : {256, 512}) {
    for (int work = 0; work < 2; ++work) {
      cudaGraph_t g;
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      CK(cudaMemsetAsync(counter, 0, sizeof(unsigned), s));
      persistent_kernel<<<sms, threads, 0, s>>>(bufs, counter, steps, work);
      CK(cudaStreamEndCapture(s, &g));
      cudaGraphExec_t ge;
      CK(cudaGraphInstantiate(&ge, g, 0));
      const float ms = time_graph(ge, s, reps);
      std::printf("persistent   grid barrier     threads %3d              %-7s %7.3f us/step\n", threads,
                  work ? "x+norm" : "empty", 1000.0f * ms / steps);
      CK(cudaGraphExecDestroy(ge));
      CK(cudaGraphDestroy(g));
    }
  }
  return 0;
}
