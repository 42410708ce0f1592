#include "core/host_memory.h"

#include <cstdio>
#include <fstream>
#include <string>

namespace dq {

size_t host_memory_available() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    unsigned long long kb = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %llu kB", &kb) == 1) return size_t(kb) * 1024;
  }
  return 0;
}

}  // namespace dq
