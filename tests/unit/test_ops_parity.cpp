// Every op on every CPU kernel set and thread count against the scalar reference, on random
// inputs of many shapes: the results must be bit-identical (the numerics contract).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "ops/numerics.h"

using namespace dq;

namespace {

struct Rig {
  std::unique_ptr<Backend> ref = make_cpu_backend(CpuKernels::Reference, 1);
  std::unique_ptr<Queue> ref_q = ref->make_queue();
  std::mt19937 rng{12345};

  Ref floats(size_t n, float scale = 1.0f) {
    std::vector<float> v(n);
    std::normal_distribution<float> d(0.f, scale);
    for (auto& e : v) e = d(rng);
    return Ref{ref->upload(v.data(), n * 4, "f")};
  }
  // x with exact zeros, tiny and huge-ish magnitudes mixed in.
  Ref inputs(size_t n, bool with_tiny = false) {
    std::vector<float> v(n);
    std::normal_distribution<float> d(0.f, 1.f);
    for (size_t i = 0; i < n; ++i) {
      v[i] = d(rng) * std::exp2(float(int(rng() % 12) - 6));
      if (rng() % 17 == 0) v[i] = 0.0f;
    }
    if (with_tiny && n) v[rng() % n] = 3e-31f;
    return Ref{ref->upload(v.data(), n * 4, "x")};
  }
  Matrix matrix(WFormat f, int rows, int cols, int bits = 4, int gs = 64, DType sd = DType::BF16) {
    Matrix m;
    m.format = f;
    m.rows = rows;
    m.cols = cols;
    m.name = "m";
    std::normal_distribution<float> d(0.f, 1.f / std::sqrt(float(cols)));
    if (f == WFormat::Affine) {
      m.bits = bits;
      m.group_size = gs;
      m.scale_dtype = sd;
      size_t words = size_t(rows) * cols * bits / 32, G = size_t(rows) * (cols / gs);
      std::vector<uint32_t> w(words);
      for (auto& e : w) e = uint32_t(rng());
      m.w = ref->upload(w.data(), words * 4, "w");
      std::vector<uint8_t> s(G * dtype_size(sd)), b(G * dtype_size(sd));
      for (size_t g = 0; g < G; ++g) {
        float sc = d(rng) * 0.2f, bi = d(rng) * 2.f;  // negative scales too
        if (sd == DType::BF16) {
          uint16_t a = f32_to_bf16(sc), c = f32_to_bf16(bi);
          std::memcpy(&s[2 * g], &a, 2), std::memcpy(&b[2 * g], &c, 2);
        } else if (sd == DType::F16) {
          uint16_t a = f32_to_f16(sc), c = f32_to_f16(bi);
          std::memcpy(&s[2 * g], &a, 2), std::memcpy(&b[2 * g], &c, 2);
        } else {
          std::memcpy(&s[4 * g], &sc, 4), std::memcpy(&b[4 * g], &bi, 4);
        }
      }
      m.scales = ref->upload(s.data(), s.size(), "s");
      m.biases = ref->upload(b.data(), b.size(), "b");
    } else {
      size_t n = size_t(rows) * cols;
      std::vector<uint8_t> w(n * (f == WFormat::F32 ? 4 : 2));
      for (size_t i = 0; i < n; ++i) {
        float v = d(rng);
        if (f == WFormat::F32) std::memcpy(&w[4 * i], &v, 4);
        else {
          uint16_t h = f == WFormat::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
          std::memcpy(&w[2 * i], &h, 2);
        }
      }
      m.w = ref->upload(w.data(), w.size(), "w");
    }
    return m;
  }
  Ref copy(const Ref& r) { return Ref{ref->upload(r.buf->ptr, r.buf->bytes, "copy"), r.off}; }
  Ref zeros(size_t bytes) { return Ref{ref->alloc(bytes, "z")}; }
};

// The fast configurations to check: every kernel set this CPU runs, with 1, 2 and 3 threads.
std::vector<std::pair<CpuKernels, int>> fast_configs() {
  std::vector<std::pair<CpuKernels, int>> out;
  for (CpuKernels k : {CpuKernels::Generic, CpuKernels::Avx2, CpuKernels::Avx512}) {
    try {
      resolve_cpu_kernels(k);
    } catch (const std::exception&) {
      continue;
    }
    for (int t : {1, 2, 3}) out.push_back({k, t});
  }
  return out;
}

bool same(const Ref& a, const Ref& b) { return std::memcmp(a.buf->ptr, b.buf->ptr, a.buf->bytes) == 0; }

std::string describe(CpuKernels k, int t) { return std::string(cpu_kernels_name(k)) + "/" + std::to_string(t) + "t"; }

// Runs `make(outputs)` on the reference and on every fast config; `outs` are the buffers the op
// writes (copied fresh for each run from their initial contents); all must match bit for bit.
void check(Rig& rig, const std::vector<Ref>& outs, const std::function<Op(const std::vector<Ref>&)>& make,
           const std::string& what) {
  std::vector<Ref> want;
  for (const Ref& o : outs) want.push_back(rig.copy(o));
  rig.ref_q->go(make(want));
  rig.ref_q->wait();
  for (auto [k, t] : fast_configs()) {
    auto be = make_cpu_backend(k, t);
    auto q = be->make_queue();
    std::vector<Ref> got;
    for (const Ref& o : outs) got.push_back(rig.copy(o));
    q->go(make(got));
    q->wait();
    for (size_t i = 0; i < outs.size(); ++i)
      ASSERT_TRUE(same(want[i], got[i])) << what << " output " << i << " differs on " << describe(k, t);
  }
}

struct Fmt {
  WFormat f;
  int bits, gs;
  DType sd;
  const char* name;
};
const Fmt kFormats[] = {
    {WFormat::Affine, 4, 64, DType::BF16, "q4g64"}, {WFormat::Affine, 4, 32, DType::BF16, "q4g32"},
    {WFormat::Affine, 4, 128, DType::BF16, "q4g128"}, {WFormat::Affine, 4, 64, DType::F16, "q4g64-f16"},
    {WFormat::Affine, 4, 64, DType::F32, "q4g64-f32"}, {WFormat::Affine, 8, 64, DType::BF16, "q8g64"},
    {WFormat::BF16, 0, 0, DType::BF16, "bf16"}, {WFormat::F16, 0, 0, DType::BF16, "f16"},
    {WFormat::F32, 0, 0, DType::BF16, "f32"},
};

}  // namespace

