#include "app/cli_common.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "core/error.h"
#include "core/mapped_file.h"
#include "core/thread_pool.h"

namespace dq::app {

void EngineFlags::add(CLI::App* cmd, bool model_required) {
  auto* m = cmd->add_option("-m,--model", model, "model folder (config.json + safetensors)");
  if (model_required) m->required();
  cmd->add_option("--device", device, "cpu, cuda (device 0) or cuda:N")->check([](const std::string& v) -> std::string {
    try {
      parse_device(v);
      return "";
    } catch (const Error& e) {
      return e.what();
    }
  });
  cmd->add_option("--threads", threads, "CPU threads (0 = all cores)")->check(CLI::Range(0, 1024));
  cmd->add_option("--kernels", kernels, "CPU kernels: auto, reference, generic, avx2, avx512")
      ->check(CLI::IsMember({"auto", "reference", "generic", "avx2", "avx512"}));
  cmd->add_option("--ctx", ctx, "context length (KV cache size)")->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--prefill-chunk", prefill_chunk, "prompt tokens per prefill forward (0: the backend's: CPU 64, CUDA 256)")
      ->check(CLI::Range(0, 1 << 16));
}

EngineOptions EngineFlags::options() const {
  EngineOptions o;
  o.device = device;
  o.cpu_kernels = parse_cpu_kernels(kernels);
  o.threads = threads;
  o.max_ctx = ctx;
  o.prefill_chunk = prefill_chunk;
  return o;
}

void SamplingFlags::add(CLI::App* cmd) {
  cmd->add_option("--temp", temperature, "sampling temperature (0 = greedy)")->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-p", top_p, "nucleus sampling mass")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--top-k", top_k, "keep the k most likely tokens (0 = all)")->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--min-p", min_p, "drop tokens below min_p x the best probability")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--presence-penalty", presence, "OpenAI presence penalty")->check(CLI::Range(-2.0, 2.0));
  cmd->add_option("--frequency-penalty", frequency, "OpenAI frequency penalty")->check(CLI::Range(-2.0, 2.0));
  cmd->add_option("--repetition-penalty", repetition, "HF repetition penalty")->check(CLI::Range(0.01, 100.0));
  cmd->add_option("--seed", seed, "random seed (reproducible sampling)")->check(CLI::Range(int64_t(0), INT64_MAX));
  cmd->add_option("--stop", stop, "stop string (repeatable; never printed)");
}

SamplingParams SamplingFlags::params() const {
  SamplingParams p;
  p.temperature = temperature;
  p.top_p = top_p;
  p.top_k = top_k;
  p.min_p = min_p;
  p.presence_penalty = presence;
  p.frequency_penalty = frequency;
  p.repetition_penalty = repetition;
  if (seed >= 0) p.seed = uint64_t(seed);
  return p;
}

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string tok = s.substr(i, j - i);
    while (!tok.empty() && tok.front() == ' ') tok.erase(tok.begin());
    while (!tok.empty() && tok.back() == ' ') tok.pop_back();
    char* end = nullptr;
    errno = 0;
    long long v = tok.empty() ? 0 : std::strtoll(tok.c_str(), &end, 10);
    if (tok.empty() || *end != '\0' || errno || v < 0 || v > INT32_MAX)
      fail("--ids: entry {} is \"{}\", expected a non-negative integer token id", ids.size() + 1, tok);
    ids.push_back(int32_t(v));
    i = j + 1;
  }
  return ids;
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

size_t peak_rss_bytes() {
  struct rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return size_t(ru.ru_maxrss) * 1024;
}

std::string demo_model_dir() {
  if (const char* e = std::getenv("DELTAQ_DEMO_MODEL")) return e;
  return DELTAQ_DEMO_DIR;
}

}  // namespace dq::app
