// The op parity cases: every op against the scalar reference on random inputs of many shapes,
// on a list of target backends (the CPU kernel sets and thread counts in test_ops_parity.cpp,
// the CUDA backend in tests/cuda/test_cuda.cpp). Results must be bit-identical.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "ops/numerics.h"

using namespace dq;

namespace parity {

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
    if (with_tiny && n >= 32) {  // whole units (8 inputs) for the 4-bit unit's integer scale
      auto unit = [&]() { return v.data() + 8 * (rng() % (n / 8)); };
      float* zero = unit();
      for (int k = 0; k < 8; ++k) zero[k] = 0.0f;
      float* tiny = unit();  // below 2^-100: the unit counts as zero
      for (int k = 0; k < 8; ++k) tiny[k] = d(rng) * 1e-32f;
      float* wide = unit();  // one large value beside small ones, and a negative power of two
      for (int k = 0; k < 8; ++k) wide[k] = d(rng) * 1e-9f;
      wide[rng() % 8] = 3.0e12f;
      wide[rng() % 8] = -0x1p21f;
      if (n >= 64) {  // the integer scale's ends: values that round to +-2^22, and ties (to even)
        float* top = unit();
        const float edge[8] = {0x1.fffffep0f, -0x1.fffffep0f, 0x1.4p-20f, -0x1.4p-20f, 0x1.cp-20f, 0x1p-22f, -0x1.8p-21f, 0.0f};
        for (int k = 0; k < 8; ++k) top[k] = edge[k];
      }
    }
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

// A backend to compare with the reference. Host inputs reach it through map(): the identity
// for CPU backends (they read host memory), an upload for device backends.
struct Target {
  std::string name;
  std::shared_ptr<Backend> be;
  std::shared_ptr<Queue> q;
  // host buffer -> (the host buffer, kept alive so its address is never reused; its copy)
  std::map<const void*, std::pair<Buffer, Buffer>> uploaded;

