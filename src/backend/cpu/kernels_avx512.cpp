#include "backend/cpu/kernels.h"
namespace dq::cpu {
const KernelSet* avx512_kernels() { return nullptr; }
}  // namespace dq::cpu
