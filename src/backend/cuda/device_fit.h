// What deltaq's CUDA kernels need of a GPU, checked before the backend is made, so that a GPU
// they cannot run on gets a plain answer instead of a launch error deep in the first step. They
// are built for sm_90 (programmatic dependent launch, thread-block clusters, bulk copies; a newer
// GPU compiles the embedded compute_90 PTX) and ask for up to 225 KB of shared memory a block.
// Plain C++ (no CUDA headers): the unit tests check it on machines without a GPU.
#pragma once
#include <cstddef>
#include <string>

#include <fmt/format.h>

namespace dq {

struct GpuFacts {
  std::string name;
  int major = 0, minor = 0;   // compute capability
  size_t smem_optin = 0;      // the most shared memory a block may ask for (bytes)
};

constexpr int kGpuMinMajor = 9;
constexpr size_t kGpuSmemNeeded = 225 * 1024;

// Empty when the kernels can run on the GPU; else why not, naming the GPU, what it has and what
// is needed.
inline std::string gpu_unfit_reason(const GpuFacts& g) {
  if (g.major < kGpuMinMajor)
    return fmt::format(
        "GPU '{}' has compute capability {}.{}; deltaq's CUDA kernels need {}.0 or newer (Hopper: H100, H200) "
        "(use --device cpu)",
        g.name, g.major, g.minor, kGpuMinMajor);
  if (g.smem_optin < kGpuSmemNeeded)
    return fmt::format(
        "GPU '{}' (compute capability {}.{}) lets a block use {} KB of shared memory; deltaq's CUDA kernels "
        "need {} KB (use --device cpu)",
        g.name, g.major, g.minor, g.smem_optin / 1024, kGpuSmemNeeded / 1024);
  return {};
}

}  // namespace dq
