// The resident mat-vec: when a product's 4-bit weights fit in shared memory spread over one
// block per SM, each block copies its rows into shared memory with bulk asynchronous copies
// (TMA, cp.async.bulk) *before* it waits for the previous kernel (programmatic dependent
// launch). The weight stream of this product then overlaps the previous kernels, and after the
// wait only the short critical path remains: normalise x, make the group sums, and compute the
// rows from shared memory. Rows are computed in the canonical order of ops/numerics.h
// (affine_dot: lane l takes units l, l+32, ...), so results equal the CPU's bit for bit.
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/kernels.cuh"
#include "backend/cuda/q4.cuh"
#include "ops/numerics.h"

namespace dq::cuda {

namespace {

// ---- bulk copies into shared memory, completed on an mbarrier (sm_90) ----------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar) {  // phase 0 complete
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(smem_addr(bar))
      : "memory");
}

// A block's rows of one matrix, and where they sit in shared memory.
struct Seg {
  int m = 0, r0 = 0, n = 0;  // matrix, first row, rows
  const uint32_t* w = nullptr;
  const void* s = nullptr;
  const void* b = nullptr;
};

__device__ __forceinline__ float scale_at(const void* p, int i, SDt t) {
  if (t == SDt::BF16) return __uint_as_float(uint32_t(static_cast<const unsigned short*>(p)[i]) << 16);
  if (t == SDt::F16) return __half2float(static_cast<const __half*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

// Rows ra of A and rb of B (two = false: A only) against x in shared memory, canonical order:
// lane l accumulates units l, l+32, ... (fmaf(scale, unit dot, acc)), then the bias terms over
// groups l, l+32, ..., then acc + bias, then the butterfly.
__device__ __forceinline__ void dot_rows(const uint32_t* wa, const void* sa, const void* ba, const uint32_t* wb,
                                         const void* sb, const void* bb, bool two, int U, int G, int gs_shift,
                                         int gs, SDt sdt, const float4* xa, const float4* xb, const float* xg,
                                         int lane, float& out_a, float& out_b) {
  float acc_a = 0.0f, acc_b = 0.0f;
  for (int base = 0; base < U; base += 256) {
    uint32_t va[8], vb[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int u = base + lane + 32 * i;
      va[i] = u < U ? wa[u] : 0u;
      vb[i] = (two && u < U) ? wb[u] : 0u;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int u = base + lane + 32 * i;
      if (u < U) {
        const float4 x0 = xa[u], x1 = xb[u];
        const int g = gs_shift >= 0 ? (u * 8) >> gs_shift : u * 8 / gs;
        acc_a = fmaf(scale_at(sa, g, sdt), unit_q4(va[i], x0, x1), acc_a);
        if (two) acc_b = fmaf(scale_at(sb, g, sdt), unit_q4(vb[i], x0, x1), acc_b);
      }
    }
  }
  float bias_a = 0.0f, bias_b = 0.0f;
  for (int g = lane; g < G; g += 32) {
    bias_a = fmaf(scale_at(ba, g, sdt), xg[g], bias_a);
    if (two) bias_b = fmaf(scale_at(bb, g, sdt), xg[g], bias_b);
  }
  out_a = warp_butterfly(acc_a + bias_a);
  if (two) out_b = warp_butterfly(acc_b + bias_b);
}

template <int WARPS>
__global__ void __launch_bounds__(WARPS * 32) resident_kernel(ProjectArgs a, int gs, int items, int bulk_scales) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ uint64_t bar;
  __shared__ float s_r;
  const int K = a.K, U = K / 8, G = K / gs;
  const int gs_shift = a.m[0].gs_shift;
  const SDt sdt = a.m[0].sdt;
  const int sbytes = sdt == SDt::F32 ? 4 : 2;
  const bool swiglu = a.epi == Epilogue::SwiGLU;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  // Shared memory: x split for conflict-free lane reads (xa[u] = x[8u..8u+3], xb[u] =
  // x[8u+4..8u+7]), unit sums, group sums, then the block's weights.
  float4* xa = reinterpret_cast<float4*>(smem);
  float4* xb = xa + U;
  float* pu = reinterpret_cast<float*>(xb + U);
  float* xg = pu + U;
  unsigned char* wbase = reinterpret_cast<unsigned char*>(xg + U);
  wbase += (16 - reinterpret_cast<uintptr_t>(wbase) % 16) % 16;

  // This block's items: rows of the concatenated matrices (SwiGLU: gate row j with up row j).
  const int i0 = int(int64_t(blockIdx.x) * items / gridDim.x);
  const int i1 = int(int64_t(blockIdx.x + 1) * items / gridDim.x);
  Seg seg[ProjectArgs::kMax];
  int nseg = 0;
  if (swiglu) {
    for (int m = 0; m < 2; ++m) seg[nseg++] = Seg{m, i0, i1 - i0};
  } else {
    int base = 0;
    for (int m = 0; m < a.n; ++m) {
      const int lo = max(i0, base), hi = min(i1, base + a.m[m].rows);
      if (lo < hi) seg[nseg++] = Seg{m, lo - base, hi - lo};
      base += a.m[m].rows;
    }
  }
  const uint32_t wrow = uint32_t(K / 2), srow = uint32_t(G * sbytes);
  {
    unsigned char* p = wbase;
    for (int i = 0; i < nseg; ++i) {
      seg[i].w = reinterpret_cast<const uint32_t*>(p);
      p += seg[i].n * wrow;
      seg[i].s = p;
      p += (seg[i].n * srow + 15) / 16 * 16;
      seg[i].b = p;
      p += (seg[i].n * srow + 15) / 16 * 16;
    }
  }

  pdl_trigger();
  // Weights do not depend on earlier kernels: start their copies before the wait.
  if (threadIdx.x == 0) {
    mbar_init(&bar);
    uint32_t total = 0;
    for (int i = 0; i < nseg; ++i) total += seg[i].n * wrow + (bulk_scales ? 2 * seg[i].n * srow : 0);
    mbar_expect_bytes(&bar, total);
    for (int i = 0; i < nseg; ++i) {
      const MatDev& m = a.m[seg[i].m];
      const size_t r0 = size_t(seg[i].r0);
      if (seg[i].n == 0) continue;
      bulk_copy(const_cast<uint32_t*>(seg[i].w), static_cast<const unsigned char*>(m.w) + r0 * wrow, seg[i].n * wrow,
                &bar);
      if (bulk_scales) {
        bulk_copy(const_cast<void*>(seg[i].s), static_cast<const unsigned char*>(m.s) + r0 * srow, seg[i].n * srow, &bar);
        bulk_copy(const_cast<void*>(seg[i].b), static_cast<const unsigned char*>(m.b) + r0 * srow, seg[i].n * srow, &bar);
      }
    }
  }
  if (!bulk_scales) {  // scale rows not 16-byte multiples: ordinary loads, 2 bytes at a time
    for (int i = 0; i < nseg; ++i) {
      const MatDev& m = a.m[seg[i].m];
      const int n2 = seg[i].n * int(srow) / 2;
      const unsigned short* gs_ = static_cast<const unsigned short*>(m.s) + size_t(seg[i].r0) * srow / 2;
      const unsigned short* gb_ = static_cast<const unsigned short*>(m.b) + size_t(seg[i].r0) * srow / 2;
      unsigned short* ds = static_cast<unsigned short*>(const_cast<void*>(seg[i].s));
      unsigned short* db = static_cast<unsigned short*>(const_cast<void*>(seg[i].b));
      for (int j = threadIdx.x; j < n2; j += blockDim.x) {
        ds[j] = __ldg(gs_ + j);
        db[j] = __ldg(gb_ + j);
      }
    }
  }
  pdl_wait();

  for (int t = 0; t < a.T; ++t) {
    const float* x = a.x + size_t(t) * K;
    // Canonical sum of squares (warp 0, lane = index mod 32) while the others stage x.
    if (a.norm && warp == 0) {
      float ss = 0.0f;
#pragma unroll 8
      for (int j = lane; j < K; j += 32) {
        const float v = x[j];
        ss = fmaf(v, v, ss);
      }
      ss = warp_butterfly(ss);
      if (lane == 0) s_r = num::rms_inv(ss, K, a.eps);
    }
    __syncthreads();  // s_r (and, for t > 0, the previous token's readers are done)
    const float r = a.norm ? s_r : 1.0f;
    // Thread per unit: its 8 inputs (normalised), in the split layout, and their chain sum.
    for (int u = threadIdx.x; u < U; u += blockDim.x) {
      float4 v0 = reinterpret_cast<const float4*>(x)[2 * u], v1 = reinterpret_cast<const float4*>(x)[2 * u + 1];
      if (a.norm) {
        const float4 w0 = reinterpret_cast<const float4*>(a.norm)[2 * u];
        const float4 w1 = reinterpret_cast<const float4*>(a.norm)[2 * u + 1];
        v0 = make_float4((v0.x * r) * w0.x, (v0.y * r) * w0.y, (v0.z * r) * w0.z, (v0.w * r) * w0.w);
        v1 = make_float4((v1.x * r) * w1.x, (v1.y * r) * w1.y, (v1.z * r) * w1.z, (v1.w * r) * w1.w);
      }
      xa[u] = v0;
      xb[u] = v1;
      float p = 0.0f;
      p = p + v0.x;
      p = p + v0.y;
      p = p + v0.z;
      p = p + v0.w;
      p = p + v1.x;
      p = p + v1.y;
      p = p + v1.z;
      p = p + v1.w;
      pu[u] = p;
    }
    __syncthreads();
    for (int g = threadIdx.x; g < G; g += blockDim.x) {  // group sums: chain of unit sums
      float s = 0.0f;
      for (int u = g * gs / 8; u < (g + 1) * gs / 8; ++u) s = s + pu[u];
      xg[g] = s;
    }
    __syncthreads();
    if (t == 0) mbar_wait(&bar);

    if (swiglu) {
      const Seg& sg = seg[0];
      const Seg& su = seg[1];
      for (int j = warp; j < sg.n; j += WARPS) {
        float gv = 0.0f, uv = 0.0f;
        dot_rows(sg.w + size_t(j) * U, static_cast<const unsigned char*>(sg.s) + j * srow,
                 static_cast<const unsigned char*>(sg.b) + j * srow, su.w + size_t(j) * U,
                 static_cast<const unsigned char*>(su.s) + j * srow, static_cast<const unsigned char*>(su.b) + j * srow,
                 true, U, G, gs_shift, gs, sdt, xa, xb, xg, lane, gv, uv);
        if (lane == 0) a.m[0].y[size_t(t) * a.m[0].rows + sg.r0 + j] = num::silu(gv) * uv;
      }
    } else {
      for (int i = 0; i < nseg; ++i) {
        const Seg& sg = seg[i];
        const MatDev& m = a.m[sg.m];
        float* y = m.y + size_t(t) * m.rows + sg.r0;
        for (int j = 2 * warp; j < sg.n; j += 2 * WARPS) {
          const bool two = j + 1 < sg.n;
          const int k = two ? j + 1 : j;
          float va = 0.0f, vb = 0.0f;
          dot_rows(sg.w + size_t(j) * U, static_cast<const unsigned char*>(sg.s) + j * srow,
                   static_cast<const unsigned char*>(sg.b) + j * srow, sg.w + size_t(k) * U,
                   static_cast<const unsigned char*>(sg.s) + k * srow, static_cast<const unsigned char*>(sg.b) + k * srow,
                   two, U, G, gs_shift, gs, sdt, xa, xb, xg, lane, va, vb);
          if (lane == 0) {
            y[j] = a.epi == Epilogue::Add ? y[j] + va : va;
            if (two) y[k] = a.epi == Epilogue::Add ? y[k] + vb : vb;
          }
        }
      }
    }
    __syncthreads();  // the next token overwrites x
  }
}

constexpr int kResidentWarps = 8;

}  // namespace

