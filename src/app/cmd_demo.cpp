// deltaq demo: the built-in model (models/demo-fortunes, a small trained Qwen3.5-architecture
// model) continues a prompt. Token ids until the tokenizer lands.
#include <chrono>
#include <cstdio>

#include "app/cli_common.h"

namespace dq::app {

Command add_demo(CLI::App& app) {
  auto* cmd = app.add_subcommand("demo", "run the built-in demo model");
  auto f = std::make_shared<EngineFlags>();
  auto n = std::make_shared<int>(48);
  f->add(cmd, false);
  cmd->add_option("-n,--max-tokens", *n, "tokens to generate")->check(CLI::Range(1, 4096));
  return {cmd, [f, n]() {
            std::string dir = f->model.empty() ? demo_model_dir() : f->model;
            auto e = Engine::open(dir, f->options());
            // "The best way to predict the future is" in the demo model's tokenizer.
            std::vector<int32_t> prompt = {318, 1034, 708, 282, 725, 67, 736, 263, 1965, 300};
            std::printf("model:  %s\nbackend: %s\nprompt ids:  %s\n", dir.c_str(), e->backend().name().c_str(),
                        join_ids(prompt).c_str());
            auto t0 = std::chrono::steady_clock::now();
            int32_t next = e->feed(prompt);
            std::vector<int32_t> out;
            for (int i = 0; i < *n; ++i) {
              out.push_back(next);
              if (i + 1 < *n) next = e->step_greedy();
            }
            double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            std::printf("generated:   %s\n%d tokens in %.3f s (%.1f tok/s)\n", join_ids(out).c_str(), *n, s, *n / s);
            return 0;
          }};
}

}  // namespace dq::app
