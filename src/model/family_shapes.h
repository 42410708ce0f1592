// The dense Qwen3.5 family's shapes (the published configs' sizes), for `deltaq make-model --like`
// and the benchmarks that build a size's step from random weights.
#pragma once
#include <string>

namespace dq {

struct FamilyShape {
  int vocab, hidden, inter, layers, heads, kv_heads, head_dim, lk_heads, lv_heads, lk_dim, lv_dim;
  bool tied;  // the head is the embedding
};

// nullptr for a name it does not know ("tiny" is a test-sized model of the same layout).
inline const FamilyShape* family_shape(const std::string& like) {
  static const FamilyShape k08{248320, 1024, 3584, 24, 8, 2, 256, 16, 16, 128, 128, true};
  static const FamilyShape k2{248320, 2048, 6144, 24, 8, 2, 256, 16, 16, 128, 128, true};
  static const FamilyShape k4{248320, 2560, 9216, 32, 16, 4, 256, 16, 32, 128, 128, true};
  static const FamilyShape k9{248320, 4096, 12288, 32, 16, 4, 256, 16, 32, 128, 128, false};
  static const FamilyShape tiny{1024, 128, 384, 4, 4, 2, 64, 2, 4, 32, 32, true};
  if (like == "qwen3.5-0.8b") return &k08;
  if (like == "qwen3.5-2b") return &k2;
  if (like == "qwen3.5-4b") return &k4;
  if (like == "qwen3.5-9b") return &k9;
  if (like == "tiny") return &tiny;
  return nullptr;
}

}  // namespace dq
