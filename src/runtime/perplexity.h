// Mean negative log-likelihood of a token sequence, the way perplexity is usually reported:
// non-overlapping windows of `window` tokens, each scored from a fresh state, every prediction
// of every full window (window - 1 per window; a partial last window is not scored).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

#include "runtime/engine.h"

namespace dq {

struct NllResult {
  double mean_nll = 0;  // nats per token
  size_t windows = 0, predictions = 0;
};

NllResult mean_nll(Engine& e, std::span<const int32_t> ids, int window);

}  // namespace dq
