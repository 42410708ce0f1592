// The CUDA backend on a GPU machine (tools/gpu-check runs this; CI only compiles it):
// every op bit-identical to the CPU reference, the queue's semantics, and whole models
// giving the same logits bytes on the CPU and the GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "../unit/lockstep.h"
#include "../unit/parity_cases.h"
#include "../unit/queue_cases.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "ops/reference.h"
#include "runtime/batcher.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

using namespace dq;
using namespace parity;

namespace {

std::vector<Target> cuda_target() {
  std::string why;
  if (!cuda_device_available(&why)) throw std::runtime_error("test_cuda needs a CUDA device: " + why);
  std::shared_ptr<Backend> be = make_cuda_backend();
  std::shared_ptr<Queue> q = be->make_queue();
  return {Target{be->name(), be, q, {}, {}}};
}

const std::string kData = DQ_TEST_DATA;
const std::string kDemo = std::string(DQ_SOURCE_DIR) + "/models/demo-fortunes/mlx-4bit";

// One checkpoint opened on the CPU and on CUDA, with the same options otherwise.
struct EnginePair {
  std::unique_ptr<Engine> cpu, gpu;
};
EnginePair open_pair(const std::string& dir, EngineOptions o = {}) {
  EnginePair p;
  p.cpu = Engine::open(dir, o);
  o.device = "cuda";
  p.gpu = Engine::open(dir, o);
  return p;
}

}  // namespace

TEST(CudaParity, Project) {
  auto t = cuda_target();
  project_cases(t, true);
}
// Backend::product_matrix on CUDA: which matrices take the lane layout, and where their words
// and scales land (the positions written out from q4.cuh's definition, not from its functions).
TEST(CudaBackend, ProductMatrixLaneLayout) {
  auto t = cuda_target();
  Rig rig;
  for (int gs : {32, 64, 256}) {
    const int K = 4096, rows = 3, U = K / 8, G = K / gs, n = gs / 8, gstep = 256 / gs;
    Matrix m = rig.matrix(WFormat::Affine, rows, K, 4, gs, DType::BF16);
    Matrix d = t[0].be->product_matrix(t[0].map(m));
    ASSERT_EQ(d.layout, WLayout::Lanes) << "gs " << gs;
    EXPECT_EQ(d.biases, t[0].map(m).biases);  // the biases keep the row order
    std::vector<uint8_t> w = t[0].read(Ref{d.w}), sc = t[0].read(Ref{d.scales});
    const auto* w0 = static_cast<const uint32_t*>(m.w->ptr);
    const auto* s0 = static_cast<const uint16_t*>(m.scales->ptr);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < U / 256; ++c)
        for (int lane = 0; lane < 32; ++lane)
          for (int i = 0; i < 8; ++i) {
            // A lane's words of a chunk: units lane + 32 i, i = 0..3 then 4..7, 16 bytes each.
            const size_t at = size_t(r) * U + c * 256 + (i / 4) * 128 + lane * 4 + i % 4;
            uint32_t got;
            std::memcpy(&got, &w[4 * at], 4);
            ASSERT_EQ(got, w0[size_t(r) * U + c * 256 + lane + 32 * i]) << "gs " << gs << " word";
            // Its 8 scales: groups (lane / n) + gstep i of the chunk, in a row.
            const int g = c * (2048 / gs) + lane / n + gstep * i;
            const size_t sat = size_t(r) * G + c * (2048 / gs) + (lane / n) * 8 + i;
            uint16_t sg;
            std::memcpy(&sg, &sc[2 * sat], 2);
            ASSERT_EQ(sg, s0[size_t(r) * G + g]) << "gs " << gs << " scale";
          }
  }
  // K = 1024 (the 0.8B's width): one half chunk, 4 units a lane: words lane * 4 + i, and the
  // lane's 4 scales (groups lane / n + gstep i) together.
  for (int gs : {8, 64, 256}) {
    const int K = 1024, rows = 3, U = K / 8, G = K / gs, n = gs / 8, gstep = 256 / gs;
    Matrix m = rig.matrix(WFormat::Affine, rows, K, 4, gs);
    Matrix d = t[0].be->product_matrix(t[0].map(m));
    ASSERT_EQ(d.layout, WLayout::Lanes) << "gs " << gs;
    std::vector<uint8_t> w = t[0].read(Ref{d.w}), sc = t[0].read(Ref{d.scales});
    const auto* w0 = static_cast<const uint32_t*>(m.w->ptr);
    const auto* s0 = static_cast<const uint16_t*>(m.scales->ptr);
    for (int r = 0; r < rows; ++r)
      for (int lane = 0; lane < 32; ++lane)
        for (int i = 0; i < 4; ++i) {
          uint32_t got;
          std::memcpy(&got, &w[4 * (size_t(r) * U + lane * 4 + i)], 4);
          ASSERT_EQ(got, w0[size_t(r) * U + lane + 32 * i]) << "gs " << gs << " word";
          uint16_t sg;
          std::memcpy(&sg, &sc[2 * (size_t(r) * G + (lane / n) * 4 + i)], 2);
          ASSERT_EQ(sg, s0[size_t(r) * G + lane / n + gstep * i]) << "gs " << gs << " scale";
        }
  }
  // Kept as they are: other widths not a multiple of 2048, 8-bit, f16 scales, dense.
  for (Matrix m : {rig.matrix(WFormat::Affine, 4, 3072), rig.matrix(WFormat::Affine, 4, 512),
                   rig.matrix(WFormat::Affine, 4, 3584), rig.matrix(WFormat::Affine, 4, 2048, 8, 64),
                   rig.matrix(WFormat::Affine, 4, 2048, 4, 64, DType::F16), rig.matrix(WFormat::BF16, 4, 2048)})
    EXPECT_EQ(t[0].be->product_matrix(t[0].map(m)).layout, WLayout::Rows);
}

