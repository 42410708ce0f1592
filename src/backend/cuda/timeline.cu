// The kernel lab's timeline (built with -DDELTAQ_TIMELINE=ON; see cuda_util.cuh pdl_wait_at):
// merges the wait records of every kernel file in time order, cuts them into decode steps at
// the embedding kernel, and prints per kernel position of a step the mean time from its wait's
// release to the next kernel's (what the kernel costs on the step's critical path) and how
// long the recording block (0, or DELTAQ_TIMELINE_BLOCK) sat at the wait (near zero: the kernel
// started late, launch-bound).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "backend/cuda/cuda_util.cuh"

namespace dq::cuda {

#ifdef DELTAQ_TIMELINE
namespace {
struct Source {
  void (*collect)(std::vector<TimelineRecord>*, const char*);
  void (*set_block)(unsigned);
  void (*sm_collect)(std::vector<SmRecord>*, const char*);
  void (*sm_enable)();
  const char* file;
};
std::vector<Source>& sources() {
  static std::vector<Source> s;
  return s;
}
}  // namespace

void timeline_register(void (*collect)(std::vector<TimelineRecord>*, const char*), void (*set_block)(unsigned),
                       void (*sm_collect)(std::vector<SmRecord>*, const char*), void (*sm_enable)(), const char* file) {
  sources().push_back({collect, set_block, sm_collect, sm_enable, file});
}

void timeline_start() {
  if (std::getenv("DELTAQ_TIMELINE") && std::getenv("DELTAQ_TIMELINE_SM"))
    for (const Source& s : sources()) s.sm_enable();
  const char* b = std::getenv("DELTAQ_TIMELINE_BLOCK");
  if (!b || !std::getenv("DELTAQ_TIMELINE")) return;
  for (const Source& s : sources()) s.set_block(unsigned(std::strtoul(b, nullptr, 10)));
}

void timeline_dump() {
  if (!std::getenv("DELTAQ_TIMELINE")) return;
  cudaDeviceSynchronize();
  if (const char* path = std::getenv("DELTAQ_TIMELINE_SM")) {  // file,t_ns,tag,block,grid,sm
    std::vector<SmRecord> sm;
    for (const Source& s : sources()) s.sm_collect(&sm, s.file);
    std::sort(sm.begin(), sm.end(), [](const SmRecord& a, const SmRecord& b) { return a.t < b.t; });
    if (FILE* f = std::fopen(path, "w")) {
      for (const SmRecord& r : sm) {
        const char* base = std::strrchr(r.file, '/');
        std::fprintf(f, "%s,%llu,%llu,%llu,%llu,%llu\n", base ? base + 1 : r.file, r.t, r.packed & 0xFF,
                     (r.packed >> 8) & 0xFFFF, (r.packed >> 24) & 0xFFFF, r.packed >> 40);
      }
      std::fclose(f);
    } else {
      std::fprintf(stderr, "timeline: cannot write the SM records to %s\n", path);
    }
  }
  std::vector<TimelineRecord> r;
  for (const Source& s : sources()) s.collect(&r, s.file);
  std::sort(r.begin(), r.end(), [](const auto& a, const auto& b) { return a.release_ns < b.release_ns; });
  auto name = [](const TimelineRecord& t) {
    const char* f = std::strrchr(t.file, '/');
    return std::string(f ? f + 1 : t.file) + ":" + std::to_string(t.line);
  };
  // Steps start at the embedding kernel (small.cu); the most common step length is the decode step.
  std::vector<size_t> starts;
  for (size_t i = 0; i < r.size(); ++i)
    if (std::strstr(r[i].file, "small.cu") && i + 1 < r.size() && name(r[i]) == name(r[0])) starts.push_back(i);
  std::map<size_t, int> lengths;
  for (size_t k = 0; k + 1 < starts.size(); ++k) ++lengths[starts[k + 1] - starts[k]];
  size_t len = 0;
  int best = 0;
  for (auto [l, n] : lengths)
    if (n > best) best = n, len = l;
  if (len == 0) {
    std::fprintf(stderr, "timeline: %zu records, no repeated step found\n", r.size());
    return;
  }
  std::vector<double> cost(len, 0.0), waited(len, 0.0);
  int steps = 0;
  double total = 0;
  for (size_t k = 0; k + 1 < starts.size(); ++k) {
    const size_t a = starts[k];
    if (starts[k + 1] - a != len || k < 2) continue;  // warm-up steps and other lengths skipped
    for (size_t j = 0; j < len; ++j) {
      cost[j] += double(r[a + j + 1].release_ns - r[a + j].release_ns);
      waited[j] += double(r[a + j].release_ns - r[a + j].arrive_ns);
    }
    total += double(r[a + len].release_ns - r[a].release_ns);
    ++steps;
  }
  std::fprintf(stderr, "\ntimeline: %d steps of %zu kernels, %.2f us per step\n", steps, len, total / steps / 1e3);
  std::fprintf(stderr, "%4s %-28s %10s %10s\n", "#", "kernel (wait at)", "cost us", "waited us");
  std::map<std::string, std::pair<double, int>> by_kernel;
  for (size_t j = 0; j < len; ++j) {
    const std::string n = name(r[starts[2] + j]);
    std::fprintf(stderr, "%4zu %-28s %10.2f %10.2f\n", j, n.c_str(), cost[j] / steps / 1e3, waited[j] / steps / 1e3);
    by_kernel[n].first += cost[j] / steps / 1e3;
    ++by_kernel[n].second;
  }
  std::fprintf(stderr, "\n%-28s %6s %10s %10s\n", "kernel (wait at)", "count", "us/step", "us each");
  for (auto& [n, v] : by_kernel)
    std::fprintf(stderr, "%-28s %6d %10.2f %10.2f\n", n.c_str(), v.second, v.first, v.first / v.second);
}
#else
void timeline_dump() {}
void timeline_start() {}
#endif

}  // namespace dq::cuda
