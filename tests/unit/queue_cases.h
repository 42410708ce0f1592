// Queue semantics shared by the CPU and the CUDA tests: partial waits (mark / wait_for).
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "backend/backend.h"

namespace queue_cases {

using namespace dq;

// Three segments of ops on separate buffers: wait_for(mark) delivers exactly the reads before
// the mark and releases exactly their buffers; later segments stay pending (or running).
inline void partial_waits(Backend& be) {
  auto q = be.make_queue();
  int32_t seen[3] = {-1, -1, -1};
  std::weak_ptr<BufferStorage> watch[3];
  uint64_t marks[2] = {0, 0};
  {
    Ref pos[3] = {Ref{be.alloc(4, "pos0")}, Ref{be.alloc(4, "pos1")}, Ref{be.alloc(4, "pos2")}};
    for (int i = 0; i < 3; ++i) {
      watch[i] = pos[i].buf;
      q->go(op::Zero{pos[i].buf});
      q->go(op::AdvancePos{pos[i], i + 1});
      q->go(op::AdvancePos{pos[i], 10 * (i + 1)});
      q->go(op::Read{pos[i].buf, 0, 4, &seen[i]});
      if (i < 2) marks[i] = q->mark();
    }
  }  // every handle dropped: the queue holds the buffers
  EXPECT_LT(marks[0], marks[1]);
  EXPECT_EQ(q->mark(), q->mark());  // no ops in between: the same point
  q->wait_for(marks[0]);
  EXPECT_EQ(seen[0], 11);
  EXPECT_TRUE(watch[0].expired());
  EXPECT_FALSE(watch[1].expired());
  EXPECT_FALSE(watch[2].expired());
  q->wait_for(marks[0]);  // again: nothing left before it
  q->wait_for(marks[1]);
  EXPECT_EQ(seen[1], 22);
  EXPECT_TRUE(watch[1].expired());
  EXPECT_FALSE(watch[2].expired());
  q->wait();
  EXPECT_EQ(seen[2], 33);
  EXPECT_TRUE(watch[2].expired());
}

// Many marks in flight with reads of a few KB each (more than the CUDA queue keeps error
// records for, and enough to wrap its staging ring), waited for in order, then all at once.
inline void many_segments(Backend& be) {
  auto q = be.make_queue();
  const int n = 60, words = 1500;
  std::vector<float> src(words);
  for (int i = 0; i < words; ++i) src[i] = float(i) * 0.5f;
  Ref buf{be.upload(src.data(), src.size() * 4, "src")};
  std::vector<std::vector<float>> got(n, std::vector<float>(words, -1.0f));
  std::vector<uint64_t> marks;
  for (int i = 0; i < n; ++i) {
    const size_t off = size_t(i % 7) * 4;
    q->go(op::Read{buf.buf, off, (words - 7) * 4, got[i].data()});
    marks.push_back(q->mark());
  }
  for (int i = 0; i < n / 2; ++i) {
    q->wait_for(marks[i]);
    EXPECT_EQ(got[i][0], src[i % 7]) << i;
    EXPECT_EQ(got[i][words - 8], src[words - 8 + i % 7]) << i;
  }
  q->wait();
  for (int i = n / 2; i < n; ++i) EXPECT_EQ(got[i][words - 8], src[words - 8 + i % 7]) << i;
}

// Readback buffers (Backend::alloc_readback): ops write them in place and the host reads them
// at the wait. The engine's pattern: two of them taken in turn, each step's read issued before
// the previous step is waited for; handles dropped before the wait; a Write into one.
inline void readback_buffers(Backend& be) {
  auto q = be.make_queue();
  std::weak_ptr<BufferStorage> watch;
  int32_t seen[9];
  {
    Ref slot[2] = {Ref{be.alloc_readback(4, "next0")}, Ref{be.alloc_readback(4, "next1")}};
    watch = slot[1].buf;
    uint64_t marks[9];
    for (int i = 0; i < 9; ++i) {
      seen[i] = -1;
      const Ref& r = slot[i % 2];
      if (i < 2) q->go(op::Zero{r.buf});
      q->go(op::AdvancePos{r, i + 1});
      q->go(op::Read{r.buf, 0, 4, &seen[i]});
      marks[i] = q->mark();
      if (i > 0) q->wait_for(marks[i - 1]);
    }
    q->wait();
  }
  // slot 0 took 1, 3, 5, 7, 9 and slot 1 took 2, 4, 6, 8, in turn.
  const int32_t want[9] = {1, 2, 4, 6, 9, 12, 16, 20, 25};
  for (int i = 0; i < 9; ++i) EXPECT_EQ(seen[i], want[i]) << i;
  EXPECT_TRUE(watch.expired());
  Ref w{be.alloc_readback(8, "written")};
  op::Write wr{w.buf, 4, std::vector<uint8_t>(4)};
  const int32_t v = 41;
  std::memcpy(wr.bytes.data(), &v, 4);
  q->go(std::move(wr));
  q->go(op::AdvancePos{w.at(1), 1});
  int32_t got[2] = {-1, -1};
  q->go(op::Read{w.buf, 0, 8, got});
  q->wait();
  EXPECT_EQ(got[0], 0);  // zero-filled
  EXPECT_EQ(got[1], 42);
}

}  // namespace queue_cases