// The lane layout's error paths: a matrix whose buffers are shorter than its shape, and a
// products-only matrix given to the embedding gather.
TEST(CudaBackend, ProductMatrixRejectsShortBuffersAndEmbedRejectsLanes) {
  auto t = cuda_target();
  Rig rig;
  Matrix m = rig.matrix(WFormat::Affine, 4, 2048);
  Matrix shorter = t[0].map(m);
  shorter.rows = 5;  // the buffers hold 4 rows
  try {
    t[0].be->product_matrix(shorter);
    FAIL() << "a matrix longer than its buffers was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("shorter than the shape"), std::string::npos) << e.what();
  }
  Matrix lanes = t[0].be->product_matrix(t[0].map(m));
  ASSERT_EQ(lanes.layout, WLayout::Lanes);
  std::vector<int32_t> ids = {0, 3};
  Ref tok{t[0].be->upload(ids.data(), 8, "ids")}, out{t[0].be->alloc(2 * 2048 * 4, "out")};
  try {
    t[0].q->go(op::Embed{lanes, tok, out, 2});
    t[0].q->wait();
    FAIL() << "the embedding gathered from a products-only layout";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("products-only layout"), std::string::npos) << e.what();
  }
}

TEST(CudaParity, LargeProject) {
  auto t = cuda_target();
  large_project_cases(t);
}
TEST(CudaParity, TallProject) {
  auto t = cuda_target();
  tall_project_cases(t);
  decode_shape_cases(t);
}
TEST(CudaParity, PrefillShapes) {
  auto t = cuda_target();
  prefill_shape_cases(t);
}
TEST(CudaParity, FamilyShapes) {
  auto t = cuda_target();
  family_shape_cases(t);
}
TEST(CudaParity, MixedAndSwiGLU) {
  auto t = cuda_target();
  mixed_and_swiglu_cases(t);
  swiglu_product_cases(t);
}
TEST(CudaParity, Embed) {
  auto t = cuda_target();
  embed_cases(t);
}
TEST(CudaParity, GatedDeltaNet) {
  auto t = cuda_target();
  gdn_cases(t);
  gdn_two_steps_case(t);
  // The one-kernel mixer runs only when every head's cluster fits at once: on the H200 the 2B's
  // 16 must, or its cases above would have checked the fallback (the two ops' kernels) only.
  EXPECT_GE(cuda_gdn_mixer_clusters(), 16);
  gdn_mixer_cases(t);
}
TEST(CudaParity, GatedAttention) {
  auto t = cuda_target();
  attn_cases(t);
  attn_two_steps_case(t);
}
TEST(CudaParity, Argmax) {
  auto t = cuda_target();
  argmax_cases(t);
}
TEST(CudaParity, TopK) {
  auto t = cuda_target();
  top_k_cases(t);
}
TEST(CudaParity, SampleDraw) {
  auto t = cuda_target();
  sample_draw_cases(t);
}

