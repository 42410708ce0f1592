#include "core/dtype.h"

#include <cmath>

namespace dq {

namespace {
struct DTypeInfo {
  DType t;
  std::string_view name;
  size_t size;
};
constexpr DTypeInfo kInfo[] = {
    {DType::BOOL, "BOOL", 1}, {DType::U8, "U8", 1},     {DType::I8, "I8", 1},
    {DType::I16, "I16", 2},   {DType::U16, "U16", 2},   {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2}, {DType::I32, "I32", 4},   {DType::U32, "U32", 4},
    {DType::F32, "F32", 4},   {DType::F64, "F64", 8},   {DType::I64, "I64", 8},
    {DType::U64, "U64", 8},   {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
};
}  // namespace

size_t dtype_size(DType t) {
  for (const auto& i : kInfo)
    if (i.t == t) return i.size;
  return 0;
}
std::string_view dtype_name(DType t) {
  for (const auto& i : kInfo)
    if (i.t == t) return i.name;
  return "?";
}
bool parse_dtype(std::string_view s, DType* out) {
  for (const auto& i : kInfo)
    if (i.name == s) {
      *out = i.t;
      return true;
    }
  return false;
}

uint16_t f32_to_f16(float f) {
  uint32_t u = f32_to_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;           // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;          // overflow -> inf (incl. rounding up)
  if (a < 0x38800000u) {                                // subnormal or zero in half
    // value = a as float; half subnormal unit = 2^-24
    float v = bits_to_f32(a);
    float q = std::nearbyint(v * 16777216.0f);  // exact scaling, rounds to nearest even
    return sign | uint16_t(q);
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
  return sign | uint16_t(((r >> 13) - (112u << 10)) & 0x7fffu);
}

}  // namespace dq
