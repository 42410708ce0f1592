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

// The row's largest number from the per-block maxima, by a whole warp (every lane gets it):
// lanes read the parts at once, then the butterfly (max is order-free).
__device__ __forceinline__ float parts_max(const float* part, int nparts) {
  float m = -INFINITY;
  for (int i = threadIdx.x & 31; i < nparts; i += 32) m = fmaxf(m, part[i]);
  for (int o = 16; o >= 1; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  return m;
}

// Block b of kDrawChunks chunks, one warp per block: its 1,024 values come in as 32 coalesced
// rows (row c = chunk c) into shared memory, then lane c sums chunk c (ids in order) and lane 0
// the chunk sums in order. (Each lane reading its own chunk from memory cost a round trip per
// id: 32 in sequence.)
constexpr int kSumWarps = 8;

__global__ void __launch_bounds__(32 * kSumWarps) chunk_sums_kernel(const float* x, int n, float T, float min_p,
                                                                    const float* part, int nparts, int nblocks,
                                                                    double* chunk, double* block) {
  pdl_trigger();
  pdl_wait();
  constexpr int C = num::kDrawChunk, NC = num::kDrawChunks;
  __shared__ float xs[kSumWarps][NC][C + 1];  // + 1: lane c's reads of row c fall in distinct banks
  __shared__ double cs[kSumWarps][NC];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int b = blockIdx.x * kSumWarps + warp;
  if (b >= nblocks) return;  // a whole warp; the block has no barrier below
  const float m = parts_max(part, nparts);
  const int base = b * NC * C;
#pragma unroll 8
  for (int r = 0; r < NC; ++r) {
    const int i = base + r * C + lane;
    xs[warp][r][lane] = i < n ? x[i] : 0.0f;
  }
  __syncwarp();
  double sum = 0.0;
  if (m > -INFINITY && m < INFINITY) {
    const int cnt = min(C, max(0, n - (base + lane * C)));
    for (int i = 0; i < cnt; ++i) sum += double(num::draw_weight(xs[warp][lane][i], m, T, min_p));
  }
  chunk[size_t(b) * NC + lane] = sum;
  cs[warp][lane] = sum;
  __syncwarp();
  if (lane == 0) {
    double t = 0.0;
    for (int j = 0; j < NC; ++j) t += cs[warp][j];
    block[b] = t;
  }
}

// The walk, by thread 0 over the block sums copied into shared memory by the whole block (the
// same sequential doubles as the reference).
constexpr int kWalkThreads = 256, kWalkSmemBlocks = 2048;

__global__ void __launch_bounds__(kWalkThreads) draw_kernel(const float* x, int n, float T, float min_p, double u,
                                                            const float* part, int nparts, const double* chunk,
                                                            const double* block, int nblocks, int32_t* out,
                                                            int32_t* out2, double* total) {
  pdl_trigger();
  pdl_wait();
  __shared__ double sb[kWalkSmemBlocks];
  const bool in_smem = nblocks <= kWalkSmemBlocks;
  if (in_smem)
    for (int i = threadIdx.x; i < nblocks; i += blockDim.x) sb[i] = block[i];
  __syncthreads();
  if (threadIdx.x >= 32) return;
  const float m = parts_max(part, nparts);
  if (threadIdx.x != 0) return;
  const double* bs = in_smem ? sb : block;
  const bool finite = m > -INFINITY && m < INFINITY;
  double Z = 0.0;
  for (int b = 0; b < nblocks; ++b) Z += bs[b];
  if (total) total[0] = finite ? Z : __longlong_as_double(0x7FF8000000000000ll);
  if (!out && !out2) return;
  int32_t id = -1;
  if (finite) {
    const double t = u * Z;
    double base = 0.0;
    const int b = num::draw_walk(bs, nblocks, t, &base);
    if (b >= 0) {
      const int c = num::draw_walk(chunk + size_t(b) * num::kDrawChunks, num::kDrawChunks, t, &base);
      const int c0 = (b * num::kDrawChunks + c) * num::kDrawChunk;
      double w[num::kDrawChunk];
      for (int i = 0; i < num::kDrawChunk; ++i) w[i] = c0 + i < n ? double(num::draw_weight(x[c0 + i], m, T, min_p)) : 0.0;
      id = c0 + num::draw_walk(w, num::kDrawChunk, t, &base);
    }
  }
  if (out) out[0] = id;
  if (out2 && id >= 0) out2[0] = id;  // a decline leaves the next input as it was
}

// op::TopDraw: numerics.h top_draw in one thread (at most 256 pairs, the reference's doubles in
// the reference's order).
__global__ void top_draw_kernel(const int32_t* ids, const float* vals, int k, int top_k, float T, float top_p,
                                float min_p, const double* total, double u, int32_t* out, int32_t* out2) {
  pdl_trigger();
  pdl_wait();
  const int32_t id = num::top_draw(ids, vals, k, top_k, T, top_p, min_p, total ? total[0] : 0.0, u);
  out[0] = id;
  if (out2 && id >= 0) out2[0] = id;  // a decline leaves the next input as it was
}

}  // namespace

void launch_top_draw(const int32_t* ids, const float* vals, int k, int top_k, float T, float top_p, float min_p,
                     const double* total, double u, int32_t* out, int32_t* out2, cudaStream_t s) {
  launch_kernel(top_draw_kernel, 1, 32, 0, s, ids, vals, k, top_k, T, top_p, min_p, total, u, out, out2);
}

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
  launch_kernel(chunk_sums_kernel, (nblocks + kSumWarps - 1) / kSumWarps, 32 * kSumWarps, 0, s, x, n, T, min_p,
                static_cast<const float*>(part), nparts, nblocks, chunk, block);
  launch_kernel(draw_kernel, 1, kWalkThreads, 0, s, x, n, T, min_p, u, static_cast<const float*>(part), nparts,
                static_cast<const double*>(chunk), static_cast<const double*>(block), nblocks, out, out2, total);
}

}  // namespace dq::cuda
