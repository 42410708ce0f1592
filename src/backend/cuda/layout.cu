// Backend::product_matrix on CUDA: a 4-bit matrix's words and scales moved into the lane
// layout (q4.cuh lane_word / lane_scale) on the device, once at load. The values are the
// same; only where they sit changes, so every product stays bit-identical.
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/q4.cuh"

namespace dq::cuda {

namespace {

// One block per row: words, then scales.
__global__ void lane_layout_kernel(const uint32_t* w, uint32_t* w_out, const uint16_t* s, uint16_t* s_out, int K,
                                   int gs_shift) {
  const int U = K / 8, G = K >> gs_shift;
  const size_t r = blockIdx.x;
  for (int u = threadIdx.x; u < U; u += blockDim.x) w_out[r * U + lane_word(u)] = w[r * U + u];
  for (int g = threadIdx.x; g < G; g += blockDim.x) s_out[r * G + lane_scale(g, gs_shift, G)] = s[r * G + g];
}

}  // namespace

void launch_lane_layout(const uint32_t* w, uint32_t* w_out, const uint16_t* s, uint16_t* s_out, int rows, int K,
                        int gs_shift, cudaStream_t st) {
  lane_layout_kernel<<<rows, 256, 0, st>>>(w, w_out, s, s_out, K, gs_shift);
  DQ_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dq::cuda
