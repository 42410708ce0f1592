// deltaq run: continue a prompt (text, streamed as it is generated; or token ids).
#include <chrono>
#include <cstdio>

#include "app/cli_common.h"
#include "core/error.h"
#if DELTAQ_HAVE_TEXT
#include "runtime/generator.h"
#include "text/model_text.h"
#endif

namespace dq::app {

Command add_run(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "continue a prompt (-p TEXT, streamed; or --ids)");
  auto f = std::make_shared<EngineFlags>();
  auto ids = std::make_shared<std::string>();
  auto prompt = std::make_shared<std::string>();
  auto n = std::make_shared<int>(64);
  auto hash = std::make_shared<bool>(false);
  auto sp = std::make_shared<SamplingFlags>();
  f->add(cmd);
  auto* o_ids = cmd->add_option("--ids", *ids, "prompt as comma-separated token ids (prints ids)");
#if DELTAQ_HAVE_TEXT
  auto* o_p = cmd->add_option("-p,--prompt", *prompt, "prompt text (output is streamed text)");
  o_p->excludes(o_ids);
  sp->add(cmd);
#endif
  cmd->add_option("-n,--max-tokens", *n, "tokens to generate")->check(CLI::Range(0, 1 << 24));
  cmd->add_flag("--hash-logits", *hash, "with --ids: print a hash of the logits of every position (to compare backends)");
  return {cmd, [f, ids, prompt, n, hash, sp]() {
            if (ids->empty() && prompt->empty()) fail("give a prompt: -p TEXT or --ids 1,2,3");
            auto e = Engine::open(f->model, f->options());
            using clk = std::chrono::steady_clock;
#if DELTAQ_HAVE_TEXT
            if (!prompt->empty()) {
              auto tc = text::TextConfig::load(f->model);
              GenerateRequest req;
              req.prompt = tc.tokenizer->encode(*prompt);
              req.sampling = sp->params();
              req.max_tokens = *n;
              req.stop = sp->stop;
              std::fwrite(prompt->data(), 1, prompt->size(), stdout);
              Generator g(*e, tc);
              GenerateResult r = g.generate(req, [](std::string_view piece) {
                std::fwrite(piece.data(), 1, piece.size(), stdout);
                std::fflush(stdout);
                return true;
              });
              std::printf("\n");
              std::fprintf(stderr, "[%d prompt tokens in %.3f s: %.1f tok/s; %d generated in %.3f s: %.1f tok/s; %s; %s]\n",
                           r.prompt_tokens, r.prompt_seconds, r.prompt_tokens / std::max(r.prompt_seconds, 1e-9),
                           r.completion_tokens, r.gen_seconds, r.completion_tokens / std::max(r.gen_seconds, 1e-9),
                           r.finish_reason.c_str(), e->backend().name().c_str());
              return 0;
            }
#endif
            std::vector<int32_t> p = parse_ids(*ids);
            auto t0 = clk::now();
            std::vector<float> logits;
            uint64_t h = 1469598103934665603ull;  // FNV-1a over the logits bytes of every position
            auto mix = [&] {
              const auto* b = reinterpret_cast<const uint8_t*>(logits.data());
              for (size_t i = 0; i < logits.size() * 4; ++i) h = (h ^ b[i]) * 1099511628211ull;
            };
            int32_t next = e->feed(p, *hash ? &logits : nullptr);
            if (*hash) mix();
            auto t1 = clk::now();
            for (int i = 0; i < *n; ++i) {
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
                         p.size(), pf, p.size() / pf, *n, dec, *n > 1 ? (*n - 1) / dec : 0.0,
                         e->backend().name().c_str());
            return 0;
          }};
}

}  // namespace dq::app
