// A safety net under the depth limits: knows where the current thread's stack ends and says
// when a recursion gets within kReserve bytes of it, whatever the thread's stack size (a
// server worker thread may have far less than the main thread's 8 MiB) and however large the
// frames are (sanitizer builds make them several times larger).
#pragma once
#include <pthread.h>

#include <cstddef>
#include <cstdint>

namespace dq::chat {

class StackGuard {
 public:
  static constexpr size_t kReserve = 256 * 1024;  // left for unwinding and the caller (a quarter of small stacks)

  StackGuard() : limit_(thread_limit()) {}
  // True when the caller's frame is within kReserve of the end of the stack.
  bool exhausted() const {
    char probe;
    return reinterpret_cast<uintptr_t>(&probe) < limit_;
  }

 private:
  uintptr_t limit_;

  static uintptr_t thread_limit() {
    thread_local uintptr_t limit = [] {
      pthread_attr_t attr;
      void* low = nullptr;
      size_t size = 0;
      if (pthread_getattr_np(pthread_self(), &attr) != 0) return uintptr_t{0};
      pthread_attr_getstack(&attr, &low, &size);
      pthread_attr_destroy(&attr);
      if (!low) return uintptr_t{0};
      return reinterpret_cast<uintptr_t>(low) + (size / 4 < kReserve ? size / 4 : kReserve);
    }();
    return limit;
  }
};

}  // namespace dq::chat
