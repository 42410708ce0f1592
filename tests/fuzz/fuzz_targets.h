// Fuzz entry points for the parsers that read untrusted bytes. Each must return normally or
// throw dq::Error for any input; anything else (a crash, a sanitizer report, another exception
// type, a hang) is a bug. Driven by libFuzzer (fuzz_*_main.cpp, clang) and, in every CI run, by
// a deterministic mutation smoke test (tests/robust/test_fuzz_smoke.cpp) under ASan+UBSan.
#pragma once
#include <cstddef>
#include <cstdint>

namespace dq::fuzz {
void safetensors_header(const uint8_t* data, size_t size);
void model_config(const uint8_t* data, size_t size);
}  // namespace dq::fuzz
