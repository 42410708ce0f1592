// Errors: one exception type carrying a complete, user-facing message
// ("file: tensor 'x': expected ..., got ..."). Thrown at the edges (loaders, CLI, API);
// DQ_CHECK guards internal invariants.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace dq {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

template <class... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace dq

#define DQ_CHECK(cond, ...)                                                        \
  do {                                                                             \
    if (!(cond)) ::dq::fail("internal check failed: {} ({}:{}) {}", #cond, __FILE__, \
                            __LINE__, ::fmt::format(__VA_ARGS__));                 \
  } while (0)