TEST(OpsParity, ProjectAllFormatsShapesAndTokenCounts) {
  Rig rig;
  for (const Fmt& f : kFormats)
    for (int K : {128, 256, 384, 640, 2048})
      for (int rows : {1, 5, 17, 64}) {
        if (f.gs && K % f.gs) continue;
        for (int T : {1, 3, 4, 6, 9}) {
          if (K == 2048 && (rows == 17 || T == 6)) continue;  // keep the test fast
          Matrix m = rig.matrix(f.f, rows, K, f.bits, f.gs, f.sd);
          bool tiny = T == 3;
          Ref x = rig.inputs(size_t(T) * K, tiny), norm = rig.floats(K);
          Ref y = rig.zeros(size_t(T) * rows * 4);
          std::string what = std::string(f.name) + " K=" + std::to_string(K) + " rows=" + std::to_string(rows) +
                             " T=" + std::to_string(T);
          check(rig, {y}, [&](const std::vector<Ref>& o) {
            return Op(op::Project{x, T % 2 ? norm : Ref{}, 1e-6f, {m}, {o[0]}, 1, T});
          }, "project " + what);
          check(rig, {y}, [&](const std::vector<Ref>& o) { return Op(op::ProjectAdd{x, m, o[0], T}); },
                "project_add " + what);
        }
      }
}

TEST(OpsParity, ProjectMixedOutputsAndSwiGLU) {
  Rig rig;
  const int K = 256, T = 5;
  Matrix a = rig.matrix(WFormat::Affine, 48, K), b = rig.matrix(WFormat::BF16, 16, K),
         c = rig.matrix(WFormat::Affine, 4, K, 4, 32), d = rig.matrix(WFormat::Affine, 4, K, 8, 64);
  Ref x = rig.inputs(size_t(T) * K), norm = rig.floats(K);
  std::vector<Ref> ys = {rig.zeros(T * 48 * 4), rig.zeros(T * 16 * 4), rig.zeros(T * 4 * 4), rig.zeros(T * 4 * 4)};
  check(rig, ys, [&](const std::vector<Ref>& o) {
    return Op(op::Project{x, norm, 1e-6f, {a, b, c, d}, {o[0], o[1], o[2], o[3]}, 4, T});
  }, "project x4");
  for (const Fmt& f : kFormats)
    for (int T2 : {1, 4, 7}) {
      Matrix g = rig.matrix(f.f, 40, K, f.bits, f.gs, f.sd), u = rig.matrix(f.f, 40, K, f.bits, f.gs, f.sd);
      Ref x2 = rig.inputs(size_t(T2) * K);
      check(rig, {rig.zeros(size_t(T2) * 40 * 4)}, [&](const std::vector<Ref>& o) {
        return Op(op::SwiGLU{x2, norm, 1e-6f, g, u, o[0], T2});
      }, std::string("swiglu ") + f.name);
    }
}

