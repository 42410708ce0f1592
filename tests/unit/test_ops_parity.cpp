// Every op on every CPU kernel set (generic, AVX2, AVX-512: whichever this CPU runs) with 1, 2
// and 3 threads, against the scalar reference: bit-identical results (the numerics contract).
#include "parity_cases.h"

using namespace dq;
using namespace parity;

namespace {

std::vector<Target> cpu_targets() {
  std::vector<Target> out;
  for (CpuKernels k : {CpuKernels::Generic, CpuKernels::Avx2, CpuKernels::Avx512}) {
    try {
      resolve_cpu_kernels(k);
    } catch (const std::exception&) {
      continue;
    }
    for (int t : {1, 2, 3}) {
      std::shared_ptr<Backend> be = make_cpu_backend(k, t);
      std::shared_ptr<Queue> q = be->make_queue();
      out.push_back({std::string(cpu_kernels_name(k)) + "/" + std::to_string(t) + "t", be, q, {}});
    }
  }
  return out;
}

}  // namespace

TEST(OpsParity, ProjectAllFormatsShapesAndTokenCounts) {
  auto t = cpu_targets();
  project_cases(t);
}
TEST(OpsParity, LargeProject) {
  auto t = cpu_targets();
  large_project_cases(t);
}
TEST(OpsParity, ProjectMixedOutputsAndSwiGLU) {
  auto t = cpu_targets();
  mixed_and_swiglu_cases(t);
}
TEST(OpsParity, Embed) {
  auto t = cpu_targets();
  embed_cases(t);
}
TEST(OpsParity, GatedDeltaNet) {
  auto t = cpu_targets();
  gdn_cases(t);
}
TEST(OpsParity, GatedAttention) {
  auto t = cpu_targets();
  attn_cases(t);
}
TEST(OpsParity, ArgmaxTiesTakeTheLowestIndex) {
  auto t = cpu_targets();
  argmax_cases(t);
}
TEST(OpsParity, TopKOrdersByValueThenIndex) {
  auto t = cpu_targets();
  top_k_cases(t);
}
TEST(OpsParity, TopKRejectsAnOutOfRangeK) {
  Rig rig;
  std::vector<float> x(300, 1.0f);
  Ref xr{rig.ref->upload(x.data(), x.size() * 4, "x")}, ids = rig.zeros(2048), vals = rig.zeros(2048);
  for (int k : {0, 257, 301}) {
    rig.ref_q->go(op::TopK{xr, 300, k, ids, vals});
    try {
      rig.ref_q->wait();
      ADD_FAILURE() << "k = " << k << " was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("top_k: k = " + std::to_string(k)), std::string::npos) << e.what();
    }
  }
}
