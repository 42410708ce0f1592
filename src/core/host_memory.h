// What the host has to spare, for sizing decisions made before memory is touched (the CPU
// backend's huge-page weights, the batcher's slots).
#pragma once
#include <cstddef>

namespace dq {

// MemAvailable from /proc/meminfo, in bytes (0 if unknown).
size_t host_memory_available();

}  // namespace dq
