// The earlier engine's microbenchmark, on any backend: the 187 weight products of one
// Qwen3.5-2B decode step in 97 stages (random 4-bit weights, 1.06 GB), timed
//   (a) one wait per product, (b) one wait per stage, (c) one recorded graph per step,
// in ms per token, with GB/s against the bandwidth the backend measures in the same run.
// usage: deltaq-bench-stages [--device cpu|cuda] [--reps N] [--like qwen3.5-4b] (another size's
// step: its products in the same order)
#include <chrono>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "random_weights.h"
#include "runtime/engine.h"

using namespace dq;
using clk = std::chrono::steady_clock;
using bench::random_q4;
using bench::Stage;

namespace {


}  // namespace

int main(int argc, char** argv) {
  EngineOptions opt;
  int reps = 20;
  std::string like = "qwen3.5-2b";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--device" && i + 1 < argc) opt.device = argv[++i];
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--like" && i + 1 < argc) like = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--device cpu|cuda] [--reps N] [--like qwen3.5-0.8b|2b|4b|9b|tiny]\n", argv[0]);
      return 2;
    }
  }
  try {
    auto be = make_backend(opt);
    auto q = be->make_queue();
    std::mt19937_64 rng(1);
    const FamilyShape* shape = family_shape(like);
    if (!shape) {
      std::fprintf(stderr, "error: --like: unknown size '%s' (expected qwen3.5-0.8b, -2b, -4b, -9b or tiny)\n", like.c_str());
      return 2;
    }
    const int I = shape->inter, V = shape->vocab;
    std::vector<bench::Stage> stages = bench::qwen35_step(*be, rng, *shape);
    size_t bytes = 0;
    int products = 0;
    for (auto& st : stages)
      for (auto& m : st.mats) bytes += m.bytes(), ++products;
    std::vector<float> xh(I);
    for (int i = 0; i < I; ++i) xh[i] = std::sin(0.01f * i);
    Ref x{be->upload(xh.data(), xh.size() * 4, "x")};
    std::vector<Ref> ys;
    for (int i = 0; i < 4; ++i) ys.push_back(Ref{be->alloc(size_t(V) * 4, "y")});

    auto issue_stage = [&](const Stage& st, bool wait_each) {
      if (wait_each) {
        for (size_t i = 0; i < st.mats.size(); ++i) {
          q->go(op::Project{x, Ref{}, 0, {st.mats[i]}, {ys[i]}, 1, 1});
          q->wait();
        }
        return;
      }
      op::Project p{x, Ref{}, 0, {}, {}, int(st.mats.size()), 1};
      for (size_t i = 0; i < st.mats.size(); ++i) p.w[i] = st.mats[i], p.y[i] = ys[i];
      q->go(std::move(p));
    };
    auto time_mode = [&](int mode, const Graph* g) {
      auto run = [&] {
        if (mode == 2) {
          q->replay(*g);
          q->wait();
          return;
        }
        for (const Stage& st : stages) {
          issue_stage(st, mode == 0);
          if (mode == 1) q->wait();
        }
      };
      run();
      double best = 1e9;
      for (int r = 0; r < reps; ++r) {
        auto t0 = clk::now();
        run();
        best = std::min(best, std::chrono::duration<double>(clk::now() - t0).count());
      }
      return best;
    };
    auto graph = q->capture([&] {
      for (const Stage& st : stages) issue_stage(st, false);
    });
    const double bw = be->measure_bandwidth_gbps();
    std::printf("%s, backend %s: %d products in %zu stages, %.3f GB of 4-bit weights; bandwidth measured %.1f GB/s\n",
                like.c_str(), be->name().c_str(), products, stages.size(), bytes / 1e9, bw);
    // Per shape: a graph of 50 launches of one stage's op, so no host launch cost is counted.
    std::printf("per stage shape (graph of 50 launches each):\n");
    std::vector<std::string> seen;
    for (const Stage& st : stages) {
      std::string key = std::to_string(st.mats.size()) + "x[" + std::to_string(st.mats[0].rows) + "," +
                        std::to_string(st.mats[0].cols) + "]";
      if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
      seen.push_back(key);
      size_t b = 0;
      for (auto& m : st.mats) b += m.bytes();
      auto g50 = q->capture([&] {
        for (int i = 0; i < 50; ++i) issue_stage(st, false);
      });
      q->replay(*g50);
      q->wait();
      double best = 1e9;
      for (int r = 0; r < 5; ++r) {
        auto t0 = clk::now();
        q->replay(*g50);
        q->wait();
        best = std::min(best, std::chrono::duration<double>(clk::now() - t0).count() / 50);
      }
      std::printf("  %-22s %8.2f MB  %8.2f us  %8.1f GB/s  %5.1f%%\n", key.c_str(), b / 1e6, best * 1e6,
                  b / best / 1e9, 100.0 * b / best / 1e9 / bw);
    }
    const char* names[] = {"(a) one wait per product", "(b) one wait per stage  ", "(c) one graph per step  "};
    for (int mode = 0; mode < 3; ++mode) {
      double s = time_mode(mode, graph.get());
      std::printf("%s: %8.3f ms/token  %8.1f GB/s  %5.1f%% of measured\n", names[mode], s * 1e3, bytes / s / 1e9,
                  100.0 * bytes / s / 1e9 / bw);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
