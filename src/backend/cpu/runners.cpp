// The two CPU runners: the scalar reference and the fast one (SIMD kernel set + thread pool).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "backend/cpu/cpu_runner.h"
#include "backend/cpu/kernels.h"
#include "core/error.h"
#include "ops/numerics.h"
#include "ops/reference.h"

namespace dq {

CpuKernels parse_cpu_kernels(const std::string& s) {
  if (s == "auto") return CpuKernels::Auto;
  if (s == "reference") return CpuKernels::Reference;
  if (s == "generic") return CpuKernels::Generic;
  if (s == "avx2") return CpuKernels::Avx2;
  if (s == "avx512") return CpuKernels::Avx512;
  fail("unknown CPU kernel set '{}' (expected auto, reference, generic, avx2 or avx512)", s);
}

const char* cpu_kernels_name(CpuKernels k) {
  switch (k) {
    case CpuKernels::Auto: return "auto";
    case CpuKernels::Reference: return "reference";
    case CpuKernels::Generic: return "generic";
    case CpuKernels::Avx2: return "avx2";
    case CpuKernels::Avx512: return "avx512";
  }
  return "?";
}

namespace {
bool cpu_has_avx2() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}
bool cpu_has_avx512() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni") && cpu_has_avx2();
#else
  return false;
#endif
}
}  // namespace

CpuKernels resolve_cpu_kernels(CpuKernels want) {
  const bool a2 = cpu::avx2_kernels() && cpu_has_avx2();
  const bool a5 = cpu::avx512_kernels() && cpu_has_avx512();
  switch (want) {
    case CpuKernels::Auto: return a5 ? CpuKernels::Avx512 : a2 ? CpuKernels::Avx2 : CpuKernels::Generic;
    case CpuKernels::Avx2:
      if (!a2) fail("CPU kernel set 'avx2' is not available on this CPU/build");
      return want;
    case CpuKernels::Avx512:
      if (!a5) fail("CPU kernel set 'avx512' is not available on this CPU/build");
      return want;
    default: return want;
  }
}

namespace {

class ReferenceRunner : public CpuRunner {
 public:
  void run(const Op& op) override {
    std::visit([](const auto& o) { ref::run(o); }, op);
  }
  std::string describe() const override { return "reference"; }
};

class FastRunner : public CpuRunner {
 public:
  FastRunner(const cpu::KernelSet* ks, int threads) : ks_(ks), pool_(threads) {}
  std::string describe() const override { return ks_->name; }

  void run(const Op& op) override {
    std::visit([this](const auto& o) { exec(o); }, op);
  }

 private:
  template <class T>
  void exec(const T& o) {
    ref::run(o);
  }

  // Top-k in one pass with a running threshold: a key enters a k-long min-heap only when it
  // beats the least kept, and a block of 64 whose largest value does not exceed the least kept
  // value is skipped whole (a later equal value has the smaller key: keys carry their index,
  // so they are unique). Then the k keys are sorted: the reference's keys in its order.
  void exec(const op::TopK& o) {
    ref::check_top_k(o);
    const float* x = o.x.as<float>();
    heap_.clear();
    const auto least_first = std::greater<uint64_t>();
    float thr = -INFINITY;  // the least kept value once the heap is full (NaN counts as -inf)
    for (int b0 = 0; b0 < o.n; b0 += 64) {
      const int b1 = std::min(o.n, b0 + 64);
      if (int(heap_.size()) == o.k) {
        float m = -INFINITY;
        for (int i = b0; i < b1; ++i) m = x[i] > m ? x[i] : m;  // NaN is never the largest
        if (!(m > thr)) continue;
      }
      for (int i = b0; i < b1; ++i) {
        if (int(heap_.size()) < o.k) {
          heap_.push_back(num::top_key(x[i], i));
          std::push_heap(heap_.begin(), heap_.end(), least_first);
          if (int(heap_.size()) < o.k) continue;
        } else {
          if (!(x[i] > thr)) continue;  // at most equal to the least kept, and later: smaller
          const uint64_t key = num::top_key(x[i], i);
          if (!(key > heap_.front())) continue;
          std::pop_heap(heap_.begin(), heap_.end(), least_first);
          heap_.back() = key;
          std::push_heap(heap_.begin(), heap_.end(), least_first);
        }
        const float v = x[num::top_key_index(heap_.front())];
        thr = std::isnan(v) ? -INFINITY : v;
      }
    }
    std::sort(heap_.begin(), heap_.end(), std::greater<uint64_t>());
    for (int i = 0; i < o.k; ++i) {
      const int id = num::top_key_index(heap_[size_t(i)]);
      o.ids.as<int32_t>()[i] = id;
      o.vals.as<float>()[i] = x[id];
    }
  }

