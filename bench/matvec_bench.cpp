// The 4-bit mat-vec alone: the whole game for CPU decode speed.
//   (0) on AVX-512 VNNI: the core's rate of 512-bit VPDPBUSD (the exact integer unit needs six
//       per 64 bytes of weights and row), i.e. the kernel's compute ceiling on this machine,
//   (1) compute rate with a matrix that stays in cache (no memory traffic),
//   (1b) x's preparation for 4-bit rows alone (the unit integers as limbs), per kernel set, in us:
//       it runs on one thread before each product's rows,
//   (2) streaming rate over the 187 weight products of one Qwen3.5-2B decode step (97 stages,
//       lm_head included; 1.06 GB, random 4-bit weights in anonymous memory), against the read
//       bandwidth measured just before and after in the same run.
// usage: deltaq-bench-matvec [--kernels auto|generic|avx2|avx512] [--threads N] [--reps N]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "core/error.h"
#include "ops/ops.h"
#include "random_weights.h"

using namespace dq;
using clk = std::chrono::steady_clock;
using bench::random_q4;

#if defined(__x86_64__)
#include <immintrin.h>
// 512-bit VPDPBUSD per second on this thread: 8 independent accumulators, so throughput and not
// latency is measured.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static double vpdpbusd_per_second() {
  __m512i a[8];
  const __m512i x = _mm512_set1_epi32(0x01020304), y = _mm512_set1_epi32(0x05060708);
  for (int i = 0; i < 8; ++i) a[i] = _mm512_set1_epi32(i);
  const long n = 100000000;
  const auto t0 = clk::now();
  for (long k = 0; k < n; k += 8) {
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) a[i] = _mm512_dpbusd_epi32(a[i], x, y);
    asm volatile("" : "+v"(a[0]), "+v"(a[1]), "+v"(a[2]), "+v"(a[3]), "+v"(a[4]), "+v"(a[5]), "+v"(a[6]), "+v"(a[7]));
  }
  const double s = std::chrono::duration<double>(clk::now() - t0).count();
  alignas(64) int32_t out[16];
  _mm512_store_si512(out, a[0]);
  volatile int32_t sink = out[0];
  (void)sink;
  return double(n) / s;
}
#endif

int main(int argc, char** argv) {
  std::string kernels = "auto";
  int threads = 0, reps = 10, cache_rows = 1024;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--kernels" && i + 1 < argc) kernels = argv[++i];
    else if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--cache-rows" && i + 1 < argc) cache_rows = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--kernels auto|generic|avx2|avx512] [--threads N] [--reps N]\n", argv[0]);
      return 2;
    }
  }
  try {
    auto be = make_cpu_backend(parse_cpu_kernels(kernels), threads);
    auto q = be->make_queue();
    std::mt19937_64 rng(1);
    std::printf("backend: %s\n", be->name().c_str());
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512vnni")) {
      const double r = vpdpbusd_per_second();
      std::printf("VPDPBUSD zmm: %.2f G/s on one thread = a ceiling of %.1f GB/s of 4-bit weights per thread "
                  "(six per 64 bytes of weights and row)\n", r / 1e9, r / 6 * 64 / 1e9);
    }
