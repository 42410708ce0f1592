// The general async queue (docs/architecture.md): go() enqueues any op and returns at once;
// wait() ends a stage — it blocks until everything queued so far is done, releases the buffers
// those ops held, and rethrows the first error raised while running them (naming the op).
// DELTAQ_TRACE=1 prints one line per wait: ops, device time, wall time.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "ops/ops.h"

namespace dq {

// A recorded sequence of ops (a decode step) that can be replayed.
class Graph {
 public:
  virtual ~Graph() = default;
  virtual int n_ops() const = 0;
};

class Queue {
 public:
  virtual ~Queue() = default;
  virtual void go(Op op) = 0;
  virtual void wait() = 0;

  // Partial waits: mark() names the point after the ops issued so far (a number that grows);
  // wait_for(m) blocks until the ops issued before mark m are done — their reads delivered,
  // their buffers released, their errors rethrown — while ops issued after it may go on
  // running. wait() is wait_for(mark()). On a backend that overlaps(), ops run while the host
  // goes on, so issuing the next step before waiting for this one keeps the device busy.
  virtual uint64_t mark() = 0;
  virtual void wait_for(uint64_t mark) = 0;
  virtual bool overlaps() const { return false; }

  // Records the ops `issue` enqueues (they do not run now) into a graph.
  virtual std::unique_ptr<Graph> capture(const std::function<void()>& issue) = 0;
  // Enqueues one run of a recorded graph, like go() does for one op.
  virtual void replay(const Graph& g) = 0;
};

// DELTAQ_PROFILE=1: per-op time, calls and the bytes of weights and state each op reads,
// gathered by a backend's queue and printed at its end (both backends print the same table).
class OpProfile {
 public:
  OpProfile();
  bool enabled() const { return enabled_; }
  // The op's row (the output head gets its own: it is a quarter of the bytes) and its bytes.
  static const char* row_name(const Op& op);
  static size_t bytes(const Op& op);
  void add(const char* row, double ms, size_t bytes);
  void print() const;

 private:
  struct Total {
    double ms = 0, bytes = 0;
    long n = 0;
  };
  bool enabled_;
  std::map<std::string, Total> rows_;
};

// Per-wait trace line, shared by the backends.
class WaitTrace {
 public:
  explicit WaitTrace(std::string backend);
  bool enabled() const { return enabled_; }
  // Called at each wait with the number of ops it completed and the device time they took.
  void report(int ops, double device_ms, double wall_ms);

 private:
  std::string backend_;
  bool enabled_;
  long waits_ = 0;
};

}  // namespace dq
