#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_fit.h"

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <mutex>
#include <set>
#include <type_traits>
#include <vector>

#include "backend/cuda/kernels.cuh"
#include "core/error.h"
#include "ops/reference.h"

namespace dq {

using namespace cuda;

int cuda_gdn_mixer_clusters() { return cuda::project_gdn_max_clusters(); }

bool cuda_device_available(std::string* why, int device) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why) *why = e != cudaSuccess ? std::string("no usable CUDA device: ") + cudaGetErrorString(e) : "no CUDA device";
    cudaGetLastError();
    return false;
  }
  if (device < 0 || device >= n) {
    if (why) *why = fmt::format("no CUDA device {} (this machine has {})", device, n);
    return false;
  }
  cudaDeviceProp prop{};
  if ((e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess) {
    if (why) *why = std::string("no usable CUDA device: ") + cudaGetErrorString(e);
    cudaGetLastError();
    return false;
  }
  const std::string unfit = gpu_unfit_reason({prop.name, prop.major, prop.minor, prop.sharedMemPerBlockOptin});
  if (!unfit.empty()) {
    if (why) *why = unfit;
    return false;
  }
  return true;
}

namespace {

using Clock = std::chrono::steady_clock;

// Device memory; `live` counts the backend's bytes allocated and not yet freed.
struct DeviceStorage : BufferStorage {
  std::shared_ptr<std::atomic<size_t>> live;
  ~DeviceStorage() override {
    if (ptr) cudaFree(ptr);
    if (live) *live -= bytes;
  }
};

// No error in the device record (which points at its mirror) and none in the mirror.
void clear_device_error(DeviceError* dev, volatile DeviceError* mirror) {
  const DeviceError none{kErrNone, 0, 0, const_cast<DeviceError*>(mirror)};
  DQ_CUDA_CHECK(cudaMemcpy(dev, &none, sizeof(DeviceError), cudaMemcpyHostToDevice));
  DQ_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // (a copy from pageable memory may return early)
  mirror->a = mirror->b = 0;
  mirror->code = kErrNone;
}

// Mapped pinned host memory (alloc_readback): kernels write it through the same address (UVA),
// the host reads it after the wait.
struct MappedStorage : BufferStorage {
  ~MappedStorage() override {
    if (ptr) cudaFreeHost(ptr);
  }
};

MatDev mat_dev(const Matrix& m, float* y) {
  MatDev d;
  d.w = m.w->ptr;
  d.s = m.scales ? m.scales->ptr : nullptr;
  d.b = m.biases ? m.biases->ptr : nullptr;
  d.rows = m.rows;
  d.cols = m.cols;
  d.bits = m.bits;
  d.gs = m.group_size;
  if (d.gs > 0 && (d.gs & (d.gs - 1)) == 0) d.gs_shift = __builtin_ctz(unsigned(d.gs));
  d.fmt = m.format == WFormat::Affine ? WFmt::Affine
          : m.format == WFormat::BF16 ? WFmt::BF16
          : m.format == WFormat::F16  ? WFmt::F16
                                      : WFmt::F32;
  d.sdt = m.scale_dtype == DType::F16 ? SDt::F16 : m.scale_dtype == DType::F32 ? SDt::F32 : SDt::BF16;
  d.lanes = m.layout == WLayout::Lanes;
  d.y = y;
  return d;
}

class CudaGraph : public Graph {
 public:
  ~CudaGraph() override {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
  int n_ops() const override { return int(ops.size()); }
  std::vector<Op> ops;  // keeps every buffer of the graph alive
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
};

class CudaBackend;

// A queue's lazily grown scratch (the tensor-core prefill's x, top_k's keys, sample_draw's sums):
// grown only when nothing in flight can still use the old one, and counted in the backend's
// allocated bytes so that `deltaq bench` reports the device memory the queue holds too.
class QueueScratch {
 public:
  QueueScratch(const char* what, std::shared_ptr<std::atomic<size_t>> allocated) : what_(what), allocated_(std::move(allocated)) {}
  QueueScratch(const QueueScratch&) = delete;
  QueueScratch& operator=(const QueueScratch&) = delete;
  ~QueueScratch() { release(); }
  // At least `bytes`; synchronises `stream` (and frees the old buffer) only when it must grow.
  void* reserve(size_t bytes, cudaStream_t stream) {
    if (bytes <= bytes_) return ptr_;
    DQ_CUDA_CHECK(cudaStreamSynchronize(stream));
    release();
    if (cudaMalloc(&ptr_, bytes) != cudaSuccess) {
      cudaGetLastError();
      ptr_ = nullptr;
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      fail("out of GPU memory allocating {:.1f} MB for the queue's {} scratch ({:.1f} MB free of {:.1f} MB)",
           bytes / 1e6, what_, free_b / 1e6, total_b / 1e6);
    }
    bytes_ = bytes;
    *allocated_ += bytes;
    return ptr_;
  }
  size_t bytes() const { return bytes_; }

