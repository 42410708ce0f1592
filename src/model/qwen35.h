// The Qwen3.5 text model (qwen35.md): configuration-driven, one forward function for the decode
// step (n = 1) and for prefill (n > 1), written only against the op set and the queue.
#pragma once
#include <span>
#include <vector>

#include "backend/backend.h"
#include "format/model_config.h"
#include "model/weights.h"

namespace dq {

// Per-sequence state: the fp32 GDN conv windows and recurrent states, the KV cache, the position.
struct SequenceState {
  Ref pos;                   // i32 [1] tokens processed so far
  std::vector<Ref> conv;     // per layer (GDN only): f32 [K-1][C]
  std::vector<Ref> S;        // per layer (GDN only): f32 [Hv][Dk][Dv]
  std::vector<Ref> k_cache;  // per layer (attention only): f32 [max_ctx][Hkv][hd]
  std::vector<Ref> v_cache;
  size_t bytes = 0;
};

// Working memory for forwards of up to max_tokens tokens.
struct Activations {
  int max_tokens = 0;
  bool all_logits = false;
  Ref tokens;         // i32 [n]
  Ref h;              // f32 [n][H]  residual stream
  Ref mixed, z, b, a; // GDN projections: [n][C], [n][Hv*Dv], [n][Hv], [n][Hv]
  Ref core;           // f32 [n][Hv*Dv] GDN output / f32 [n][H*hd] attention output
  Ref conv_out;       // f32 [n][C] GDN conv + SiLU scratch
  Ref qg, k, v;       // attention projections: [n][2*H*hd], [n][Hkv*hd] x 2
  Ref scores;         // f32 [n][H][max_ctx]
  Ref ffn;            // f32 [n][I]
  Ref logits;         // f32 [n or 1][V]
  Ref next;           // i32 [1] argmax of the last logits row
  size_t bytes = 0;
};

class Qwen35 {
 public:
  Qwen35(const ModelConfig& cfg, ModelWeights weights, Backend& be, int max_ctx);

  const ModelConfig& config() const { return cfg_; }
  const ModelWeights& weights() const { return w_; }
  int max_ctx() const { return max_ctx_; }
  GdnDims gdn_dims() const;
  AttnDims attn_dims() const;

  SequenceState new_state(Backend& be) const;
  Activations new_activations(Backend& be, int max_tokens, bool all_logits) const;
  // Enqueues zeroing of the recurrent state and pos = 0.
  void reset(Queue& q, SequenceState& s) const;
  // A state's contents at position pos, as host bytes: every GDN layer's conv and recurrent
  // state and the first pos rows of every attention layer's K and V caches, in layer order.
  size_t state_bytes_at(int pos) const;
  // Enqueues reads of those bytes into host (state_bytes_at(pos) of them, valid until the wait).
  void read_state(Queue& q, const SequenceState& s, int pos, uint8_t* host) const;
  // Enqueues writes of them back into s (host stays valid until the wait), and of pos (the
  // state then continues from there).
  void write_state(Queue& q, SequenceState& s, int pos, std::span<const uint8_t> host) const;

  // Enqueues one forward over a.tokens[0..n) at positions s.pos...: writes the logits of the
  // last token (of every token when all_logits) and their argmax (a.next), then advances pos.
  // The caller keeps pos + n within max_ctx (the ops read pos from device memory).
  // When `layer_out` is set, the residual stream is read into it: [0] the embeddings, [i] the
  // output of layer i-1 ([L+1][n][H]), the layout of HF's hidden_states.
  // `next_token`, when set, also receives the argmax: the input of the next decode step stays
  // on the device (only the token id is read back to the host).
  void forward(Queue& q, SequenceState& s, Activations& a, int n, bool all_logits, Ref next_token = {},
               std::vector<std::vector<float>>* layer_out = nullptr) const;

  // Enqueues one decode step for several sequences at once: token j (a.tokens[j]) is fed to
  // *seqs[j] at its own position. The products read each weight matrix once for all of them;
  // the token mixers (GDN, attention) run per sequence on its own state. Writes every row's
  // logits (a.logits [n][V]: a must have all_logits and n <= max_tokens) and row j's argmax into
  // next[j] (i32 [n]), then advances each position. Row j is the same bits as a lone forward of
  // that sequence (the products are per token; docs/numerics.md). One sequence takes forward's ops.
  void forward_batch(Queue& q, std::span<SequenceState* const> seqs, Activations& a, Ref next) const;

  // Bytes one decode step reads: weight matrices (one embedding row), norms, GDN state
  // (read and written), KV cache at context length ctx.
  double bytes_per_token(int ctx) const;
  // The part of it that is one sequence's own (GDN state read and written, KV cache at ctx): a
  // batched step of n sequences reads bytes_per_token(ctx) + (n - 1) * this.
  double sequence_bytes_per_token(int ctx) const;

 private:
  size_t conv_state_bytes() const;  // a GDN layer's conv state
  size_t gdn_state_bytes() const;   // a GDN layer's recurrent state
  size_t kv_row_bytes() const;      // one position of an attention layer's K (or V) cache

  ModelConfig cfg_;
  ModelWeights w_;
  int max_ctx_;
  Ref rope_cos_, rope_sin_;  // f32 [max_ctx][rot/2]
};

}  // namespace dq
