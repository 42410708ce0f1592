// Buffers: reference-counted memory owned by a backend (host memory on the CPU backend,
// device memory on CUDA). An op holds a reference to every buffer it touches, and the queue
// keeps the op until the wait that completes it: dropping a handle early is always safe.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace dq {

struct BufferStorage {
  virtual ~BufferStorage() = default;
  void* ptr = nullptr;  // host or device address, depending on the backend
  size_t bytes = 0;
  std::string name;
  // The host reads ptr itself (no copy in the stream): a Read of it is a host copy at the wait
  // that completes the Read (Backend::alloc_readback).
  bool host_visible = false;
};
using Buffer = std::shared_ptr<BufferStorage>;

// A buffer plus an element offset. Ops address their operands through Refs.
struct Ref {
  Buffer buf;
  size_t off = 0;  // in elements of the type the op reads

  explicit operator bool() const { return bool(buf); }
  template <class T>
  T* as() const {
    return static_cast<T*>(buf->ptr) + off;
  }
  Ref at(size_t elements) const { return Ref{buf, off + elements}; }
};

}  // namespace dq
