// Scalar reference implementation of every op: the definition of its evaluation order.
// Operands are host memory. Single-threaded, plain loops over numerics.h.
#pragma once
#include <vector>

#include "ops/numerics.h"
#include "ops/ops.h"

namespace dq::ref {

// y = W[row] . x for one row, in the canonical order; xg = group sums of x (affine only).
float row_dot(const Matrix& m, int row, const float* x, const float* xg);
// The same for a 4-bit affine matrix whose x units were quantized once (numerics.h quantize_unit).
float row_dot_q4(const Matrix& m, int row, const num::UnitInts* units, const float* xg);
// Group sums of x for an affine matrix (size cols / group_size); no-op for dense.
void group_sums_for(const Matrix& m, const float* x, float* xg);

void run(const op::Embed& o);
void run(const op::Project& o);
void run(const op::ProjectAdd& o);
void run(const op::SwiGLU& o);
void run(const op::GdnCore& o);
void run(const op::ProjectGdn& o);
void run(const op::AttnCore& o);
void run(const op::Argmax& o);
void run(const op::TopK& o);
void check_top_k(const op::TopK& o);  // k in range, else dq::Error
void run(const op::SampleDraw& o);
void check_sample_draw(const op::SampleDraw& o);  // n, temperature, min_p and u in range, else dq::Error
void run(const op::TopDraw& o);
void check_top_draw(const op::TopDraw& o);  // k, top_k, temperature, top_p, min_p, u and the total's presence, else dq::Error
// The draw's sums (numerics.h): the row's largest number m (NaN skipped), every chunk's and
// block's sum and Z; chunks are independent, so a backend may make them in parallel.
struct DrawSums {
  float m = -INFINITY;
  std::vector<double> chunk, block;
  double Z = 0.0;
};
DrawSums draw_sums(const float* x, int n, float temperature, float min_p);
// SampleDraw's outputs from its sums: the walk to the id, and Z.
void sample_draw_finish(const op::SampleDraw& o, const DrawSums& d);
// The plain temperature draw (numerics.h) over x[0..n): the id, or -1 (no number above -inf, or +inf).
int32_t draw_plain(const float* x, int n, float temperature, float min_p, double u);
// Its weights' sum Z without min-p (what top-p measures its mass against); NaN when it declines.
double draw_total(const float* x, int n, float temperature);
void run(const op::AdvancePos& o);
void run(const op::Zero& o);
void run(const op::Write& o);
void run(const op::Read& o);

}  // namespace dq::ref
