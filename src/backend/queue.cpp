#include "backend/queue.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <variant>

namespace dq {

OpProfile::OpProfile() {
  const char* e = std::getenv("DELTAQ_PROFILE");
  enabled_ = e && *e && std::strcmp(e, "0") != 0;
}

const char* OpProfile::row_name(const Op& op) {
  if (const auto* p = std::get_if<op::Project>(&op); p && p->w[0].rows >= 65536) return "project_head";
  return op_name(op);
}

size_t OpProfile::bytes(const Op& op) {
  if (const auto* p = std::get_if<op::ProjectGdn>(&op)) return bytes(Op(p->proj)) + bytes(Op(p->core));
  return std::visit(
      [](const auto& o) -> size_t {
        using T = std::decay_t<decltype(o)>;
        if constexpr (std::is_same_v<T, op::Project>) {
          size_t b = 0;
          for (int i = 0; i < o.n_out; ++i) b += o.w[i].bytes();
          return b;
        } else if constexpr (std::is_same_v<T, op::ProjectAdd>) {
          return o.w.bytes();
        } else if constexpr (std::is_same_v<T, op::SwiGLU>) {
          return o.gate.bytes() + o.up.bytes();
        } else if constexpr (std::is_same_v<T, op::GdnCore>) {
          return size_t(o.d.n_v_heads) * o.d.k_dim * o.d.v_dim * 8;  // the state, read and written
        } else {
          return 0;
        }
      },
      op);
}

void OpProfile::add(const char* row, double ms, size_t b) {
  Total& t = rows_[row];
  t.ms += ms;
  t.bytes += double(b);
  t.n += 1;
}

void OpProfile::print() const {
  double total = 0;
  for (const auto& [n, t] : rows_) total += t.ms;
  std::fprintf(stderr, "\n%-14s %8s %12s %10s %10s %8s\n", "op", "calls", "total ms", "us/call", "GB/s", "share");
  for (const auto& [n, t] : rows_)
    std::fprintf(stderr, "%-14s %8ld %12.3f %10.2f %10.1f %7.1f%%\n", n.c_str(), t.n, t.ms, 1e3 * t.ms / t.n,
                 t.bytes / (t.ms * 1e-3) / 1e9, 100.0 * t.ms / total);
}

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