  // The reference's argmax (the first index of the largest value; NaN never wins; 0 when nothing
  // beats -inf) over chunks in parallel, each chunk its own first best, then the chunks in order
  // with a strictly larger value winning: the same index.
  void exec(const op::Argmax& o) {
    const float* x = o.x.as<float>();
    constexpr int64_t kGrain = 1 << 14;
    struct Best {
      float v = -INFINITY;
      int i = -1;
    };
    std::vector<Best> part(size_t((o.n + kGrain - 1) / kGrain));
    pool_.parallel_for(o.n, [&](int64_t b, int64_t e, int) {
      Best c;
      for (int64_t i = b; i < e; ++i)
        if (x[i] > c.v) c.v = x[i], c.i = int(i);
      part[size_t(b / kGrain)] = c;
    }, kGrain);
    Best best{-INFINITY, 0};
    for (const Best& c : part)
      if (c.i >= 0 && c.v > best.v) best = c;
    o.out.as<int32_t>()[0] = best.i;
    if (o.out2) o.out2.as<int32_t>()[0] = best.i;
  }

  // The draw's sums in parallel over blocks of 32 chunks (each chunk's sum in id order, as the
  // reference), the weights by the kernel set's vector exp; the walk as the reference.
  void exec(const op::SampleDraw& o) {
    ref::check_sample_draw(o);
    const float* x = o.x.as<float>();
    const int n = o.n, C = num::kDrawChunk, NC = num::kDrawChunks, B = C * NC;
    const int nblocks = (n + B - 1) / B;
    ref::DrawSums d;
    std::vector<float> part(size_t(pool_.size()), -INFINITY);
    pool_.parallel_for(n, [&](int64_t b, int64_t e, int th) {
      float m = part[size_t(th)];
      for (int64_t i = b; i < e; ++i)
        if (x[i] > m) m = x[i];  // NaN compares false; max is order-free
      part[size_t(th)] = m;
    }, 1 << 14);
    for (float m : part)
      if (m > d.m) d.m = m;
    if (d.m > -INFINITY && d.m < INFINITY) {
      d.chunk.assign(size_t(nblocks) * NC, 0.0);
      d.block.assign(size_t(nblocks), 0.0);
      pool_.parallel_for(nblocks, [&](int64_t b0, int64_t b1, int) {
        float w[num::kDrawChunk * num::kDrawChunks];
        for (int64_t b = b0; b < b1; ++b) {
          const int i0 = int(b) * B, cnt = std::min(B, n - i0);
          ks_->draw_weights(x + i0, cnt, d.m, o.temperature, o.min_p, w);
          double bs = 0.0;
          for (int c = 0; c < NC; ++c) {
            double s = 0.0;
            for (int i = c * C; i < std::min(cnt, (c + 1) * C); ++i) s += double(w[i]);
            d.chunk[size_t(b) * NC + size_t(c)] = s;
            bs += s;
          }
          d.block[size_t(b)] = bs;
        }
      }, 8);
      for (double s : d.block) d.Z += s;
    }
    ref::sample_draw_finish(o, d);
  }