TEST(CudaQueue, DroppingHandlesBeforeTheWaitIsSafe) {
  auto be = make_cuda_backend();
  auto q = be->make_queue();
  std::vector<float> want(256), got(256);
  std::weak_ptr<BufferStorage> watch;
  for (int run = 0; run < 2; ++run) {
    std::vector<float>& out = run == 0 ? want : got;
    {
      std::vector<float> w(256 * 64), x(64);
      for (size_t i = 0; i < w.size(); ++i) w[i] = float(int(i % 13) - 6) * 0.25f;
      for (int i = 0; i < 64; ++i) x[i] = 0.5f - 0.01f * i;
      Matrix m;
      m.format = WFormat::F32;
      m.rows = 256;
      m.cols = 64;
      m.w = be->upload(w.data(), w.size() * 4, "w");
      Ref xr{be->upload(x.data(), x.size() * 4, "x")}, y{be->alloc(256 * 4, "y")};
      watch = m.w;
      q->go(op::Project{xr, Ref{}, 0, {m}, {y}, 1, 1});
      q->go(op::Read{y.buf, 0, 256 * 4, out.data()});
      if (run == 0) q->wait();
    }  // run 1: every handle dropped before the wait
    if (run == 1) {
      EXPECT_FALSE(watch.expired());
      q->wait();
      EXPECT_TRUE(watch.expired());
    }
  }
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0);
}

// Issues an embedding of token `id` from a 10-row table (ids from 10 on raise a device error).
static void issue_embed(Backend& be, Queue& q, int32_t id) {
  Matrix t;
  t.format = WFormat::F32;
  t.rows = 10;
  t.cols = 8;
  t.w = be.alloc(320, "table");
  Ref tok{be.alloc(4, "tok")}, out{be.alloc(32, "out")};
  op::Write w{tok.buf, 0, std::vector<uint8_t>(4)};
  std::memcpy(w.bytes.data(), &id, 4);
  q.go(std::move(w));
  q.go(op::Embed{t, tok, out, 1});
}

TEST(CudaQueue, DeviceErrorsAreRethrownAtTheWaitWithTheOpName) {
  auto be = make_cuda_backend();
  auto q = be->make_queue();
  issue_embed(*be, *q, 77);
  try {
    q->wait();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("embed: token id 77 out of range [0, 10)"), std::string::npos) << e.what();
  }
  Ref pos{be->alloc(4, "pos")};
  int32_t p = -1;
  q->go(op::AdvancePos{pos, 3});
  q->go(op::Read{pos.buf, 0, 4, &p});
  q->wait();
  EXPECT_EQ(p, 3);
}

TEST(CudaQueue, PartialWaitsDeliverAndReleaseOnlyWhatIsBeforeTheMark) {
  auto be = make_cuda_backend();
  queue_cases::partial_waits(*be);
  queue_cases::many_segments(*be);
  queue_cases::readback_buffers(*be);
}

// A device error before a mark, with ops issued after it: the partial wait rethrows it, and
// the queue works again.
TEST(CudaQueue, DeviceErrorsInAPartialWait) {
  auto be = make_cuda_backend();
  auto q = be->make_queue();
  Ref pos{be->alloc(4, "pos")};
  issue_embed(*be, *q, 12);
  const uint64_t m = q->mark();
  q->go(op::AdvancePos{pos, 5});
  EXPECT_THROW(q->wait_for(m), Error);
  int32_t p = -1;
  q->go(op::Zero{pos.buf});
  q->go(op::AdvancePos{pos, 3});
  q->go(op::Read{pos.buf, 0, 4, &p});
  q->wait();
  EXPECT_EQ(p, 3);
}

