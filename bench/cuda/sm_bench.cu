// Two facts about one H200 SM that decide how the decode kernels are written (session 18):
//   (a) the tensor cores through mma.sync: cycles per mma for one warp, as a dependent chain
//       (latency) and as 8 independent chains (throughput), s8 m16n8k32 and f16 m16n8k16, and
//       s8 from zero with the result consumed at once (the 4-bit unit's pattern);
//   (b) instruction fetch: straight-line code (N FFMAs, 8 chains) run twice in one launch: pass 1
//       fetches the code cold (first launch, or after another big kernel), pass 2 finds it in
//       the SM's instruction caches when it fits. Cycles per instruction for each.
// usage: deltaq-bench-sm
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define CK(e)                                                                            \
  do {                                                                                   \
    cudaError_t r_ = (e);                                                                \
    if (r_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "deltaq-bench-sm: %s at %s:%d\n", cudaGetErrorString(r_), __FILE__, __LINE__); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

namespace {

__device__ __forceinline__ void stamp(long long* cyc, long long t) {
  if (threadIdx.x % 32 == 0) cyc[blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32] = t;
}

template <int CH>
__global__ void imma_chains(int iters, int* out, long long* cyc) {
  int d[CH][4];
  for (int c = 0; c < CH; ++c)
    for (int k = 0; k < 4; ++k) d[c][k] = threadIdx.x + c + k;
  const uint32_t a0 = threadIdx.x, a1 = a0 * 3, a2 = a0 * 5, a3 = a0 * 7, b0 = a0 ^ 0x55, b1 = a0 ^ 0x33;
  const long long t0 = clock64();
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int c = 0; c < CH; ++c)
      asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                   : "+r"(d[c][0]), "+r"(d[c][1]), "+r"(d[c][2]), "+r"(d[c][3])
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  stamp(cyc, clock64() - t0);
  int s = 0;
  for (int c = 0; c < CH; ++c)
    for (int k = 0; k < 4; ++k) s += d[c][k];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

__global__ void imma_from_zero(int iters, int* out, long long* cyc) {
  const uint32_t a0 = threadIdx.x, a1 = a0 * 3, a2 = a0 * 5, a3 = a0 * 7, b0 = a0 ^ 0x55, b1 = a0 ^ 0x33;
  int acc = 0;
  const long long t0 = clock64();
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      int d0, d1, d2, d3;
      asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
                   : "=r"(d0), "=r"(d1), "=r"(d2), "=r"(d3)
                   : "r"(a0 + c), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1 + i), "r"(0));
      acc += d0 * 65536 + d1 * 256 + d2 + d3;
    }
  }
  stamp(cyc, clock64() - t0);
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

template <int CH>
__global__ void hmma_chains(int iters, int* out, long long* cyc) {
  float d[CH][4] = {};
  const uint32_t a0 = threadIdx.x, a1 = a0 * 3, a2 = a0 * 5, a3 = a0 * 7, b0 = a0 ^ 0x55, b1 = a0 ^ 0x33;
  const long long t0 = clock64();
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int c = 0; c < CH; ++c)
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                   : "+f"(d[c][0]), "+f"(d[c][1]), "+f"(d[c][2]), "+f"(d[c][3])
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  stamp(cyc, clock64() - t0);
  float s = 0;
  for (int c = 0; c < CH; ++c)
    for (int k = 0; k < 4; ++k) s += d[c][k];
  out[blockIdx.x * blockDim.x + threadIdx.x] = int(s);
}

template <int N>
__global__ void straight_code(float* out, long long* cyc, float b, float c) {
  float a[8];
  for (int k = 0; k < 8; ++k) a[k] = threadIdx.x + k;
  long long t[3];
#pragma unroll 1
  for (int pass = 0; pass < 2; ++pass) {
    t[pass] = clock64();
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
      for (int k = 0; k < 8; ++k) a[k] = fmaf(a[k], b, c);
  }
  t[2] = clock64();
  float s = 0;
  for (int k = 0; k < 8; ++k) s += a[k];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) {
    cyc[2 * blockIdx.x] = t[1] - t[0];
    cyc[2 * blockIdx.x + 1] = t[2] - t[1];
  }
}

