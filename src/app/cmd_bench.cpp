// deltaq bench: batch-1 decode speed against the memory bandwidth measured in the same run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "app/cli_common.h"
#include "runtime/sampler.h"

namespace dq::app {

Command add_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "decode tok/s, bytes per token, GB/s and % of measured bandwidth");
  auto f = std::make_shared<EngineFlags>();
  auto tokens = std::make_shared<int>(64);
  auto prompt = std::make_shared<int>(32);
  auto no_graph = std::make_shared<bool>(false);
  auto no_sampled = std::make_shared<bool>(false);
  f->add(cmd);
  cmd->add_flag("--no-graph", *no_graph, "issue the step's ops one by one instead of replaying the recorded graph "
                                         "(with DELTAQ_PROFILE=1: a per-op time table)");
  cmd->add_flag("--no-sampled", *no_sampled, "time greedy decoding only (not the three sampled runs, which each "
                                             "feed the prompt again)");
  cmd->add_option("--tokens", *tokens, "decode steps to time")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--prompt", *prompt, "prompt tokens fed first (prefill is timed too)")->check(CLI::Range(1, 1 << 20));
  return {cmd, [f, tokens, prompt, no_graph, no_sampled]() {
            using clk = std::chrono::steady_clock;
            EngineOptions opt = f->options();
            opt.use_graph = !*no_graph;
            auto e = Engine::open(f->model, opt);
            const ModelConfig& c = e->config();
            std::mt19937 rng(7);
            std::vector<int32_t> ids(*prompt);
            for (auto& t : ids) t = int32_t(rng() % uint32_t(c.vocab_size));
            auto t0 = clk::now();
            e->feed(ids);
            const double first_feed_s = std::chrono::duration<double>(clk::now() - t0).count();
            // Prefill is timed again on a fresh sequence: the first feed also pays one-time costs
            // (kernel attributes, the first launches, the CPU's weights faulted in).
            e->reset();
            t0 = clk::now();
            e->feed(ids);
            const double prefill_s = std::chrono::duration<double>(clk::now() - t0).count();
            for (int i = 0; i < 3; ++i) e->step_greedy();  // warm-up
            const int start_pos = e->position();
            t0 = clk::now();
            for (int i = 0; i < *tokens; ++i) e->step_greedy();
            double s = std::chrono::duration<double>(clk::now() - t0).count();
            const int end_pos = e->position();
            e->sync();  // the step issued ahead of the last result (not counted)
            const size_t rss = peak_rss_bytes();
            // Sampled decoding as the generator does it: temperature 0.7, top_p 0.9 (the top 256 logits
            // and the row's weight sum come back; the whole row too when the top_p mass is wider, as
            // it always is with random weights); with top_k 20 too (the top 21 logits, op::TopK, and
            // the draw from them on the backend, op::TopDraw: only the id comes back); temperature
            // 0.7 alone (drawn on the backend, op::SampleDraw: only the id).
            const int n_sampled = std::min(*tokens, 200);
            std::pair<int, int> sampled_ctx{0, 0};
            auto time_sampled = [&](int top_k, float top_p) {
              SamplingParams sp;
              sp.temperature = 0.7f;
              sp.top_p = top_p;
              sp.top_k = top_k;
              sp.seed = 1;
              Sampler sampler(sp);
              std::vector<float> logits;
              std::vector<int32_t> top_ids;
              std::vector<float> top_vals;
              int32_t tok = 1;
              // From the prompt again, so that every sampled run decodes at the contexts of the
              // greedy one (attention's cost grows with the context; after 500 greedy tokens
              // the sampled steps would otherwise pay for a longer one).
              e->reset();
              e->feed(ids);
              const int first = e->position();
              const auto ts = clk::now();
              for (int i = 0; i < n_sampled && e->position() < e->max_ctx(); ++i) {
                if (sampler.plain() || sampler.top_needed()) {  // as the generator: drawn on the backend
                  const DrawParams d = sampler.plain() ? DrawParams{sp.temperature, sp.min_p}
                                                       : DrawParams{sp.temperature, sp.min_p, sp.top_k, sp.top_p};
                  double u = 0;
                  tok = e->step_draw_ahead(tok, d, [&] { return sampler.take_uniform(); }, &u);
                  if (tok < 0) {
                    e->read_logits(&logits);
                    tok = d.plain() ? sampler.sample_declined(logits, u) : sampler.sample_with(logits, u);
                  }
                } else if (const int need = sampler.top_p_needed(); need && need <= c.vocab_size) {
                  double total = 0;
                  e->step_top(tok, need, &top_ids, &top_vals, &total, sp.temperature);
                  auto t = sampler.sample_top_p(top_ids, top_vals, total);
                  if (!t) e->read_logits(&logits);
                  tok = t ? *t : sampler.sample(logits, {}, 0);
                } else {
                  e->step(tok, &logits);
                  tok = sampler.sample(logits, {}, 0);
                }
              }
              const double sec = std::chrono::duration<double>(clk::now() - ts).count();
              e->sync();  // a step issued ahead of the last id (not counted)
              sampled_ctx = {first, e->position()};
              return n_sampled / sec;
            };
            double tps_row = 0, tps_top = 0, tps_draw = 0;
            if (!*no_sampled) tps_row = time_sampled(0, 0.9f), tps_top = time_sampled(20, 0.9f), tps_draw = time_sampled(0, 1.0f);
            const double tps = *tokens / s;
            const double bpt = e->model().bytes_per_token(start_pos + *tokens / 2);
            std::printf("model        %s (%d layers, hidden %d, vocab %d)\n", f->model.c_str(), c.num_layers,
                        c.hidden_size, c.vocab_size);
            std::printf("backend      %s%s\n", e->backend().name().c_str(), *no_graph ? ", ops one by one" : ", graph replay");
            const double bw = e->backend().measure_bandwidth_gbps();
            // A prefill forward reads every matrix once for its whole chunk (the head for its
            // last token) and the state and cache as a step does: one step's bytes a chunk.
            const int chunks = (*prompt + e->prefill_chunk() - 1) / e->prefill_chunk();
            const double prefill_gbps = chunks * e->model().bytes_per_token(*prompt / 2) / prefill_s / 1e9;
            std::printf("prefill      %d tokens in %.3f s: %.1f tok/s (chunks of %d; the first feed took %.3f s); "
                        "%d forwards of a step's bytes: %.2f GB/s = %.1f%% of the bandwidth below\n",
                        *prompt, prefill_s, *prompt / prefill_s, e->prefill_chunk(), first_feed_s, chunks, prefill_gbps,
                        100.0 * prefill_gbps / bw);
            std::printf("decode       %d tokens in %.3f s: %.2f tok/s, %.3f ms/token (context %d..%d)\n", *tokens, s,
                        tps, 1e3 * s / *tokens, start_pos, end_pos);
            if (!*no_sampled)
              std::printf("sampled      %d tokens each: %.2f tok/s with T 0.7, top_p 0.9 (top 256 logits and the weight sum; "
                        "the whole row when the top_p mass is wider); "
                        "%.2f tok/s with top_k 20 too (drawn on the backend from the top 21); %.2f tok/s with T 0.7 alone "
                        "(drawn on the backend); context %d..%d\n",
                        n_sampled, tps_row, tps_top, tps_draw, sampled_ctx.first, sampled_ctx.second);
            // An untied embedding is in the weights but only one row of it is read a token.
            std::printf("bytes/token  %.1f MB (weights %.1f MB, less an untied embedding's rows not read; "
                        "+ state and KV cache)\n",
                        bpt / 1e6, e->model().weights().matrix_bytes / 1e6);
            const double gbps = bpt * tps / 1e9;
            std::printf("throughput   %.2f GB/s = %.1f%% of the %.2f GB/s read bandwidth measured now\n", gbps,
                        100.0 * gbps / bw, bw);
            std::printf("memory       peak RSS %.1f MB; backend allocations %.1f MB (state + activations %.1f MB)\n",
                        rss / 1e6, e->backend().allocated_bytes() / 1e6, e->state_bytes() / 1e6);
            std::printf("BENCH tok_s=%.3f ms_token=%.4f bytes_token=%.0f gb_s=%.3f bw_gb_s=%.3f pct_bw=%.2f "
                        "prefill_tok_s=%.2f prefill_gb_s=%.3f peak_rss_mb=%.1f backend=\"%s\"\n",
                        tps, 1e3 * s / *tokens, bpt, gbps, bw, 100.0 * gbps / bw, *prompt / prefill_s, prefill_gbps, rss / 1e6,
                        e->backend().name().c_str());
            return 0;
          }};
}

}  // namespace dq::app
