// The per-token and per-head pieces of the reference ops, inline so that the fast CPU kernels
// (compiled for AVX2/AVX-512) run exactly this code, vectorised across independent outputs.
#pragma once
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "ops/numerics.h"
#include "ops/ops.h"

namespace dq::ref {

// ---- Gated DeltaNet ---------------------------------------------------------------------------

DQ_HD void gdn_conv(const op::GdnCore& o, int t, float* u) {
  const int C = o.d.conv_channels(), K = o.d.conv_kernel;
  const float* mixed = o.mixed.as<float>() + size_t(t) * C;
  const float* w = o.conv_w.as<float>();
  float* st = o.conv_state.as<float>();
  for (int c = 0; c < C; ++c) {
    float acc = 0.0f;
    for (int j = 0; j < K - 1; ++j) acc = fmaf(w[c * K + j], st[size_t(j) * C + c], acc);
    acc = fmaf(w[c * K + K - 1], mixed[c], acc);
    u[c] = num::silu(acc);
  }
  // Roll the window: it keeps the last K-1 raw projections, oldest first.
  if (K > 1) {
    std::memmove(st, st + C, sizeof(float) * size_t(K - 2) * C);
    std::memcpy(st + size_t(K - 2) * C, mixed, sizeof(float) * C);
  }
}

DQ_HD void gdn_qk_norm(const op::GdnCore& o, const float* u, float* qn, float* kn) {
  const int Hk = o.d.n_k_heads, Dk = o.d.k_dim;
  const float scale = 1.0f / sqrtf(float(Dk));
  for (int h = 0; h < Hk; ++h) {
    const float* q = u + h * Dk;
    const float* k = u + Hk * Dk + h * Dk;
    float rq = 1.0f / sqrtf(num::sum_squares(q, Dk) + 1e-6f);
    float rk = 1.0f / sqrtf(num::sum_squares(k, Dk) + 1e-6f);
    for (int i = 0; i < Dk; ++i) {
      qn[h * Dk + i] = (q[i] * rq) * scale;
      kn[h * Dk + i] = k[i] * rk;
    }
  }
}

DQ_HD void gdn_head(const op::GdnCore& o, int t, int hv, const float* u, const float* qn, const float* kn) {
  const int Hk = o.d.n_k_heads, Hv = o.d.n_v_heads, Dk = o.d.k_dim, Dv = o.d.v_dim;
  const int hk = hv / (Hv / Hk);
  const float* q = qn + hk * Dk;
  const float* k = kn + hk * Dk;
  const float* v = u + 2 * Hk * Dk + hv * Dv;
  const float beta = num::sigmoid(o.b.as<float>()[size_t(t) * Hv + hv]);
  const float g = o.A_neg.as<float>()[hv] * num::softplus(o.a.as<float>()[size_t(t) * Hv + hv] + o.dt_bias.as<float>()[hv]);
  const float alpha = num::exp(g);
  float* S = o.S.as<float>() + size_t(hv) * Dk * Dv;  // [Dk][Dv]
  float m[256], delta[256], out[256];
  for (int j = 0; j < Dv; ++j) m[j] = 0.0f;
  for (int i = 0; i < Dk; ++i)
    for (int j = 0; j < Dv; ++j) {
      float s = alpha * S[i * Dv + j];
      S[i * Dv + j] = s;
      m[j] = fmaf(s, k[i], m[j]);
    }
  for (int j = 0; j < Dv; ++j) {
    delta[j] = beta * (v[j] - m[j]);
    out[j] = 0.0f;
  }
  for (int i = 0; i < Dk; ++i)
    for (int j = 0; j < Dv; ++j) {
      float s = fmaf(k[i], delta[j], S[i * Dv + j]);
      S[i * Dv + j] = s;
      out[j] = fmaf(s, q[i], out[j]);
    }
  // Gated RMSNorm: ((o * r) * w) * silu(z)
  const float r = num::rms_inv(num::sum_squares(out, Dv), Dv, o.d.norm_eps);
  const float* w = o.norm.as<float>();
  const float* z = o.z.as<float>() + size_t(t) * Hv * Dv + hv * Dv;
  float* y = o.out.as<float>() + size_t(t) * Hv * Dv + hv * Dv;
  for (int j = 0; j < Dv; ++j) y[j] = ((out[j] * r) * w[j]) * num::silu(z[j]);
}

// ---- gated attention ---------------------------------------------------------------------------

DQ_HD void attn_append_kv(const op::AttnCore& o, int t) {
  const AttnDims& d = o.d;
  const int p = o.pos.as<int32_t>()[0] + t;
  const int hd = d.head_dim, half = d.rotary_dim / 2;
  const float* cs = o.rope_cos.as<float>() + size_t(p) * half;
  const float* sn = o.rope_sin.as<float>() + size_t(p) * half;
  for (int j = 0; j < d.n_kv_heads; ++j) {
    const float* k = o.k.as<float>() + (size_t(t) * d.n_kv_heads + j) * hd;
    const float* v = o.v.as<float>() + (size_t(t) * d.n_kv_heads + j) * hd;
    float* kc = o.k_cache.as<float>() + (size_t(p) * d.n_kv_heads + j) * hd;
    float* vc = o.v_cache.as<float>() + (size_t(p) * d.n_kv_heads + j) * hd;
    num::rmsnorm(k, o.k_norm.as<float>(), hd, d.norm_eps, kc);
    num::rope(kc, d.rotary_dim, cs, sn);
    std::memcpy(vc, v, sizeof(float) * hd);
  }
}

DQ_HD void attn_head(const op::AttnCore& o, int t, int h) {
  const AttnDims& d = o.d;
  const int p = o.pos.as<int32_t>()[0] + t;
  const int hd = d.head_dim, half = d.rotary_dim / 2, L = p + 1;
  const int j = h / (d.n_heads / d.n_kv_heads);
  const float* qg = o.qg.as<float>() + (size_t(t) * d.n_heads + h) * 2 * hd;
  float q[512], acc[512];
  num::rmsnorm(qg, o.q_norm.as<float>(), hd, d.norm_eps, q);
  num::rope(q, d.rotary_dim, o.rope_cos.as<float>() + size_t(p) * half, o.rope_sin.as<float>() + size_t(p) * half);
  const float scale = 1.0f / sqrtf(float(hd));
  float* s = o.scores.as<float>() + (size_t(t) * d.n_heads + h) * d.max_ctx;
  const size_t stride = size_t(d.n_kv_heads) * hd;
  const float* kc = o.k_cache.as<float>() + size_t(j) * hd;
  const float* vc = o.v_cache.as<float>() + size_t(j) * hd;
  float mx = -INFINITY;
  for (int tau = 0; tau < L; ++tau) {
    s[tau] = num::dot(q, kc + tau * stride, hd) * scale;
    mx = s[tau] > mx ? s[tau] : mx;
  }
  for (int tau = 0; tau < L; ++tau) s[tau] = num::exp(s[tau] - mx);
  const float Z = num::sum(s, L);
  for (int i = 0; i < hd; ++i) acc[i] = 0.0f;
  for (int tau = 0; tau < L; ++tau)
    for (int i = 0; i < hd; ++i) acc[i] = fmaf(s[tau], vc[tau * stride + i], acc[i]);
  const float* gate = qg + hd;
  float* out = o.out.as<float>() + (size_t(t) * d.n_heads + h) * hd;
  for (int i = 0; i < hd; ++i) out[i] = (acc[i] / Z) * num::sigmoid(gate[i]);
}

}  // namespace dq::ref