__global__ void other_big_kernel(float* out, float b, float c) {  // evicts the caches' code
  float a[8];
  for (int k = 0; k < 8; ++k) a[k] = threadIdx.x * 3 + k;
#pragma unroll
  for (int i = 0; i < 2048; ++i)
#pragma unroll
    for (int k = 0; k < 8; ++k) a[k] = fmaf(a[k], c, b);
  float s = 0;
  for (int k = 0; k < 8; ++k) s += a[k];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

long long h_cyc[2 * 4096];

template <class K>
void mma_case(const char* name, K kernel, int warps, int iters, int per_iter, int* out, long long* cyc) {
  for (int rep = 0; rep < 2; ++rep) kernel<<<1, warps * 32>>>(iters, out, cyc);  // the second is timed
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(h_cyc, cyc, sizeof(long long) * warps, cudaMemcpyDeviceToHost));
  long long mx = 0;
  for (int i = 0; i < warps; ++i) mx = h_cyc[i] > mx ? h_cyc[i] : mx;
  std::printf("  %-34s %d warps: %6.2f cycles per mma per warp\n", name, warps, double(mx) / (double(iters) * per_iter));
}

template <int N>
void fetch_case(float* out, long long* cyc, int warps, int blocks) {
  const char* when[3] = {"first launch", "second launch", "after another kernel"};
  for (int rep = 0; rep < 3; ++rep) {
    if (rep == 2) other_big_kernel<<<blocks, 256>>>(out + (1 << 20), 1.0001f, 0.5f);
    straight_code<N><<<blocks, warps * 32>>>(out, cyc, 1.0001f, 0.5f);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h_cyc, cyc, sizeof(long long) * 2 * blocks, cudaMemcpyDeviceToHost));
    double p1 = 0, p2 = 0;
    for (int i = 0; i < blocks; ++i) p1 += double(h_cyc[2 * i]), p2 += double(h_cyc[2 * i + 1]);
    const double instr = 8.0 * N * blocks;
    std::printf("  %6.1f KB of code, %d warps x %d blocks, %-20s: pass 1 %.2f, pass 2 %.2f cycles per instruction\n",
                8.0 * N * 16 / 1024, warps, blocks, when[rep], p1 / instr, p2 / instr);
  }
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("deltaq-bench-sm on %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
  int* iout;
  float* fout;
  long long* cyc;
  CK(cudaMalloc(&iout, 1 << 22));
  CK(cudaMalloc(&fout, 1 << 24));
  CK(cudaMalloc(&cyc, sizeof(h_cyc)));
  std::printf("(a) mma.sync, one block\n");
  for (int w : {1, 4, 8}) {
    mma_case("s8 m16n8k32, one dependent chain", imma_chains<1>, w, 4096, 1, iout, cyc);
    mma_case("s8 m16n8k32, 8 chains", imma_chains<8>, w, 1024, 8, iout, cyc);
    mma_case("s8 m16n8k32 from zero, consumed", imma_from_zero, w, 1024, 8, iout, cyc);
    mma_case("f16 m16n8k16, one dependent chain", hmma_chains<1>, w, 4096, 1, iout, cyc);
    mma_case("f16 m16n8k16, 8 chains", hmma_chains<8>, w, 1024, 8, iout, cyc);
  }
  std::printf("(b) straight-line code, one block per SM\n");
  const int sms = prop.multiProcessorCount;
  for (int w : {1, 8}) {
    fetch_case<16>(fout, cyc, w, sms);
    fetch_case<64>(fout, cyc, w, sms);
    fetch_case<256>(fout, cyc, w, sms);
    fetch_case<1024>(fout, cyc, w, sms);
  }
  return 0;
}
