// The op set. The model is written only in terms of these ops (src/model/qwen35.cpp); each
// backend executes them. Every op's evaluation order is fixed by its reference implementation
// (src/ops/reference.cpp, built from src/ops/numerics.h), which the fast CPU and the CUDA
// kernels reproduce bit for bit.
//
// Activations are fp32, row-major [n_tokens][...]. Dynamic values (token ids, the position)
// live in buffers, so a decode step can be recorded once and replayed.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "backend/buffer.h"
#include "core/dtype.h"

namespace dq {

// A weight matrix [rows, cols] in its stored format, used in place.
enum class WFormat : uint8_t { Affine, BF16, F16, F32 };
// Rows: as stored in the checkpoint (every backend reads it). Lanes: a backend's own order of
// each row's words and scales, made by Backend::product_matrix and read only by that backend's
// products (CUDA: q4.cuh lane_word / lane_scale).
enum class WLayout : uint8_t { Rows, Lanes };
struct Matrix {
  WFormat format = WFormat::F32;
  WLayout layout = WLayout::Rows;
  int rows = 0, cols = 0;
  int bits = 0, group_size = 0;     // Affine only
  DType scale_dtype = DType::BF16;  // Affine only: dtype of scales and biases
  Buffer w, scales, biases;         // w: U32 [rows][cols*bits/32] or [rows][cols] floats
  std::string name;

