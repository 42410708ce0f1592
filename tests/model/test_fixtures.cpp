// The whole model against HF transformers' float64 references (tests/data/tiny-*, the demo
// model), and the engine's own invariants: prefill == token by token, every thread count and
// kernel set gives the same logits bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/mapped_file.h"
#include "format/checkpoint.h"
#include "format/safetensors.h"
#include "runtime/engine.h"

using namespace dq;

namespace {

const std::string kData = DQ_TEST_DATA;
const std::string kDemo = std::string(DQ_SOURCE_DIR) + "/models/demo-fortunes/mlx-4bit";

struct Reference {
  std::shared_ptr<const SafetensorsFile> f;
  explicit Reference(const std::string& dir) : f(SafetensorsFile::open(dir + "/reference.safetensors")) {}
  std::vector<float> floats(const std::string& n) const {
    const TensorInfo* t = f->find(n);
    std::vector<float> v(size_t(t->numel()));
    std::memcpy(v.data(), t->data, t->nbytes);
    return v;
  }
  std::vector<int32_t> ints(const std::string& n) const {
    const TensorInfo* t = f->find(n);
    std::vector<int32_t> v(size_t(t->numel()));
    std::memcpy(v.data(), t->data, t->nbytes);
    return v;
  }
  std::vector<int64_t> shape(const std::string& n) const { return f->find(n)->shape; }
};

double rel_l2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// ids fed teacher-forced: the prompt then the greedy continuation (minus its last token).
std::vector<int32_t> forced_ids(const Reference& r) {
  std::vector<int32_t> ids = r.ints("prompt_ids"), gen = r.ints("generated_ids");
  ids.insert(ids.end(), gen.begin(), gen.end() - 1);
  return ids;
}

void expect_logits_match(const std::string& dir, double bound, EngineOptions opt = {}) {
  Reference r(dir);
  auto e = Engine::open(dir, opt);
  std::vector<int32_t> ids = forced_ids(r);
  std::vector<float> got = e->score(ids);
  std::vector<float> pre = r.floats("prefill_logits"), dec = r.floats("decode_logits");
  const size_t V = size_t(e->config().vocab_size), P = r.ints("prompt_ids").size();
  double worst = 0;
  size_t worst_row = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const float* want = i < P ? &pre[i * V] : &dec[(i - P) * V];
    double err = rel_l2(&got[i * V], want, V);
    if (err > worst) worst = err, worst_row = i;
  }
  std::printf("%s: %zu rows, worst relative L2 error %.3e (row %zu), bound %.0e\n", dir.c_str(), ids.size(), worst,
              worst_row, bound);
  EXPECT_LE(worst, bound);
}

void expect_greedy_matches(const std::string& dir, int max_tokens = 1 << 30) {
  Reference r(dir);
  auto e = Engine::open(dir);
  std::vector<int32_t> gen = r.ints("generated_ids");
  std::vector<float> gap = r.floats("top2_gap");  // [0]: after the prompt, [i]: after generated i-1
  int32_t next = e->feed(r.ints("prompt_ids"));
  int compared = 0;
  for (size_t i = 0; i < gen.size() && int(i) < max_tokens; ++i) {
    if (gap[i] <= 1e-3f) break;  // a near tie: the reference's choice is not meaningful past here
    ASSERT_EQ(next, gen[i]) << dir << ": greedy token " << i;
    ++compared;
    next = e->step(gen[i]);
  }
  std::printf("%s: %d greedy tokens equal to HF's\n", dir.c_str(), compared);
  EXPECT_GE(compared, std::min<int>(8, int(gen.size())));
}

std::vector<float> score_with(const std::string& dir, const std::vector<int32_t>& ids, EngineOptions opt) {
  return Engine::open(dir, opt)->score(ids);
}

std::vector<int32_t> some_ids(int n, int vocab, uint32_t seed) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = int32_t((seed * 2654435761u + 40503u * i * i + 7u * i) % uint32_t(vocab));
  return v;
}

}  // namespace

