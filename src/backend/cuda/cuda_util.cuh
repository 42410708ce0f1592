// Small CUDA helpers shared by the kernel files.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <utility>
#include <vector>

#include "core/error.h"

#define DQ_CUDA_CHECK(expr)                                                                    \
  do {                                                                                         \
    cudaError_t err_ = (expr);                                                                 \
    if (err_ != cudaSuccess) ::dq::fail("CUDA error in {}: {} ({})", #expr, cudaGetErrorString(err_), int(err_)); \
  } while (0)

namespace dq::cuda {

// Makes `device` the calling thread's current CUDA device. The runtime keeps the current device
// per thread, and the server's worker thread drives an engine opened on another thread: every
// entry of the backend and its queue binds first (a thread-local compare when already bound).
// try_bind_device is for destructors: false (the error cleared) where bind_device would throw.
inline bool try_bind_device(int device) noexcept {
  thread_local int bound = -1;
  if (bound == device) return true;
  if (cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  bound = device;
  return true;
}
inline void bind_device(int device) {
  if (!try_bind_device(device)) fail("cannot make CUDA device {} current", device);
}

// A launcher's tuning knob: the integer in environment variable `name`, or `dflt` when unset.
inline int env_int(const char* name, int dflt) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : dflt;
}

// Device-side input errors (a token id out of range, ...) are recorded here by the kernels and
// turned into a dq::Error at the next wait. The record is in device memory (the first error
// wins by an atomic); its winner copies it into `mirror`, mapped host memory that the host reads
// at the wait, so that no copy of the record has to run in the stream between two steps.
struct DeviceError {
  int code;  // 0 = none
  int a, b;
  DeviceError* mirror;  // (in the device record only)
};
enum : int { kErrNone = 0, kErrTokenRange = 1, kErrContextFull = 2 };

__device__ __forceinline__ void report_error(DeviceError* e, int code, int a, int b) {
  if (atomicCAS(&e->code, 0, code) == 0) {
    e->a = a;
    e->b = b;
    if (DeviceError* m = e->mirror) {
      m->a = a;
      m->b = b;
      __threadfence_system();  // a and b are visible before the code that says they are set
      m->code = code;
    }
  }
}

// Programmatic dependent launch (sm_90): every kernel lets the next one start at once
// (pdl_trigger), does only work that needs no earlier result (weight prefetches), then waits for
// the previous kernel's results (pdl_wait) before reading or writing anything else.
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
#ifndef DELTAQ_TIMELINE
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
#define DQ_MARK() ((void)0)
#define DQ_TL_SLOTS() ((void)0)
#define DQ_SM(tag) ((void)0)
#else
// The kernel lab's timeline (a build with -DDELTAQ_TIMELINE=ON): block 0 of every kernel records
// when it reached its wait and when the wait released it (the global timer, ns), with the source
// line of the wait; at exit the records of every kernel file are merged in time order and
// printed per kernel of a step (timeline.cu). One buffer per file: no relocatable device code.
// DELTAQ_TIMELINE_BLOCK=N makes block N (modulo each grid's size) the recorder instead, to see
// how the blocks of a kernel differ (one that started late on a full SM, say).
namespace {
constexpr unsigned kTimelineMax = 1u << 19;  // slots (24 B each), reserved ones included
__device__ unsigned long long tl_rec[3 * kTimelineMax];
__device__ unsigned tl_count;
__device__ unsigned tl_block;
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ bool tl_recorder() {
  return blockIdx.x == tl_block % gridDim.x && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0;
}
__device__ __forceinline__ void tl_store(unsigned i, unsigned long long release, unsigned long long arrive, int line) {
  if (i < kTimelineMax) {
    tl_rec[3 * i] = release;
    tl_rec[3 * i + 1] = arrive;
    tl_rec[3 * i + 2] = (unsigned long long)line;
  }
}
// A record's slot comes from an atomic on tl_count: an L2 round trip (0.3-0.5 us in a loaded
// step) that must not sit between a record's time and the work after it, or every segment
// timed from a record carries it (session 35: the 2B's timeline build ran at 1,004 tok/s against
// the engine's 1,160 on an H100, ~500 records a step). So a kernel that marks points
// declares DQ_TL_SLOTS() at its top: its recorder reserves kTlSlots slots there, before its
// wait, and each record is then a plain store. Kernels without it find the namespace's
// tl_slots (no slots) and take their one slot with the atomic before the wait.
constexpr unsigned kTlSlots = 16;
struct TlSlots {
  unsigned next, end;  // end 0: not the recorder
};
struct TlNoSlots {};
__device__ TlNoSlots tl_slots;
__device__ __forceinline__ TlSlots tl_reserve() {
  TlSlots s{0, 0};
  if (tl_recorder()) {
    s.next = atomicAdd(&tl_count, kTlSlots);
    s.end = s.next + kTlSlots;
  }
  return s;
}
__device__ __forceinline__ void pdl_wait_at(int line, TlSlots& s) {
  const bool rec = s.end != 0;
  const unsigned long long t0 = rec ? global_ns() : 0;
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (rec && s.next < s.end) tl_store(s.next++, global_ns(), t0, line);
}
__device__ __forceinline__ void pdl_wait_at(int line, TlNoSlots&) {
  const bool rec = tl_recorder();
  const unsigned i = rec ? atomicAdd(&tl_count, 1u) : 0u;  // before the wait (see above)
  const unsigned long long t0 = rec ? global_ns() : 0;
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (rec) tl_store(i, global_ns(), t0, line);
}
// A point inside a kernel (thread 0 of block 0 passing it), printed like a kernel of its own.
__device__ __forceinline__ void tl_mark_at(int line, TlSlots& s) {
  if (s.end != 0 && s.next < s.end) {
    const unsigned long long t = global_ns();
    tl_store(s.next++, t, t, line);
  }
}
__device__ __forceinline__ void tl_mark_at(int line, TlNoSlots&) {
  if (tl_recorder()) {
    const unsigned i = atomicAdd(&tl_count, 1u);
    const unsigned long long t = global_ns();
    tl_store(i, t, t, line);
  }
}
// Where blocks run (DELTAQ_TIMELINE_SM=FILE): thread 0 of every block records the time, its SM
// and a tag at DQ_SM(tag) into a ring per kernel file (the last kSmMax records); the timeline's
// dump writes them to FILE as CSV, to see which SMs a kernel's late blocks waited for.
constexpr unsigned kSmMax = 1u << 20;
__device__ unsigned long long tl_sm_rec[2 * kSmMax];
__device__ unsigned tl_sm_count;
__device__ unsigned tl_sm_on;
__device__ __forceinline__ void tl_sm_at(unsigned tag) {
  if (tl_sm_on && threadIdx.x == 0 && threadIdx.y == 0) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    const unsigned i = atomicAdd(&tl_sm_count, 1u) % kSmMax;
    tl_sm_rec[2 * i] = global_ns();
    tl_sm_rec[2 * i + 1] = (unsigned long long)(tag & 0xFFu) | ((unsigned long long)(blockIdx.x & 0xFFFFu) << 8) |
                           ((unsigned long long)(gridDim.x & 0xFFFFu) << 24) | ((unsigned long long)smid << 40);
  }
}
}  // namespace
#define pdl_wait() pdl_wait_at(__LINE__, tl_slots)
#define DQ_MARK() tl_mark_at(__LINE__, tl_slots)
#define DQ_TL_SLOTS() TlSlots tl_slots = tl_reserve()
#define DQ_SM(tag) tl_sm_at(tag)
#endif

// The kernel lab's flags, one word a kernel argument ("skip") for the kernels that take both:
// kLabSkip: DELTAQ_LAB_SKIP=gdn,attn makes those kernels return right after their wait (results
// are then wrong), to see what they cost inside the decode step;
// kLabLateLoads: DELTAQ_LATE_LOADS=1 (an A/B knob; results never depend on it): the GDN cluster
// kernel's z and norm weight and attention's output gate loaded at the end, as before session 33.
enum : int { kLabSkip = 1, kLabLateLoads = 2 };
bool lab_skip(const char* what);
int late_loads();  // kLabLateLoads when DELTAQ_LATE_LOADS=1, else 0

// Launches a kernel with the programmatic-serialization attribute (DELTAQ_PDL=0 turns it off).
bool pdl_enabled();
// Every kernel asks for the whole unified L1 as shared memory (carveout 100%), so that a kernel
// and the next one launched early (PDL) never wait for an SM to change its L1/shared split:
// measured 2.6% faster decode on the H200 than the driver's choice. DELTAQ_CARVEOUT=N (the
// kernel lab) sets another percentage, -1 the driver's default. True once per kernel.
int carveout_percent();
bool first_launch(const void* kernel);
// Launches with the programmatic-serialization attribute (unless DELTAQ_PDL=0) and, when
// cluster > 1, as a grid of thread-block clusters of that many blocks (sm_90: the blocks of a
// cluster run at once on one GPC and reach each other's shared memory).
template <class... KArgs, class... Args>
void launch_kernel_in(unsigned cluster, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                      Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl_enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster;
    attr[n].val.clusterDim.y = 1;
    attr[n++].val.clusterDim.z = 1;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  if (const int c = carveout_percent(); c >= 0 && first_launch(reinterpret_cast<const void*>(kernel)))
    DQ_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, c));
  DQ_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}
