// deltaq demo: the built-in model (models/demo-fortunes, a small trained Qwen3.5-architecture
// model, see its README) writes a fortune after a text prompt, streamed as it is generated.
#include <chrono>
#include <cstdio>

#include "app/cli_common.h"
#if DELTAQ_HAVE_TEXT
#include "text/model_text.h"
#endif

namespace dq::app {

Command add_demo(CLI::App& app) {
  auto* cmd = app.add_subcommand("demo", "run the built-in demo model");
  auto f = std::make_shared<EngineFlags>();
  auto n = std::make_shared<int>(48);
  f->add(cmd, false);
  cmd->add_option("-n,--max-tokens", *n, "tokens to generate")->check(CLI::Range(1, 4096));
  auto prompt = std::make_shared<std::string>("The best way to predict the future is");
  cmd->add_option("-p,--prompt", *prompt, "prompt text");
  return {cmd, [f, n, prompt]() {
            std::string dir = f->model.empty() ? demo_model_dir() : f->model;
            auto e = Engine::open(dir, f->options());
            std::printf("deltaq demo: %s on %s\n\n", dir.c_str(), e->backend().name().c_str());
#if DELTAQ_HAVE_TEXT
            auto tc = text::TextConfig::load(dir);
            std::vector<int32_t> ids = tc.tokenizer->encode(*prompt);
            std::printf("%s", prompt->c_str());
            std::fflush(stdout);
            auto t0 = std::chrono::steady_clock::now();
            int32_t next = e->feed(ids);
            text::StreamDecoder dec(*tc.tokenizer);
            int made = 0;
            for (; made < *n && !tc.is_eos(next); ++made) {
              std::string piece = dec.push(next);
              std::fwrite(piece.data(), 1, piece.size(), stdout);
              std::fflush(stdout);
              if (made + 1 < *n) next = e->step_greedy();
            }
            std::string tail = dec.flush();
            std::fwrite(tail.data(), 1, tail.size(), stdout);
            double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            std::printf("\n\n[%zu prompt tokens, %d generated in %.3f s: %.1f tok/s]\n", ids.size(), made, s, made / s);
#else
            // Built without the tokenizer: the same prompt as token ids.
            std::vector<int32_t> ids = {318, 1034, 708, 282, 725, 67, 736, 263, 1965, 300};
            auto t0 = std::chrono::steady_clock::now();
            int32_t next = e->feed(ids);
            std::vector<int32_t> out;
            for (int i = 0; i < *n; ++i) {
              out.push_back(next);
              if (i + 1 < *n) next = e->step_greedy();
            }
            double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            std::printf("prompt ids: %s\ngenerated:  %s\n%d tokens in %.3f s (%.1f tok/s)\n", join_ids(ids).c_str(),
                        join_ids(out).c_str(), *n, s, *n / s);
#endif
            return 0;
          }};
}

}  // namespace dq::app
