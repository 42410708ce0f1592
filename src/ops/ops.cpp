#include "ops/ops.h"

#include <type_traits>

#include "core/dtype.h"

namespace dq {

size_t Matrix::bytes() const {
  size_t n = size_t(rows) * size_t(cols);
  switch (format) {
    case WFormat::Affine: {
      size_t groups = size_t(rows) * size_t(cols / group_size);
      return n * size_t(bits) / 8 + 2 * groups * dtype_size(scale_dtype);
    }
    case WFormat::BF16:
    case WFormat::F16: return n * 2;
    case WFormat::F32: return n * 4;
  }
  return 0;
}

const char* op_name(const Op& op) {
  return std::visit(
      [](const auto& o) -> const char* {
        using T = std::decay_t<decltype(o)>;
        if constexpr (std::is_same_v<T, op::Embed>) return "embed";
        else if constexpr (std::is_same_v<T, op::Project>) return "project";
        else if constexpr (std::is_same_v<T, op::ProjectAdd>) return "project_add";
        else if constexpr (std::is_same_v<T, op::SwiGLU>) return "swiglu";
        else if constexpr (std::is_same_v<T, op::GdnCore>) return "gdn_core";
        else if constexpr (std::is_same_v<T, op::ProjectGdn>) return "project_gdn";
        else if constexpr (std::is_same_v<T, op::AttnCore>) return "attn_core";
        else if constexpr (std::is_same_v<T, op::Argmax>) return "argmax";
        else if constexpr (std::is_same_v<T, op::TopK>) return "top_k";
        else if constexpr (std::is_same_v<T, op::SampleDraw>) return "sample_draw";
        else if constexpr (std::is_same_v<T, op::TopDraw>) return "top_draw";
        else if constexpr (std::is_same_v<T, op::AdvancePos>) return "advance_pos";
        else if constexpr (std::is_same_v<T, op::Zero>) return "zero";
        else if constexpr (std::is_same_v<T, op::Write>) return "write";
        else return "read";
      },
      op);
}

}  // namespace dq
