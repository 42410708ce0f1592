// Several sequences decoded together (runtime/batcher.h): what a server running N requests at once
// gets. For each batch size n, n sequences are fed a prompt each, then `tokens` greedy steps of
// all n run (each fed its own argmax); a step reads the weights once and each sequence's state.
// Prints steps/s, tokens/s over all sequences and per sequence, bytes a step and GB/s against the
// memory bandwidth measured in the same run; and, for comparison, the engine's own batch-1 decode
// (Engine::step_greedy: on CUDA its recorded graph and decode kernels).
// usage: deltaq-bench-batch -m DIR [--device D] [--threads N] [--ctx N] [--slots 1,2,4,8]
//                           [--tokens N] [--prompt N] [--no-graph] [--sampled]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/batcher.h"
#include "runtime/engine.h"

using namespace dq;
using clk = std::chrono::steady_clock;

static double seconds_since(clk::time_point t0) { return std::chrono::duration<double>(clk::now() - t0).count(); }

int main(int argc, char** argv) {
  EngineOptions opt;
  std::string dir, slot_list = "1,2,4,8";
  int tokens = 64, prompt = 32;
  bool sampled = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "-m") dir = next();
    else if (a == "--device") opt.device = next();
    else if (a == "--threads") opt.threads = std::atoi(next().c_str());
    else if (a == "--ctx") opt.max_ctx = std::atoi(next().c_str());
    else if (a == "--slots") slot_list = next();
    else if (a == "--tokens") tokens = std::atoi(next().c_str());
    else if (a == "--prompt") prompt = std::atoi(next().c_str());
    else if (a == "--no-graph") opt.use_graph = false;  // op by op (DELTAQ_PROFILE=1 times each op)
    else if (a == "--sampled") sampled = true;  // every row a draw at temperature 0.7, top_k 20 (as serve does)
    else dir.clear(), i = argc;
  }
  std::vector<int> sizes;
  std::stringstream ss(slot_list);
  for (std::string t; std::getline(ss, t, ',');) sizes.push_back(std::atoi(t.c_str()));
  bool sizes_ok = !sizes.empty();
  for (int n : sizes) sizes_ok = sizes_ok && n >= 1 && n <= 256;
  if (dir.empty() || tokens < 1 || prompt < 1 || !sizes_ok) {
    std::fprintf(stderr,
                 "usage: %s -m DIR [--device D] [--threads N] [--ctx N] [--slots 1,2,4,8] [--tokens N] [--prompt N] [--no-graph] [--sampled]\n",
                 argv[0]);
    return 2;
  }
  try {
    auto e = Engine::open(dir, opt);
    const int V = e->config().vocab_size;
    if (prompt + tokens + 1 > e->max_ctx()) fail("--prompt + --tokens exceed the context of {} (raise --ctx)", e->max_ctx());
    auto ids = [&](int n, uint32_t seed) {
      std::vector<int32_t> v(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) v[size_t(i)] = int32_t((uint32_t(i) * 2654435761u + seed * 40503u + 17u) % uint32_t(V));
      return v;
    };
    const double bw = e->backend().measure_bandwidth_gbps();
    const Qwen35& m = e->model();
    const int mid = prompt + tokens / 2;
    std::printf("backend %s; %s; prompt %d tokens a sequence, then %d steps (context %d..%d)%s\n",
                e->backend().name().c_str(), dir.c_str(), prompt, tokens, prompt, prompt + tokens,
                sampled ? "; batched rows drawn at temperature 0.7, top_k 20" : "");
    std::printf("memory read bandwidth measured now: %.2f GB/s\n", bw);

    // The engine's own batch-1 decode, for comparison.
    e->reset();
    e->feed(ids(prompt, 1));
    e->step_greedy();
    auto t0 = clk::now();
    for (int i = 0; i < tokens; ++i) e->step_greedy();
    e->sync();
    const double s1 = seconds_since(t0);
    const double b1 = m.bytes_per_token(mid);
    std::printf("engine batch-1 (step_greedy)  %9.2f tok/s  %7.3f ms/step  %7.2f GB/s = %5.1f%% of bandwidth\n",
                tokens / s1, 1e3 * s1 / tokens, b1 * tokens / s1 / 1e9, 100.0 * b1 * tokens / s1 / 1e9 / bw);

    std::printf("%6s %10s %12s %14s %12s %10s %9s %8s\n", "slots", "ms/step", "steps/s", "tok/s (all)", "tok/s each",
                "MB/step", "GB/s", "% bw");
    for (int n : sizes) {
      Batcher b(*e, n);
      std::vector<int> which(static_cast<size_t>(n));
      std::vector<int32_t> toks(static_cast<size_t>(n)), next;
      for (int s = 0; s < n; ++s) {
        which[size_t(s)] = s;
        toks[size_t(s)] = b.feed(s, ids(prompt, uint32_t(2 + s)));
      }
      std::vector<Batcher::Draw> draws(size_t(n), Batcher::Draw{sampled, DrawParams{0.7f, 0.0f, 20, 1.0f}, 0.5});
      std::vector<int32_t> drawn;
      auto one = [&](int i) {  // a step; the drawn ids (or the argmaxes) are the next inputs
        for (size_t r = 0; r < draws.size(); ++r) draws[r].u = double((i * 7919 + int(r) * 104729) % 1000) / 1000.0;
        b.step(which, toks, &next, draws, &drawn);
        for (size_t r = 0; r < toks.size(); ++r) toks[r] = sampled && drawn[r] >= 0 ? drawn[r] : next[r];
      };
      one(0);  // warm-up
      t0 = clk::now();
      for (int i = 0; i < tokens - 1; ++i) one(i + 1);
      const double sec = seconds_since(t0);
      const double steps = tokens - 1;
      const double bytes = m.bytes_per_token(mid) + (n - 1) * m.sequence_bytes_per_token(mid);
      const double gbps = bytes * steps / sec / 1e9;
      std::printf("%6d %10.3f %12.2f %14.2f %12.2f %10.1f %9.2f %8.1f\n", n, 1e3 * sec / steps, steps / sec,
                  n * steps / sec, steps / sec, bytes / 1e6, gbps, 100.0 * gbps / bw);
      std::printf("BENCH slots=%d tok_s=%.3f ms_step=%.4f bytes_step=%.0f gb_s=%.3f bw_gb_s=%.3f pct_bw=%.2f backend=\"%s\"\n",
                  n, n * steps / sec, 1e3 * sec / steps, bytes, gbps, bw, 100.0 * gbps / bw,
                  e->backend().name().c_str());
      std::fflush(stdout);
    }
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "error: %s\n", ex.what());
    return 1;
  }
  return 0;
}
