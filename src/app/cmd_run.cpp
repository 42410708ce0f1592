// deltaq run: greedy continuation of token ids (text prompts come with the tokenizer).
#include <chrono>
#include <cstdio>

#include "app/cli_common.h"

namespace dq::app {

Command add_run(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "greedy continuation of a prompt");
  auto f = std::make_shared<EngineFlags>();
  auto ids = std::make_shared<std::string>();
  auto n = std::make_shared<int>(32);
  auto hash = std::make_shared<bool>(false);
  f->add(cmd);
  cmd->add_flag("--hash-logits", *hash, "print a hash of the logits of every position (to compare backends)");
  cmd->add_option("--ids", *ids, "prompt as comma-separated token ids")->required();
  cmd->add_option("-n,--max-tokens", *n, "tokens to generate")->check(CLI::Range(0, 1 << 24));
  return {cmd, [f, ids, n, hash]() {
            std::vector<int32_t> prompt = parse_ids(*ids);
            auto e = Engine::open(f->model, f->options());
            using clk = std::chrono::steady_clock;
            auto t0 = clk::now();
            std::vector<float> logits;
            uint64_t h = 1469598103934665603ull;  // FNV-1a over the logits bytes of every position
            auto mix = [&] {
              const auto* b = reinterpret_cast<const uint8_t*>(logits.data());
              for (size_t i = 0; i < logits.size() * 4; ++i) h = (h ^ b[i]) * 1099511628211ull;
            };
            int32_t next = e->feed(prompt, *hash ? &logits : nullptr);
            if (*hash) mix();
            auto t1 = clk::now();
            std::vector<int32_t> out;
            for (int i = 0; i < *n; ++i) {
              out.push_back(next);
              std::printf("%s%d", i ? "," : "", next);
              std::fflush(stdout);
              if (i + 1 < *n) {
                if (*hash) {
                  next = e->step(next, &logits);
                  mix();
                } else {
                  next = e->step_greedy();
                }
              }
            }
            auto t2 = clk::now();
            std::printf("\n");
            if (*hash) std::printf("logits hash %016llx over %d positions\n", (unsigned long long)h, *n);
            double pf = std::chrono::duration<double>(t1 - t0).count();
            double dec = std::chrono::duration<double>(t2 - t1).count();
            std::fprintf(stderr, "prompt %zu tokens in %.3f s (%.1f tok/s); generated %d tokens in %.3f s (%.1f tok/s) on %s\n",
                         prompt.size(), pf, prompt.size() / pf, *n, dec, *n > 1 ? (*n - 1) / dec : 0.0,
                         e->backend().name().c_str());
            return 0;
          }};
}

}  // namespace dq::app
