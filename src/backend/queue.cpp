#include "backend/queue.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace dq {

WaitTrace::WaitTrace(std::string backend) : backend_(std::move(backend)) {
  const char* e = std::getenv("DELTAQ_TRACE");
  enabled_ = e && *e && std::strcmp(e, "0") != 0;
}

void WaitTrace::report(int ops, double device_ms, double wall_ms) {
  ++waits_;
  if (!enabled_) return;
  std::fprintf(stderr, "[trace %s] wait %ld: %d ops, device %.3f ms, wall %.3f ms\n", backend_.c_str(), waits_, ops,
               device_ms, wall_ms);
}

}  // namespace dq
