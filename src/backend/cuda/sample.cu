// op::SampleDraw: the plain temperature draw of ops/numerics.h (draw_weight, draw_walk) over a
// logits row, so that sampling with only a temperature (and min-p) brings back one id, not the
// row; and the weights' sum Z, which top-p sampling needs beside the top logits (op::TopK). Three kernels: the row's largest number (per-block maxima; max is order-free), the chunk
// and block sums (one warp per block of 32 chunks: lane c sums chunk c in id order, lane 0 the
// chunk sums in order), and the walk (one thread, the same sequential doubles as the reference).
#include "backend/cuda/kernels.cuh"
#include "ops/numerics.h"

namespace dq::cuda {

DQ_TIMELINE_FILE

namespace {

constexpr int kMaxThreads = 256;

__global__ void __launch_bounds__(kMaxThreads) row_max_kernel(const float* x, int n, float* part) {
  pdl_trigger();
  pdl_wait();
  __shared__ float sm[kMaxThreads / 32];
  float m = -INFINITY;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    if (x[i] > m) m = x[i];  // NaN compares false
  for (int o = 16; o >= 1; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < int(blockDim.x >> 5); ++w) m = fmaxf(m, sm[w]);
    part[blockIdx.x] = m;
  }
}

__device__ __forceinline__ float parts_max(const float* part, int nparts) {
  float m = -INFINITY;
  for (int i = 0; i < nparts; ++i) m = fmaxf(m, part[i]);
  return m;
}

// Block b of kDrawChunks chunks: lane c sums chunk c (ids in order), lane 0 then the chunk sums.
__global__ void __launch_bounds__(32) chunk_sums_kernel(const float* x, int n, float T, float min_p, const float* part,
                                                        int nparts, double* chunk, double* block) {
  pdl_trigger();
  pdl_wait();
  __shared__ double cs[num::kDrawChunks];
  const float m = parts_max(part, nparts);
  const int c = blockIdx.x * num::kDrawChunks + threadIdx.x;
  double s = 0.0;
  if (m > -INFINITY && m < INFINITY) {
    const int i0 = c * num::kDrawChunk, i1 = min(n, i0 + num::kDrawChunk);
    for (int i = i0; i < i1; ++i) s += double(num::draw_weight(x[i], m, T, min_p));
  }
  chunk[c] = s;
  cs[threadIdx.x] = s;
  __syncwarp();
  if (threadIdx.x == 0) {
    double b = 0.0;
    for (int j = 0; j < num::kDrawChunks; ++j) b += cs[j];
    block[blockIdx.x] = b;
  }
}

__global__ void draw_kernel(const float* x, int n, float T, float min_p, double u, const float* part, int nparts,
                            const double* chunk, const double* block, int nblocks, int32_t* out, int32_t* out2,
                            double* total) {
  pdl_trigger();
  pdl_wait();
  if (threadIdx.x != 0) return;
  const float m = parts_max(part, nparts);
  const bool finite = m > -INFINITY && m < INFINITY;
  double Z = 0.0;
  for (int b = 0; b < nblocks; ++b) Z += block[b];
  if (total) total[0] = finite ? Z : __longlong_as_double(0x7FF8000000000000ll);
  if (!out && !out2) return;
  int32_t id = -1;
  if (finite) {
    const double t = u * Z;
    double base = 0.0;
    const int b = num::draw_walk(block, nblocks, t, &base);
    if (b >= 0) {
      const int c = num::draw_walk(chunk + size_t(b) * num::kDrawChunks, num::kDrawChunks, t, &base);
      const int c0 = (b * num::kDrawChunks + c) * num::kDrawChunk;
      double w[num::kDrawChunk];
      for (int i = 0; i < num::kDrawChunk; ++i) w[i] = c0 + i < n ? double(num::draw_weight(x[c0 + i], m, T, min_p)) : 0.0;
      id = c0 + num::draw_walk(w, num::kDrawChunk, t, &base);
    }
  }
  if (out) out[0] = id;
  if (out2) out2[0] = id;
}

}  // namespace

size_t sample_draw_scratch_bytes(int n, int num_sms) {
  const int nblocks = (n + num::kDrawChunk * num::kDrawChunks - 1) / (num::kDrawChunk * num::kDrawChunks);
  return size_t(num_sms) * 4 + size_t(nblocks) * (num::kDrawChunks + 1) * 8 + 16;
}

void launch_sample_draw(const float* x, int n, float T, float min_p, double u, int32_t* out, int32_t* out2,
                        double* total, void* scratch, int num_sms, cudaStream_t s) {
  const int nblocks = (n + num::kDrawChunk * num::kDrawChunks - 1) / (num::kDrawChunk * num::kDrawChunks);
  const int nparts = std::max(1, std::min(num_sms, (n + kMaxThreads - 1) / kMaxThreads));
  auto* chunk = static_cast<double*>(scratch);
  double* block = chunk + size_t(nblocks) * num::kDrawChunks;
  auto* part = reinterpret_cast<float*>(block + nblocks);
  launch_kernel(row_max_kernel, nparts, kMaxThreads, 0, s, x, n, part);
  launch_kernel(chunk_sums_kernel, nblocks, 32, 0, s, x, n, T, min_p, static_cast<const float*>(part), nparts, chunk, block);
  launch_kernel(draw_kernel, 1, 32, 0, s, x, n, T, min_p, u, static_cast<const float*>(part), nparts,
                static_cast<const double*>(chunk), static_cast<const double*>(block), nblocks, out, out2, total);
}

}  // namespace dq::cuda
