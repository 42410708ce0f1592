// The generic kernel set: the reference order, no ISA-specific code. Used on CPUs without
// AVX2 and for matrix formats the SIMD sets do not specialise.
#include <cstring>
#include <new>

#include "backend/cpu/kernels.h"
#include "ops/reference.h"
#include "ops/reference_impl.h"

namespace dq::cpu {

namespace {

bool handles(const Matrix&) { return true; }

bool is_q4(const Matrix& m) { return m.format == WFormat::Affine && m.bits == 4; }

// 4-bit affine: x's units quantized once for every row (numerics.h UnitInts, 9 floats' room
// each), then x as given (for a SwiGLU up matrix of another format); anything else: x as given.
constexpr size_t kUnitFloats = sizeof(num::UnitInts) / sizeof(float);
static_assert(sizeof(num::UnitInts) % sizeof(float) == 0 && alignof(num::UnitInts) <= alignof(float));

size_t units_floats(const Matrix& m) { return is_q4(m) ? size_t(m.cols / 8) * kUnitFloats : 0; }

size_t prepared_size(const Matrix& m) { return units_floats(m) + size_t(m.cols); }

void prepare(const Matrix& m, const float* x, float* xp) {
  if (is_q4(m))
    for (int u = 0; u < m.cols / 8; ++u) new (xp + size_t(u) * kUnitFloats) num::UnitInts(num::quantize_unit(x + 8 * u));
  std::memcpy(xp + units_floats(m), x, sizeof(float) * m.cols);
}

// Row r of m against x prepared for matrix `prep` (the same matrix, or SwiGLU's gate).
float row(const Matrix& m, const Matrix& prep, int r, const float* xp, const float* xg) {
  if (is_q4(m) && is_q4(prep)) return ref::row_dot_q4(m, r, std::launder(reinterpret_cast<const num::UnitInts*>(xp)), xg);
  return ref::row_dot(m, r, xp + units_floats(prep), xg);
}

void rows(const MatTask& t, int r0, int r1, bool add) {
  for (int r = r0; r < r1; ++r)
    for (int i = 0; i < t.nt; ++i) {
      float v = row(*t.m, *t.m, r, t.x[i], t.xg[i]);
      t.y[i][r] = add ? t.y[i][r] + v : v;
    }
}

void swiglu_rows(const MatTask& g, const Matrix& up, int r0, int r1) {
  for (int r = r0; r < r1; ++r)
    for (int i = 0; i < g.nt; ++i) {
      float a = row(*g.m, *g.m, r, g.x[i], g.xg[i]);
      float b = row(up, *g.m, r, g.x[i], g.xg[i]);
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

void draw_weights(const float* x, int n, float m, float T, float min_p, float* w) {
  for (int i = 0; i < n; ++i) w[i] = num::draw_weight(x[i], m, T, min_p);
}

const KernelSet kGeneric = {"generic",   handles,     prepared_size, prepare,   rows,       swiglu_rows,
                            rmsnorm,     gdn_prep,    attn_append,   gdn_heads, attn_heads, draw_weights};

}  // namespace

const KernelSet* generic_kernels() { return &kGeneric; }

}  // namespace dq::cpu
