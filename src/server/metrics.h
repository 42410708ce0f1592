// Prometheus text metrics of the server: requests by endpoint and status, latency histogram, and
// the worker's token / time counters and queue gauges.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "server/worker.h"

namespace dq::server {

class Metrics {
 public:
  // endpoint: one of the known paths or "other" (keeps the label set bounded).
  static std::string endpoint_label(const std::string& path);
  void record(const std::string& endpoint, int status, double seconds);
  std::string render(const Worker& worker) const;

 private:
  static constexpr std::array<double, 11> kBuckets = {0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120};
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, std::array<uint64_t, kBuckets.size() + 1>> latency_;  // per endpoint, +Inf last
  std::map<std::string, double> latency_sum_;
};

}  // namespace dq::server