TEST(Fixtures, TinyQ4LogitsMatchHF) { expect_logits_match(kData + "/tiny-q4", 1e-4); }
TEST(Fixtures, TinyHf16LogitsMatchHF) { expect_logits_match(kData + "/tiny-hf16", 1e-4); }
TEST(Fixtures, TinyQ4ReferenceKernelsMatchHF) {
  EngineOptions o;
  o.cpu_kernels = CpuKernels::Reference;
  expect_logits_match(kData + "/tiny-q4", 1e-4, o);
}
TEST(Fixtures, DemoModelLogitsMatchHF) { expect_logits_match(kDemo, 5e-4); }

TEST(Fixtures, GreedyIdsMatchHF) {
  expect_greedy_matches(kData + "/tiny-q4");
  expect_greedy_matches(kData + "/tiny-hf16");
  expect_greedy_matches(kDemo);
}

TEST(Fixtures, PerLayerHiddenStatesMatchHF) {
  for (const std::string& dir : {kData + "/tiny-q4", kData + "/tiny-hf16"}) {
    Reference r(dir);
    auto e = Engine::open(dir);
    auto layers = e->layer_outputs(r.ints("prompt_ids"));
    std::vector<float> hid = r.floats("prefill_hidden");  // [L+1][T][H]
    auto sh = r.shape("prefill_hidden");
    const size_t L = size_t(e->config().num_layers), T = size_t(sh[1]), H = size_t(sh[2]);
    ASSERT_EQ(layers.size(), L + 1);
    for (size_t l = 0; l < L; ++l) {  // index L in HF is after the final norm
      double worst = 0;
      for (size_t t = 0; t < T; ++t)
        worst = std::max(worst, rel_l2(&layers[l][t * H], &hid[(l * T + t) * H], H));
      EXPECT_LE(worst, l == 0 ? 1e-7 : 1e-4) << dir << " hidden state " << l;
    }
  }
}

TEST(Fixtures, PrefillThenDecodeEqualsTokenByToken) {
  for (const std::string& dir : {kData + "/tiny-q4", kData + "/tiny-hf16"}) {
    Reference r(dir);
    std::vector<int32_t> ids = forced_ids(r);
    const size_t V = 1024, split = 13;
    // A: prefill the first `split` ids in one forward (chunks of 5 too), then decode one by one.
    for (int chunk : {64, 5}) {
      EngineOptions o;
      o.prefill_chunk = chunk;
      auto a = Engine::open(dir, o);
      auto b = Engine::open(dir, o);
      std::vector<float> la, lb;
      a->feed(std::span(ids).first(split), &la);
      for (size_t i = 0; i < split; ++i) b->step(ids[i], &lb);
      ASSERT_EQ(std::memcmp(la.data(), lb.data(), V * 4), 0) << dir << " after the prefill (chunk " << chunk << ")";
      for (size_t i = split; i < ids.size(); ++i) {
        a->step(ids[i], &la);
        b->step(ids[i], &lb);
        ASSERT_EQ(std::memcmp(la.data(), lb.data(), V * 4), 0) << dir << " position " << i;
      }
      // score() (all logits of a prefill) agrees with the step-by-step logits too
      std::vector<float> all = a->score(ids);
      auto c = Engine::open(dir, o);
      for (size_t i = 0; i < ids.size(); ++i) {
        c->step(ids[i], &lb);
        ASSERT_EQ(std::memcmp(&all[i * V], lb.data(), V * 4), 0) << dir << " score row " << i;
      }
    }
  }
}

TEST(Fixtures, SameLogitsBytesForEveryThreadCountAndKernelSet) {
  for (const std::string& dir : {kData + "/tiny-q4", kData + "/tiny-hf16", kDemo}) {
    auto cfg = Engine::open(dir)->config();
    std::vector<int32_t> ids = some_ids(70, cfg.vocab_size, 3);
    EngineOptions ref;
    ref.cpu_kernels = CpuKernels::Reference;
    std::vector<float> want = score_with(dir, ids, ref);
    for (CpuKernels k : {CpuKernels::Auto, CpuKernels::Generic, CpuKernels::Avx2, CpuKernels::Avx512}) {
      try {
        resolve_cpu_kernels(k);
      } catch (const std::exception&) {
        continue;
      }
      for (int t : {1, 2, 5}) {
        EngineOptions o;
        o.cpu_kernels = k;
        o.threads = t;
        std::vector<float> got = score_with(dir, ids, o);
        ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0)
            << dir << " kernels " << cpu_kernels_name(k) << " threads " << t;
      }
    }
  }
}

