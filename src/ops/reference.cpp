#include "ops/reference.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "core/error.h"
#include "ops/numerics.h"
#include "ops/reference_impl.h"

namespace dq::ref {

namespace {

template <int BITS, class S>
float affine_row(const Matrix& m, int row, const float* x, const float* xg) {
  const int K = m.cols, G = K / m.group_size;
  const auto* w = static_cast<const uint32_t*>(m.w->ptr) + size_t(row) * (size_t(K) * BITS / 32);
  const auto* s = static_cast<const S*>(m.scales->ptr) + size_t(row) * G;
  const auto* b = static_cast<const S*>(m.biases->ptr) + size_t(row) * G;
  return num::affine_dot<BITS, S>(w, s, b, x, xg, K, m.group_size);
}

template <class S>
float affine_row_q4(const Matrix& m, int row, const num::UnitInts* units, const float* xg) {
  const int K = m.cols, G = K / m.group_size;
  const auto* w = static_cast<const uint32_t*>(m.w->ptr) + size_t(row) * (size_t(K) / 8);
  const auto* s = static_cast<const S*>(m.scales->ptr) + size_t(row) * G;
  const auto* b = static_cast<const S*>(m.biases->ptr) + size_t(row) * G;
  return num::affine_dot_q4<S>(w, s, b, units, xg, K, m.group_size);
}

template <int BITS>
float affine_row_s(const Matrix& m, int row, const float* x, const float* xg) {
  switch (m.scale_dtype) {
    case DType::BF16: return affine_row<BITS, uint16_t>(m, row, x, xg);
    case DType::F16: return affine_row<BITS, num::f16_t>(m, row, x, xg);
    case DType::F32: return affine_row<BITS, float>(m, row, x, xg);
    default: fail("{}: unsupported scale dtype {}", m.name, dtype_name(m.scale_dtype));
  }
}

template <int BITS, class S>
void affine_embed_row(const Matrix& m, int row, float* out) {
  const int K = m.cols, G = K / m.group_size;
  const auto* w = static_cast<const uint32_t*>(m.w->ptr) + size_t(row) * (size_t(K) * BITS / 32);
  const auto* s = static_cast<const S*>(m.scales->ptr) + size_t(row) * G;
  const auto* b = static_cast<const S*>(m.biases->ptr) + size_t(row) * G;
  for (int j = 0; j < K; ++j) out[j] = num::affine_weight<BITS, S>(w, s, b, j, m.group_size);
}

template <int BITS>
void affine_embed_row_s(const Matrix& m, int row, float* out) {
  switch (m.scale_dtype) {
    case DType::BF16: return affine_embed_row<BITS, uint16_t>(m, row, out);
    case DType::F16: return affine_embed_row<BITS, num::f16_t>(m, row, out);
    case DType::F32: return affine_embed_row<BITS, float>(m, row, out);
    default: fail("{}: unsupported scale dtype {}", m.name, dtype_name(m.scale_dtype));
  }
}

}  // namespace

float row_dot_q4(const Matrix& m, int row, const num::UnitInts* units, const float* xg) {
  DQ_CHECK(m.format == WFormat::Affine && m.bits == 4, "{}: row_dot_q4 of a matrix that is not 4-bit affine", m.name);
  switch (m.scale_dtype) {
    case DType::BF16: return affine_row_q4<uint16_t>(m, row, units, xg);
    case DType::F16: return affine_row_q4<num::f16_t>(m, row, units, xg);
    case DType::F32: return affine_row_q4<float>(m, row, units, xg);
    default: fail("{}: unsupported scale dtype {}", m.name, dtype_name(m.scale_dtype));
  }
}

void group_sums_for(const Matrix& m, const float* x, float* xg) {
  if (m.format == WFormat::Affine) num::group_sums(x, m.cols, m.group_size, xg);
}

float row_dot(const Matrix& m, int row, const float* x, const float* xg) {
  const size_t off = size_t(row) * size_t(m.cols);
  switch (m.format) {
    case WFormat::Affine:
      if (m.bits == 4) return affine_row_s<4>(m, row, x, xg);
      if (m.bits == 8) return affine_row_s<8>(m, row, x, xg);
      fail("{}: unsupported quantization bits {}", m.name, m.bits);
    case WFormat::BF16: return num::dense_dot(static_cast<const uint16_t*>(m.w->ptr) + off, x, m.cols);
    case WFormat::F16: return num::dense_dot(static_cast<const num::f16_t*>(m.w->ptr) + off, x, m.cols);
    case WFormat::F32: return num::dense_dot(static_cast<const float*>(m.w->ptr) + off, x, m.cols);
  }
  return 0.0f;
}

void run(const op::Embed& o) {
  const Matrix& m = o.table;
  const int32_t* tok = o.tokens.as<int32_t>();
  for (int t = 0; t < o.n_tokens; ++t) {
    int row = tok[t];
    if (row < 0 || row >= m.rows) fail("embed: token id {} out of range [0, {})", row, m.rows);
    float* out = o.out.as<float>() + size_t(t) * m.cols;
    const size_t off = size_t(row) * size_t(m.cols);
    switch (m.format) {
      case WFormat::Affine:
        if (m.bits == 4) affine_embed_row_s<4>(m, row, out);
        else if (m.bits == 8) affine_embed_row_s<8>(m, row, out);
        else fail("{}: unsupported quantization bits {}", m.name, m.bits);
        break;
      case WFormat::BF16:
        for (int j = 0; j < m.cols; ++j) out[j] = bf16_to_f32(static_cast<const uint16_t*>(m.w->ptr)[off + j]);
        break;
      case WFormat::F16:
        for (int j = 0; j < m.cols; ++j) out[j] = f16_to_f32(static_cast<const uint16_t*>(m.w->ptr)[off + j]);
        break;
      case WFormat::F32: std::memcpy(out, static_cast<const float*>(m.w->ptr) + off, size_t(m.cols) * 4); break;
    }
  }
}

namespace {
// xn = rmsnorm(x) * norm, or x itself when there is no norm.
const float* normed(const Ref& x, const Ref& norm, float eps, int t, int K, std::vector<float>& buf) {
  const float* xt = x.as<float>() + size_t(t) * K;
  if (!norm) return xt;
  buf.resize(K);
  num::rmsnorm(xt, norm.as<float>(), K, eps, buf.data());
  return buf.data();
}
}  // namespace

void run(const op::Project& o) {
  const int K = o.w[0].cols;
  std::vector<float> xn, xg(K);
  for (int t = 0; t < o.n_tokens; ++t) {
    const float* x = normed(o.x, o.norm, o.eps, t, K, xn);
    for (int i = 0; i < o.n_out; ++i) {
      const Matrix& m = o.w[i];
      group_sums_for(m, x, xg.data());
      float* y = o.y[i].as<float>() + size_t(t) * m.rows;
      for (int r = 0; r < m.rows; ++r) y[r] = row_dot(m, r, x, xg.data());
    }
  }
}

void run(const op::ProjectAdd& o) {
  const Matrix& m = o.w;
  std::vector<float> xg(m.cols);
  for (int t = 0; t < o.n_tokens; ++t) {
    const float* x = o.x.as<float>() + size_t(t) * m.cols;
    group_sums_for(m, x, xg.data());
    float* acc = o.acc.as<float>() + size_t(t) * m.rows;
    for (int r = 0; r < m.rows; ++r) acc[r] = acc[r] + row_dot(m, r, x, xg.data());
  }
}

void run(const op::SwiGLU& o) {
  const int K = o.gate.cols;
  std::vector<float> xn, xg(K);
  for (int t = 0; t < o.n_tokens; ++t) {
    const float* x = normed(o.x, o.norm, o.eps, t, K, xn);
    group_sums_for(o.gate, x, xg.data());  // gate and up share the group size (checked at load)
    float* out = o.out.as<float>() + size_t(t) * o.gate.rows;
    for (int r = 0; r < o.gate.rows; ++r) {
      float g = row_dot(o.gate, r, x, xg.data());
      float u = row_dot(o.up, r, x, xg.data());
      out[r] = num::silu(g) * u;
    }
  }
}

void run(const op::GdnCore& o) {
  const int C = o.d.conv_channels(), Hk = o.d.n_k_heads, Dk = o.d.k_dim;
  std::vector<float> u(C), qn(size_t(Hk) * Dk), kn(size_t(Hk) * Dk);
  for (int t = 0; t < o.n_tokens; ++t) {
    gdn_conv(o, t, u.data());
    gdn_qk_norm(o, u.data(), qn.data(), kn.data());
    for (int hv = 0; hv < o.d.n_v_heads; ++hv) gdn_head(o, t, hv, u.data(), qn.data(), kn.data());
  }
}

void run(const op::ProjectGdn& o) {
  run(o.proj);
  run(o.core);
}

void run(const op::AttnCore& o) {
  for (int t = 0; t < o.n_tokens; ++t) attn_append_kv(o, t);
  for (int t = 0; t < o.n_tokens; ++t)
    for (int h = 0; h < o.d.n_heads; ++h) attn_head(o, t, h);
}

// ---- small ops -----------------------------------------------------------------------------------

void run(const op::Argmax& o) {
  const float* x = o.x.as<float>();
  int best = 0;
  float bv = -INFINITY;
  for (int i = 0; i < o.n; ++i)
    if (x[i] > bv) {
      bv = x[i];
      best = i;
    }
  o.out.as<int32_t>()[0] = best;
  if (o.out2) o.out2.as<int32_t>()[0] = best;
}

void check_top_k(const op::TopK& o) {
  DQ_CHECK(o.k >= 1 && o.k <= op::TopK::kMax && o.k <= o.n, "top_k: k = {} must be in [1, min(n = {}, {})]", o.k, o.n,
           op::TopK::kMax);
}

void run(const op::TopK& o) {
  check_top_k(o);
  const float* x = o.x.as<float>();
  std::vector<uint64_t> keys(size_t(o.n));
  for (int i = 0; i < o.n; ++i) keys[size_t(i)] = num::top_key(x[i], i);
  std::partial_sort(keys.begin(), keys.begin() + o.k, keys.end(), std::greater<uint64_t>());
  for (int i = 0; i < o.k; ++i) {
    const int id = num::top_key_index(keys[size_t(i)]);
    o.ids.as<int32_t>()[i] = id;
    o.vals.as<float>()[i] = x[id];
  }
}

void check_sample_draw(const op::SampleDraw& o) {
  DQ_CHECK(o.n >= 1, "sample_draw: empty row (n = {})", o.n);
  DQ_CHECK(o.temperature > 0.0f && o.temperature < INFINITY, "sample_draw: temperature {} must be positive and finite",
           o.temperature);
  DQ_CHECK(o.min_p >= 0.0f && o.min_p <= 1.0f, "sample_draw: min_p {} must be in [0, 1]", o.min_p);
  DQ_CHECK(o.u >= 0.0 && o.u < 1.0, "sample_draw: u {} must be in [0, 1)", o.u);
}

DrawSums draw_sums(const float* x, int n, float temperature, float min_p) {
  DrawSums d;
  for (int i = 0; i < n; ++i)
    if (x[i] > d.m) d.m = x[i];  // NaN compares false
  if (d.m == -INFINITY || d.m == INFINITY) return d;
  const int C = num::kDrawChunk, B = C * num::kDrawChunks;
  const int nchunks = (n + C - 1) / C, nblocks = (n + B - 1) / B;
  d.chunk.assign(size_t(nblocks) * num::kDrawChunks, 0.0);
  d.block.assign(size_t(nblocks), 0.0);
  for (int c = 0; c < nchunks; ++c) {
    double s = 0.0;
    for (int i = c * C; i < std::min(n, (c + 1) * C); ++i) s += double(num::draw_weight(x[i], d.m, temperature, min_p));
    d.chunk[size_t(c)] = s;
  }
  for (int b = 0; b < nblocks; ++b) {
    double s = 0.0;
    for (int c = 0; c < num::kDrawChunks; ++c) s += d.chunk[size_t(b) * num::kDrawChunks + c];
    d.block[size_t(b)] = s;
    d.Z += s;
  }
  return d;
}
namespace {
// The walk of numerics.h over the sums: the id, or -1.
int32_t draw_walk_row(const DrawSums& d, const float* x, int n, float temperature, float min_p, double u) {
  if (d.m == -INFINITY || d.m == INFINITY) return -1;
  const int C = num::kDrawChunk;
  const double t = u * d.Z;
  double base = 0.0;
  const int b = num::draw_walk(d.block.data(), int(d.block.size()), t, &base);
  if (b < 0) return -1;  // every weight is 0 (not reached: the top's weight is 1)
  const int c = num::draw_walk(d.chunk.data() + size_t(b) * num::kDrawChunks, num::kDrawChunks, t, &base);
  const int c0 = (b * num::kDrawChunks + c) * C;
  double w[num::kDrawChunk] = {};
  for (int i = c0; i < std::min(n, c0 + C); ++i) w[i - c0] = double(num::draw_weight(x[i], d.m, temperature, min_p));
  return c0 + num::draw_walk(w, C, t, &base);
}
}  // namespace

void sample_draw_finish(const op::SampleDraw& o, const DrawSums& d) {
  const float* x = o.x.as<float>();
  if (o.out || o.out2) {
    const int32_t id = draw_walk_row(d, x, o.n, o.temperature, o.min_p, o.u);
    if (o.out) o.out.as<int32_t>()[0] = id;
    if (o.out2 && id >= 0) o.out2.as<int32_t>()[0] = id;  // a decline leaves the next input as it was
  }
  if (o.total) o.total.as<double>()[0] = d.m == -INFINITY || d.m == INFINITY ? NAN : d.Z;
}

double draw_total(const float* x, int n, float temperature) {
  const DrawSums d = draw_sums(x, n, temperature, 0.0f);
  return d.m == -INFINITY || d.m == INFINITY ? NAN : d.Z;
}

int32_t draw_plain(const float* x, int n, float temperature, float min_p, double u) {
  return draw_walk_row(draw_sums(x, n, temperature, min_p), x, n, temperature, min_p, u);
}

void run(const op::SampleDraw& o) {
  check_sample_draw(o);
  sample_draw_finish(o, draw_sums(o.x.as<float>(), o.n, o.temperature, o.min_p));
}

void check_top_draw(const op::TopDraw& o) {
  DQ_CHECK(o.k >= 1 && o.k <= op::TopK::kMax, "top_draw: k = {} must be in [1, {}]", o.k, op::TopK::kMax);
  DQ_CHECK(o.top_k <= 0 || o.top_k + 1 <= o.k, "top_draw: top_k = {} needs top_k + 1 pairs, got k = {}", o.top_k, o.k);
  DQ_CHECK(o.top_k >= 1 || bool(o.total), "top_draw: top-p alone (top_k = {}) needs the row's total", o.top_k);
  DQ_CHECK(o.temperature > 0.0f && o.temperature < INFINITY, "top_draw: temperature {} must be positive and finite",
           o.temperature);
  DQ_CHECK(o.top_p > 0.0f && o.top_p <= 1.0f, "top_draw: top_p {} must be in (0, 1]", o.top_p);
  DQ_CHECK(o.min_p >= 0.0f && o.min_p <= 1.0f, "top_draw: min_p {} must be in [0, 1]", o.min_p);
  DQ_CHECK(o.u >= 0.0 && o.u < 1.0, "top_draw: u {} must be in [0, 1)", o.u);
}

void run(const op::TopDraw& o) {
  check_top_draw(o);
  const double total = o.total ? o.total.as<double>()[0] : 0.0;
  const int32_t id = num::top_draw(o.ids.as<int32_t>(), o.vals.as<float>(), o.k, o.top_k, o.temperature, o.top_p,
                                   o.min_p, total, o.u);
  o.out.as<int32_t>()[0] = id;
  if (o.out2 && id >= 0) o.out2.as<int32_t>()[0] = id;
}

void run(const op::AdvancePos& o) { o.pos.as<int32_t>()[0] += o.delta; }

void run(const op::Zero& o) { std::memset(o.buf->ptr, 0, o.buf->bytes); }

void run(const op::Write& o) {
  DQ_CHECK(o.offset_bytes + o.size() <= o.dst->bytes, "write past the end of {}", o.dst->name);
  std::memcpy(static_cast<uint8_t*>(o.dst->ptr) + o.offset_bytes, o.data(), o.size());
}

void run(const op::Read& o) {
  DQ_CHECK(o.offset_bytes + o.bytes <= o.src->bytes, "read past the end of {}", o.src->name);
  std::memcpy(o.host, static_cast<const uint8_t*>(o.src->ptr) + o.offset_bytes, o.bytes);
}

}  // namespace dq::ref
