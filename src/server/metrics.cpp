#include "server/metrics.h"

#include <fmt/format.h>

namespace dq::server {

std::string Metrics::endpoint_label(const std::string& path) {
  static const char* known[] = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health",
                                "/metrics",             "/tokenize",       "/detokenize"};
  for (const char* k : known)
    if (path == k) return k;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
}

void Metrics::record(const std::string& endpoint, int status, double seconds) {
  std::lock_guard<std::mutex> lk(mu_);
  ++requests_[{endpoint, status}];
  auto& h = latency_[endpoint];
  size_t b = 0;
  while (b < kBuckets.size() && seconds > kBuckets[b]) ++b;
  ++h[b];
  latency_sum_[endpoint] += seconds;
}

std::string Metrics::render(const Worker& w) const {
  std::string o;
  auto head = [&](const char* name, const char* type, const char* help) {
    o += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  {
    std::lock_guard<std::mutex> lk(mu_);
    head("deltaq_requests_total", "counter", "HTTP requests by endpoint and status.");
    for (const auto& [k, n] : requests_)
      o += fmt::format("deltaq_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", k.first, k.second, n);
    head("deltaq_request_duration_seconds", "histogram", "Time from the request to the end of its response.");
    for (const auto& [ep, h] : latency_) {
      uint64_t cum = 0;
      for (size_t b = 0; b < h.size(); ++b) {
        cum += h[b];
        std::string le = b < kBuckets.size() ? fmt::format("{}", kBuckets[b]) : "+Inf";
        o += fmt::format("deltaq_request_duration_seconds_bucket{{endpoint=\"{}\",le=\"{}\"}} {}\n", ep, le, cum);
      }
      o += fmt::format("deltaq_request_duration_seconds_sum{{endpoint=\"{}\"}} {:.6f}\n", ep, latency_sum_.at(ep));
      o += fmt::format("deltaq_request_duration_seconds_count{{endpoint=\"{}\"}} {}\n", ep, cum);
    }
  }
  const Worker::Stats s = w.stats();
  head("deltaq_prompt_tokens_total", "counter", "Prompt tokens processed.");
  o += fmt::format("deltaq_prompt_tokens_total {}\n", s.prompt_tokens);
  head("deltaq_prompt_cached_tokens_total", "counter", "Prompt tokens not fed again: held by the engine or restored.");
  o += fmt::format("deltaq_prompt_cached_tokens_total {}\n", s.cached_tokens);
  head("deltaq_prompt_cache_restores_total", "counter", "Prompts that continued from a saved state.");
  o += fmt::format("deltaq_prompt_cache_restores_total {}\n", s.cache_restores);
  head("deltaq_prompt_cache_saves_total", "counter", "States saved at a prompt's end.");
  o += fmt::format("deltaq_prompt_cache_saves_total {}\n", s.cache_saves);
  head("deltaq_prompt_cache_bytes", "gauge", "Bytes of saved states held (host memory).");
  o += fmt::format("deltaq_prompt_cache_bytes {}\n", s.cache_bytes);
  head("deltaq_prompt_cache_entries", "gauge", "Saved states held.");
  o += fmt::format("deltaq_prompt_cache_entries {}\n", s.cache_entries);
  head("deltaq_completion_tokens_total", "counter", "Tokens generated.");
  o += fmt::format("deltaq_completion_tokens_total {}\n", s.completion_tokens);
  head("deltaq_prompt_seconds_total", "counter", "Time spent on prompts (prefill).");
  o += fmt::format("deltaq_prompt_seconds_total {:.6f}\n", s.prompt_seconds);
  head("deltaq_generation_seconds_total", "counter", "Time spent generating after the prompt.");
  o += fmt::format("deltaq_generation_seconds_total {:.6f}\n", s.gen_seconds);
  head("deltaq_prompt_tokens_per_second", "gauge", "Prefill speed of the last request.");
  o += fmt::format("deltaq_prompt_tokens_per_second {:.3f}\n", s.last_prompt_tps);
  head("deltaq_generation_tokens_per_second", "gauge", "Generation speed of the last request.");
  o += fmt::format("deltaq_generation_tokens_per_second {:.3f}\n", s.last_gen_tps);
  head("deltaq_jobs_total", "counter", "Generations run by the engine worker, by outcome.");
  const uint64_t done = s.jobs - s.cancelled - s.timed_out - s.failed;
  o += fmt::format("deltaq_jobs_total{{outcome=\"completed\"}} {}\n", done);
  o += fmt::format("deltaq_jobs_total{{outcome=\"cancelled\"}} {}\n", s.cancelled);
  o += fmt::format("deltaq_jobs_total{{outcome=\"timed_out\"}} {}\n", s.timed_out);
  o += fmt::format("deltaq_jobs_total{{outcome=\"failed\"}} {}\n", s.failed);
  head("deltaq_queue_depth", "gauge", "Requests waiting for the engine.");
  o += fmt::format("deltaq_queue_depth {}\n", w.queue_depth());
  head("deltaq_requests_running", "gauge", "Requests the engine is generating now.");
  o += fmt::format("deltaq_requests_running {}\n", w.running_count());
  head("deltaq_model_ready", "gauge", "1 once the model is loaded.");
  o += fmt::format("deltaq_model_ready {}\n", w.state() == Worker::State::Ready ? 1 : 0);
  return o;
}

}  // namespace dq::server