namespace {
// A copy of a fixture folder whose config unties the head and whose shards gain a head tensor
// (the embedding's own bytes, or, when `random` is set, other bytes of the same shape).
std::string untied_copy(const std::string& src, const std::string& head_module, bool random) {
  namespace fs = std::filesystem;
  const std::string dir = std::string(::testing::TempDir()) + "/untied-" + fs::path(src).filename().string() +
                          (random ? "-random" : "-copy");
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto st = SafetensorsFile::open(src + "/model.safetensors");
  std::vector<TensorToWrite> ts;
  std::vector<std::vector<uint8_t>> keep;
  for (const TensorInfo& t : st->tensors()) ts.push_back({t.name, t.dtype, t.shape, t.data, t.nbytes});
  const std::string embed = Checkpoint::open(src).refs().embed.module;
  for (const char* part : {".weight", ".scales", ".biases"}) {
    const TensorInfo* t = st->find(embed + part);
    if (!t) continue;
    keep.emplace_back(t->data, t->data + t->nbytes);
    if (random && std::string(part) == ".weight")
      for (size_t i = 0; i < keep.back().size(); ++i) keep.back()[i] = uint8_t((i * 2654435761u) >> 13);
    ts.push_back({head_module + part, t->dtype, t->shape, keep.back().data(), keep.back().size()});
  }
  write_safetensors(dir + "/model.safetensors", ts);
  std::string cfg = read_text_file(src + "/config.json");
  for (size_t at; (at = cfg.find("\"tie_word_embeddings\": true")) != std::string::npos;)
    cfg.replace(at, 27, "\"tie_word_embeddings\": false");
  std::ofstream(dir + "/config.json") << cfg;
  return dir;
}
}  // namespace

TEST(Fixtures, UntiedHeadIsUsed) {
  for (auto [src, head] : {std::pair<std::string, std::string>{kData + "/tiny-q4", "language_model.lm_head"},
                           {kData + "/tiny-hf16", "lm_head"}}) {
    std::vector<int32_t> ids = some_ids(20, 1024, 5);
    std::vector<float> tied = score_with(src, ids, {});
    const std::string same = untied_copy(src, head, false), other = untied_copy(src, head, true);
    ASSERT_FALSE(Checkpoint::open(same).refs().tied);
    // The head holding the embedding's bytes gives the tied model's logits exactly ...
    std::vector<float> a = score_with(same, ids, {});
    EXPECT_EQ(std::memcmp(a.data(), tied.data(), a.size() * 4), 0) << src;
    // ... and other bytes give other logits (on every kernel set alike).
    std::vector<float> b = score_with(other, ids, {});
    EXPECT_NE(std::memcmp(b.data(), tied.data(), b.size() * 4), 0) << src;
    EngineOptions ref;
    ref.cpu_kernels = CpuKernels::Reference;
    std::vector<float> c = score_with(other, ids, ref);
    EXPECT_EQ(std::memcmp(b.data(), c.data(), b.size() * 4), 0) << src;
  }
}

TEST(Fixtures, FeedWithOneTokenChunks) {
  // A prefill cut into chunks of one token (e.g. a tiny context) feeds every token.
  const std::string dir = kData + "/tiny-q4";
  std::vector<int32_t> ids = some_ids(9, 1024, 11);
  EngineOptions one;
  one.prefill_chunk = 1;
  auto a = Engine::open(dir, one), b = Engine::open(dir);
  std::vector<float> la, lb;
  a->feed(ids, &la);
  b->feed(ids, &lb);
  EXPECT_EQ(a->position(), 9);
  ASSERT_EQ(std::memcmp(la.data(), lb.data(), la.size() * 4), 0);
}