  size_t bytes() const;  // bytes one full product reads
  explicit operator bool() const { return bool(w); }
};

struct GdnDims {
  int n_k_heads, n_v_heads, k_dim, v_dim, conv_kernel;
  float norm_eps;
  int conv_channels() const { return 2 * n_k_heads * k_dim + n_v_heads * v_dim; }
  int value_dim() const { return n_v_heads * v_dim; }
};
struct AttnDims {
  int n_heads, n_kv_heads, head_dim, rotary_dim, max_ctx;
  float norm_eps;
};

namespace op {

// out[t] = dequantized row tokens[t] of the table.
struct Embed {
  Matrix table;
  Ref tokens;  // i32 [n]
  Ref out;     // f32 [n][cols]
  int n_tokens;
};

// xn = rmsnorm(x) * norm (if norm is set); y_i = W_i xn for up to four matrices that share x.
struct Project {
  static constexpr int kMax = 4;
  Ref x;     // f32 [n][K]
  Ref norm;  // f32 [K] or empty
  float eps = 1e-6f;
  std::array<Matrix, kMax> w;
  std::array<Ref, kMax> y;  // f32 [n][rows_i]
  int n_out = 1;
  int n_tokens = 1;
};

// acc += W x  (the residual add after out_proj / o_proj / down_proj).
struct ProjectAdd {
  Ref x;    // f32 [n][K]
  Matrix w;
  Ref acc;  // f32 [n][rows]
  int n_tokens = 1;
};

// xn = rmsnorm(x) * norm; out = silu(W_gate xn) * (W_up xn).
struct SwiGLU {
  Ref x, norm;
  float eps = 1e-6f;
  Matrix gate, up;
  Ref out;  // f32 [n][rows]
  int n_tokens = 1;
};

// The Gated DeltaNet token mixer after its input projections, for n tokens in order:
// causal conv (rolling state) + SiLU, split q|k|v, L2-normalised q (scaled) and k, gates
// beta = sigmoid(b) and decay = exp(A_neg * softplus(a + dt_bias)), the delta-rule update of
// the fp32 state S, read-out, and the gated RMSNorm with silu(z). See reference.cpp.
struct GdnCore {
  GdnDims d;
  Ref mixed;    // f32 [n][C]     in_proj_qkv output
  Ref z;        // f32 [n][Hv*Dv] in_proj_z output
  Ref b, a;     // f32 [n][Hv]
  Ref conv_w;   // f32 [C][K]
  Ref A_neg;    // f32 [Hv]       -exp(A_log)
  Ref dt_bias;  // f32 [Hv]
  Ref norm;     // f32 [Dv]       gated norm weight (plain)
  Ref conv_state;  // f32 [K-1][C] oldest first (sequence state)
  Ref S;           // f32 [Hv][Dk][Dv] (sequence state)
  Ref out;         // f32 [n][Hv*Dv]
  Ref conv_out;    // f32 [n][C] scratch: the conv + SiLU output
  int n_tokens = 1;
};

// A GDN layer's token mixer whole: `proj` (the in-projections) then `core`, whose inputs are
// proj's outputs. One op so that a backend may run both in one kernel (CUDA decode: a cluster
// per head computes its rows, conv and delta rule; no launch between them). Same results as
// the two ops in order.
struct ProjectGdn {
  Project proj;  // y = {mixed, z, b, a} of core
  GdnCore core;
};

// Gated attention after its input projections, for n tokens at positions pos..pos+n-1:
// per-head RMSNorm of q and k, partial rotary embedding, append k/v to the cache, causal GQA
// softmax attention, output gate sigmoid(g). See reference.cpp.
struct AttnCore {
  AttnDims d;
  Ref qg;        // f32 [n][H][2*hd]  query | gate per head
  Ref k, v;      // f32 [n][Hkv*hd]
  Ref q_norm, k_norm;  // f32 [hd] (1 + w)
  Ref rope_cos, rope_sin;  // f32 [max_ctx][rot/2]
  Ref k_cache, v_cache;    // f32 [max_ctx][Hkv][hd] (sequence state)
  Ref pos;                 // i32 [1] position of the first token (sequence state)
  Ref scores;              // f32 [n][H][max_ctx] scratch
  Ref out;                 // f32 [n][H*hd]
  int n_tokens = 1;
};

// out[0] = index of the largest value of x[0..n) (lowest index on ties; NaN never wins).
// out2, when set, receives the same index (the next decode step's input token).
struct Argmax {
  Ref x;    // f32 [n]
  int n;
  Ref out;  // i32 [1]
  Ref out2;
};

// The k largest values of x[0..n) in descending order, ties by the lower index; NaN and -inf
// rank below every number (among themselves by index). ids[i] = the index, vals[i] = x[ids[i]].
// 1 <= k <= min(n, kMax). Sampling with top-k reads these k pairs, not the whole logits row.
struct TopK {
  static constexpr int kMax = 256;
  Ref x;  // f32 [n]
  int n = 0, k = 0;
  Ref ids;   // i32 [k]
  Ref vals;  // f32 [k]
};

// The plain temperature draw of numerics.h (draw_weight ... draw_walk) over x[0..n) with the
// uniform u: out[0] = the id, or -1 when the row has no number above -inf or its largest is +inf
// (the caller samples those on the host). out2, when set, receives the id too (the next input)
// unless the draw declines;
// total, when set, the weights' sum Z (what top-p sampling measures its mass against).
struct SampleDraw {
  Ref x;  // f32 [n]
  int n = 0;
  float temperature = 1.0f, min_p = 0.0f;
  double u = 0.0;
  Ref out;    // i32 [1], or unset
  Ref out2;   // i32 [1], or unset
  Ref total;  // f64 [1], or unset
};

// The top-k / top-p choice of numerics.h top_draw from op::TopK's k pairs (ids, vals) with the
// uniform u: out[0] = the id, or -1 when those pairs do not decide it (the caller then samples
// the whole row with the same u). top_k >= 1: k = top_k + 1 pairs; top_k <= 0 (top-p alone):
// total = op::SampleDraw's Z. out2, when set, receives the id too (the next input) unless the
// draw declines.
struct TopDraw {
  Ref ids, vals;  // i32 [k], f32 [k]
  Ref total;      // f64 [1], or unset (top_k >= 1)
  int k = 0, top_k = 0;
  float temperature = 1.0f, top_p = 1.0f, min_p = 0.0f;
  double u = 0.0;
  Ref out;   // i32 [1]
  Ref out2;  // i32 [1], or unset
};

// pos[0] += delta (advances the sequence after a step).
struct AdvancePos {
  Ref pos;
  int delta;
};

// Zero-fills a buffer (state reset).
struct Zero {
  Buffer buf;
};

// Host -> buffer copy of `bytes`, which the op owns, or of host_bytes at `host`, which must
// stay valid until the wait (as op::Read's; a saved state's bytes are written without a copy).
struct Write {
  Buffer dst;
  size_t offset_bytes = 0;
  std::vector<uint8_t> bytes;
  const void* host = nullptr;
  size_t host_bytes = 0;
  const uint8_t* data() const { return host ? static_cast<const uint8_t*>(host) : bytes.data(); }
  size_t size() const { return host ? host_bytes : bytes.size(); }
};
// Buffer -> host copy; `host` must stay valid until the wait.
struct Read {
  Buffer src;
  size_t offset_bytes = 0;
  size_t bytes = 0;
  void* host = nullptr;
};

}  // namespace op

using Op = std::variant<op::Embed, op::Project, op::ProjectAdd, op::SwiGLU, op::GdnCore, op::ProjectGdn, op::AttnCore, op::Argmax, op::TopK,
                        op::SampleDraw, op::TopDraw, op::AdvancePos, op::Zero, op::Write, op::Read>;

const char* op_name(const Op& op);

}  // namespace dq
