// End to end on trained weights (models/demo-fortunes): the text prompt gives HF's prompt ids,
// greedy decoding continues as HF did, and the held-out perplexity is the README's, for both
// checkpoint layouts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/mapped_file.h"
#include "format/safetensors.h"
#include "runtime/engine.h"
#include "runtime/perplexity.h"
#include "text/model_text.h"

using namespace dq;

namespace {
const std::string kDemo = std::string(DQ_SOURCE_DIR) + "/models/demo-fortunes";

std::vector<int32_t> ints(const SafetensorsFile& f, const std::string& n) {
  const TensorInfo* t = f.find(n);
  std::vector<int32_t> v(size_t(t->numel()));
  std::memcpy(v.data(), t->data, t->nbytes);
  return v;
}
}  // namespace

TEST(TextE2E, DemoPromptAndGreedyContinuationMatchHF) {
  auto ref = SafetensorsFile::open(kDemo + "/mlx-4bit/reference.safetensors");
  auto tc = text::TextConfig::load(kDemo + "/mlx-4bit");
  std::vector<int32_t> prompt = tc.tokenizer->encode("The best way to predict the future is");
  EXPECT_EQ(prompt, ints(*ref, "prompt_ids"));
  auto e = Engine::open(kDemo + "/mlx-4bit");
  std::vector<int32_t> want = ints(*ref, "generated_ids"), got;
  int32_t next = e->feed(prompt);
  for (size_t i = 0; i < want.size(); ++i) {
    got.push_back(next);
    next = e->step_greedy();
  }
  EXPECT_EQ(got, want);
  std::string text = tc.tokenizer->decode(got);
  EXPECT_EQ(text.rfind(" to\nsure the way to the same.\n\t\t-- J. R. R. Tolkien", 0), 0u) << text;
}

TEST(TextE2E, HeldOutPerplexityMatchesTheReadme) {
  const std::string heldout = read_text_file(kDemo + "/heldout.txt");
  struct Case {
    const char* layout;
    double nll;
  };
  for (Case c : {Case{"mlx-4bit", 4.735133}, Case{"hf-bf16", 4.707425}}) {
    const std::string dir = kDemo + "/" + c.layout;
    auto tc = text::TextConfig::load(dir);
    std::vector<int32_t> ids = tc.tokenizer->encode(heldout);
    EXPECT_EQ(ids.size(), 14284u);
    auto e = Engine::open(dir);
    NllResult r = mean_nll(*e, ids, 256);
    EXPECT_EQ(r.predictions, 14025u);
    std::printf("%s: mean NLL %.6f (README %.6f)\n", c.layout, r.mean_nll, c.nll);
    EXPECT_NEAR(r.mean_nll, c.nll, 1e-3) << c.layout;
  }
}
