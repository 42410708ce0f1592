// Storage dtypes and conversions to fp32 (bf16, f16). Host and device.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__CUDACC__)
#define DQ_HD __host__ __device__ __forceinline__
#else
// always_inline: a SIMD kernel that calls these compiles them with its own target flags,
// and no out-of-line copy built for one ISA can be picked by the linker for another.
#define DQ_HD inline __attribute__((always_inline))
#endif

namespace dq {

enum class DType : uint8_t { BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64, F8_E4M3, F8_E5M2 };

// Size in bytes of one element; every safetensors dtype we can name has a whole-byte size.
size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
// Parses a safetensors dtype string ("BF16", ...); returns false for an unknown one.
bool parse_dtype(std::string_view s, DType* out);

DQ_HD float bits_to_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
DQ_HD uint32_t f32_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

DQ_HD float bf16_to_f32(uint16_t h) { return bits_to_f32(uint32_t(h) << 16); }

// Round-to-nearest-even fp32 -> bf16 (NaN stays NaN).
DQ_HD uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// Exact IEEE half -> float (subnormals, inf, NaN).
DQ_HD float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do { man <<= 1; ++e; } while (!(man & 0x400u));
    u = sign | (uint32_t(112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  return bits_to_f32(u);
}

// Round-to-nearest-even fp32 -> half.
uint16_t f32_to_f16(float f);

}  // namespace dq
