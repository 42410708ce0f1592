#include "fuzz/fuzz_targets.h"
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dq::fuzz::model_config(data, size);
  return 0;
}
