#include "runtime/perplexity.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace dq {

NllResult mean_nll(Engine& e, std::span<const int32_t> ids, int window) {
  if (window < 2) fail("perplexity window must be at least 2 tokens, got {}", window);
  if (window > e.max_ctx()) fail("perplexity window {} exceeds the context of {} (raise --ctx)", window, e.max_ctx());
  const size_t V = size_t(e.config().vocab_size), W = size_t(window);
  NllResult r;
  r.windows = ids.size() / W;
  if (r.windows == 0) fail("{} tokens: fewer than one window of {}", ids.size(), W);
  double total = 0;
  for (size_t w = 0; w < r.windows; ++w) {
    std::span<const int32_t> win = ids.subspan(w * W, W);
    std::vector<float> logits = e.score(win);
    for (size_t i = 0; i + 1 < W; ++i) {
      const float* row = &logits[i * V];
      double mx = -INFINITY;
      for (size_t v = 0; v < V; ++v) mx = std::max(mx, double(row[v]));
      double z = 0;
      for (size_t v = 0; v < V; ++v) z += std::exp(double(row[v]) - mx);
      total += (mx + std::log(z)) - double(row[win[i + 1]]);
      ++r.predictions;
    }
  }
  r.mean_nll = total / double(r.predictions);
  return r;
}

}  // namespace dq