 private:
  void release() {
    if (!ptr_) return;
    cudaFree(ptr_);
    *allocated_ -= bytes_;
    ptr_ = nullptr;
    bytes_ = 0;
  }
  const char* what_;
  std::shared_ptr<std::atomic<size_t>> allocated_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// go() launches at once (asynchronously) on the queue's stream; mark() closes a segment of ops
// (an event after them); wait_for() synchronises on a segment's event, releases its ops and
// rethrows launch errors and device-side input errors with the op names; wait() does both.
class CudaQueue : public Queue {
 public:
  CudaQueue(int device, int num_sms, DeviceError* err_dev, volatile DeviceError* err_mirror,
            std::shared_ptr<std::atomic<size_t>> allocated)
      : device_(device), num_sms_(num_sms), err_dev_(err_dev), err_mirror_(err_mirror),
        topk_scratch_("top_k", allocated), draw_scratch_("sample_draw", allocated),
        mma_scratch_("tensor-core prefill", allocated), trace_("cuda") {
    bind_device(device_);
    DQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DQ_CUDA_CHECK(cudaMallocHost(&staging_, kStagingBytes));
    DQ_CUDA_CHECK(cudaMalloc(&argmax_key_, sizeof(unsigned long long)));
    DQ_CUDA_CHECK(cudaMemset(argmax_key_, 0, sizeof(unsigned long long)));  // each argmax leaves it 0
    DQ_CUDA_CHECK(cudaMalloc(&gdn_counters_, kGdnCounterSlots * sizeof(unsigned)));
    DQ_CUDA_CHECK(cudaMemset(gdn_counters_, 0, kGdnCounterSlots * sizeof(unsigned)));  // each GDN step leaves them 0
    DQ_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // the legacy stream's zeros land before stream_'s work
    timeline_start();
  }
  ~CudaQueue() override {
    try_bind_device(device_);  // (a destructor does not throw; the frees below report nothing)
    cudaStreamSynchronize(stream_);
    if (profile_.enabled()) {
      collect_profile();
      profile_.print();
    }
    timeline_dump();
    for (Segment& g : inflight_) release_events(g);
    release_events(cur_);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    cudaFreeHost(staging_);
    cudaFree(argmax_key_);
    cudaFree(gdn_counters_);
    cudaStreamDestroy(stream_);
  }

  void go(Op op) override {
    bind_device(device_);
    if (capture_) {
      launch(op);
      capture_->ops.push_back(std::move(op));
      return;
    }
    open_segment();
    if (profile_.enabled()) {
      cudaEvent_t a, b;
      cudaEventCreate(&a);
      cudaEventCreate(&b);
      cudaEventRecord(a, stream_);
      launch(op);
      cudaEventRecord(b, stream_);
      pending_prof_.push_back({OpProfile::row_name(op), a, b, OpProfile::bytes(op)});
    } else {
      launch(op);
    }
    cur_.ops.push_back(std::move(op));
    ++cur_.n_ops;
  }

  void replay(const Graph& g) override {
    bind_device(device_);
    open_segment();
    no_early_ = true;
    const auto& cg = static_cast<const CudaGraph&>(g);
    DQ_CUDA_CHECK(cudaGraphLaunch(cg.exec, stream_));
    cur_.n_ops += cg.n_ops();
  }

