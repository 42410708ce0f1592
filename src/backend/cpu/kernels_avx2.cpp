#include "backend/cpu/kernels.h"
namespace dq::cpu {
const KernelSet* avx2_kernels() { return nullptr; }
}  // namespace dq::cpu