template <class... KArgs, class... Args>
void launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  launch_kernel_in(1, kernel, grid, block, smem, s, std::forward<Args>(args)...);
}

// cp.async: 16-byte copies from global to shared memory, many in flight per thread, with no
// registers held; commit groups them, wait_group<N> waits until at most N groups are pending.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void async_copy16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void async_copy4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void async_wait_group() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
__device__ __forceinline__ void async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Copies bytes from global to shared memory with all threads of the block: 16-byte cp.async
// when both ends are 16-byte aligned and bytes % 16 == 0, else 2-byte loads and stores.
__device__ __forceinline__ void stage_copy(void* dst, const void* src, uint32_t bytes) {
  if ((reinterpret_cast<uintptr_t>(src) | bytes) % 16 == 0 && smem_addr(dst) % 16 == 0) {
    for (uint32_t i = threadIdx.x; i < bytes / 16; i += blockDim.x)
      async_copy16(static_cast<unsigned char*>(dst) + 16 * i, static_cast<const unsigned char*>(src) + 16 * i);
  } else {
    for (uint32_t i = threadIdx.x; i < bytes / 2; i += blockDim.x)
      static_cast<unsigned short*>(dst)[i] = __ldg(static_cast<const unsigned short*>(src) + i);
  }
}

// Bulk asynchronous copies (TMA, cp.async.bulk): one thread hands a whole contiguous span
// (both ends 16-byte aligned, a multiple of 16 bytes) to the SM's copy engine; an mbarrier in
// shared memory counts the bytes as they land, and a thread that has waited on it sees them.
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the copy engine sees the barrier
}
// One arrival that also announces `bytes` more to come.
__device__ __forceinline__ void mbar_arrive_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}
// Waits until the barrier's phase of parity `parity` has completed (every arrival and byte).
// CLUSTER: with acquire at cluster scope, for bytes other blocks of the cluster stored by
// st.async (their complete_tx releases at cluster scope).
template <bool CLUSTER = false>
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  uint32_t done = 0;
  do {
    if constexpr (CLUSTER)
      asm volatile(
          "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
          : "=r"(done)
          : "r"(smem_addr(bar)), "r"(parity)
          : "memory");
    else
      asm volatile(
          "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
          : "=r"(done)
          : "r"(smem_addr(bar)), "r"(parity)
          : "memory");
  } while (!done);
}
// Makes barrier initialisations visible to the cluster (before the cluster's first barrier).
__device__ __forceinline__ void mbar_init_fence_cluster() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// Stores v at `dst` (this block's address of a shared variable) in block `rank` of the cluster
// and counts its 4 bytes on that block's barrier `bar` (st.async): no fence, no cluster barrier;
// the receiver waits on its barrier for every byte it expects (mbar_wait<true>).
__device__ __forceinline__ void push_f32(float* dst, unsigned rank, float v, uint64_t* bar) {
  uint32_t d, b;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(d) : "r"(smem_addr(dst)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(b) : "r"(smem_addr(bar)), "r"(rank));
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(d),
               "r"(__float_as_uint(v)), "r"(b)
               : "memory");
}