  // DELTAQ_AHEAD=0 (an A/B knob): report no overlap, so the engine does not issue ahead.
  bool overlaps() const override {
    static const bool on = !(std::getenv("DELTAQ_AHEAD") && std::getenv("DELTAQ_AHEAD")[0] == '0');
    return on;
  }

  // Closes the open segment: its end event. (The device-error record needs no copy: kernels
  // mirror it into mapped host memory, read at the wait. Two copies between decode steps cost
  // 11.5 us a step on the H200, session 19.)
  uint64_t mark() override {
    if (!cur_open_) return last_mark_;
    bind_device(device_);
    if (inflight_.size() >= kSegmentsMax) complete_front();
    cur_.id = ++last_mark_;
    cur_.done = take_event();
    DQ_CUDA_CHECK(cudaEventRecord(cur_.done, stream_));
    inflight_.push_back(std::move(cur_));
    cur_ = Segment{};
    cur_open_ = false;
    return last_mark_;
  }

  void wait_for(uint64_t m) override {
    bind_device(device_);
    while (!inflight_.empty() && inflight_.front().id <= m) complete_front();
  }

  void wait() override { wait_for(mark()); }

  std::unique_ptr<Graph> capture(const std::function<void()>& issue) override {
    bind_device(device_);
    auto g = std::make_unique<CudaGraph>();
    DQ_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    capture_ = g.get();
    // A graph starts on an idle stream: inside it, the first GDN op on each state reads early.
    std::set<const void*> outside;
    outside.swap(early_states_);
    const bool outside_replayed = no_early_;
    no_early_ = false;
    struct Restore {
      CudaQueue* q;
      std::set<const void*>* outside;
      bool replayed;
      ~Restore() {
        q->early_states_.swap(*outside);
        q->no_early_ = replayed;
      }
    } restore{this, &outside, outside_replayed};
    try {
      issue();
    } catch (...) {
      capture_ = nullptr;
      cudaGraph_t dummy;
      cudaStreamEndCapture(stream_, &dummy);
      if (dummy) cudaGraphDestroy(dummy);
      throw;
    }
    capture_ = nullptr;
    DQ_CUDA_CHECK(cudaStreamEndCapture(stream_, &g->graph));
    DQ_CUDA_CHECK(cudaGraphInstantiate(&g->exec, g->graph, 0));
    return g;
  }

 private:
  // A segment: the ops between two marks, with what their completion must do.
  struct StagedRead {
    uint8_t* host;
    const uint8_t* from;  // the staging ring's slot or a host-visible buffer
    size_t bytes;
  };
  struct Segment {
    uint64_t id = 0;
    std::vector<Op> ops;             // kept alive until the segment is done
    std::vector<StagedRead> reads;   // copied out of the staging ring or readback buffers then
    size_t ring_bytes = 0;           // staging ring bytes the reads took
    int n_ops = 0;
    cudaEvent_t start = nullptr, done = nullptr;
    Clock::time_point wall_start;
  };

  void open_segment() {
    if (cur_open_) return;
    cur_open_ = true;
    cur_.wall_start = Clock::now();
    if (trace_.enabled()) {  // the segment's device time, for DELTAQ_TRACE only
      cur_.start = take_event();
      DQ_CUDA_CHECK(cudaEventRecord(cur_.start, stream_));
    }
  }

