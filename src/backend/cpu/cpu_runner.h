// How the CPU backend executes ops: the scalar reference (the contract itself) or the fast
// kernels (SIMD, multi-threaded), chosen once when the backend is made.
#pragma once
#include <memory>
#include <string>

#include "core/thread_pool.h"
#include "ops/ops.h"

namespace dq {

enum class CpuKernels { Auto, Reference, Generic, Avx2, Avx512 };
// "auto", "reference", "generic", "avx2", "avx512"; throws dq::Error for an unknown name.
CpuKernels parse_cpu_kernels(const std::string& s);
const char* cpu_kernels_name(CpuKernels k);
// The best kernel set this CPU runs (Auto resolved); throws if `want` is not supported here.
CpuKernels resolve_cpu_kernels(CpuKernels want);

class CpuRunner {
 public:
  virtual ~CpuRunner() = default;
  virtual void run(const Op& op) = 0;
  virtual std::string describe() const = 0;
};

std::unique_ptr<CpuRunner> make_reference_runner();
std::unique_ptr<CpuRunner> make_fast_runner(CpuKernels isa, int threads);

}  // namespace dq
