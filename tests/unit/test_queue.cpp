// The general queue: go/wait, errors at the wait naming the op, lifetime safety, graphs, trace.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "queue_cases.h"

using namespace dq;

namespace {

Matrix dense(Backend& be, int rows, int cols, uint32_t seed) {
  Matrix m;
  m.format = WFormat::F32;
  m.rows = rows;
  m.cols = cols;
  m.name = "test.weight";
  std::vector<float> w(size_t(rows) * cols);
  std::mt19937 rng(seed);
  std::normal_distribution<float> n;
  for (float& v : w) v = n(rng);
  m.w = be.upload(w.data(), w.size() * 4, "w");
  return m;
}

std::vector<float> run_product(Backend& be, bool drop_handles) {
  auto q = be.make_queue();
  std::vector<float> out(64);
  std::weak_ptr<BufferStorage> watch;
  {
    Matrix m = dense(be, 64, 32, 7);
    std::vector<float> xv(32);
    for (int i = 0; i < 32; ++i) xv[i] = 0.1f * i - 1.f;
    Ref x{be.upload(xv.data(), 128, "x")};
    Ref y{be.alloc(256, "y")};
    watch = m.w;
    q->go(op::Project{x, Ref{}, 0, {m}, {y}, 1, 1});
    q->go(op::Read{y.buf, 0, 256, out.data()});
    if (!drop_handles) {
      q->wait();
      return out;
    }
  }  // every handle dropped before the wait: the queue keeps the buffers alive
  EXPECT_FALSE(watch.expired());
  q->wait();
  EXPECT_TRUE(watch.expired());  // released at the wait
  return out;
}

}  // namespace

TEST(Queue, DroppingHandlesBeforeTheWaitIsSafe) {
  for (CpuKernels k : {CpuKernels::Reference, CpuKernels::Auto}) {
    auto be = make_cpu_backend(k, 2);
    std::vector<float> kept = run_product(*be, false);
    std::vector<float> dropped = run_product(*be, true);
    EXPECT_EQ(std::memcmp(kept.data(), dropped.data(), kept.size() * 4), 0);
  }
}

TEST(Queue, OpsRunInOrder) {
  auto be = make_cpu_backend(CpuKernels::Auto, 2);
  auto q = be->make_queue();
  Ref pos{be->alloc(4, "pos")};
  int32_t seen[3] = {};
  for (int i = 0; i < 3; ++i) {
    q->go(op::AdvancePos{pos, i + 1});
    q->go(op::Read{pos.buf, 0, 4, &seen[i]});
  }
  q->wait();
  EXPECT_EQ(seen[0], 1);
  EXPECT_EQ(seen[1], 3);
  EXPECT_EQ(seen[2], 6);
}

TEST(Queue, ErrorsAreRethrownAtTheWaitWithTheOpName) {
  auto be = make_cpu_backend(CpuKernels::Auto, 2);
  auto q = be->make_queue();
  Matrix table = dense(*be, 10, 8, 1);
  Ref tok{be->alloc(4, "tok")}, out{be->alloc(32, "out")}, pos{be->alloc(4, "pos")};
  int32_t bad = 99;
  op::Write w{tok.buf, 0, std::vector<uint8_t>(4)};
  std::memcpy(w.bytes.data(), &bad, 4);
  q->go(std::move(w));
  q->go(op::Embed{table, tok, out, 1});  // fails on the executor
  q->go(op::AdvancePos{pos, 5});         // skipped: the stage failed
  try {
    q->wait();
    FAIL() << "expected the embed error at the wait";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("embed: token id 99 out of range"), std::string::npos) << e.what();
  }
  // The queue is usable again after the failed stage.
  int32_t p = -1;
  q->go(op::AdvancePos{pos, 1});
  q->go(op::Read{pos.buf, 0, 4, &p});
  q->wait();
  EXPECT_EQ(p, 1);
}

TEST(Queue, CaptureRecordsAndReplayRuns) {
  auto be = make_cpu_backend(CpuKernels::Auto, 2);
  auto q = be->make_queue();
  Ref pos{be->alloc(4, "pos")};
  auto g = q->capture([&] {
    q->go(op::AdvancePos{pos, 2});
    q->go(op::AdvancePos{pos, 3});
  });
  EXPECT_EQ(g->n_ops(), 2);
  int32_t p = -1;
  q->go(op::Read{pos.buf, 0, 4, &p});
  q->wait();
  EXPECT_EQ(p, 0);  // capturing runs nothing
  q->replay(*g);
  q->replay(*g);
  q->go(op::Read{pos.buf, 0, 4, &p});
  q->wait();
  EXPECT_EQ(p, 10);
}

TEST(Queue, TracePrintsOneLinePerWait) {
  setenv("DELTAQ_TRACE", "1", 1);
  auto be = make_cpu_backend(CpuKernels::Auto, 1);
  auto q = be->make_queue();
  Ref pos{be->alloc(4, "pos")};
  ::testing::internal::CaptureStderr();
  q->go(op::AdvancePos{pos, 1});
  q->go(op::AdvancePos{pos, 1});
  q->go(op::AdvancePos{pos, 1});
  q->wait();
  q->go(op::AdvancePos{pos, 1});
  q->wait();
  std::string err = ::testing::internal::GetCapturedStderr();
  unsetenv("DELTAQ_TRACE");
  EXPECT_NE(err.find("wait 1: 3 ops, device"), std::string::npos) << err;
  EXPECT_NE(err.find("wait 2: 1 ops, device"), std::string::npos) << err;
  EXPECT_NE(err.find("wall"), std::string::npos) << err;
}

TEST(ThreadPool, CoversTheRangeOnce) {
  for (int threads : {1, 2, 3, 7}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 5, 64, 1000, 12345}) {
      std::vector<int> hits(size_t(n), 0);
      pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
      }, 8);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)], 1);
    }
  }
}

TEST(Queue, PartialWaitsDeliverAndReleaseOnlyWhatIsBeforeTheMark) {
  for (CpuKernels k : {CpuKernels::Reference, CpuKernels::Auto}) {
    auto be = make_cpu_backend(k, 2);
    queue_cases::partial_waits(*be);
    queue_cases::many_segments(*be);
    queue_cases::readback_buffers(*be);
  }
}

TEST(Queue, ProfilePrintsOneRowPerOpAtTheEnd) {
  setenv("DELTAQ_PROFILE", "1", 1);
  auto be = make_cpu_backend(CpuKernels::Auto, 1);
  ::testing::internal::CaptureStderr();
  {
    auto q = be->make_queue();
    Ref pos{be->alloc(4, "pos")};
    int32_t p = 0;
    for (int i = 0; i < 3; ++i) q->go(op::AdvancePos{pos, 1});
    q->go(op::Read{pos.buf, 0, 4, &p});
    q->wait();
    EXPECT_EQ(p, 3);
  }  // the table comes at the queue's end
  std::string err = ::testing::internal::GetCapturedStderr();
  unsetenv("DELTAQ_PROFILE");
  EXPECT_NE(err.find("calls"), std::string::npos) << err;
  EXPECT_NE(err.find("advance_pos           3"), std::string::npos) << err;
  EXPECT_NE(err.find("read                  1"), std::string::npos) << err;
}
