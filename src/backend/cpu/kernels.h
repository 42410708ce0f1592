// CPU kernel sets: the same evaluation order as the reference (src/ops/), vectorised for one
// ISA. A set is chosen once when the backend is made (never inside a loop).
#pragma once
#include "ops/ops.h"

namespace dq::cpu {

constexpr int kMaxTile = 4;  // tokens processed per pass over a block of weight rows

// One product for up to kMaxTile tokens: y_t[r] = W[r] . x_t for rows r in a range.
struct MatTask {
  const Matrix* m = nullptr;
  int nt = 0;
  const float* x[kMaxTile] = {};   // prepared x per token (the set's layout)
  const float* xg[kMaxTile] = {};  // group sums per token (affine)
  float* y[kMaxTile] = {};         // output per token, indexed by row
};

struct KernelSet {
  const char* name;
  // Whether rows()/swiglu_rows() have a fast path for this matrix; otherwise the generic set's are used.
  bool (*handles)(const Matrix& m);
  // Floats of a prepared x for this matrix (>= m.cols).
  size_t (*prepared_size)(const Matrix& m);
  // Writes x in the layout rows() reads (every x: the layouts carry it exactly).
  void (*prepare)(const Matrix& m, const float* x, float* xp);
  // y_t[r] = W[r].x_t, or y_t[r] += W[r].x_t when add, for r in [r0, r1).
  void (*rows)(const MatTask& t, int r0, int r1, bool add);
  // out_t[r] = silu(Wg[r].x_t) * (Wu[r].x_t); gate and up share x, xg and layout.
  void (*swiglu_rows)(const MatTask& gate, const Matrix& up, int r0, int r1);
  // The reference per-token / per-head code compiled for this ISA.
  void (*rmsnorm)(const float* x, const float* w, int n, float eps, float* out);
  void (*gdn_prep)(const op::GdnCore& o, int t, float* u, float* qn, float* kn);  // conv, silu, q/k norms
  void (*attn_append)(const op::AttnCore& o, int t);
  void (*gdn_heads)(const op::GdnCore& o, int t, int h0, int h1, const float* u, const float* qn, const float* kn);
  void (*attn_heads)(const op::AttnCore& o, int t, int h0, int h1);
  // w[i] = num::draw_weight(x[i], m, T, min_p) for i < n (the sampling draw's weights).
  void (*draw_weights)(const float* x, int n, float m, float T, float min_p, float* w);
};

const KernelSet* generic_kernels();
const KernelSet* avx2_kernels();    // nullptr when not built for x86
const KernelSet* avx512_kernels();  // nullptr when not built for x86

}  // namespace dq::cpu