  void exec(const op::Project& o) {
    std::array<const Matrix*, op::Project::kMax> ms{};
    for (int i = 0; i < o.n_out; ++i) ms[i] = &o.w[i];
    products(ms.data(), o.y.data(), o.n_out, o.x, o.norm, o.eps, o.n_tokens, Epi::Store, nullptr);
  }
  void exec(const op::ProjectAdd& o) {
    const Matrix* m = &o.w;
    products(&m, &o.acc, 1, o.x, Ref{}, 0.0f, o.n_tokens, Epi::Add, nullptr);
  }
  void exec(const op::SwiGLU& o) {
    const Matrix* m = &o.gate;
    products(&m, &o.out, 1, o.x, o.norm, o.eps, o.n_tokens, Epi::SwiGLU, &o.up);
  }

  void exec(const op::GdnCore& o) {
    const int C = o.d.conv_channels(), HkDk = o.d.n_k_heads * o.d.k_dim;
    u_.resize(C);
    qn_.resize(HkDk);
    kn_.resize(HkDk);
    for (int t = 0; t < o.n_tokens; ++t) {
      ks_->gdn_prep(o, t, u_.data(), qn_.data(), kn_.data());
      const int64_t per_head = int64_t(o.d.k_dim) * o.d.v_dim;
      pool_.parallel_for(o.d.n_v_heads, [&](int64_t h0, int64_t h1, int) {
        ks_->gdn_heads(o, t, int(h0), int(h1), u_.data(), qn_.data(), kn_.data());
      }, std::max<int64_t>(1, (int64_t(1) << 15) / per_head));
    }
  }

  void exec(const op::ProjectGdn& o) {
    exec(o.proj);
    exec(o.core);
  }

