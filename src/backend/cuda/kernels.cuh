// Launchers of the CUDA kernels (one file per op family: kernel, then launcher). The backend
// (cuda_backend.cu) calls these with device pointers; they enqueue on `stream` and return.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_util.cuh"

namespace dq::cuda {

enum class WFmt : int { Affine = 0, BF16 = 1, F16 = 2, F32 = 3 };
enum class SDt : int { BF16 = 0, F16 = 1, F32 = 2 };

struct MatDev {
  const void* w = nullptr;
  const void* s = nullptr;
  const void* b = nullptr;
  int rows = 0, cols = 0, bits = 0, gs = 0;
  int gs_shift = -1;  // log2(gs) when gs is a power of two (no integer division in the loop)
  WFmt fmt = WFmt::F32;
  SDt sdt = SDt::BF16;
  bool lanes = false;  // WLayout::Lanes: words and scales in q4.cuh's lane order
  float* y = nullptr;  // output [T][rows]
};

// Whether a width takes the lane layout (q4.cuh): whole chunks of 2048 inputs, or the one half
// chunk of K = 1024 (the 0.8B's width).
__host__ __device__ inline bool lane_width(int K) { return K > 0 && (K % 2048 == 0 || K == 1024); }
// Backend::product_matrix's layout change on the device: row by row, word u to lane_word(u) and
// scale g to lane_scale(g) (q4.cuh); dst and src do not overlap.
void launch_lane_layout(const uint32_t* w, uint32_t* w_out, const uint16_t* s, uint16_t* s_out, int rows, int K,
                        int gs_shift, cudaStream_t st);

enum class Epilogue : int { Store = 0, Add = 1, SwiGLU = 2 };

struct ProjectArgs {
  static constexpr int kMax = 4;
  const float* x = nullptr;     // [T][K]
  const float* norm = nullptr;  // [K] or null
  float eps = 1e-6f;
  int K = 0, T = 1;
  int n = 1;
  MatDev m[kMax];  // for SwiGLU: m[0] gate (its y is the output), m[1] up
  Epilogue epi = Epilogue::Store;
  // Device scratch the queue lends a prefill chunk's products (the tensor-core kernel's x), or null.
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
};

void launch_project(const ProjectArgs& a, int num_sms, cudaStream_t s);
// The resident variant (matvec_resident.cu): all matrices 4-bit with group size gs and the
// block's rows fitting in shared memory. Returns false (nothing launched) when it does not apply.
// fast_only: only its fast path (bf16 scales, K a multiple of 2048).
bool launch_project_resident(const ProjectArgs& a, int gs, int num_sms, cudaStream_t s, bool fast_only = false);
// The prefill variant (matvec_prefill.cu): T >= 2 tokens, 4-bit matrices with bf16 scales and
// power-of-two groups of 8 to 256; a warp carries four rows against a tile of tokens. Returns
// false when it does not apply, below 8 tokens (DELTAQ_MV_PREFILL=1: from 2) or with
// DELTAQ_MV_PREFILL=0.
bool launch_project_prefill(const ProjectArgs& a, int num_sms, cudaStream_t s);
// The tensor-core prefill variant (matvec_mma.cu): T >= 2 tokens, 4-bit matrices in the lane
// layout with bf16 scales and power-of-two groups, K <= 8192, a.scratch of at least
// project_mma_scratch_bytes(T, K) (0: it will not run). Returns false when it does not apply or
// below 128 tokens (DELTAQ_MV_MMA=1: from 2; =0: never).
bool launch_project_mma(const ProjectArgs& a, int num_sms, cudaStream_t s);
size_t project_mma_scratch_bytes(int T, int K);
// The tall-product variant (matvec_head.cu): one 4-bit matrix of many rows, K <= 2048, x kept
// in registers. Returns false when it does not apply.
bool launch_project_head(const ProjectArgs& a, int num_sms, cudaStream_t s);
// The pipelined product (matvec_pipe.cu): one token, 4-bit matrices with bf16 scales and
// power-of-two groups, K a multiple of 256, streamed through shared memory in tiles of rows by
// chunks of 2048 inputs. Returns false when it does not apply or DELTAQ_MV_PIPE=0.
bool launch_project_pipe(const ProjectArgs& a, int num_sms, cudaStream_t s);
// DELTAQ_MV_PIPE: 0 off, 1 (default) for the products the head kernels and the resident
// kernel's fast path do not take, 2 for every product it applies to (tests).
int project_pipe_mode();

struct EmbedArgs {
  MatDev table;
  const int32_t* tokens;
  float* out;
  int T;
  DeviceError* err;
};
void launch_embed(const EmbedArgs& a, cudaStream_t s);

struct GdnArgs {
  int hk, hv, dk, dv, K;  // heads, head dims, conv kernel
  float eps;
  const float *mixed, *z, *b, *a, *conv_w, *A_neg, *dt_bias, *norm;
  float *conv_state, *S, *out;
  float* u;  // scratch [T][C] (conv + silu output)
  int T;
  unsigned* counters = nullptr;  // [kGdnCounterSlots] zeros, kept by the queue (split decode kernel)
  // The queue's promise that nothing launched since the last point where the stream was idle
  // (a wait, or a graph's start) writes this S or conv state, so the kernel may read them
  // before its programmatic wait (the previous kernel may still be running).
  bool early = false;
};
constexpr int kGdnCounterSlots = 1024;
void launch_gdn(const GdnArgs& a, cudaStream_t s);
// Prefill (T >= 2) of 128-dim heads with conv kernel 4 in three kernels (gdn_prefill.cu): a
// per-token prep, a barrier-free scan per value head, the gated norm. False when shapes do not apply.
bool launch_gdn_prefill(const GdnArgs& a, cudaStream_t s);
// op::ProjectGdn's decode in one kernel (gdn_mixer.cu): p the in-projections (y = g's mixed,
// z, b, a), g the token mixer. Returns false (nothing launched) when its shapes do not apply.
bool launch_project_gdn(const ProjectArgs& p, const GdnArgs& g, cudaStream_t s);
// Clusters of that kernel resident at once on this device (0 when it cannot run).
int project_gdn_max_clusters();

struct AttnArgs {
  int h, hkv, hd, rot, max_ctx;
  float eps;
  const float *qg, *k, *v, *q_norm, *k_norm, *rope_cos, *rope_sin;
  float *k_cache, *v_cache, *scores, *out;
  const int32_t* pos;
  int T;
  DeviceError* err;
  // Set by the queue when no op in flight can write this cache or the position (none on them
  // since the stream was last idle): the decode kernels then read the position and the cache
  // rows before the new one before their programmatic wait.
  bool early = false;
};
void launch_attn(const AttnArgs& a, cudaStream_t s);

// key: a device word the launch may use as scratch (kept by the queue).
void launch_argmax(const float* x, int n, int32_t* out, int32_t* out2, unsigned long long* key, int num_sms,
                   cudaStream_t s);
void launch_advance_pos(int32_t* pos, int delta, cudaStream_t s);

// op::TopK (topk.cu); scratch holds 2 * top_k_scratch_keys(n, k) keys.
size_t top_k_scratch_keys(int n, int k);
void launch_top_k(const float* x, int n, int k, int32_t* ids, float* vals, unsigned long long* scratch,
                  cudaStream_t s);

// op::SampleDraw (sample.cu); scratch holds sample_draw_scratch_bytes(n, num_sms) bytes.
size_t sample_draw_scratch_bytes(int n, int num_sms);
void launch_sample_draw(const float* x, int n, float T, float min_p, double u, int32_t* out, int32_t* out2,
                        double* total, void* scratch, int num_sms, cudaStream_t s);
// op::TopDraw (sample.cu).
void launch_top_draw(const int32_t* ids, const float* vals, int k, int top_k, float T, float top_p, float min_p,
                     const double* total, double u, int32_t* out, int32_t* out2, cudaStream_t s);

}  // namespace dq::cuda
