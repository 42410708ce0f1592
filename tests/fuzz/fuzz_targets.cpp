#include "fuzz/fuzz_targets.h"

#include <string_view>

#include "core/error.h"
#include "format/model_config.h"
#include "format/safetensors.h"

namespace dq::fuzz {

void safetensors_header(const uint8_t* data, size_t size) {
  try {
    auto f = SafetensorsFile::parse(data, size, "fuzz.safetensors");
    // Touch every tensor's bytes: all must lie inside the input.
    volatile uint8_t sink = 0;
    for (const TensorInfo& t : f->tensors())
      if (t.nbytes) sink = sink + t.data[0] + t.data[t.nbytes - 1];
  } catch (const Error&) {
  }
}

void model_config(const uint8_t* data, size_t size) {
  try {
    parse_model_config(std::string_view(reinterpret_cast<const char*>(data), size), "config.json");
  } catch (const Error&) {
  }
}

}  // namespace dq::fuzz
