// The sampling ops alone, on any backend: op::TopK (k = 21, what top_k 20 reads; k = 256, what
// top_p reads) and op::SampleDraw (the temperature draw and its weight sum) over one logits row
// of the Qwen3.5 vocabulary (248,320 random values), N ops issued back to back and one wait, in
// microseconds per op.
// usage: deltaq-bench-sampling [--device cpu|cuda] [--reference] [--reps N]   (--reference: the scalar reference ops)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "runtime/engine.h"

using namespace dq;
using clk = std::chrono::steady_clock;

int main(int argc, char** argv) {
  EngineOptions opt;
  int reps = 200;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--device" && i + 1 < argc) opt.device = argv[++i];
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--reference") opt.cpu_kernels = CpuKernels::Reference;
    else {
      std::fprintf(stderr, "usage: %s [--device cpu|cuda] [--reference] [--reps N]\n", argv[0]);
      return 2;
    }
  }
  try {
    auto be = make_backend(opt);
    auto q = be->make_queue();
    const int V = 248320;
    std::mt19937 rng(5);
    std::normal_distribution<float> d(0.f, 3.f);
    std::vector<float> xh(V);
    for (float& v : xh) v = d(rng);
    Ref x{be->upload(xh.data(), xh.size() * 4, "logits")};
    Ref ids{be->alloc(256 * 4, "ids")}, vals{be->alloc(256 * 4, "vals")}, id{be->alloc(4, "id")},
        total{be->alloc(8, "total")};
    std::printf("backend %s, one row of %d logits, %d ops per timing\n", be->name().c_str(), V, reps);
    auto time = [&](const char* what, const auto& make) {
      q->go(make());  // warm-up (scratch allocation)
      q->wait();
      const auto t0 = clk::now();
      for (int r = 0; r < reps; ++r) q->go(make());
      q->wait();
      const double us = std::chrono::duration<double, std::micro>(clk::now() - t0).count() / reps;
      std::printf("%-40s %9.2f us per op\n", what, us);
    };
    time("top_k k=21 (top_k 20)", [&] { return Op(op::TopK{x, V, 21, ids, vals}); });
    time("top_k k=256 (top_p)", [&] { return Op(op::TopK{x, V, 256, ids, vals}); });
    time("sample_draw T=0.7 (the draw)", [&] { return Op(op::SampleDraw{x, V, 0.7f, 0.0f, 0.5, id, Ref{}, Ref{}}); });
    time("sample_draw T=0.7 (the weight sum)", [&] { return Op(op::SampleDraw{x, V, 0.7f, 0.0f, 0.0, Ref{}, Ref{}, total}); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