// Asking for more device memory than there is gives one clear error naming the buffer, and the
// backend works on.
TEST(CudaBackend, OutOfMemoryIsAClearError) {
  auto be = make_cuda_backend();
  const size_t before = be->allocated_bytes();
  try {
    be->alloc(size_t(1) << 44, "a 16 TB buffer");
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of GPU memory allocating"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("a 16 TB buffer"), std::string::npos) << e.what();
  }
  EXPECT_EQ(be->allocated_bytes(), before);
  Ref small{be->alloc(64, "small")};
  EXPECT_EQ(be->allocated_bytes(), before + 64);
}

// The queue's lazily grown scratch (here top_k's keys) counts in the backend's allocated bytes
// while the queue holds it, and is given back with the queue.
TEST(CudaQueue, ScratchCountsInAllocatedBytes) {
  auto be = make_cuda_backend();
  const int n = 248320, k = 20;
  std::vector<float> x(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) x[size_t(i)] = float((int64_t(i) * 7919) % 1009);
  Ref xr{be->upload(x.data(), x.size() * 4, "x")}, ids{be->alloc(k * 4, "ids")}, vals{be->alloc(k * 4, "vals")};
  const size_t buffers = be->allocated_bytes();
  auto q = be->make_queue();
  EXPECT_EQ(be->allocated_bytes(), buffers);
  q->go(op::TopK{xr, n, k, ids, vals});
  q->wait();
  const size_t with_scratch = be->allocated_bytes();
  EXPECT_GT(with_scratch, buffers);
  q->go(op::TopK{xr, n / 2, k, ids, vals});  // smaller: the scratch is reused, not grown
  q->wait();
  EXPECT_EQ(be->allocated_bytes(), with_scratch);
  q.reset();
  EXPECT_EQ(be->allocated_bytes(), buffers);
}

TEST(CudaQueue, GraphCaptureAndReplay) {
  auto be = make_cuda_backend();
  auto q = be->make_queue();
  Ref pos{be->alloc(4, "pos")};
  auto g = q->capture([&] {
    q->go(op::AdvancePos{pos, 2});
    q->go(op::AdvancePos{pos, 5});
  });
  for (int i = 0; i < 3; ++i) q->replay(*g);
  int32_t p = -1;
  q->go(op::Read{pos.buf, 0, 4, &p});
  q->wait();
  EXPECT_EQ(p, 21);
}