  cudaEvent_t take_event() {
    if (free_events_.empty()) {
      cudaEvent_t e;
      DQ_CUDA_CHECK(cudaEventCreate(&e));
      return e;
    }
    cudaEvent_t e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  void release_events(Segment& g) {
    for (cudaEvent_t* e : {&g.start, &g.done})
      if (*e) {
        free_events_.push_back(*e);
        *e = nullptr;
      }
  }

  // Waits for the oldest segment in flight and finishes it: reads delivered, ops released,
  // launch errors and device-side input errors rethrown with the op names. After an error
  // the stream is drained and every segment dropped (the state is then unknown).
  void complete_front() {
    Segment g = std::move(inflight_.front());
    inflight_.pop_front();
    cudaError_t e = cudaEventSynchronize(g.done);
    float gpu_ms = 0;
    if (e == cudaSuccess) {
      for (const StagedRead& r : g.reads) std::memcpy(r.host, r.from, r.bytes);
      if (g.start) cudaEventElapsedTime(&gpu_ms, g.start, g.done);
    }
    ring_used_ -= g.ring_bytes;
    release_events(g);
    if (inflight_.empty() && !cur_open_) {  // the stream is idle
      early_states_.clear();
      no_early_ = false;
      ring_head_ = 0;
    }
    const double wall = std::chrono::duration<double, std::milli>(Clock::now() - g.wall_start).count();
    if (e != cudaSuccess) {
      drop_all();
      std::string names;
      for (const Op& o : g.ops) names += std::string(names.empty() ? "" : ", ") + op_name(o);
      fail("CUDA error during the stage [{}]: {}", names.empty() ? "graph replay" : names, cudaGetErrorString(e));
    }
    if (profile_.enabled() && inflight_.empty() && !cur_open_) collect_profile();  // every profiled op is done
    trace_.report(g.n_ops, gpu_ms, wall);
    // The record as it is now: an error of a later segment already running is reported at this
    // wait, one wait early (every segment is dropped then either way).
    const DeviceError d{err_mirror_->code, err_mirror_->a, err_mirror_->b, nullptr};
    if (d.code != kErrNone) {
      drop_all();
      clear_device_error(err_dev_, err_mirror_);
      if (d.code == kErrTokenRange) fail("embed: token id {} out of range [0, {})", d.a, d.b);
      if (d.code == kErrContextFull) fail("attn_core: position {} is past the context of {} tokens", d.a, d.b);
      fail("device error {}", d.code);
    }
  }

  // After an error: drains the stream and forgets the segments in flight (the open one keeps
  // its ops and its place in the staging ring; the stream is idle now).
  void drop_all() {
    cudaStreamSynchronize(stream_);
    for (Segment& g : inflight_) release_events(g);
    inflight_.clear();
    ring_used_ = cur_.ring_bytes;
    early_states_.clear();
    no_early_ = false;
  }

  // A place for `bytes` in the pinned staging ring (segments free theirs in order), or
  // nullopt when it is full.
  std::optional<size_t> ring_alloc(size_t bytes) {
    const size_t n = (bytes + 15) / 16 * 16;
    size_t at = ring_head_, take = n;
    if (at + n > kStagingBytes) {  // wrap: the ring's tail end is skipped
      take += kStagingBytes - at;
      at = 0;
    }
    if (n > kStagingBytes || ring_used_ + take > kStagingBytes) return std::nullopt;
    ring_used_ += take;
    cur_.ring_bytes += take;
    ring_head_ = (at + n) % kStagingBytes;
    return at;
  }

  void launch(const Op& op) {
    std::visit([this](const auto& o) { launch_one(o); }, op);
  }

  void launch_one(const op::Embed& o) {
    launch_embed({mat_dev(o.table, nullptr), o.tokens.as<int32_t>(), o.out.as<float>(), o.n_tokens, err_dev_}, stream_);
  }
  ProjectArgs project_args(const op::Project& o) {
    ProjectArgs a;
    a.x = o.x.as<float>();
    a.norm = o.norm ? o.norm.as<float>() : nullptr;
    a.eps = o.eps;
    a.K = o.w[0].cols;
    a.T = o.n_tokens;
    a.n = o.n_out;
    for (int i = 0; i < o.n_out; ++i) a.m[i] = mat_dev(o.w[i], o.y[i].as<float>());
    a.epi = Epilogue::Store;
    return a;
  }
  // A product: a prefill chunk's (T >= 2, outside a graph capture) gets the queue's scratch
  // when the tensor-core kernel is on (it needs some).
  void product(ProjectArgs a) {
    const size_t bytes = a.T >= 2 && !capture_ ? project_mma_scratch_bytes(a.T, a.K) : 0;
    if (bytes > 0) {
      a.scratch = mma_scratch_.reserve(bytes, stream_);
      a.scratch_bytes = mma_scratch_.bytes();
    }
    launch_project(a, num_sms_, stream_);
  }
  void launch_one(const op::Project& o) { product(project_args(o)); }
  void launch_one(const op::ProjectAdd& o) {
    ProjectArgs a;
    a.x = o.x.as<float>();
    a.K = o.w.cols;
    a.T = o.n_tokens;
    a.n = 1;
    a.m[0] = mat_dev(o.w, o.acc.as<float>());
    a.epi = Epilogue::Add;
    product(a);
  }
  void launch_one(const op::SwiGLU& o) {
    ProjectArgs a;
    a.x = o.x.as<float>();
    a.norm = o.norm ? o.norm.as<float>() : nullptr;
    a.eps = o.eps;
    a.K = o.gate.cols;
    a.T = o.n_tokens;
    a.n = 2;
    a.m[0] = mat_dev(o.gate, o.out.as<float>());
    a.m[1] = mat_dev(o.up, nullptr);
    a.epi = Epilogue::SwiGLU;
    product(a);
  }
  GdnArgs gdn_args(const op::GdnCore& o) {
    GdnArgs a{o.d.n_k_heads, o.d.n_v_heads, o.d.k_dim, o.d.v_dim, o.d.conv_kernel, o.d.norm_eps,
              o.mixed.as<float>(), o.z.as<float>(), o.b.as<float>(), o.a.as<float>(), o.conv_w.as<float>(),
              o.A_neg.as<float>(), o.dt_bias.as<float>(), o.norm.as<float>(), o.conv_state.as<float>(),
              o.S.as<float>(), o.out.as<float>(), o.conv_out.as<float>(), o.n_tokens, gdn_counters_};
    // Early state reads: only the first GDN op on this state since the stream was last idle,
    // and none after a graph replay, a memset or a copy since then (a programmatic launch is
    // early only against a kernel: keep to the case that is certain).
    a.early = !no_early_ && early_states_.insert(a.S).second;
    return a;
  }
  void launch_one(const op::GdnCore& o) { launch_gdn(gdn_args(o), stream_); }
  // One kernel for decode where the shapes allow (gdn_mixer.cu), else the two ops' own.
  void launch_one(const op::ProjectGdn& o) {
    const ProjectArgs p = project_args(o.proj);
    const GdnArgs g = gdn_args(o.core);
    if (launch_project_gdn(p, g, stream_)) return;
    product(p);
    launch_gdn(g, stream_);
  }
  void launch_one(const op::AttnCore& o) {
    AttnArgs a{o.d.n_heads, o.d.n_kv_heads, o.d.head_dim, o.d.rotary_dim, o.d.max_ctx, o.d.norm_eps,
               o.qg.as<float>(), o.k.as<float>(), o.v.as<float>(), o.q_norm.as<float>(), o.k_norm.as<float>(),
               o.rope_cos.as<float>(), o.rope_sin.as<float>(), o.k_cache.as<float>(), o.v_cache.as<float>(),
               o.scores.as<float>(), o.out.as<float>(), o.pos.as<int32_t>(), o.n_tokens, err_dev_};
    // Early cache reads as for GDN: the first attention op on this cache since the stream was
    // idle, with no position advance in between (the decode kernels only, one token).
    const bool first_on_cache = early_states_.insert(a.k_cache).second;
    a.early = !no_early_ && o.n_tokens == 1 && first_on_cache && !early_states_.count(a.pos);
    launch_attn(a, stream_);
  }
  void launch_one(const op::Argmax& o) {
    launch_argmax(o.x.as<float>(), o.n, o.out.as<int32_t>(), o.out2 ? o.out2.as<int32_t>() : nullptr, argmax_key_,
                  num_sms_, stream_);
  }
  void launch_one(const op::TopK& o) {
    ref::check_top_k(o);
    const size_t bytes = 2 * top_k_scratch_keys(o.n, o.k) * sizeof(unsigned long long);
    DQ_CHECK(!capture_ || bytes <= topk_scratch_.bytes(),
             "top_k: its first use (scratch allocation) cannot be inside a graph capture");
    auto* keys = static_cast<unsigned long long*>(topk_scratch_.reserve(bytes, stream_));
    launch_top_k(o.x.as<float>(), o.n, o.k, o.ids.as<int32_t>(), o.vals.as<float>(), keys, stream_);
  }
  void launch_one(const op::SampleDraw& o) {
    ref::check_sample_draw(o);
    const size_t bytes = sample_draw_scratch_bytes(o.n, num_sms_);
    DQ_CHECK(!capture_ || bytes <= draw_scratch_.bytes(),
             "sample_draw: its first use (scratch allocation) cannot be inside a graph capture");
    void* scratch = draw_scratch_.reserve(bytes, stream_);
    launch_sample_draw(o.x.as<float>(), o.n, o.temperature, o.min_p, o.u, o.out ? o.out.as<int32_t>() : nullptr,
                       o.out2 ? o.out2.as<int32_t>() : nullptr, o.total ? o.total.as<double>() : nullptr, scratch,
                       num_sms_, stream_);
  }
  void launch_one(const op::TopDraw& o) {
    ref::check_top_draw(o);
    launch_top_draw(o.ids.as<int32_t>(), o.vals.as<float>(), o.k, o.top_k, o.temperature, o.top_p, o.min_p,
                    o.total ? o.total.as<double>() : nullptr, o.u, o.out.as<int32_t>(),
                    o.out2 ? o.out2.as<int32_t>() : nullptr, stream_);
  }
  void launch_one(const op::AdvancePos& o) {
    early_states_.insert(o.pos.as<int32_t>());  // no early position reads after this in the stage
    launch_advance_pos(o.pos.as<int32_t>(), o.delta, stream_);
  }
  void launch_one(const op::Zero& o) {
    no_early_ = true;
    DQ_CUDA_CHECK(cudaMemsetAsync(o.buf->ptr, 0, o.buf->bytes, stream_));
  }
  void launch_one(const op::Write& o) {
    no_early_ = true;
    DQ_CHECK(o.offset_bytes + o.size() <= o.dst->bytes, "write past the end of {}", o.dst->name);
    DQ_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(o.dst->ptr) + o.offset_bytes, o.data(), o.size(),
                                  cudaMemcpyHostToDevice, stream_));
  }
  void launch_one(const op::Read& o) {
    DQ_CHECK(o.offset_bytes + o.bytes <= o.src->bytes, "read past the end of {}", o.src->name);
    const uint8_t* src = static_cast<const uint8_t*>(o.src->ptr) + o.offset_bytes;
    // A host-visible buffer is copied by the host at the wait (the device wrote it in place).
    if (!capture_ && o.src->host_visible) {
      cur_.reads.push_back({static_cast<uint8_t*>(o.host), src, o.bytes});
      return;
    }
    // Small reads (a token id, top-k lists) go to pinned staging and are copied out at the
    // wait: a copy into pageable memory would block the host until the stream got there.
    if (!capture_ && o.bytes <= kStagingBytes / 4)
      if (const auto at = ring_alloc(o.bytes)) {
        DQ_CUDA_CHECK(cudaMemcpyAsync(staging_ + *at, src, o.bytes, cudaMemcpyDeviceToHost, stream_));
        cur_.reads.push_back({static_cast<uint8_t*>(o.host), staging_ + *at, o.bytes});
        return;
      }
    DQ_CUDA_CHECK(cudaMemcpyAsync(o.host, src, o.bytes, cudaMemcpyDeviceToHost, stream_));
  }