  Ref map(const Ref& r) {
    if (!r || be->is_cpu()) return r;
    auto& e = uploaded[r.buf.get()];
    if (!e.second) e = {r.buf, be->upload(r.buf->ptr, r.buf->bytes, r.buf->name)};
    return Ref{e.second, r.off};
  }
  Matrix map(const Matrix& m) {
    Matrix d = m;
    d.w = map(Ref{m.w}).buf;
    if (m.scales) d.scales = map(Ref{m.scales}).buf, d.biases = map(Ref{m.biases}).buf;
    return d;
  }
  // As the engine gives the products their matrices: in the backend's own layout (CUDA: the
  // lane layout of 4-bit matrices with K % 2048 == 0), made once per host matrix.
  std::map<const void*, Matrix> products;
  Matrix map_product(const Matrix& m) {
    auto& e = products[m.w.get()];
    if (!e.w) {
      e = be->product_matrix(map(m));  // (map keeps the host buffer, so its address is not reused)
    }
    return e;
  }
  Ref fresh_copy(const Ref& host) {  // an output buffer with the host buffer's initial bytes
    return Ref{be->upload(host.buf->ptr, host.buf->bytes, "out"), host.off};
  }
  std::vector<uint8_t> read(const Ref& r) {
    std::vector<uint8_t> v(r.buf->bytes);
    q->go(op::Read{r.buf, 0, v.size(), v.data()});
    q->wait();
    return v;
  }
};

using Maker = std::function<Op(Target&, const std::vector<Ref>&)>;

// Runs the op made by `make` on the reference and on every target; `outs` are the host buffers
// the op writes (each run starts from their initial contents). All must match bit for bit.
// steps > 1: the op is issued that many times in one stage (one wait) on every target.
inline void check(Rig& rig, std::vector<Target>& targets, const std::vector<Ref>& outs, const Maker& make,
                  const std::string& what, int steps = 1) {
  Target ref{"reference", std::shared_ptr<Backend>(rig.ref.get(), [](Backend*) {}),
             std::shared_ptr<Queue>(rig.ref_q.get(), [](Queue*) {}), {}, {}};
  std::vector<Ref> want;
  for (const Ref& o : outs) want.push_back(rig.copy(o));
  for (int i = 0; i < steps; ++i) rig.ref_q->go(make(ref, want));
  rig.ref_q->wait();
  for (Target& t : targets) {
    std::vector<Ref> got;
    for (const Ref& o : outs) got.push_back(t.fresh_copy(o));
    for (int i = 0; i < steps; ++i) t.q->go(make(t, got));
    t.q->wait();
    for (size_t i = 0; i < outs.size(); ++i) {
      std::vector<uint8_t> g = t.read(got[i]);
      ASSERT_EQ(std::memcmp(want[i].buf->ptr, g.data(), g.size()), 0)
          << what << ": output " << i << " differs on " << t.name;
    }
  }
}

struct Fmt {
  WFormat f;
  int bits, gs;
  DType sd;
  const char* name;
};
inline const Fmt kFormats[] = {
    {WFormat::Affine, 4, 64, DType::BF16, "q4g64"}, {WFormat::Affine, 4, 32, DType::BF16, "q4g32"},
    {WFormat::Affine, 4, 128, DType::BF16, "q4g128"}, {WFormat::Affine, 4, 256, DType::BF16, "q4g256"},
    {WFormat::Affine, 4, 64, DType::F16, "q4g64-f16"},
    {WFormat::Affine, 4, 64, DType::F32, "q4g64-f32"}, {WFormat::Affine, 8, 64, DType::BF16, "q8g64"},
    {WFormat::BF16, 0, 0, DType::BF16, "bf16"}, {WFormat::F16, 0, 0, DType::BF16, "f16"},
    {WFormat::F32, 0, 0, DType::BF16, "f32"},
};

inline void project_cases(std::vector<Target>& targets, bool quick = false) {
  Rig rig;
  for (const Fmt& f : kFormats)
    for (int K : {128, 256, 384, 640, 2048})
      for (int rows : {1, 5, 17, 64}) {
        if (f.gs && K % f.gs) continue;
        for (int T : {1, 3, 4, 6, 9}) {
          if (K == 2048 && (rows == 17 || T == 6)) continue;  // keep the test fast
          if (quick && (T == 6 || rows == 17 || K == 640)) continue;
          Matrix m = rig.matrix(f.f, rows, K, f.bits, f.gs, f.sd);
          bool tiny = T == 3;
          Ref x = rig.inputs(size_t(T) * K, tiny), norm = rig.floats(K);
          Ref y = rig.zeros(size_t(T) * rows * 4);
          // Both layouts: the checkpoint's and the backend's own for products (as the engine).
          for (bool own : {false, true}) {
            std::string what = std::string(f.name) + " K=" + std::to_string(K) + " rows=" + std::to_string(rows) +
                               " T=" + std::to_string(T) + (own ? " product layout" : "");
            auto mat = [&](Target& g) { return own ? g.map_product(m) : g.map(m); };
            check(rig, targets, {y}, [&](Target& g, const std::vector<Ref>& o) {
              return Op(op::Project{g.map(x), T % 2 ? g.map(norm) : Ref{}, 1e-6f, {mat(g)}, {o[0]}, 1, T});
            }, "project " + what);
            check(rig, targets, {y}, [&](Target& g, const std::vector<Ref>& o) {
              return Op(op::ProjectAdd{g.map(x), mat(g), o[0], T});
            }, "project_add " + what);
          }
        }
      }
}

// Enough rows for the CUDA kernel's paired-row path (and a multi-matrix launch across it).
inline void large_project_cases(std::vector<Target>& targets) {
  Rig rig;
  const int K = 256;
  Matrix big = rig.matrix(WFormat::Affine, 7001, K), small = rig.matrix(WFormat::Affine, 33, K);
  for (int T : {1, 2}) {
    Ref x = rig.inputs(size_t(T) * K), norm = rig.floats(K);
    std::vector<Ref> ys = {rig.zeros(size_t(T) * 7001 * 4), rig.zeros(size_t(T) * 33 * 4)};
    check(rig, targets, ys, [&](Target& g, const std::vector<Ref>& o) {
      return Op(op::Project{g.map(x), g.map(norm), 1e-6f, {g.map(big), g.map(small)}, {o[0], o[1]}, 2, T});
    }, "large project T=" + std::to_string(T));
    check(rig, targets, {ys[0]}, [&](Target& g, const std::vector<Ref>& o) {
      return Op(op::ProjectAdd{g.map(x), g.map(big), o[0], T});
    }, "large project_add T=" + std::to_string(T));
  }
}

// The 2B decode's products at their real shapes (K = 2048 and 6144, bf16 scales, groups of
// 64): the CUDA resident kernel's fast path (bf16 scales, K a multiple of 2048) at the row
// counts per block the decode step gives it (in-projections ~62, gate/up ~47, down and out 16).
inline void decode_shape_cases(std::vector<Target>& targets) {
  Rig rig;
  const int D = 2048, I = 6144;
  Matrix qkv = rig.matrix(WFormat::Affine, I, D), z = rig.matrix(WFormat::Affine, D, D),
         b = rig.matrix(WFormat::Affine, 16, D), a = rig.matrix(WFormat::Affine, 16, D);
  Matrix gate = rig.matrix(WFormat::Affine, I, D), up = rig.matrix(WFormat::Affine, I, D),
         down = rig.matrix(WFormat::Affine, D, I), out = rig.matrix(WFormat::Affine, D, D);
  Ref x = rig.inputs(D), xi = rig.inputs(I), norm = rig.floats(D);
  std::vector<Ref> ys = {rig.zeros(size_t(I) * 4), rig.zeros(size_t(D) * 4), rig.zeros(16 * 4), rig.zeros(16 * 4)};
  check(rig, targets, ys, [&](Target& g, const std::vector<Ref>& o) {
    return Op(op::Project{g.map(x), g.map(norm), 1e-6f,
                          {g.map_product(qkv), g.map_product(z), g.map_product(b), g.map_product(a)},
                          {o[0], o[1], o[2], o[3]}, 4, 1});
  }, "decode in-projections");
  check(rig, targets, {rig.zeros(size_t(I) * 4)}, [&](Target& g, const std::vector<Ref>& o) {
    return Op(op::SwiGLU{g.map(x), g.map(norm), 1e-6f, g.map_product(gate), g.map_product(up), o[0], 1});
  }, "decode gate/up");
  check(rig, targets, {rig.inputs(D)}, [&](Target& g, const std::vector<Ref>& o) {
    return Op(op::ProjectAdd{g.map(xi), g.map_product(down), o[0], 1});
  }, "decode down");
  check(rig, targets, {rig.inputs(D)}, [&](Target& g, const std::vector<Ref>& o) {
    return Op(op::ProjectAdd{g.map(x), g.map_product(out), o[0], 1});
  }, "decode out");
  // The tied head with its final norm (the CUDA pipelined head kernel, 1881-1882 rows per block).
  Matrix head = rig.matrix(WFormat::Affine, 248320, D);
  check(rig, targets, {rig.zeros(size_t(248320) * 4)}, [&](Target& g, const std::vector<Ref>& o) {
    return Op(op::Project{g.map(x), g.map(norm), 1e-6f, {g.map(head)}, {o[0]}, 1, 1});
  }, "decode head");
}

// One decode step's products at the other Qwen3.5 sizes' shapes (bf16 scales, groups of 64, one
// token): the 0.8B's widths 1024 and 3584 and the 4B's 2560 and 9216 (not multiples of 2048: the
// checkpoint's layout, and stage parts of 3584, 2560 and 3072 inputs in CUDA's pipelined product),
// the 4B's and 9B's 4096 and 12288 (the lane layout; rows too many for the resident kernel), with
// several matrices, SwiGLU, the residual add and the tall heads. Large: the GPU suite runs them.
inline void family_shape_cases(std::vector<Target>& targets) {
  Rig rig;
  struct Shape {
    const char* name;
    int D, I, qkv, z, heads, out_k;
  };
  for (Shape sh : {Shape{"0.8b", 1024, 3584, 6144, 2048, 16, 2048}, Shape{"4b", 2560, 9216, 8192, 4096, 32, 4096},
                   Shape{"9b", 4096, 12288, 8192, 4096, 32, 4096}}) {
    const int D = sh.D, I = sh.I;
    const std::string n = sh.name;
    Matrix qkv = rig.matrix(WFormat::Affine, sh.qkv, D), z = rig.matrix(WFormat::Affine, sh.z, D),
           b = rig.matrix(WFormat::Affine, sh.heads, D), a = rig.matrix(WFormat::Affine, sh.heads, D);
    Matrix gate = rig.matrix(WFormat::Affine, I, D), up = rig.matrix(WFormat::Affine, I, D),
           down = rig.matrix(WFormat::Affine, D, I), out = rig.matrix(WFormat::Affine, D, sh.out_k);
    Ref x = rig.inputs(D), xi = rig.inputs(I), xo = rig.inputs(sh.out_k), norm = rig.floats(D);
    std::vector<Ref> ys = {rig.zeros(size_t(sh.qkv) * 4), rig.zeros(size_t(sh.z) * 4), rig.zeros(size_t(sh.heads) * 4),
                           rig.zeros(size_t(sh.heads) * 4)};
    check(rig, targets, ys, [&](Target& g, const std::vector<Ref>& o) {
      return Op(op::Project{g.map(x), g.map(norm), 1e-6f,
                            {g.map_product(qkv), g.map_product(z), g.map_product(b), g.map_product(a)},
                            {o[0], o[1], o[2], o[3]}, 4, 1});
    }, n + " in-projections");
    check(rig, targets, {rig.zeros(size_t(I) * 4)}, [&](Target& g, const std::vector<Ref>& o) {
      return Op(op::SwiGLU{g.map(x), g.map(norm), 1e-6f, g.map_product(gate), g.map_product(up), o[0], 1});
    }, n + " gate/up");
    check(rig, targets, {rig.inputs(D)}, [&](Target& g, const std::vector<Ref>& o) {
      return Op(op::ProjectAdd{g.map(xi), g.map_product(down), o[0], 1});
    }, n + " down");
    check(rig, targets, {rig.inputs(D)}, [&](Target& g, const std::vector<Ref>& o) {
      return Op(op::ProjectAdd{g.map(xo), g.map_product(out), o[0], 1});
    }, n + " out");
    Matrix head = rig.matrix(WFormat::Affine, 248320, D);
    check(rig, targets, {rig.zeros(size_t(248320) * 4)}, [&](Target& g, const std::vector<Ref>& o) {
      return Op(op::Project{g.map(x), g.map(norm), 1e-6f, {g.map(head)}, {o[0]}, 1, 1});
    }, n + " head");
  }
}

// gate/up in the products' layout (CUDA: the resident kernel's lane layout) at shapes beside the
// 2B's: one and two chunks of 2048 inputs and the 0.8B's half chunk (K = 1024), pair counts
// that split unevenly over the blocks, several tokens, and an x with zero units and a huge input
// (x's limbs at their extremes).
inline void swiglu_product_cases(std::vector<Target>& targets) {
  Rig rig;
  for (int K : {1024, 2048, 4096})
    for (int T : {1, 3}) {
      const int I = K == 4096 ? 1540 : 1000;
      Matrix gate = rig.matrix(WFormat::Affine, I, K), up = rig.matrix(WFormat::Affine, I, K);
      Ref x = rig.inputs(size_t(T) * K), norm = rig.floats(K);
      float* xv = x.as<float>();
      for (int k = 0; k < 16; ++k) xv[k] = 0.0f;  // two units of zeros (step 0)
      xv[21] = 3.0e4f;                             // a unit whose other inputs round to small limbs
      check(rig, targets, {rig.zeros(size_t(T) * I * 4)}, [&](Target& g, const std::vector<Ref>& o) {
        return Op(op::SwiGLU{g.map(x), g.map(norm), 1e-6f, g.map_product(gate), g.map_product(up), o[0], T});
      }, "swiglu products K=" + std::to_string(K) + " T=" + std::to_string(T));
    }
  // The half chunk's scales at every group size the lane layout takes (CUDA: a lane's 4 scales
  // are one 8-byte load; groups of 256 give all lanes the same 4), stored products of several
  // matrices (attention's in-projections) and a residual product, one and two tokens.
  for (int gs : {8, 32, 128, 256})
    for (int T : {1, 2}) {
      const int K = 1024;
      Matrix q = rig.matrix(WFormat::Affine, 700, K, 4, gs), k = rig.matrix(WFormat::Affine, 130, K, 4, gs),
             r = rig.matrix(WFormat::Affine, 300, K, 4, gs);
      Ref x = rig.inputs(size_t(T) * K), norm = rig.floats(K);
      const std::string n = " K=1024 gs=" + std::to_string(gs) + " T=" + std::to_string(T);
      check(rig, targets, {rig.zeros(size_t(T) * 700 * 4), rig.zeros(size_t(T) * 130 * 4)},
            [&](Target& g, const std::vector<Ref>& o) {
              return Op(op::Project{g.map(x), g.map(norm), 1e-6f, {g.map_product(q), g.map_product(k)}, {o[0], o[1]}, 2, T});
            }, "stored products" + n);
      check(rig, targets, {rig.inputs(size_t(T) * 300)}, [&](Target& g, const std::vector<Ref>& o) {
        return Op(op::ProjectAdd{g.map(x), g.map_product(r), o[0], T});
      }, "residual product" + n);
    }
  // Widths with a last part of 1-7 units a lane in the row layout (CUDA: the resident kernel's
  // fast path where its rows leave room beside it; the 0.8B's down is K = 3584).
  for (int K : {3584, 1792, 2304})
    for (int T : {1, 2}) {
      Matrix r = rig.matrix(WFormat::Affine, 1030, K, 4, K == 2304 ? 128 : 64);
      Ref x = rig.inputs(size_t(T) * K);
      check(rig, targets, {rig.inputs(size_t(T) * 1030)}, [&](Target& g, const std::vector<Ref>& o) {
        return Op(op::ProjectAdd{g.map(x), g.map_product(r), o[0], T});
      }, "residual product K=" + std::to_string(K) + " T=" + std::to_string(T));
    }
  // Many rows a warp: with K = 256 a block of the CUDA resident kernel holds ~300 gate/up rows
  // (40000 over 132 SMs), ~38 a warp, so its SwiGLU epilogue (made after the dots, 32 rows a
  // lane window) flushes a full window and then a partial one.
  {
    const int K = 256, I = 40000;
    Matrix gate = rig.matrix(WFormat::Affine, I, K), up = rig.matrix(WFormat::Affine, I, K);
    Ref x = rig.inputs(K), norm = rig.floats(K);
    check(rig, targets, {rig.zeros(size_t(I) * 4)}, [&](Target& g, const std::vector<Ref>& o) {
      return Op(op::SwiGLU{g.map(x), g.map(norm), 1e-6f, g.map_product(gate), g.map_product(up), o[0], 1});
    }, "swiglu products K=256, 40000 rows");
  }
}

// A prefill chunk's products at the 2B's shapes (CUDA: the prefill kernel, a warp's four rows
// against a tile of up to 8 tokens): token counts that fill no tile, one and several, the whole
// default chunk (64), in the products' layout (K = 2048 and 6144), with the in-projections' four
// matrices (16-row b and a), gate/up, down's residual add, and inputs with the unit's edge
// values (with_tiny). Large: the GPU suite runs them.
inline void prefill_shape_cases(std::vector<Target>& targets) {
  Rig rig;
  const int D = 2048, I = 6144;
  Matrix qkv = rig.matrix(WFormat::Affine, I, D), z = rig.matrix(WFormat::Affine, D, D),
         b = rig.matrix(WFormat::Affine, 16, D), a = rig.matrix(WFormat::Affine, 16, D);
  Matrix gate = rig.matrix(WFormat::Affine, I, D), up = rig.matrix(WFormat::Affine, I, D),
         down = rig.matrix(WFormat::Affine, D, I);
  Ref norm = rig.floats(D);
  for (int T : {2, 5, 8, 13, 33, 64}) {  // (33: the tensor-core kernel's 16-token blocks, the last partly empty)
    const std::string n = " T=" + std::to_string(T);
    Ref x = rig.inputs(size_t(T) * D, true), xi = rig.inputs(size_t(T) * I, true);
    std::vector<Ref> ys = {rig.zeros(size_t(T) * I * 4), rig.zeros(size_t(T) * D * 4), rig.zeros(size_t(T) * 16 * 4),
                           rig.zeros(size_t(T) * 16 * 4)};
    check(rig, targets, ys, [&](Target& g, const std::vector<Ref>& o) {
      return Op(op::Project{g.map(x), g.map(norm), 1e-6f,
                            {g.map_product(qkv), g.map_product(z), g.map_product(b), g.map_product(a)},
                            {o[0], o[1], o[2], o[3]}, 4, T});
    }, "prefill in-projections" + n);
    check(rig, targets, {rig.zeros(size_t(T) * I * 4)}, [&](Target& g, const std::vector<Ref>& o) {
      return Op(op::SwiGLU{g.map(x), g.map(norm), 1e-6f, g.map_product(gate), g.map_product(up), o[0], T});
    }, "prefill gate/up" + n);
    check(rig, targets, {rig.inputs(size_t(T) * D)}, [&](Target& g, const std::vector<Ref>& o) {
      return Op(op::ProjectAdd{g.map(xi), g.map_product(down), o[0], T});
    }, "prefill down" + n);
    check(rig, targets, {rig.zeros(size_t(T) * 16 * 4)}, [&](Target& g, const std::vector<Ref>& o) {
      return Op(op::Project{g.map(x), Ref{}, 1e-6f, {g.map_product(b)}, {o[0]}, 1, T});
    }, "prefill 16 rows, no norm" + n);
  }
}

// Tall 4-bit products (the CUDA output-head kernel takes 32768 rows and more, K <= 2048): group
// sizes 32/64/128, with and without the fused norm, one and two tokens.
inline void tall_project_cases(std::vector<Target>& targets) {
  Rig rig;
  const int rows = 33001;
  for (int K : {256, 768, 1024, 2048, 2560, 4096})
    for (int gs : {32, 64, 128}) {
      Matrix m = rig.matrix(WFormat::Affine, rows, K, 4, gs, DType::BF16);
      for (int T : {1, 2})
        for (bool with_norm : {true, false}) {
          if (T == 2 && with_norm) continue;
          Ref x = rig.inputs(size_t(T) * K), norm = rig.floats(K);
          Ref y = rig.zeros(size_t(T) * rows * 4);
          const std::string what = "tall K=" + std::to_string(K) + " gs=" + std::to_string(gs) +
                                   " T=" + std::to_string(T) + (with_norm ? " norm" : "");
          check(rig, targets, {y}, [&](Target& g, const std::vector<Ref>& o) {
            return Op(op::Project{g.map(x), with_norm ? g.map(norm) : Ref{}, 1e-6f, {g.map(m)}, {o[0]}, 1, T});
          }, what);
        }
    }
}

inline void mixed_and_swiglu_cases(std::vector<Target>& targets) {
  Rig rig;
  const int K = 256, T = 5;
  Matrix a = rig.matrix(WFormat::Affine, 48, K), b = rig.matrix(WFormat::BF16, 16, K),
         c = rig.matrix(WFormat::Affine, 4, K, 4, 32), d = rig.matrix(WFormat::Affine, 4, K, 8, 64);
  Ref x = rig.inputs(size_t(T) * K), norm = rig.floats(K);
  std::vector<Ref> ys = {rig.zeros(T * 48 * 4), rig.zeros(T * 16 * 4), rig.zeros(T * 4 * 4), rig.zeros(T * 4 * 4)};
  check(rig, targets, ys, [&](Target& g, const std::vector<Ref>& o) {
    return Op(op::Project{g.map(x), g.map(norm), 1e-6f, {g.map(a), g.map(b), g.map(c), g.map(d)}, {o[0], o[1], o[2], o[3]}, 4, T});
  }, "project x4");
  for (const Fmt& f : kFormats)
    for (int T2 : {1, 4, 7}) {
      Matrix g = rig.matrix(f.f, 40, K, f.bits, f.gs, f.sd), u = rig.matrix(f.f, 40, K, f.bits, f.gs, f.sd);
      Ref x2 = rig.inputs(size_t(T2) * K);
      check(rig, targets, {rig.zeros(size_t(T2) * 40 * 4)}, [&](Target& tg, const std::vector<Ref>& o) {
        return Op(op::SwiGLU{tg.map(x2), tg.map(norm), 1e-6f, tg.map(g), tg.map(u), o[0], T2});
      }, std::string("swiglu ") + f.name);
    }
}

inline void embed_cases(std::vector<Target>& targets) {
  Rig rig;
  for (const Fmt& f : kFormats) {
    if (f.gs && 128 % f.gs) continue;
    Matrix t = rig.matrix(f.f, 50, 128, f.bits, f.gs, f.sd);
    std::vector<int32_t> ids = {0, 49, 7, 7, 23};
    Ref tok{rig.ref->upload(ids.data(), ids.size() * 4, "ids")};
    check(rig, targets, {rig.zeros(5 * 128 * 4)}, [&](Target& g, const std::vector<Ref>& o) {
      return Op(op::Embed{g.map(t), g.map(tok), o[0], 5});
    }, std::string("embed ") + f.name);
  }
}

inline void gdn_cases(std::vector<Target>& targets) {
  Rig rig;
  struct D {
    int hk, hv, dk, dv;
  };
  // Hk == Hv with 128-dim heads (the 0.8B and 2B): CUDA's fused kernel (T > 1) and its split
  // decode kernel (T == 1), at 4 heads and at the 2B's 16. Hv == 2 Hk with 128-dim heads (the
  // 4B and 9B: 16 key heads, 32 value heads): at T == 1 the split kernel's grouped clusters.
  // With 128-dim heads and T >= 2, CUDA's prefill scan (gdn_prefill.cu): T = 2 takes the new conv
  // state partly from the old, T = 20 and 33 cross staging groups and wrap the ring.
  for (D d : {D{2, 4, 32, 32}, D{1, 1, 8, 16}, D{4, 4, 64, 64}, D{2, 4, 128, 128}, D{3, 6, 24, 40}, D{4, 4, 128, 128},
              D{16, 16, 128, 128}, D{16, 32, 128, 128}})
    for (int T : {1, 2, 3, 7, 20, 33}) {
      if (T > 7 && d.dk != 128) continue;  // CUDA's prefill scan stages 8 tokens a group, 3 in a ring
      GdnDims g{d.hk, d.hv, d.dk, d.dv, 4, 1e-6f};
      const int C = g.conv_channels(), VD = g.value_dim();
      Ref mixed = rig.inputs(size_t(T) * C), z = rig.inputs(size_t(T) * VD), b = rig.floats(size_t(T) * d.hv, 2.f),
          a = rig.floats(size_t(T) * d.hv, 2.f), conv_w = rig.floats(size_t(C) * 4, 0.4f), A = rig.floats(d.hv),
          dt = rig.floats(d.hv), norm = rig.floats(d.dv);
      for (int h = 0; h < d.hv; ++h) A.as<float>()[h] = -std::fabs(A.as<float>()[h]) - 0.5f;
      Ref conv_state = rig.floats(size_t(3) * C), S = rig.floats(size_t(d.hv) * d.dk * d.dv, 0.1f);
      Ref out = rig.zeros(size_t(T) * VD * 4), scratch = rig.zeros(size_t(T) * C * 4);
      check(rig, targets, {conv_state, S, out}, [&](Target& tg, const std::vector<Ref>& o) {
        return Op(op::GdnCore{g, tg.map(mixed), tg.map(z), tg.map(b), tg.map(a), tg.map(conv_w), tg.map(A), tg.map(dt),
                              tg.map(norm), o[0], o[1], o[2], tg.map(scratch), T});
      }, "gdn hk=" + std::to_string(d.hk) + " hv=" + std::to_string(d.hv) + " T=" + std::to_string(T));
    }
}

// Two GDN steps on one state in one stage: on CUDA the first may read its state before its
// programmatic wait (GdnArgs::early) and the second must not; both equal the reference's.
inline void gdn_two_steps_case(std::vector<Target>& targets) {
  Rig rig;
  for (int hk : {16, 8}) {  // the 2B's heads; grouped as the 4B's (two value heads a key head)
    const int H = 16;
    GdnDims g{hk, H, 128, 128, 4, 1e-6f};
    const int C = g.conv_channels(), VD = g.value_dim();
    Ref mixed = rig.inputs(C), z = rig.inputs(VD), b = rig.floats(H, 2.f), a = rig.floats(H, 2.f),
        conv_w = rig.floats(size_t(C) * 4, 0.4f), A = rig.floats(H), dt = rig.floats(H), norm = rig.floats(128);
    for (int h = 0; h < H; ++h) A.as<float>()[h] = -std::fabs(A.as<float>()[h]) - 0.5f;
    std::vector<Ref> outs = {rig.floats(size_t(3) * C), rig.floats(size_t(H) * 128 * 128, 0.1f),
                             rig.zeros(size_t(VD) * 4)};
    Ref scratch = rig.zeros(size_t(C) * 4);
    auto step = [&](Target& t, const std::vector<Ref>& o) {
      return Op(op::GdnCore{g, t.map(mixed), t.map(z), t.map(b), t.map(a), t.map(conv_w), t.map(A), t.map(dt),
                            t.map(norm), o[0], o[1], o[2], t.map(scratch), 1});
    };
    check(rig, targets, outs, step, "gdn two steps hk=" + std::to_string(hk), 2);
  }
}

// A GDN layer's token mixer as one op (op::ProjectGdn): the in-projections at the 2B's shapes
// (K = 2048, groups of 64, bf16 scales, in the backend's product layout, as the engine gives
// them) feeding the GDN core. On CUDA one token runs as one kernel, a cluster per head (16
// heads: the 2B; 4 heads: fewer clusters); several tokens, or two steps in one stage (the
// first may read its state before its programmatic wait, the second must not), are checked
// too. Every buffer either op writes (but the conv's scratch) must equal the reference's.
inline void gdn_mixer_cases(std::vector<Target>& targets) {
  Rig rig;
  for (int D : {2048, 1024})  // the 2B's hidden, the 0.8B's
  for (int H : {16, 4})
    for (int T : {1, 2}) {
      const int steps = T == 1 ? 2 : 1;
      GdnDims g{H, H, 128, 128, 4, 1e-6f};
      const int C = g.conv_channels(), VD = g.value_dim();
      Matrix qkv = rig.matrix(WFormat::Affine, C, D), zw = rig.matrix(WFormat::Affine, VD, D),
             bw = rig.matrix(WFormat::Affine, H, D), aw = rig.matrix(WFormat::Affine, H, D);
      Ref x = rig.inputs(size_t(T) * D), norm = rig.floats(D);
      Ref conv_w = rig.floats(size_t(C) * 4, 0.4f), A = rig.floats(H), dt = rig.floats(H), gnorm = rig.floats(128);
      for (int h = 0; h < H; ++h) A.as<float>()[h] = -std::fabs(A.as<float>()[h]) - 0.5f;
      std::vector<Ref> outs = {rig.zeros(size_t(T) * C * 4),  rig.zeros(size_t(T) * VD * 4),
                               rig.zeros(size_t(T) * H * 4),  rig.zeros(size_t(T) * H * 4),
                               rig.floats(size_t(3) * C),     rig.floats(size_t(H) * 128 * 128, 0.1f),
                               rig.zeros(size_t(T) * VD * 4)};
      Ref scratch = rig.zeros(size_t(T) * C * 4);  // conv + SiLU output: scratch, as in gdn_cases
      check(rig, targets, outs, [&](Target& tg, const std::vector<Ref>& o) {
        return Op(op::ProjectGdn{
            op::Project{tg.map(x), tg.map(norm), 1e-6f,
                        {tg.map_product(qkv), tg.map_product(zw), tg.map_product(bw), tg.map_product(aw)},
                        {o[0], o[1], o[2], o[3]}, 4, T},
            op::GdnCore{g, o[0], o[1], o[2], o[3], tg.map(conv_w), tg.map(A), tg.map(dt), tg.map(gnorm), o[4], o[5], o[6],
                        tg.map(scratch), T}});
      }, "project_gdn D=" + std::to_string(D) + " H=" + std::to_string(H) + " T=" + std::to_string(T), steps);
    }
}

inline void attn_cases(std::vector<Target>& targets) {
  Rig rig;
  struct D {
    int h, hkv, hd, rot;
  };
  // Contexts of one and of several 64-position chunks (more chunks than the CUDA ring's stages;
  // 302: rows of CUDA's per-head weights padded to 16 bytes).
  for (int ctx : {64, 302})
  for (D d : {D{4, 2, 64, 16}, D{8, 2, 256, 64}, D{2, 2, 32, 32}, D{3, 1, 48, 0}})
    for (int pos0 : {0, 5, 40, 130, 290})
      for (int T : {1, 4}) {
        if ((ctx == 64) != (pos0 <= 40)) continue;
        AttnDims ad{d.h, d.hkv, d.hd, d.rot, ctx, 1e-6f};
        Ref qg = rig.inputs(size_t(T) * d.h * 2 * d.hd), k = rig.inputs(size_t(T) * d.hkv * d.hd),
            v = rig.inputs(size_t(T) * d.hkv * d.hd), qn = rig.floats(d.hd), kn = rig.floats(d.hd);
        Ref cs = rig.floats(size_t(ctx) * std::max(1, d.rot / 2)), sn = rig.floats(size_t(ctx) * std::max(1, d.rot / 2));
        Ref kc = rig.floats(size_t(ctx) * d.hkv * d.hd), vc = rig.floats(size_t(ctx) * d.hkv * d.hd);
        Ref pos{rig.ref->upload(&pos0, 4, "pos")};
        Ref scores = rig.zeros(size_t(T) * d.h * ctx * 4), out = rig.zeros(size_t(T) * d.h * d.hd * 4);
        check(rig, targets, {kc, vc, out}, [&](Target& g, const std::vector<Ref>& o) {
          return Op(op::AttnCore{ad, g.map(qg), g.map(k), g.map(v), g.map(qn), g.map(kn), g.map(cs), g.map(sn), o[0], o[1],
                                 g.map(pos), g.map(scores), o[2], T});
        }, "attn h=" + std::to_string(d.h) + " ctx=" + std::to_string(ctx) + " pos=" + std::to_string(pos0) +
               " T=" + std::to_string(T));
      }
}

// Two decode attention steps on one cache in one stage, the position advanced in between: on
// CUDA the first may read the position and the cache before its programmatic wait
// (AttnArgs::early) and the second must not; the new row's chunk in and past the V ring's
// first stages.
inline void attn_two_steps_case(std::vector<Target>& targets) {
  Rig rig;
  const int h = 8, hkv = 2, hd = 256, rot = 64, ctx = 300;
  AttnDims ad{h, hkv, hd, rot, ctx, 1e-6f};
  for (int pos0 : {5, 130, 250}) {
    Ref qg = rig.inputs(size_t(h) * 2 * hd), k = rig.inputs(size_t(hkv) * hd), v = rig.inputs(size_t(hkv) * hd),
        qn = rig.floats(hd), kn = rig.floats(hd);
    Ref cs = rig.floats(size_t(ctx) * rot / 2), sn = rig.floats(size_t(ctx) * rot / 2);
    Ref kc = rig.floats(size_t(ctx) * hkv * hd), vc = rig.floats(size_t(ctx) * hkv * hd);
    Ref pos{rig.ref->upload(&pos0, 4, "pos")};
    Ref scores = rig.zeros(size_t(h) * ctx * 4), out = rig.zeros(size_t(h) * hd * 4);
    int n = 0;  // attention, advance, attention
    check(rig, targets, {kc, vc, out, pos}, [&](Target& g, const std::vector<Ref>& o) {
      if (n++ % 3 == 1) return Op(op::AdvancePos{o[3], 1});
      return Op(op::AttnCore{ad, g.map(qg), g.map(k), g.map(v), g.map(qn), g.map(kn), g.map(cs), g.map(sn), o[0], o[1],
                             o[3], g.map(scores), o[2], 1});
    }, "attn two steps pos=" + std::to_string(pos0), 3);
  }
}

inline void argmax_cases(std::vector<Target>& targets) {
  Rig rig;
  std::vector<std::vector<float>> cases = {{1.f, 5.f, NAN, 5.f, -INFINITY, 2.f}, {NAN, -INFINITY, -INFINITY},
                                           {-INFINITY, NAN}, {0.f, -0.f, 0.f}, {-3.f, -1.f, -1.f, -2.f}};
  std::vector<float> big(248320);
  for (size_t i = 0; i < big.size(); ++i) big[i] = float((i * 7919) % 100003) * 1e-3f;
  big[200001] = big[99999] = 1000.f;  // the largest twice, far apart: the lower index
  cases.push_back(big);
  std::vector<float> none(70000, NAN);  // nothing beats -inf, over many chunks: index 0
  none[40000] = -INFINITY;
  cases.push_back(none);
  for (const auto& x : cases) {
    Ref xr{rig.ref->upload(x.data(), x.size() * 4, "x")};
    const int n = int(x.size());
    check(rig, targets, {rig.zeros(4)}, [&](Target& g, const std::vector<Ref>& o) {
      return Op(op::Argmax{g.map(xr), n, o[0], {}});
    }, "argmax n=" + std::to_string(n));
  }
  Ref xr{rig.ref->upload(cases[0].data(), 24, "x")}, out = rig.zeros(4);
  rig.ref_q->go(op::Argmax{xr, 6, out, {}});
  rig.ref_q->wait();
  EXPECT_EQ(out.as<int32_t>()[0], 1);
}

// TopK: ties, NaN, -inf, +inf, -0, small and vocabulary-sized rows, k from 1 to the maximum.
inline void top_k_cases(std::vector<Target>& targets) {
  Rig rig;
  std::vector<std::vector<float>> rows = {{1.f, 5.f, NAN, 5.f, -INFINITY, 2.f, -0.f, 0.f},
                                          {NAN, -INFINITY, NAN, 3.f, -INFINITY, INFINITY}};
  for (int n : {300, 4096, 4097, 70000, 248320, 270000}) {  // 270000: past the CUDA selection path
    std::vector<float> x(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) x[size_t(i)] = float((int64_t(i) * 7919) % 1009) * 0.25f - 100.f;  // many ties
    x[size_t(n / 3)] = NAN;
    x[size_t(n / 2)] = -INFINITY;
    rows.push_back(x);
  }
  // Rising (every value beats the kept ones), falling (none after the first k) and random rows.
  std::vector<float> up(5000), down(5000), rnd(70000);
  for (int i = 0; i < 5000; ++i) up[size_t(i)] = 0.01f * float(i), down[size_t(i)] = -0.01f * float(i);
  uint32_t seed = 12345;
  for (float& v : rnd) v = float((seed = seed * 1664525u + 1013904223u) >> 8) * 1e-6f - 8.0f;
  rows.push_back(up);
  rows.push_back(down);
  rows.push_back(rnd);
  for (const auto& x : rows) {
    const int n = int(x.size());
    Ref xr{rig.ref->upload(x.data(), x.size() * 4, "x")};
    for (int k : {1, 3, 21, 256}) {
      if (k > n) continue;
      check(rig, targets, {rig.zeros(size_t(k) * 4), rig.zeros(size_t(k) * 4)}, [&](Target& g, const std::vector<Ref>& o) {
        return Op(op::TopK{g.map(xr), n, k, o[0], o[1]});
      }, "top_k n=" + std::to_string(n) + " k=" + std::to_string(k));
    }
  }
  // The order itself, on the first row: 5 (id 1), 5 (id 3), 2, 1, -0 (id 6) == 0 (id 7), then -inf and NaN by id.
  const auto& x0 = rows[0];
  Ref xr{rig.ref->upload(x0.data(), x0.size() * 4, "x")}, ids = rig.zeros(32), vals = rig.zeros(32);
  rig.ref_q->go(op::TopK{xr, 8, 8, ids, vals});
  rig.ref_q->wait();
  const std::vector<int32_t> want = {1, 3, 5, 0, 6, 7, 2, 4};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(ids.as<int32_t>()[i], want[size_t(i)]) << i;
}

// The plain temperature draw (op::SampleDraw): rows of many lengths (chunk and block edges),
// temperatures, min-p and uniforms (0, the middle, next to 1); NaN and -inf inside; rows that
// decline (-1: nothing above -inf, or +inf).
inline void sample_draw_cases(std::vector<Target>& targets) {  // (also its total, the weight sum)
  Rig rig;
  std::mt19937 rng(77);
  std::normal_distribution<float> d(0.f, 3.f);
  std::vector<std::vector<float>> rows = {{2.f}, {NAN, -INFINITY}, {1.f, INFINITY, 3.f}, {-INFINITY, 0.5f, NAN}};
  for (int n : {31, 32, 33, 1023, 1024, 1025, 5000, 248320}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = d(rng);
    x[size_t(n / 3)] = NAN;
    x[size_t(n / 2)] = -INFINITY;
    rows.push_back(x);
  }
  std::vector<float> wide(6001);  // 0 down to -60: weights down to zero through exp's scaling edge
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = -0.01f * float(i);
  rows.push_back(wide);
  for (const auto& x : rows) {
    const int n = int(x.size());
    Ref xr{rig.ref->upload(x.data(), x.size() * 4, "x")};
    for (float T : {0.3f, 1.0f, 2.5f})
      for (float min_p : {0.0f, 0.05f})
        for (double u : {0.0, 0.5, 0.999999999, std::uniform_real_distribution<double>(0, 1)(rng)}) {
          check(rig, targets, {rig.zeros(4), rig.zeros(4), rig.zeros(8)}, [&](Target& g, const std::vector<Ref>& o) {
            return Op(op::SampleDraw{g.map(xr), n, T, min_p, u, o[0], o[1], o[2]});
          }, "sample_draw n=" + std::to_string(n) + " T=" + std::to_string(T) + " min_p=" + std::to_string(min_p) +
                 " u=" + std::to_string(u));
        }
  }
}

}  // namespace parity