// Sampled decoding drawn on the device (Engine::step_draw, op::SampleDraw) takes the same ids as
// on the CPU, and as the host's draw from the whole row; top-p's inputs (step_top with the
// weight sum) are the same bytes.
TEST(CudaModel, DeviceDrawEqualsTheCpu) {
  auto [cpu, gpu] = open_pair(kDemo);
  const int V = cpu->config().vocab_size;
  std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  int32_t a = cpu->feed(prompt), b = gpu->feed(prompt);
  ASSERT_EQ(a, b);
  Rng rng(5);
  std::vector<float> logits;
  for (int i = 0; i < 40; ++i) {
    const double u = rng.uniform();
    const float T = i % 2 ? 0.8f : 1.2f, min_p = i % 3 ? 0.0f : 0.05f;
    const int32_t prev = a;
    a = cpu->step_draw(prev, T, min_p, u);
    b = gpu->step_draw(prev, T, min_p, u);
    gpu->read_logits(&logits);
    ASSERT_EQ(int(logits.size()), V);
    ASSERT_EQ(a, b) << "step " << i;
    ASSERT_EQ(b, ref::draw_plain(logits.data(), V, T, min_p, u)) << "step " << i;
  }
  // Top-k (and top-p, min-p) drawn on the device from op::TopK's pairs (op::TopDraw): the CPU's
  // ids, and the host sampler's from the whole row with the same uniform.
  for (int i = 0; i < 24; ++i) {
    const double u = rng.uniform();
    DrawParams d{i % 2 ? 0.8f : 1.3f, i % 3 ? 0.0f : 0.05f, i % 4 < 2 ? 20 : 5, i % 5 < 3 ? 0.9f : 1.0f};
    const int32_t prev = a;
    a = cpu->step_draw(prev, d, u);
    b = gpu->step_draw(prev, d, u);
    gpu->read_logits(&logits);
    ASSERT_EQ(a, b) << "top draw " << i;
    SamplingParams sp;
    sp.temperature = d.temperature, sp.min_p = d.min_p, sp.top_k = d.top_k, sp.top_p = d.top_p;
    ASSERT_EQ(b, Sampler(sp).sample_with(logits, u)) << "top draw " << i;
  }
  // Top-p's inputs: the top 256 logits and the row's weight sum, the same bytes on both.
  std::vector<int32_t> ia, ib;
  std::vector<float> va, vb;
  for (int i = 0; i < 10; ++i) {
    double ta = 0, tb = 0;
    cpu->step_top(a, 256, &ia, &va, &ta, 0.9f);
    gpu->step_top(a, 256, &ib, &vb, &tb, 0.9f);
    gpu->read_logits(&logits);
    ASSERT_EQ(ia, ib) << "step " << i;
    ASSERT_EQ(std::memcmp(va.data(), vb.data(), va.size() * 4), 0) << "step " << i;
    ASSERT_EQ(std::memcmp(&ta, &tb, 8), 0) << "step " << i;
    const double want = ref::draw_total(logits.data(), V, 0.9f);
    ASSERT_EQ(std::memcmp(&tb, &want, 8), 0) << "step " << i;
    a = ia[size_t(i % 3)];
  }
}

TEST(CudaModel, SameLogitsBytesAsTheCpu) {
  for (const std::string& dir : {kData + "/tiny-q4", kData + "/tiny-hf16", kDemo}) {
    auto [cpu, gpu] = open_pair(dir);
    const int V = cpu->config().vocab_size;
    std::vector<int32_t> ids;
    for (int i = 0; i < 70; ++i) ids.push_back(int32_t((i * 2654435761u + 17u) % uint32_t(V)));
    std::vector<float> a = cpu->score(ids), b = gpu->score(ids);
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << dir << ": prefill logits differ";
    // decode step by step through the recorded graph
    cpu->reset();
    gpu->reset();
    std::vector<float> la, lb;
    int32_t na = cpu->feed(std::span(ids).first(7)), nb = gpu->feed(std::span(ids).first(7));
    ASSERT_EQ(na, nb);
    for (int i = 0; i < 40; ++i) {
      na = cpu->step(na, &la);
      nb = gpu->step(nb, &lb);
      ASSERT_EQ(std::memcmp(la.data(), lb.data(), size_t(V) * 4), 0) << dir << ": decode step " << i;
      ASSERT_EQ(na, nb);
    }
  }
}