  // DELTAQ_PROFILE=1: per-op GPU time (events around every op outside graphs), printed at exit.
  struct Pending {
    const char* name;
    cudaEvent_t a, b;
    size_t bytes;
  };
  void collect_profile() {
    for (auto& p : pending_prof_) {
      float ms = 0;
      cudaEventElapsedTime(&ms, p.a, p.b);
      profile_.add(p.name, ms, p.bytes);
      cudaEventDestroy(p.a);
      cudaEventDestroy(p.b);
    }
    pending_prof_.clear();
  }

  cudaStream_t stream_ = nullptr;
  int device_;
  int num_sms_;
  DeviceError* err_dev_;
  volatile DeviceError* err_mirror_;  // mapped host memory: the record as the kernels mirror it
  unsigned long long* argmax_key_ = nullptr;  // argmax scratch (fixed address: graphs use it)
  unsigned* gdn_counters_ = nullptr;          // the split GDN kernel's per-head arrivals (same)
  static constexpr size_t kStagingBytes = 64 * 1024;
  static constexpr size_t kSegmentsMax = 16;  // in flight at once
  uint8_t* staging_ = nullptr;  // pinned ring: small reads land here, copied out at their wait
  size_t ring_head_ = 0, ring_used_ = 0;
  Segment cur_;  // the ops since the last mark
  bool cur_open_ = false;
  std::deque<Segment> inflight_;  // closed by a mark, not yet waited for
  uint64_t last_mark_ = 0;
  std::vector<cudaEvent_t> free_events_;
  std::set<const void*> early_states_;  // GDN states, KV caches, positions: ops on them since the stream was idle
  bool no_early_ = false;  // since the stream was idle: a graph replay, a memset or a copy (not kernels)
  QueueScratch topk_scratch_;  // top_k rounds' keys
  QueueScratch draw_scratch_;  // sample_draw's maxima, chunk and block sums
  QueueScratch mma_scratch_;   // the tensor-core prefill products' x (matvec_mma.cu)
  WaitTrace trace_;
  CudaGraph* capture_ = nullptr;
  OpProfile profile_;
  std::vector<Pending> pending_prof_;
};

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    bind_device(device);
    cudaDeviceProp prop{};
    DQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    name_ = prop.name;
    num_sms_ = prop.multiProcessorCount;
    DQ_CUDA_CHECK(cudaMalloc(&err_dev_, sizeof(DeviceError)));
    DQ_CUDA_CHECK(cudaHostAlloc(&err_mirror_, sizeof(DeviceError), cudaHostAllocMapped));
    clear_device_error(err_dev_, err_mirror_);
  }
  ~CudaBackend() override {
    try_bind_device(device_);
    cudaFree(err_dev_);
    cudaFreeHost(err_mirror_);
  }