TEST(OpsParity, Embed) {
  Rig rig;
  for (const Fmt& f : kFormats) {
    Matrix t = rig.matrix(f.f, 50, 128, f.bits, f.gs, f.sd);
    std::vector<int32_t> ids = {0, 49, 7, 7, 23};
    Ref tok{rig.ref->upload(ids.data(), ids.size() * 4, "ids")};
    check(rig, {rig.zeros(5 * 128 * 4)}, [&](const std::vector<Ref>& o) { return Op(op::Embed{t, tok, o[0], 5}); },
          std::string("embed ") + f.name);
  }
}

TEST(OpsParity, GatedDeltaNet) {
  Rig rig;
  struct D {
    int hk, hv, dk, dv;
  };
  for (D d : {D{2, 4, 32, 32}, D{1, 1, 8, 16}, D{4, 4, 64, 64}, D{2, 4, 128, 128}, D{3, 6, 24, 40}})
    for (int T : {1, 3, 7}) {
      GdnDims g{d.hk, d.hv, d.dk, d.dv, 4, 1e-6f};
      const int C = g.conv_channels(), VD = g.value_dim();
      Ref mixed = rig.inputs(size_t(T) * C), z = rig.inputs(size_t(T) * VD), b = rig.floats(size_t(T) * d.hv, 2.f),
          a = rig.floats(size_t(T) * d.hv, 2.f), conv_w = rig.floats(size_t(C) * 4, 0.4f), A = rig.floats(d.hv),
          dt = rig.floats(d.hv), norm = rig.floats(d.dv);
      for (int h = 0; h < d.hv; ++h) A.as<float>()[h] = -std::fabs(A.as<float>()[h]) - 0.5f;
      Ref conv_state = rig.floats(size_t(3) * C), S = rig.floats(size_t(d.hv) * d.dk * d.dv, 0.1f);
      Ref out = rig.zeros(size_t(T) * VD * 4);
      check(rig, {conv_state, S, out}, [&](const std::vector<Ref>& o) {
        return Op(op::GdnCore{g, mixed, z, b, a, conv_w, A, dt, norm, o[0], o[1], o[2], T});
      }, "gdn hk=" + std::to_string(d.hk) + " hv=" + std::to_string(d.hv) + " T=" + std::to_string(T));
    }
}

TEST(OpsParity, GatedAttention) {
  Rig rig;
  struct D {
    int h, hkv, hd, rot;
  };
  const int ctx = 64;
  for (D d : {D{4, 2, 64, 16}, D{8, 2, 256, 64}, D{2, 2, 32, 32}, D{3, 1, 48, 0}})
    for (int pos0 : {0, 5, 40})
      for (int T : {1, 4}) {
        AttnDims ad{d.h, d.hkv, d.hd, d.rot, ctx, 1e-6f};
        Ref qg = rig.inputs(size_t(T) * d.h * 2 * d.hd), k = rig.inputs(size_t(T) * d.hkv * d.hd),
            v = rig.inputs(size_t(T) * d.hkv * d.hd), qn = rig.floats(d.hd), kn = rig.floats(d.hd);
        Ref cs = rig.floats(size_t(ctx) * std::max(1, d.rot / 2)), sn = rig.floats(size_t(ctx) * std::max(1, d.rot / 2));
        Ref kc = rig.floats(size_t(ctx) * d.hkv * d.hd), vc = rig.floats(size_t(ctx) * d.hkv * d.hd);
        Ref pos{rig.ref->upload(&pos0, 4, "pos")};
        Ref scores = rig.zeros(size_t(T) * d.h * ctx * 4), out = rig.zeros(size_t(T) * d.h * d.hd * 4);
        check(rig, {kc, vc, out}, [&](const std::vector<Ref>& o) {
          return Op(op::AttnCore{ad, qg, k, v, qn, kn, cs, sn, o[0], o[1], pos, scores, o[2], T});
        }, "attn h=" + std::to_string(d.h) + " pos=" + std::to_string(pos0) + " T=" + std::to_string(T));
      }
}

TEST(OpsParity, ArgmaxTiesTakeTheLowestIndex) {
  Rig rig;
  std::vector<float> x = {1.f, 5.f, NAN, 5.f, -INFINITY, 2.f};
  Ref xr{rig.ref->upload(x.data(), x.size() * 4, "x")};
  check(rig, {rig.zeros(4)}, [&](const std::vector<Ref>& o) { return Op(op::Argmax{xr, 6, o[0]}); }, "argmax");
  Ref out = rig.zeros(4);
  rig.ref_q->go(op::Argmax{xr, 6, out});
  rig.ref_q->wait();
  EXPECT_EQ(out.as<int32_t>()[0], 1);
}
