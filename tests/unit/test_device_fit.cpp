// What the CUDA backend asks of a GPU (backend/cuda/device_fit.h): plain C++, checked without one.
#include <gtest/gtest.h>

#include "backend/cuda/device_fit.h"

namespace dq {
namespace {

TEST(DeviceFit, HopperFits) {
  EXPECT_EQ(gpu_unfit_reason({"NVIDIA H200", 9, 0, 227 * 1024}), "");
  EXPECT_EQ(gpu_unfit_reason({"NVIDIA H100 80GB HBM3", 9, 0, 227 * 1024}), "");
  EXPECT_EQ(gpu_unfit_reason({"NVIDIA B200", 10, 0, 227 * 1024}), "");  // runs the compute_90 PTX
}

TEST(DeviceFit, OlderGpuIsNamedWithItsCapability) {
  const std::string why = gpu_unfit_reason({"NVIDIA A100-SXM4-80GB", 8, 0, 163 * 1024});
  EXPECT_NE(why.find("NVIDIA A100-SXM4-80GB"), std::string::npos) << why;
  EXPECT_NE(why.find("compute capability 8.0"), std::string::npos) << why;
  EXPECT_NE(why.find("need 9.0 or newer"), std::string::npos) << why;
  EXPECT_NE(why.find("--device cpu"), std::string::npos) << why;
}

TEST(DeviceFit, TooLittleSharedMemoryIsNamed) {
  const std::string why = gpu_unfit_reason({"a newer GPU with small blocks", 12, 0, 99 * 1024});
  EXPECT_NE(why.find("99 KB"), std::string::npos) << why;
  EXPECT_NE(why.find("need 225 KB"), std::string::npos) << why;
  EXPECT_EQ(gpu_unfit_reason({"just enough", 9, 0, 225 * 1024}), "");
  EXPECT_NE(gpu_unfit_reason({"one byte short", 9, 0, 225 * 1024 - 1}), "");
}

}  // namespace
}  // namespace dq
