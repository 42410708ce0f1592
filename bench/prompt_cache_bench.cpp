// What the prompt cache saves (runtime/prompt_cache.h): a chat's next turn, after another
// conversation ran in between, fed from scratch or from the state saved where its last prompt's
// messages ended. On random ids (no tokenizer needed), with the engine calls the generator makes:
//   fresh:    reset(), feed(the whole turn-2 prompt)
//   restored: restore(the saved state), feed(the rest: the reply as the template renders it, the new message)
// and what saving and restoring cost (snapshot() / restore() alone: bytes, ms, GB/s).
// usage: deltaq-bench-prompt-cache -m DIR [--device D] [--threads N] [--ctx N] [--prompt N]
//                                  [--reply N] [--message N] [--rounds N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/engine.h"
#include "runtime/prompt_cache.h"

using namespace dq;
using clk = std::chrono::steady_clock;

static double ms_since(clk::time_point t0) { return std::chrono::duration<double, std::milli>(clk::now() - t0).count(); }

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char** argv) {
  EngineOptions opt;
  std::string dir;
  int prompt = 1000, reply = 200, message = 50, rounds = 3;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "-m") dir = next();
    else if (a == "--device") opt.device = next();
    else if (a == "--threads") opt.threads = std::atoi(next().c_str());
    else if (a == "--ctx") opt.max_ctx = std::atoi(next().c_str());
    else if (a == "--prompt") prompt = std::atoi(next().c_str());
    else if (a == "--reply") reply = std::atoi(next().c_str());
    else if (a == "--message") message = std::atoi(next().c_str());
    else if (a == "--rounds") rounds = std::atoi(next().c_str());
    else dir.clear(), i = argc;
  }
  if (dir.empty() || prompt < 1 || reply < 0 || message < 1 || rounds < 1) {
    std::fprintf(stderr,
                 "usage: %s -m DIR [--device D] [--threads N] [--ctx N] [--prompt N] [--reply N] [--message N] "
                 "[--rounds N]\n",
                 argv[0]);
    return 2;
  }
  try {
    auto e = Engine::open(dir, opt);
    const int V = e->config().vocab_size;
    auto ids = [&](int n, uint32_t seed) {
      std::vector<int32_t> v(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) v[size_t(i)] = int32_t((uint32_t(i) * 2654435761u + seed * 40503u + 17u) % uint32_t(V));
      return v;
    };
    const auto turn1 = ids(prompt, 1), other = ids(prompt, 2), rest = ids(reply + message, 3);
    std::vector<int32_t> turn2 = turn1;
    turn2.insert(turn2.end(), rest.begin(), rest.end());
    if (int64_t(turn2.size()) >= e->max_ctx())
      fail("the turn-2 prompt has {} tokens; the context holds {} (raise --ctx)", turn2.size(), e->max_ctx());
    const double bw = e->backend().measure_bandwidth_gbps();
    std::printf("backend %s; %s\n", e->backend().name().c_str(), dir.c_str());
    std::printf("turn 1: %d prompt tokens; turn 2: those + %d (the reply as rendered) + %d (the new message) = %zu\n",
                prompt, reply, message, turn2.size());

    std::vector<double> save_ms, resave_ms, restore_ms, fresh_ms, restored_ms;
    std::shared_ptr<StateSnapshot> s;
    for (int r = 0; r < rounds; ++r) {
      e->reset();
      e->feed(turn1);
      auto t0 = clk::now();
      s = e->snapshot();  // into new memory
      save_ms.push_back(ms_since(t0));
      t0 = clk::now();
      s = e->snapshot(std::move(s->bytes));  // into a dropped snapshot's (PromptCache::take_spare)
      resave_ms.push_back(ms_since(t0));
      e->reset();
      e->feed(other);  // another conversation in between
      t0 = clk::now();
      e->restore(*s);
      restore_ms.push_back(ms_since(t0));
      e->feed(rest);
      restored_ms.push_back(ms_since(t0));
      e->reset();
      e->feed(other);
      t0 = clk::now();
      e->reset();
      e->feed(turn2);
      fresh_ms.push_back(ms_since(t0));
    }
    const double mb = double(s->bytes.size()) / 1e6;
    const double sv = median(save_ms), rsv = median(resave_ms), rs = median(restore_ms), fr = median(fresh_ms),
                 rd = median(restored_ms);
    std::printf("saved state at %d tokens: %.1f MB (recurrent state %.1f MB + K/V rows %.1f MB)\n", prompt, mb,
                double(e->model().state_bytes_at(0)) / 1e6, mb - double(e->model().state_bytes_at(0)) / 1e6);
    std::printf("save, into new memory       %8.2f ms  %6.2f GB/s   (median of %d; the backend's memory read bandwidth: "
                "%.1f GB/s)\n",
                sv, mb / sv, rounds, bw);
    std::printf("save, into reused memory    %8.2f ms  %6.2f GB/s   (a full cache: a dropped snapshot's storage)\n", rsv,
                mb / rsv);
    std::printf("restore                     %8.2f ms  %6.2f GB/s\n", rs, mb / rs);
    std::printf("turn-2 prompt, fresh:          %9.1f ms  (%zu tokens fed, %.1f tok/s)\n", fr, turn2.size(),
                turn2.size() / fr * 1e3);
    std::printf("turn-2 prompt, from the state: %9.1f ms  (%zu tokens fed after the restore)  %.2fx faster\n", rd,
                rest.size(), fr / rd);
    std::printf("(a save is paid once per request, where its messages end: %.1f%% / %.1f%% of the fresh turn-2 prompt)\n",
                100.0 * sv / fr, 100.0 * rsv / fr);
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "error: %s\n", ex.what());
    return 1;
  }
  return 0;
}