// Saved states (Engine::snapshot, the prompt cache's) cross backends: the state bytes are the
// same on both, so a CPU snapshot restored on CUDA and a CUDA one (saved with a step issued
// ahead) restored on the CPU continue with the same logits bytes.
TEST(CudaModel, SavedStatesAreTheSameBytesOnBothBackends) {
  for (const std::string& dir : {kData + "/tiny-q4", kDemo}) {
    EngineOptions o;
    o.max_ctx = 256;
    auto [cpu, gpu] = open_pair(dir, o);
    const int V = cpu->config().vocab_size;
    std::vector<int32_t> ids;
    for (int i = 0; i < 70; ++i) ids.push_back(int32_t((i * 2654435761u + 17u) % uint32_t(V)));
    cpu->feed(ids);
    gpu->feed(ids);
    auto sc = cpu->snapshot(), sg = gpu->snapshot();
    ASSERT_EQ(sc->tokens, sg->tokens);
    ASSERT_EQ(sc->bytes.size(), sg->bytes.size());
    ASSERT_EQ(std::memcmp(sc->bytes.data(), sg->bytes.data(), sc->bytes.size()), 0) << dir << ": state bytes";
    const std::vector<int32_t> rest = {5, 7, 11};
    std::vector<float> la, lb;
    // A CPU snapshot restored on CUDA (after something else ran there).
    gpu->feed(rest);
    gpu->restore(*sc);
    cpu->restore(*sc);
    int32_t a = cpu->feed(rest, &la), b = gpu->feed(rest, &lb);
    ASSERT_EQ(a, b);
    ASSERT_EQ(std::memcmp(la.data(), lb.data(), size_t(V) * 4), 0) << dir << ": after a CPU state on CUDA";
    // A CUDA snapshot with a step issued ahead, restored on the CPU.
    gpu->step_greedy();
    auto sg2 = gpu->snapshot();
    cpu->restore(*sg2);
    ASSERT_EQ(cpu->history(), gpu->history());
    a = cpu->step(42 % V, &la);
    b = gpu->step(42 % V, &lb);
    ASSERT_EQ(a, b);
    ASSERT_EQ(std::memcmp(la.data(), lb.data(), size_t(V) * 4), 0) << dir << ": after a CUDA state on the CPU";
  }
}

// The pipelined greedy decode (CUDA issues the step feeding each returned token before
// returning it) gives the CPU's ids; continuing with the returned token takes the step fed
// ahead, another token rebuilds the state without it; the context's end is where the CPU's is.
TEST(CudaModel, PipelinedGreedyDecodeEqualsTheCpu) {
  for (const std::string& dir : {kData + "/tiny-q4", kDemo}) {
    EngineOptions small;
    small.max_ctx = 48;
    auto [cpu, gpu] = open_pair(dir, small);
    const int V = cpu->config().vocab_size;
    std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6};
    int32_t a = cpu->feed(prompt), b = gpu->feed(prompt);
    ASSERT_EQ(a, b);
    for (int i = 0; i < 12; ++i) {
      a = cpu->step_greedy();
      b = gpu->step_greedy();
      ASSERT_EQ(a, b) << dir << " greedy step " << i;
    }
    std::vector<float> la, lb;
    a = cpu->step(a, &la);  // the token just returned: on CUDA it was fed ahead
    b = gpu->step(b, &lb);
    ASSERT_EQ(a, b);
    ASSERT_EQ(std::memcmp(la.data(), lb.data(), size_t(V) * 4), 0) << dir << ": the step fed ahead";
    for (int i = 0; i < 4; ++i) {
      a = cpu->step_greedy();
      b = gpu->step_greedy();
      ASSERT_EQ(a, b) << dir;
    }
    const int32_t other = (a + 1) % V;  // not the token returned: the state is rebuilt without it
    a = cpu->step(other, &la);
    b = gpu->step(other, &lb);
    ASSERT_EQ(a, b);
    ASSERT_EQ(std::memcmp(la.data(), lb.data(), size_t(V) * 4), 0) << dir << ": after the rebuild";
    ASSERT_EQ(cpu->history(), gpu->history());
    // Up to the end of the context: the same tokens, then the same error.
    lockstep::to_context_end([&] { return cpu->step_greedy(); }, [&] { return gpu->step_greedy(); }, dir + " greedy");
    EXPECT_EQ(cpu->position(), small.max_ctx);
    EXPECT_EQ(gpu->position(), small.max_ctx);
    // Reuse of the history: the CUDA one ends with the last returned token (fed ahead)
    // unless the context had no room for it.
    gpu->sync();
    EXPECT_EQ(gpu->history(), cpu->history());
  }
}

