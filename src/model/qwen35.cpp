#include "model/qwen35.h"

#include <cmath>
#include <cstring>

#include "core/error.h"

namespace dq {

Qwen35::Qwen35(const ModelConfig& cfg, ModelWeights weights, Backend& be, int max_ctx)
    : cfg_(cfg), w_(std::move(weights)), max_ctx_(max_ctx) {
  // Rotary tables, computed once on the host in double precision (identical on every backend).
  const int half = cfg_.rotary_dim / 2;
  std::vector<float> c(size_t(max_ctx) * std::max(half, 1)), s(c.size());
  for (int p = 0; p < max_ctx; ++p)
    for (int i = 0; i < half; ++i) {
      double inv = std::pow(cfg_.rope_theta, -2.0 * i / cfg_.rotary_dim);
      double ang = double(p) * inv;
      c[size_t(p) * half + i] = float(std::cos(ang));
      s[size_t(p) * half + i] = float(std::sin(ang));
    }
  rope_cos_ = Ref{be.upload(c.data(), c.size() * 4, "rope_cos")};
  rope_sin_ = Ref{be.upload(s.data(), s.size() * 4, "rope_sin")};
}

GdnDims Qwen35::gdn_dims() const {
  return GdnDims{cfg_.lin_k_heads, cfg_.lin_v_heads, cfg_.lin_k_dim, cfg_.lin_v_dim, cfg_.conv_kernel, cfg_.rms_eps};
}
AttnDims Qwen35::attn_dims() const {
  return AttnDims{cfg_.num_heads, cfg_.num_kv_heads, cfg_.head_dim, cfg_.rotary_dim, max_ctx_, cfg_.rms_eps};
}

SequenceState Qwen35::new_state(Backend& be) const {
  SequenceState s;
  auto alloc = [&](size_t bytes, const std::string& name) {
    s.bytes += bytes;
    return Ref{be.alloc(bytes, name)};
  };
  s.pos = alloc(4, "pos");
  for (int i = 0; i < cfg_.num_layers; ++i) {
    const std::string l = std::to_string(i);
    if (cfg_.layers[i] == LayerKind::Linear) {
      s.conv.push_back(alloc(conv_state_bytes(), "conv_state." + l));
      s.S.push_back(alloc(gdn_state_bytes(), "gdn_state." + l));
      s.k_cache.emplace_back();
      s.v_cache.emplace_back();
    } else {
      s.conv.emplace_back();
      s.S.emplace_back();
      s.k_cache.push_back(alloc(kv_row_bytes() * max_ctx_, "k_cache." + l));
      s.v_cache.push_back(alloc(kv_row_bytes() * max_ctx_, "v_cache." + l));
    }
  }
  return s;
}

Activations Qwen35::new_activations(Backend& be, int n, bool all_logits) const {
  Activations a;
  a.max_tokens = n;
  a.all_logits = all_logits;
  auto f32 = [&](size_t elems, const std::string& name) {
    a.bytes += 4 * elems;
    return Ref{be.alloc(4 * elems, name)};
  };
  const GdnDims g = gdn_dims();
  const AttnDims d = attn_dims();
  const size_t N = size_t(n);
  a.tokens = f32(N, "tokens");
  a.h = f32(N * cfg_.hidden_size, "h");
  a.mixed = f32(N * g.conv_channels(), "mixed");
  a.z = f32(N * g.value_dim(), "z");
  a.b = f32(N * g.n_v_heads, "b");
  a.a = f32(N * g.n_v_heads, "a");
  a.core = f32(N * std::max(g.value_dim(), d.n_heads * d.head_dim), "core");
  a.conv_out = f32(N * g.conv_channels(), "conv_out");
  a.qg = f32(N * 2 * d.n_heads * d.head_dim, "qg");
  a.k = f32(N * d.n_kv_heads * d.head_dim, "k");
  a.v = f32(N * d.n_kv_heads * d.head_dim, "v");
  a.scores = f32(N * d.n_heads * size_t(max_ctx_), "scores");
  a.ffn = f32(N * cfg_.intermediate_size, "ffn");
  a.logits = f32((all_logits ? N : 1) * size_t(cfg_.vocab_size), "logits");
  a.next = Ref{be.alloc_readback(4, "next")};
  a.bytes += 4;
  return a;
}

void Qwen35::reset(Queue& q, SequenceState& s) const {
  for (const Ref& r : s.conv)
    if (r) q.go(op::Zero{r.buf});
  for (const Ref& r : s.S)
    if (r) q.go(op::Zero{r.buf});
  q.go(op::Zero{s.pos.buf});
}

// The state's parts in snapshot order: (buffer, bytes used at pos).
template <class F>
static void for_state_parts(const SequenceState& s, int pos, size_t kv_row_bytes, F&& f) {
  for (size_t i = 0; i < s.conv.size(); ++i) {
    if (s.conv[i]) f(s.conv[i].buf, s.conv[i].buf->bytes);
    if (s.S[i]) f(s.S[i].buf, s.S[i].buf->bytes);
    if (s.k_cache[i]) f(s.k_cache[i].buf, kv_row_bytes * size_t(pos));
    if (s.v_cache[i]) f(s.v_cache[i].buf, kv_row_bytes * size_t(pos));
  }
}

size_t Qwen35::conv_state_bytes() const {
  const GdnDims g = gdn_dims();
  return 4ull * (g.conv_kernel - 1 > 0 ? g.conv_kernel - 1 : 1) * g.conv_channels();
}
size_t Qwen35::gdn_state_bytes() const {
  const GdnDims g = gdn_dims();
  return 4ull * g.n_v_heads * g.k_dim * g.v_dim;
}
size_t Qwen35::kv_row_bytes() const {
  const AttnDims d = attn_dims();
  return 4ull * d.n_kv_heads * d.head_dim;
}

size_t Qwen35::state_bytes_at(int pos) const {
  size_t total = 0;
  for (LayerKind k : cfg_.layers)
    total += k == LayerKind::Linear ? conv_state_bytes() + gdn_state_bytes() : 2 * kv_row_bytes() * size_t(pos);
  return total;
}

void Qwen35::read_state(Queue& q, const SequenceState& s, int pos, uint8_t* host) const {
  DQ_CHECK(pos >= 0 && pos <= max_ctx_, "state read at position {} (context {})", pos, max_ctx_);
  size_t at = 0;
  for_state_parts(s, pos, kv_row_bytes(), [&](const Buffer& b, size_t bytes) {
    if (bytes) q.go(op::Read{b, 0, bytes, host + at});
    at += bytes;
  });
}

void Qwen35::write_state(Queue& q, SequenceState& s, int pos, std::span<const uint8_t> host) const {
  if (pos < 0 || pos > max_ctx_) fail("a saved state at position {} does not fit the context of {} tokens", pos, max_ctx_);
  if (host.size() != state_bytes_at(pos))
    fail("a saved state at position {} has {} bytes; this model's state there has {}", pos, host.size(),
         state_bytes_at(pos));
  size_t at = 0;
  for_state_parts(s, pos, kv_row_bytes(), [&](const Buffer& b, size_t bytes) {
    if (bytes) q.go(op::Write{b, 0, {}, host.data() + at, bytes});
    at += bytes;
  });
  op::Write p{s.pos.buf, 0, std::vector<uint8_t>(4)};
  const int32_t p32 = pos;
  std::memcpy(p.bytes.data(), &p32, 4);
  q.go(std::move(p));
}

void Qwen35::forward(Queue& q, SequenceState& s, Activations& a, int n, bool all_logits, Ref next_token,
                     std::vector<std::vector<float>>* layer_out) const {
  DQ_CHECK(n >= 1 && n <= a.max_tokens && (!all_logits || a.all_logits), "forward of {} tokens", n);
  const int H = cfg_.hidden_size;
  const float eps = cfg_.rms_eps;
  const GdnDims gd = gdn_dims();
  const AttnDims ad = attn_dims();
  if (layer_out) layer_out->assign(cfg_.num_layers + 1, std::vector<float>(size_t(n) * H));

  q.go(op::Embed{w_.embed, a.tokens, a.h, n});
  if (layer_out) q.go(op::Read{a.h.buf, 0, size_t(n) * H * 4, (*layer_out)[0].data()});
  for (int i = 0; i < cfg_.num_layers; ++i) {
    const LayerWeights& l = w_.layers[i];
    if (l.kind == LayerKind::Linear) {
      q.go(op::ProjectGdn{
          op::Project{a.h, l.input_norm, eps, {l.qkv, l.z, l.b, l.a}, {a.mixed, a.z, a.b, a.a}, 4, n},
          op::GdnCore{gd, a.mixed, a.z, a.b, a.a, l.conv_w, l.A_neg, l.dt_bias, l.gdn_norm, s.conv[i], s.S[i], a.core,
                      a.conv_out, n}});
      q.go(op::ProjectAdd{a.core, l.out, a.h, n});
    } else {
      q.go(op::Project{a.h, l.input_norm, eps, {l.q, l.k, l.v}, {a.qg, a.k, a.v}, 3, n});
      q.go(op::AttnCore{ad, a.qg, a.k, a.v, l.q_norm, l.k_norm, rope_cos_, rope_sin_, s.k_cache[i], s.v_cache[i],
                        s.pos, a.scores, a.core, n});
      q.go(op::ProjectAdd{a.core, l.o, a.h, n});
    }
    q.go(op::SwiGLU{a.h, l.post_norm, eps, l.gate, l.up, a.ffn, n});
    q.go(op::ProjectAdd{a.ffn, l.down, a.h, n});
    if (layer_out) q.go(op::Read{a.h.buf, 0, size_t(n) * H * 4, (*layer_out)[i + 1].data()});
  }
  const int rows = all_logits ? n : 1;
  const Ref x = all_logits ? a.h : a.h.at(size_t(n - 1) * H);
  q.go(op::Project{x, w_.final_norm, eps, {w_.head}, {a.logits}, 1, rows});
  q.go(op::Argmax{a.logits.at(size_t(rows - 1) * cfg_.vocab_size), cfg_.vocab_size, a.next, next_token});
  q.go(op::AdvancePos{s.pos, n});
}

void Qwen35::forward_batch(Queue& q, std::span<SequenceState* const> seqs, Activations& a, Ref next) const {
  const int n = int(seqs.size());
  DQ_CHECK(n >= 1 && n <= a.max_tokens && a.all_logits, "batched step of {} sequences", n);
  if (n == 1) {  // the lone step (its fused ops, e.g. op::ProjectGdn): the same bits
    Activations one = a;
    one.next = next;
    forward(q, *seqs[0], one, 1, false);
    return;
  }
  const float eps = cfg_.rms_eps;
  const GdnDims gd = gdn_dims();
  const AttnDims ad = attn_dims();
  const size_t C = size_t(gd.conv_channels()), Dz = size_t(gd.value_dim()), Hv = size_t(gd.n_v_heads);
  const size_t Q = size_t(2) * ad.n_heads * ad.head_dim, KV = size_t(ad.n_kv_heads) * ad.head_dim;
  const size_t O = size_t(ad.n_heads) * ad.head_dim, S = size_t(ad.n_heads) * size_t(max_ctx_);
  q.go(op::Embed{w_.embed, a.tokens, a.h, n});
  for (int i = 0; i < cfg_.num_layers; ++i) {
    const LayerWeights& l = w_.layers[i];
    if (l.kind == LayerKind::Linear) {
      q.go(op::Project{a.h, l.input_norm, eps, {l.qkv, l.z, l.b, l.a}, {a.mixed, a.z, a.b, a.a}, 4, n});
      for (int j = 0; j < n; ++j)
        q.go(op::GdnCore{gd, a.mixed.at(j * C), a.z.at(j * Dz), a.b.at(j * Hv), a.a.at(j * Hv), l.conv_w, l.A_neg,
                         l.dt_bias, l.gdn_norm, seqs[j]->conv[i], seqs[j]->S[i], a.core.at(j * Dz),
                         a.conv_out.at(j * C), 1});
      q.go(op::ProjectAdd{a.core, l.out, a.h, n});
    } else {
      q.go(op::Project{a.h, l.input_norm, eps, {l.q, l.k, l.v}, {a.qg, a.k, a.v}, 3, n});
      for (int j = 0; j < n; ++j)
        q.go(op::AttnCore{ad, a.qg.at(j * Q), a.k.at(j * KV), a.v.at(j * KV), l.q_norm, l.k_norm, rope_cos_, rope_sin_,
                          seqs[j]->k_cache[i], seqs[j]->v_cache[i], seqs[j]->pos, a.scores.at(j * S),
                          a.core.at(j * O), 1});
      q.go(op::ProjectAdd{a.core, l.o, a.h, n});
    }
    q.go(op::SwiGLU{a.h, l.post_norm, eps, l.gate, l.up, a.ffn, n});
    q.go(op::ProjectAdd{a.ffn, l.down, a.h, n});
  }
  const size_t V = size_t(cfg_.vocab_size);
  q.go(op::Project{a.h, w_.final_norm, eps, {w_.head}, {a.logits}, 1, n});
  for (int j = 0; j < n; ++j) {
    q.go(op::Argmax{a.logits.at(j * V), cfg_.vocab_size, next.at(size_t(j)), {}});
    q.go(op::AdvancePos{seqs[j]->pos, 1});
  }
}

double Qwen35::bytes_per_token(int ctx) const {
  double b = double(w_.matrix_bytes) - double(w_.embed.bytes()) * (w_.head.w == w_.embed.w ? 0.0 : 1.0);
  // The embedding gather reads one row; the head reads the whole table.
  b += double(w_.embed.bytes()) / w_.embed.rows;
  b += sequence_bytes_per_token(ctx);
  b += 4.0 * cfg_.hidden_size * (2 * cfg_.num_layers + 1);
  return b;
}

double Qwen35::sequence_bytes_per_token(int ctx) const {
  const GdnDims g = gdn_dims();
  const AttnDims d = attn_dims();
  return 2.0 * 4 * cfg_.n_linear() * (double(g.n_v_heads) * g.k_dim * g.v_dim + double(g.conv_kernel - 1) * g.conv_channels()) +
         2.0 * 4 * cfg_.n_full() * double(ctx) * d.n_kv_heads * d.head_dim;
}

}  // namespace dq