__device__ __forceinline__ float warp_butterfly(float v) {
  // The canonical 32-lane butterfly (numerics.h butterfly32): lane l adds lane l ^ m.
  for (int m = 16; m >= 1; m >>= 1) v = v + __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

// The canonical butterfly of two values at once, with the same bits: after its first step
// (m = 16) lanes l and l ^ 16 hold the same sum, so lanes 0-15 carry on with a's and lanes
// 16-31 with b's (every later step stays within a half). Returns a's sum in lanes 0-15 and b's
// in lanes 16-31: one shuffle and one add a step instead of two.
__device__ __forceinline__ float warp_butterfly2(float a, float b, int lane) {
  const bool upper = lane & 16;
  float v = (upper ? b : a) + __shfl_xor_sync(0xffffffffu, upper ? a : b, 16);
  for (int m = 8; m >= 1; m >>= 1) v = v + __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

// Sum of squares of x[0..n) in the canonical lane order (lane = index mod 32, then the
// butterfly), by warp 0; every thread of the block gets the result. x may be shared memory.
__device__ __forceinline__ float block_sum_squares(const float* x, int n, float* slot) {
  if (threadIdx.x < 32) {
    float ss = 0.0f;
    for (int j = threadIdx.x; j < n; j += 32) ss = fmaf(x[j], x[j], ss);
    ss = warp_butterfly(ss);
    if (threadIdx.x == 0) *slot = ss;
  }
  __syncthreads();
  float v = *slot;
  __syncthreads();
  return v;
}

// Prints the timeline when built with it and DELTAQ_TIMELINE is set (the queue's destructor);
// timeline_start (the queue's constructor, the device current) sets DELTAQ_TIMELINE_BLOCK.
void timeline_dump();
void timeline_start();
#ifdef DELTAQ_TIMELINE
// Each kernel file hands its records to the timeline at exit (timeline.cu).
struct TimelineRecord {
  unsigned long long release_ns, arrive_ns;
  int line;
  const char* file;
};
struct SmRecord {
  unsigned long long t, packed;  // tl_sm_at's time and tag | block << 8 | grid << 24 | SM << 40
  const char* file;
};
void timeline_register(void (*collect)(std::vector<TimelineRecord>*, const char*), void (*set_block)(unsigned),
                       void (*sm_collect)(std::vector<SmRecord>*, const char*), void (*sm_enable)(), const char* file);
namespace {
inline void tl_collect(std::vector<TimelineRecord>* out, const char* file) {
  unsigned n = 0;
  if (cudaMemcpyFromSymbol(&n, tl_count, sizeof n) != cudaSuccess) return;
  n = n < kTimelineMax ? n : kTimelineMax;
  std::vector<unsigned long long> r(3 * size_t(n));
  if (n && cudaMemcpyFromSymbol(r.data(), tl_rec, r.size() * 8) != cudaSuccess) return;
  for (unsigned i = 0; i < n; ++i)  // (line 0: a reserved slot its kernel did not use)
    if (r[3 * i + 2] != 0) out->push_back({r[3 * i], r[3 * i + 1], int(r[3 * i + 2]), file});
}
inline void tl_set_block(unsigned b) { cudaMemcpyToSymbol(tl_block, &b, sizeof b); }
inline void tl_sm_collect(std::vector<SmRecord>* out, const char* file) {
  unsigned n = 0;
  if (cudaMemcpyFromSymbol(&n, tl_sm_count, sizeof n) != cudaSuccess) return;
  if (n > kSmMax)  // the ring overwrote its oldest records: launches can no longer be told apart
    std::fprintf(stderr, "timeline: %s: %u SM records, only the last %u kept (run fewer tokens)\n", file, n, kSmMax);
  n = n < kSmMax ? n : kSmMax;
  std::vector<unsigned long long> r(2 * size_t(n));
  if (n && cudaMemcpyFromSymbol(r.data(), tl_sm_rec, r.size() * 8) != cudaSuccess) return;
  for (unsigned i = 0; i < n; ++i) out->push_back({r[2 * i], r[2 * i + 1], file});
}
inline void tl_sm_enable() {
  const unsigned on = 1;
  cudaMemcpyToSymbol(tl_sm_on, &on, sizeof on);
}
struct TimelineRegistration {
  explicit TimelineRegistration(const char* file) {
    timeline_register(&tl_collect, &tl_set_block, &tl_sm_collect, &tl_sm_enable, file);
  }
};
}  // namespace
#define DQ_TIMELINE_FILE static TimelineRegistration tl_registration_(__FILE__);
#else
#define DQ_TIMELINE_FILE
#endif

}  // namespace dq::cuda
