// The CUDA backend: every op of the step on the device, through the general queue, with the
// decode step recorded once as a CUDA graph. Host code never includes CUDA headers through this.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"

namespace dq {

// Whether CUDA device `device` is present and can run the kernels (device_fit.h); `why` says
// what is missing when it cannot.
bool cuda_device_available(std::string* why = nullptr, int device = 0);
std::unique_ptr<Backend> make_cuda_backend(int device = 0);
// Clusters of the one-kernel GDN token mixer (op::ProjectGdn's decode) that the current device
// holds at once; it runs only when every linear-attention head's cluster fits (2B: 16).
int cuda_gdn_mixer_clusters();

}  // namespace dq