bool launch_project_resident(const ProjectArgs& a, int gs, int num_sms, cudaStream_t s) {
  static const char* env = std::getenv("DELTAQ_MV_RESIDENT");
  static const bool enabled = !(env && env[0] == '0');
  static const int budget_kb = std::getenv("DELTAQ_MV_RESIDENT_KB") ? std::atoi(std::getenv("DELTAQ_MV_RESIDENT_KB")) : 200;
  if (!enabled || a.n < 1 || gs <= 0 || a.K % 32 != 0 || gs % 8 != 0 || a.K % gs != 0) return false;
  const MatDev& m0 = a.m[0];
  for (int i = 0; i < a.n; ++i) {
    const MatDev& m = a.m[i];
    if (m.fmt != WFmt::Affine || m.bits != 4 || m.gs != gs || m.sdt != m0.sdt || m.cols != a.K) return false;
    if (reinterpret_cast<uintptr_t>(m.w) % 16 || reinterpret_cast<uintptr_t>(m.s) % 4 ||
        reinterpret_cast<uintptr_t>(m.b) % 4)
      return false;
  }
  if (reinterpret_cast<uintptr_t>(a.x) % 16 || (a.norm && reinterpret_cast<uintptr_t>(a.norm) % 16)) return false;
  const bool swiglu = a.epi == Epilogue::SwiGLU;
  if (swiglu && (a.n != 2 || a.m[1].rows != m0.rows)) return false;
  int items = 0;
  if (swiglu) items = m0.rows;
  else
    for (int i = 0; i < a.n; ++i) items += a.m[i].rows;
  const int G = a.K / gs, sbytes = m0.sdt == SDt::F32 ? 4 : 2;
  const size_t srow = size_t(G) * sbytes;
  bool bulk_scales = srow % 16 == 0;
  for (int i = 0; i < a.n; ++i)
    if (reinterpret_cast<uintptr_t>(a.m[i].s) % 16 || reinterpret_cast<uintptr_t>(a.m[i].b) % 16) bulk_scales = false;
  const int blocks = std::min(items, num_sms);
  const int per_block = (items + blocks - 1) / blocks;
  const int segs = swiglu ? 2 : a.n;
  const size_t row_bytes = size_t(a.K / 2) + 2 * ((srow + 15) / 16 * 16);
  const size_t x_bytes = size_t(a.K) * 4 + 2 * size_t(a.K / 8) * 4;
  const size_t smem = x_bytes + 16 + size_t(per_block) * row_bytes * (swiglu ? 2 : 1) + size_t(segs) * 2 * 16;
  if (smem > size_t(budget_kb) * 1024 || smem > 227 * 1024) return false;
  static bool attr_set = false;
  if (!attr_set) {
    DQ_CUDA_CHECK(cudaFuncSetAttribute(resident_kernel<kResidentWarps>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       227 * 1024));
    attr_set = true;
  }
  launch_kernel(resident_kernel<kResidentWarps>, blocks, kResidentWarps * 32, smem, s, a, gs, items, int(bulk_scales));
  return true;
}

}  // namespace dq::cuda
