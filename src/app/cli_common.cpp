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
  cmd->add_option("--device", device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--threads", threads, "CPU threads (0 = all cores)")->check(CLI::Range(0, 1024));
  cmd->add_option("--kernels", kernels, "CPU kernels: auto, reference, generic, avx2, avx512")
      ->check(CLI::IsMember({"auto", "reference", "generic", "avx2", "avx512"}));
  cmd->add_option("--ctx", ctx, "context length (KV cache size)")->check(CLI::Range(1, 1 << 24));
}

EngineOptions EngineFlags::options() const {
  EngineOptions o;
  o.device = device;
  o.cpu_kernels = parse_cpu_kernels(kernels);
  o.threads = threads;
  o.max_ctx = ctx;
  return o;
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