  std::string name() const override { return "cuda (" + name_ + ")"; }
  bool is_cpu() const override { return false; }
  // 256: the tensor-core products gain from 128 tokens a chunk (512 tokens: 5,001 tok/s against
  // 3,927 in chunks of 64 on an H100, docs/bench.md session 39).
  int prefill_chunk() const override { return 256; }

  Buffer alloc(size_t bytes, const std::string& name) override {
    bind_device(device_);
    auto b = std::make_shared<DeviceStorage>();
    cudaError_t e = cudaMalloc(&b->ptr, bytes ? bytes : 16);
    if (e != cudaSuccess) {
      cudaGetLastError();
      b->ptr = nullptr;  // (nothing for the storage's destructor to free)
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      fail("out of GPU memory allocating {:.1f} MB for {} ({:.1f} MB free of {:.1f} MB)", bytes / 1e6, name,
           free_b / 1e6, total_b / 1e6);
    }
    // cudaMemset runs on the legacy stream, which the queues' non-blocking streams do not wait
    // for: wait here, or a kernel issued next may write the buffer before the zeros land over it
    // (the likely cause of session 41's prefill bits moving while other processes started on the
    // GPU: a prefill's activations are allocated right before its forward).
    DQ_CUDA_CHECK(cudaMemset(b->ptr, 0, bytes ? bytes : 16));
    DQ_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    b->bytes = bytes;
    b->name = name;
    b->live = allocated_;
    *allocated_ += bytes;
    return b;
  }
  Buffer alloc_readback(size_t bytes, const std::string& name) override {
    bind_device(device_);
    auto b = std::make_shared<MappedStorage>();
    if (cudaHostAlloc(&b->ptr, bytes ? bytes : 16, cudaHostAllocMapped) != cudaSuccess) {
      cudaGetLastError();
      b->ptr = nullptr;
      fail("out of pinned host memory allocating {} bytes for {}", bytes, name);
    }
    std::memset(b->ptr, 0, bytes ? bytes : 16);
    b->bytes = bytes;
    b->name = name;
    b->host_visible = true;
    return b;
  }
  Buffer upload(const void* host, size_t bytes, const std::string& name) override {
    bind_device(device_);
    Buffer b = alloc(bytes, name);
    if (bytes) {
      DQ_CUDA_CHECK(cudaMemcpy(b->ptr, host, bytes, cudaMemcpyHostToDevice));
      // A copy from pageable memory may return before its DMA lands, and the queues' streams
      // do not wait for the legacy stream: wait here, so no kernel can read the buffer early.
      DQ_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    }
    return b;
  }
  Buffer weights(const void* host, size_t bytes, std::shared_ptr<const void>, const std::string& name) override {
    return upload(host, bytes, name);  // uploaded once; the mapping can go
  }
  std::unique_ptr<Queue> make_queue() override { return std::make_unique<CudaQueue>(device_, num_sms_, err_dev_, err_mirror_, allocated_); }
  size_t allocated_bytes() const override { return *allocated_; }