#endif

    // (1) cache-resident compute rate: a [1024, 2048] matrix (1.1 MB, half per core), many passes.
    {
      Matrix m = random_q4(*be, cache_rows, 2048, rng);
      Ref x{be->alloc(2048 * 4, "x")}, y{be->alloc(size_t(cache_rows) * 4, "y")};
      for (int i = 0; i < 2048; ++i) x.as<float>()[i] = std::sin(0.1f * i);
      const int passes = int(2000LL * 1024 / cache_rows);
      for (int i = 0; i < 100; ++i) q->go(op::Project{x, Ref{}, 0, {m}, {y}, 1, 1});
      q->wait();
      auto t0 = clk::now();
      for (int i = 0; i < passes; ++i) q->go(op::Project{x, Ref{}, 0, {m}, {y}, 1, 1});
      q->wait();
      double s = std::chrono::duration<double>(clk::now() - t0).count();
      double elems = double(passes) * cache_rows * 2048;
      std::printf("in-cache   [%d x 2048] 4-bit: %.2f G weights/s = %.1f GB/s of 4-bit weights (%.2f us per product)\n", cache_rows,
                  elems / s / 1e9, double(passes) * m.bytes() / s / 1e9, 1e6 * s / passes);
    }

    // (1b) x prepared for the 4-bit rows of the 2B step's widths, on one thread.
    for (CpuKernels set : {CpuKernels::Generic, CpuKernels::Avx2, CpuKernels::Avx512}) {
      try {
        resolve_cpu_kernels(set);
      } catch (const std::exception&) {
        continue;  // not on this CPU
      }
      const cpu::KernelSet* ks = set == CpuKernels::Generic ? cpu::generic_kernels()
                                 : set == CpuKernels::Avx2  ? cpu::avx2_kernels()
                                                            : cpu::avx512_kernels();
      std::printf("prepare    %-8s", ks->name);
      for (int K : {2048, 4096, 6144}) {
        Matrix m;
        m.format = WFormat::Affine;
        m.bits = 4;
        m.group_size = 64;
        m.cols = K;
        m.rows = 1;
        std::vector<float> x(static_cast<size_t>(K)), xp(ks->prepared_size(m));
        std::normal_distribution<float> nd;
        for (float& v : x) v = nd(rng);
        const int n = 4000;
        auto t0 = clk::now();
        for (int i = 0; i < n; ++i) {
          ks->prepare(m, x.data(), xp.data());
          asm volatile("" ::"r"(xp.data()) : "memory");
        }
        std::printf("  K %d: %.2f us", K, std::chrono::duration<double, std::micro>(clk::now() - t0).count() / n);
      }
      std::printf("\n");
    }

    if (reps == 0) return 0;
    // (2) one 2B decode step's products, streamed from memory.
    const int I = bench::k2bInter, V = bench::k2bVocab;
    std::vector<bench::Stage> stages = bench::qwen35_2b_step(*be, rng);
    size_t bytes = 0;
    int products = 0;
    for (auto& st : stages)
      for (auto& m : st.mats) bytes += m.bytes(), ++products;
    Ref x{be->alloc(size_t(I) * 4, "x")};
    for (int i = 0; i < I; ++i) x.as<float>()[i] = std::cos(0.01f * i);
    std::vector<Ref> ys;
    for (int i = 0; i < 4; ++i) ys.push_back(Ref{be->alloc(size_t(V) * 4, "y")});
    auto step = [&] {
      for (auto& st : stages) {
        op::Project p{x, Ref{}, 0, {}, {}, int(st.mats.size()), 1};
        for (size_t i = 0; i < st.mats.size(); ++i) p.w[i] = st.mats[i], p.y[i] = ys[i];
        q->go(std::move(p));
      }
      q->wait();  // one wait per step: the products of a stage run as one op
    };
    step();
    double bw0 = be->measure_bandwidth_gbps();
    double best = 1e9, total = 0;
    for (int r = 0; r < reps; ++r) {
      auto t0 = clk::now();
      step();
      double s = std::chrono::duration<double>(clk::now() - t0).count();
      best = std::min(best, s);
      total += s;
    }
    double bw1 = be->measure_bandwidth_gbps();
    double bw = std::max(bw0, bw1);
    std::printf("2B step    %d products in %zu stages, %.3f GB: best %.2f ms (%.1f GB/s = %.1f%% of %.1f GB/s), "
                "mean %.2f ms (%.1f GB/s); bandwidth before/after %.1f / %.1f GB/s\n",
                products, stages.size(), bytes / 1e9, best * 1e3, bytes / best / 1e9, 100.0 * bytes / best / 1e9 / bw, bw,
                total / reps * 1e3, bytes / (total / reps) / 1e9, bw0, bw1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