// The pipelined draw (CUDA issues the step feeding each drawn id, with its own draw, before
// returning the id): the CPU's step_draw ids with the same uniforms; another token rebuilds the
// state and the draw taken back lends its uniform to the next; the context's end where the CPU's is.
TEST(CudaModel, PipelinedDrawDecodeEqualsTheCpu) {
  for (const std::string& dir : {kData + "/tiny-q4", kDemo}) {
    EngineOptions small;
    small.max_ctx = 48;
    auto [cpu, gpu] = open_pair(dir, small);
    ASSERT_TRUE(gpu->queue().overlaps());
    const int V = cpu->config().vocab_size;
    std::mt19937_64 ra(9), rb(9);
    auto uni = [](std::mt19937_64& r) { return double(r() >> 11) * 0x1.0p-53; };
    auto next_b = [&] { return uni(rb); };
    const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6};
    int32_t a = cpu->feed(prompt), b = gpu->feed(prompt);
    ASSERT_EQ(a, b);
    for (float min_p : {0.0f, 0.05f})
      for (int i = 0; i < 8; ++i) {
        const double ua = uni(ra);
        double ub = -1;
        a = cpu->step_draw(a, 0.9f, min_p, ua);
        b = gpu->step_draw_ahead(b, 0.9f, min_p, next_b, &ub);
        ASSERT_EQ(a, b) << dir << " draw " << i << " min_p " << min_p;
        ASSERT_EQ(ua, ub) << dir << " draw " << i;
      }
    std::vector<float> la, lb;
    const int32_t other = (a + 1) % V;
    a = cpu->step(other, &la);
    b = gpu->step(other, &lb);
    ASSERT_EQ(a, b);
    ASSERT_EQ(std::memcmp(la.data(), lb.data(), size_t(V) * 4), 0) << dir << ": after the rebuild";
    // Top-k draws (op::TopDraw) pipelined the same way, the parameters changing between them.
    for (int i = 0; i < 9; ++i) {
      const DrawParams d = i % 3 == 2 ? DrawParams{0.9f, 0.0f} : DrawParams{0.9f, i % 2 ? 0.05f : 0.0f, 20, 0.9f};
      const double ua = uni(ra);
      double ub = -1;
      a = cpu->step_draw(a, d, ua);
      b = gpu->step_draw_ahead(b, d, next_b, &ub);
      ASSERT_EQ(a, b) << dir << " top draw " << i;
      ASSERT_EQ(ua, ub) << dir << " top draw " << i;
    }
    double ua = 0, ub = -1;
    const DrawParams top{0.7f, 0.0f, 20, 0.9f};
    lockstep::to_context_end([&] { return a = cpu->step_draw(a, top, ua = uni(ra)); },
                             [&] { return b = gpu->step_draw_ahead(b, top, next_b, &ub); }, dir + " top draw",
                             [&](int i) { ASSERT_EQ(ua, ub) << dir << " top draw " << i; });
    EXPECT_EQ(cpu->position(), small.max_ctx);
    EXPECT_EQ(gpu->position(), small.max_ctx);
    gpu->sync();
    EXPECT_EQ(gpu->history(), cpu->history());
  }
}