  void exec(const op::AttnCore& o) {
    for (int t = 0; t < o.n_tokens; ++t) ks_->attn_append(o, t);
    const int H = o.d.n_heads;
    const int64_t per_head = int64_t(o.pos.as<int32_t>()[0] + o.n_tokens) * o.d.head_dim;
    pool_.parallel_for(int64_t(o.n_tokens) * H, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) ks_->attn_heads(o, int(i / H), int(i % H), int(i % H) + 1);
    }, std::max<int64_t>(1, (int64_t(1) << 15) / per_head));
  }

  enum class Epi { Store, Add, SwiGLU };

  // A prepared input: x in a kernel set's layout plus group sums, for every token. The layout
  // depends on the kernel set and on the matrix's format and bits (4-bit: unit integers).
  struct Prepared {
    const cpu::KernelSet* ks;
    WFormat format;
    int bits, gs;
    size_t stride;  // floats per token in x
    std::vector<float> x, xg;
  };

  Prepared& prepared_for(const cpu::KernelSet* ks, const Matrix& m, const float* xn, int T, int K) {
    const int gs = m.format == WFormat::Affine ? m.group_size : 0;
    for (int i = 0; i < n_prep_; ++i)
      if (prep_[i].ks == ks && prep_[i].format == m.format && prep_[i].bits == m.bits && prep_[i].gs == gs)
        return prep_[i];
    Prepared& p = prep_[n_prep_++];
    p.ks = ks;
    p.format = m.format;
    p.bits = m.bits;
    p.gs = gs;
    p.stride = ks->prepared_size(m);
    p.x.resize(size_t(T) * p.stride);
    for (int t = 0; t < T; ++t) ks->prepare(m, xn + size_t(t) * K, p.x.data() + size_t(t) * p.stride);
    if (gs) {
      p.xg.resize(size_t(T) * (K / gs));
      for (int t = 0; t < T; ++t) num::group_sums(xn + size_t(t) * K, K, gs, p.xg.data() + size_t(t) * (K / gs));
    }
    return p;
  }

  void products(const Matrix* const* ms, const Ref* ys, int n, const Ref& x, const Ref& norm, float eps, int T,
                Epi epi, const Matrix* up) {
    const int K = ms[0]->cols;
    const float* xn = x.as<float>();
    if (norm) {
      xn_.resize(size_t(T) * K);
      for (int t = 0; t < T; ++t) ks_->rmsnorm(x.as<float>() + size_t(t) * K, norm.as<float>(), K, eps, xn_.data() + size_t(t) * K);
      xn = xn_.data();
    }
    n_prep_ = 0;
    Prepared* prep[op::Project::kMax];
    int64_t row_start[op::Project::kMax + 1] = {0};
    for (int i = 0; i < n; ++i) {
      // A matrix the SIMD set does not specialise runs the generic (same-order) code.
      // SwiGLU's up rows read the gate's prepared x: the fast path needs the same layout for both.
      bool fast = ks_->handles(*ms[i]) &&
                  (epi != Epi::SwiGLU || (ks_->handles(*up) && up->format == ms[i]->format && up->bits == ms[i]->bits));
      prep[i] = &prepared_for(fast ? ks_ : cpu::generic_kernels(), *ms[i], xn, T, K);
      row_start[i + 1] = row_start[i] + ms[i]->rows;
    }
    constexpr int kRowBlock = 32;  // rows whose weights stay in cache across token tiles
    // Each thread gets at least ~256K weight-token products: below that, waking workers costs
    // more than it saves (small models run single-threaded).
    const int64_t grain = std::max<int64_t>(8, (int64_t(1) << 18) / (int64_t(K) * T));
    pool_.parallel_for(row_start[n], [&](int64_t b, int64_t e, int) {
      for (int i = 0; i < n; ++i) {
        int64_t lo = std::max(b, row_start[i]), hi = std::min(e, row_start[i + 1]);
        if (lo >= hi) continue;
        const Matrix& m = *ms[i];
        const Prepared& p = *prep[i];
        const int G = p.gs ? K / p.gs : 0;
        float* y = ys[i].as<float>();
        for (int64_t r0 = lo - row_start[i]; r0 < hi - row_start[i]; r0 += kRowBlock) {
          int r1 = int(std::min<int64_t>(r0 + kRowBlock, hi - row_start[i]));
          for (int t0 = 0; t0 < T; t0 += cpu::kMaxTile) {
            cpu::MatTask task;
            task.m = &m;
            task.nt = std::min(cpu::kMaxTile, T - t0);
            for (int j = 0; j < task.nt; ++j) {
              task.x[j] = p.x.data() + size_t(t0 + j) * p.stride;
              task.xg[j] = G ? p.xg.data() + size_t(t0 + j) * G : nullptr;
              task.y[j] = y + size_t(t0 + j) * m.rows;
            }
            if (epi == Epi::SwiGLU) p.ks->swiglu_rows(task, *up, int(r0), r1);
            else p.ks->rows(task, int(r0), r1, epi == Epi::Add);
          }
        }
      }
    }, grain);
  }

  const cpu::KernelSet* ks_;
  ThreadPool pool_;
  std::vector<float> xn_, u_, qn_, kn_;
  std::vector<uint64_t> heap_;  // top_k's kept keys
  Prepared prep_[op::Project::kMax];
  int n_prep_ = 0;
};

}  // namespace

std::unique_ptr<CpuRunner> make_reference_runner() { return std::make_unique<ReferenceRunner>(); }

std::unique_ptr<CpuRunner> make_fast_runner(CpuKernels isa, int threads) {
  const cpu::KernelSet* ks = cpu::generic_kernels();
  if (isa == CpuKernels::Avx512) ks = cpu::avx512_kernels();
  if (isa == CpuKernels::Avx2) ks = cpu::avx2_kernels();
  DQ_CHECK(ks != nullptr, "kernel set {} not built", cpu_kernels_name(isa));
  return std::make_unique<FastRunner>(ks, threads);
}

}  // namespace dq
