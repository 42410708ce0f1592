// Embedding gather, argmax, position advance.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

#include "backend/cuda/kernels.cuh"
#include "ops/numerics.h"

namespace dq::cuda {

DQ_TIMELINE_FILE

namespace {

__device__ __forceinline__ float scale_at(const void* p, int i, SDt t) {
  if (t == SDt::BF16) return __uint_as_float(uint32_t(static_cast<const uint16_t*>(p)[i]) << 16);
  if (t == SDt::F16) return __half2float(static_cast<const __half*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

// out[t][j] = the dequantized table row tokens[t]: s * q + b rounded once (fmaf), as numerics.h.
// Blocks over (token, 256 elements), one element per thread: the row is cold in memory, and a
// loop of eight dependent trips to DRAM per thread made this the step's first 8.6 us.
constexpr int kEmbedThreads = 256;

__global__ void __launch_bounds__(kEmbedThreads) embed_kernel(EmbedArgs a) {
  pdl_trigger();
  pdl_wait();
  const int t = blockIdx.x, H = a.table.cols;
  int row = a.tokens[t];
  float* out = a.out + size_t(t) * H;
  const int stride = gridDim.y * blockDim.x;
  if (row < 0 || row >= a.table.rows) {
    if (blockIdx.y == 0 && threadIdx.x == 0) report_error(a.err, kErrTokenRange, row, a.table.rows);
    for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < H; j += stride) out[j] = 0.0f;
    return;
  }
  const MatDev& m = a.table;
  for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < H; j += stride) {
    float v;
    if (m.fmt == WFmt::Affine) {
      const int G = H / m.gs, per_word = 32 / m.bits;
      const uint32_t* w = static_cast<const uint32_t*>(m.w) + size_t(row) * (size_t(H) * m.bits / 32);
      uint32_t q = (w[j / per_word] >> (m.bits * (j % per_word))) & ((1u << m.bits) - 1u);
      v = fmaf(scale_at(m.s, row * G + j / m.gs, m.sdt), float(q), scale_at(m.b, row * G + j / m.gs, m.sdt));
    } else if (m.fmt == WFmt::BF16) {
      v = __uint_as_float(uint32_t(static_cast<const uint16_t*>(m.w)[size_t(row) * H + j]) << 16);
    } else if (m.fmt == WFmt::F16) {
      v = __half2float(static_cast<const __half*>(m.w)[size_t(row) * H + j]);
    } else {
      v = static_cast<const float*>(m.w)[size_t(row) * H + j];
    }
    out[j] = v;
  }
}

// Argmax as one 64-bit atomicMax per block: key = (order-preserving bits of the value) << 32 |
// (~index), so the largest value wins and, among equal values, the lowest index. Only values
// > -inf are candidates (NaN never wins); nothing beats -inf -> index 0. The same result as the
// reference's first-maximum scan, whatever the order of the blocks.
__device__ __forceinline__ unsigned long long argmax_key(float v, int i) {
  if (!(v > -INFINITY)) return 0ull;
  if (v == 0.0f) v = 0.0f;  // -0 and +0 are equal values
  uint32_t b = __float_as_uint(v);
  b ^= (b >> 31) ? 0xFFFFFFFFu : 0x80000000u;
  return (static_cast<unsigned long long>(b) << 32) | (0xFFFFFFFFu - uint32_t(i));
}

__global__ void argmax_kernel(const float* x, int n, unsigned long long* key) {
  pdl_trigger();
  pdl_wait();
  unsigned long long best = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    unsigned long long k = argmax_key(x[i], i);
    best = k > best ? k : best;
  }
  for (int m = 16; m >= 1; m >>= 1) {
    unsigned long long o = __shfl_xor_sync(0xffffffffu, best, m);
    best = o > best ? o : best;
  }
  if ((threadIdx.x & 31) == 0 && best) atomicMax(key, best);
}

// Writes the result and puts the key back to 0 for the next argmax (the queue zeroes it once).
__global__ void argmax_finish(unsigned long long* key, int32_t* out, int32_t* out2) {
  pdl_trigger();
  pdl_wait();
  const unsigned long long k = *key;
  const int r = k ? int(0xFFFFFFFFu - uint32_t(k & 0xFFFFFFFFull)) : 0;
  *out = r;
  if (out2) *out2 = r;
  *key = 0;
}

__global__ void advance_kernel(int32_t* pos, int delta) {
  pdl_trigger();
  pdl_wait();
  *pos += delta;
}

}  // namespace

bool pdl_enabled() {
  static const bool on = !(std::getenv("DELTAQ_PDL") && std::string(std::getenv("DELTAQ_PDL")) == "0");
  return on;
}

int carveout_percent() {
  static const int c = env_int("DELTAQ_CARVEOUT", 100);
  return c;
}

bool first_launch(const void* kernel) {
  static std::mutex mu;
  static std::set<const void*> seen;
  std::lock_guard<std::mutex> lock(mu);
  return seen.insert(kernel).second;
}

bool lab_skip(const char* what) {
  const char* env = std::getenv("DELTAQ_LAB_SKIP");
  return env && std::string(env).find(what) != std::string::npos;
}

int late_loads() {
  static const int v = env_int("DELTAQ_LATE_LOADS", 0) ? kLabLateLoads : 0;
  return v;
}

void launch_embed(const EmbedArgs& a, cudaStream_t s) {
  DQ_CHECK(!a.table.lanes, "embed: the table is in a products-only layout (Backend::product_matrix)");
  const int parts = std::min(64, (a.table.cols + kEmbedThreads - 1) / kEmbedThreads);
  launch_kernel(embed_kernel, dim3(a.T, std::max(1, parts)), kEmbedThreads, 0, s, a);
}

void launch_argmax(const float* x, int n, int32_t* out, int32_t* out2, unsigned long long* key, int num_sms,
                   cudaStream_t s) {
  const int blocks = std::max(1, std::min((n + 255) / 256, num_sms * 2));
  launch_kernel(argmax_kernel, blocks, 256, 0, s, x, n, key);
  launch_kernel(argmax_finish, 1, 1, 0, s, key, out, out2);
}

void launch_advance_pos(int32_t* pos, int delta, cudaStream_t s) { launch_kernel(advance_kernel, 1, 1, 0, s, pos, delta); }

}  // namespace dq::cuda
