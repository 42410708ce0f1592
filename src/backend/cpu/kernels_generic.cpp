// The generic kernel set: the reference order, no ISA-specific code. Used on CPUs without
// AVX2 and for matrix formats the SIMD sets do not specialise.
#include <cstring>

#include "backend/cpu/kernels.h"
#include "ops/reference.h"
#include "ops/reference_impl.h"

namespace dq::cpu {

namespace {

bool handles(const Matrix&) { return true; }

size_t prepared_size(const Matrix& m) { return size_t(m.cols); }

bool prepare(const Matrix& m, const float* x, float* xp) {
  std::memcpy(xp, x, sizeof(float) * m.cols);
  return true;
}

void rows(const MatTask& t, int r0, int r1, bool add) {
  for (int r = r0; r < r1; ++r)
    for (int i = 0; i < t.nt; ++i) {
      float v = ref::row_dot(*t.m, r, t.x[i], t.xg[i]);
      t.y[i][r] = add ? t.y[i][r] + v : v;
    }
}

void swiglu_rows(const MatTask& g, const Matrix& up, int r0, int r1) {
  for (int r = r0; r < r1; ++r)
    for (int i = 0; i < g.nt; ++i) {
      float a = ref::row_dot(*g.m, r, g.x[i], g.xg[i]);
      float b = ref::row_dot(up, r, g.x[i], g.xg[i]);
      g.y[i][r] = num::silu(a) * b;
    }
}

void rmsnorm(const float* x, const float* w, int n, float eps, float* out) { num::rmsnorm(x, w, n, eps, out); }

void gdn_prep(const op::GdnCore& o, int t, float* u, float* qn, float* kn) {
  ref::gdn_conv(o, t, u);
  ref::gdn_qk_norm(o, u, qn, kn);
}

void attn_append(const op::AttnCore& o, int t) { ref::attn_append_kv(o, t); }

void gdn_heads(const op::GdnCore& o, int t, int h0, int h1, const float* u, const float* qn, const float* kn) {
  for (int h = h0; h < h1; ++h) ref::gdn_head(o, t, h, u, qn, kn);
}

void attn_heads(const op::AttnCore& o, int t, int h0, int h1) {
  for (int h = h0; h < h1; ++h) ref::attn_head(o, t, h);
}

const KernelSet kGeneric = {"generic", handles, prepared_size, prepare, rows, swiglu_rows, rmsnorm, gdn_prep, attn_append, gdn_heads, attn_heads};

}  // namespace

const KernelSet* generic_kernels() { return &kGeneric; }

}  // namespace dq::cpu
