// Queue semantics shared by the CPU and the CUDA tests: partial waits (mark / wait_for).
#pragma once
#include <gtest/gtest.h>

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

}  // namespace queue_cases
