#include "model/weights.h"

#include <cstring>
#include <vector>

#include "core/error.h"
#include "ops/numerics.h"

namespace dq {

namespace {

float element_f32(const TensorInfo& t, size_t i) {
  switch (t.dtype) {
    case DType::BF16: {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      return bf16_to_f32(h);
    }
    case DType::F16: {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      return f16_to_f32(h);
    }
    case DType::F32: {
      float f;
      std::memcpy(&f, t.data + 4 * i, 4);
      return f;
    }
    default: fail("tensor '{}': cannot read {} as float", t.name, dtype_name(t.dtype));
  }
}

std::vector<float> to_f32(const TensorInfo& t) {
  std::vector<float> v(size_t(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = element_f32(t, i);
  return v;
}

Ref upload_vec(Backend& be, const std::vector<float>& v, const std::string& name) {
  return Ref{be.upload(v.data(), v.size() * sizeof(float), name)};
}

// Matrices point into the mapped shards; `keep` holds every shard's mapping alive.
Matrix matrix(const LinearRef& r, Backend& be, const std::shared_ptr<const void>& keep) {
  Matrix m;
  m.rows = r.rows;
  m.cols = r.cols;
  m.name = r.module;
  auto wrap = [&](const TensorInfo* t, const std::string& what) {
    return be.weights(t->data, t->nbytes, keep, r.module + what);
  };
  m.w = wrap(r.weight, ".weight");
  if (r.quantized) {
    m.format = WFormat::Affine;
    m.bits = r.bits;
    m.group_size = r.group_size;
    m.scale_dtype = r.scales->dtype;
    m.scales = wrap(r.scales, ".scales");
    m.biases = wrap(r.biases, ".biases");
  } else {
    m.format = r.weight->dtype == DType::BF16 ? WFormat::BF16 : r.weight->dtype == DType::F16 ? WFormat::F16 : WFormat::F32;
  }
  return m;
}

Ref norm_vec(const VectorRef& v, Backend& be) {
  std::vector<float> x = to_f32(*v.t);
  if (v.add_one)
    for (float& e : x) e = 1.0f + e;  // HF stores w; the multiplier is 1 + w, computed in fp32
  return upload_vec(be, x, v.t->name);
}

}  // namespace

ModelWeights load_weights(const Checkpoint& ck, Backend& be) {
  const ModelRefs& r = ck.refs();
  ModelWeights w;
  auto keep = std::make_shared<std::vector<std::shared_ptr<const SafetensorsFile>>>(ck.files());
  w.embed = matrix(r.embed, be, keep);
  w.head = r.tied ? w.embed : matrix(r.head, be, keep);
  w.final_norm = norm_vec(r.final_norm, be);
  w.matrix_bytes = w.embed.bytes() + (r.tied ? 0 : w.head.bytes());
  // The layers' matrices are read only by the products: the backend may lay them out its way
  // (the embedding and the head keep the checkpoint's layout: the embedding gathers rows).
  auto product = [&](const LinearRef& lr) { return be.product_matrix(matrix(lr, be, keep)); };
  for (const LayerRefs& l : r.layers) {
    LayerWeights lw;
    lw.kind = l.kind;
    lw.input_norm = norm_vec(l.input_norm, be);
    lw.post_norm = norm_vec(l.post_norm, be);
    if (l.kind == LayerKind::Linear) {
      lw.qkv = product(l.qkv);
      lw.z = product(l.z);
      lw.b = product(l.b);
      lw.a = product(l.a);
      lw.out = product(l.out);
      lw.conv_w = upload_vec(be, to_f32(*l.conv.t), l.conv.t->name);  // [C][K] in both layouts
      std::vector<float> A = to_f32(*l.A_log.t);
      for (float& e : A) e = -num::exp(e);
      lw.A_neg = upload_vec(be, A, l.A_log.t->name);
      lw.dt_bias = upload_vec(be, to_f32(*l.dt_bias.t), l.dt_bias.t->name);
      lw.gdn_norm = norm_vec(l.gdn_norm, be);
      w.matrix_bytes += lw.qkv.bytes() + lw.z.bytes() + lw.b.bytes() + lw.a.bytes() + lw.out.bytes();
    } else {
      lw.q = product(l.q);
      lw.k = product(l.k);
      lw.v = product(l.v);
      lw.o = product(l.o);
      lw.q_norm = norm_vec(l.q_norm, be);
      lw.k_norm = norm_vec(l.k_norm, be);
      w.matrix_bytes += lw.q.bytes() + lw.k.bytes() + lw.v.bytes() + lw.o.bytes();
    }
    lw.gate = product(l.gate);
    lw.up = product(l.up);
    lw.down = product(l.down);
    w.matrix_bytes += lw.gate.bytes() + lw.up.bytes() + lw.down.bytes();
    w.layers.push_back(std::move(lw));
  }
  return w;
}

}  // namespace dq