// Sequences decoded together (runtime/batcher.h, serve --parallel) on CUDA: each slot's logits
// are the bytes a lone sequence gets on the CPU, in batches of 1 to 8 of every composition.
TEST(CudaModel, BatchedSlotsEqualLoneSequencesOnTheCpu) {
  for (const std::string& dir : {kData + "/tiny-q4", kDemo}) {
    EngineOptions o;
    o.max_ctx = 512;
    auto [cpu, gpu] = open_pair(dir, o);
    const int V = cpu->config().vocab_size;
    const int S = 8, T = 10;
    auto ids = [&](int n, int seed) {
      std::vector<int32_t> v;
      for (int i = 0; i < n; ++i) v.push_back(int32_t((uint32_t(i) * 2654435761u + uint32_t(seed) * 97u + 17u) % uint32_t(V)));
      return v;
    };
    // Lone sequences on the CPU: the logits after the prompt and after each token.
    std::vector<std::vector<int32_t>> prompts, tokens;
    std::vector<std::vector<std::vector<float>>> want(S);
    for (int k = 0; k < S; ++k) {
      prompts.push_back(ids(k == 3 ? 300 : 1 + 9 * k, k));
      tokens.push_back(ids(T, 50 + k));
      cpu->reset();
      std::vector<float> l;
      cpu->feed(prompts.back(), &l);
      want[size_t(k)].push_back(l);
      for (int32_t t : tokens.back()) {
        cpu->step(t, &l);
        want[size_t(k)].push_back(l);
      }
    }
    Batcher b(*gpu, S);
    std::vector<float> l;
    for (int k = 0; k < S; ++k) {
      b.feed(k, prompts[size_t(k)], &l);
      ASSERT_EQ(std::memcmp(l.data(), want[size_t(k)][0].data(), size_t(V) * 4), 0) << dir << ": prompt " << k;
    }
    std::vector<int> at(S, 0);
    for (int round = 0; round < 3 * T; ++round) {
      std::vector<int> which;
      std::vector<int32_t> toks;
      for (int k = 0; k < S; ++k)  // a different subset and size every round
        if (at[size_t(k)] < T && ((k * 7 + round * 3) % (1 + round % 4) == 0)) {
          which.push_back(k);
          toks.push_back(tokens[size_t(k)][size_t(at[size_t(k)])]);
        }
      if (which.empty()) continue;
      std::vector<int32_t> next;
      b.step(which, toks, &next, &l);
      for (size_t i = 0; i < which.size(); ++i) {
        const int k = which[i], row = ++at[size_t(k)];
        ASSERT_EQ(std::memcmp(l.data() + i * size_t(V), want[size_t(k)][size_t(row)].data(), size_t(V) * 4), 0)
            << dir << ": sequence " << k << " token " << row << " in a batch of " << which.size();
      }
    }
    int done = 0;
    for (int k = 0; k < S; ++k) done += at[size_t(k)];
    EXPECT_GT(done, S * T / 2);
  }
}

// Samples drawn per row of a batched step on CUDA (temperature alone; top_k with top_p) are the
// ids the CPU's lone Engine::step_draw takes with the same uniforms.
TEST(CudaModel, BatchedDrawsEqualTheCpusLoneDraws) {
  for (const std::string& dir : {kData + "/tiny-q4", kDemo}) {
    EngineOptions o;
    o.max_ctx = 256;
    auto [cpu, gpu] = open_pair(dir, o);
    const int V = cpu->config().vocab_size;
    Batcher b(*gpu, 4);
    for (int s = 0; s < 4; ++s) {
      std::vector<int32_t> p;
      for (int i = 0; i < 3 + 5 * s; ++i) p.push_back(int32_t((uint32_t(i) * 2654435761u + uint32_t(s) * 97u + 17u) % uint32_t(V)));
      b.feed(s, p);
    }
    std::vector<Batcher::Draw> draws = {{true, DrawParams{0.8f, 0.0f}, 0.1},
                                        {true, DrawParams{0.7f, 0.05f, 5, 0.9f}, 0.2},
                                        {false, {}, 0},
                                        {true, DrawParams{1.1f, 0.0f, 40, 1.0f}, 0.3}};
    std::vector<int32_t> toks = {1, 2, 3, 4}, next, drawn;
    for (int round = 0; round < 6; ++round) {
      for (auto& d : draws) d.u = std::fmod(d.u + 0.37, 1.0);
      b.step(std::vector<int>{0, 1, 2, 3}, toks, &next, draws, &drawn);
      for (int s = 0; s < 4; ++s) {
        std::vector<int32_t> h = b.history(s);
        h.pop_back();
        cpu->reset();
        cpu->feed(h);
        if (draws[size_t(s)].on) {
          ASSERT_EQ(drawn[size_t(s)], cpu->step_draw(toks[size_t(s)], draws[size_t(s)].params, draws[size_t(s)].u))
              << dir << ": slot " << s << " round " << round;
        } else {
          ASSERT_EQ(drawn[size_t(s)], -1);
          ASSERT_EQ(next[size_t(s)], cpu->step(toks[size_t(s)]));
        }
        toks[size_t(s)] = drawn[size_t(s)] >= 0 ? drawn[size_t(s)] : next[size_t(s)];
      }
    }
  }
}