  // 4-bit matrices of the fast path (K a multiple of 2048 or K = 1024, power-of-two groups of 8
  // to 256, bf16 scales) in the lane layout (q4.cuh); DELTAQ_LANES=0 keeps the checkpoint's layout.
  Matrix product_matrix(const Matrix& m) override {
    bind_device(device_);
    static const bool on = !(std::getenv("DELTAQ_LANES") && std::getenv("DELTAQ_LANES")[0] == '0');
    const int gs = m.group_size;
    if (!on || m.format != WFormat::Affine || m.bits != 4 || m.layout != WLayout::Rows || !lane_width(int(m.cols)) ||
        gs < 8 || gs > 256 || (gs & (gs - 1)) != 0 || m.scale_dtype != DType::BF16 || !m.w || !m.scales)
      return m;
    const size_t wbytes = size_t(m.rows) * (m.cols / 2), sbytes = size_t(m.rows) * (m.cols / gs) * 2;
    DQ_CHECK(m.w->bytes >= wbytes && m.scales->bytes >= sbytes, "{}: weights or scales shorter than the shape", m.name);
    Matrix d = m;
    d.w = alloc(wbytes, m.w->name);
    d.scales = alloc(sbytes, m.scales->name);
    launch_lane_layout(static_cast<const uint32_t*>(m.w->ptr), static_cast<uint32_t*>(d.w->ptr),
                       static_cast<const uint16_t*>(m.scales->ptr), static_cast<uint16_t*>(d.scales->ptr), m.rows,
                       m.cols, __builtin_ctz(unsigned(gs)), nullptr);
    DQ_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    d.layout = WLayout::Lanes;
    return d;
  }

  double measure_bandwidth_gbps() override {
    bind_device(device_);
    const size_t n = size_t(2) << 30;  // 2 GiB copied device to device; bytes read + written
    void *a = nullptr, *b = nullptr;
    if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess) {
      cudaGetLastError();
      if (a) cudaFree(a);
      return 0;
    }
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float best = 1e30f;
    for (int i = 0; i < 6; ++i) {
      cudaEventRecord(e0);
      cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice);
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      if (i > 0 && ms < best) best = ms;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return 2.0 * double(n) / (best * 1e-3) / 1e9;
  }

 private:
  int device_;
  std::string name_;
  int num_sms_ = 0;
  DeviceError* err_dev_ = nullptr;
  DeviceError* err_mirror_ = nullptr;  // mapped pinned host memory
  std::shared_ptr<std::atomic<size_t>> allocated_ = std::make_shared<std::atomic<size_t>>(0);
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device) {
  std::string why;
  if (!cuda_device_available(&why, device)) fail("{}", why);
  return std::make_unique<CudaBackend>(device);
}

}  // namespace dq
