// Generator on the demo model (models/demo-fortunes/mlx-4bit, a small trained model with a tokenizer):
// greedy text and ids, streaming, stop strings across token boundaries, eos, max_tokens, context,
// cancellation, seeds.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "format/safetensors.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "runtime/sampler.h"
#include "text/model_text.h"
#include "../unit/lockstep.h"

namespace {

const std::string kDemo = std::string(DQ_SOURCE_DIR) + "/models/demo-fortunes/mlx-4bit";

struct Demo {
  std::unique_ptr<dq::Engine> engine;
  dq::text::TextConfig text;
};

Demo& demo() {
  static Demo d = [] {
    Demo x;
    dq::EngineOptions o;
    o.threads = 1;
    x.engine = dq::Engine::open(kDemo, o);
    x.text = dq::text::TextConfig::load(kDemo);
    return x;
  }();
  return d;
}

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!n || i + size_t(n) > s.size()) return false;
    for (int k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + size_t(k)]) >> 6) != 2) return false;
    i += size_t(n);
  }
  return true;
}

dq::GenerateRequest greedy_request(const std::string& prompt, int max_tokens) {
  dq::GenerateRequest r;
  r.prompt = demo().text.tokenizer->encode(prompt);
  r.sampling.temperature = 0;
  r.max_tokens = max_tokens;
  return r;
}

// 40 sampled tokens of "Love is" at temperature 0.9 with a seed, never stopped early.
dq::GenerateRequest sampled_request(uint64_t seed) {
  auto r = greedy_request("Love is", 40);
  r.stop_at_eos = false;
  r.sampling.temperature = 0.9f;
  r.sampling.seed = seed;
  return r;
}

// The plain loop: feed, then step_greedy.
std::vector<int32_t> greedy_ids(const std::vector<int32_t>& prompt, int n) {
  auto& e = *demo().engine;
  e.reset();
  std::vector<int32_t> out = {e.feed(prompt)};
  while (int(out.size()) < n) out.push_back(e.step_greedy());
  return out;
}

}  // namespace

TEST(Generator, GreedyTextIsDecodeOfGreedyIds) {
  auto& d = demo();
  dq::Generator g(*d.engine, d.text);
  auto req = greedy_request("The best way to predict the future is", 64);
  req.stop_at_eos = false;
  std::string streamed;
  int pieces = 0;
  auto r = g.generate(req, [&](std::string_view p) {
    EXPECT_TRUE(valid_utf8(p));
    EXPECT_FALSE(p.empty());
    streamed += p;
    ++pieces;
    return true;
  });
  EXPECT_EQ(r.finish_reason, "length");
  EXPECT_EQ(r.completion_tokens, 64);
  EXPECT_EQ(r.prompt_tokens, int(req.prompt.size()));
  EXPECT_EQ(r.tokens, greedy_ids(req.prompt, 64));
  EXPECT_EQ(r.text, d.text.tokenizer->decode(r.tokens));
  EXPECT_EQ(streamed, r.text);
  EXPECT_GT(pieces, 10);
  EXPECT_GT(r.gen_seconds, 0);
  // The reference continuation of this prompt (models/demo-fortunes/README.md).
  EXPECT_EQ(r.text.substr(0, 4), " to\n");
}

TEST(Generator, HostLogitsPathEqualsDeviceArgmaxPath) {
  // A penalty too small to change any float forces the sampled (host logits) path with greedy choice.
  auto& d = demo();
  dq::Generator g(*d.engine, d.text);
  auto req = greedy_request("A fool and his money", 40);
  req.stop_at_eos = false;
  auto fast = g.generate(req, {});
  req.sampling.presence_penalty = 1e-30f;
  auto slow = g.generate(req, {});
  EXPECT_EQ(fast.tokens, slow.tokens);
  EXPECT_EQ(fast.text, slow.text);
}

TEST(Generator, StopsAtEosWithoutEmittingIt) {
  auto& d = demo();
  dq::Generator g(*d.engine, d.text);
  auto req = greedy_request("The best way to predict the future is", 200);
  auto all = greedy_ids(req.prompt, 200);
  auto eos = std::find(all.begin(), all.end(), 4091);
  ASSERT_NE(eos, all.end()) << "the demo model's greedy continuation ends a fortune";
  auto r = g.generate(req, {});
  EXPECT_EQ(r.finish_reason, "stop");
  ASSERT_TRUE(r.stop_id);
  EXPECT_EQ(*r.stop_id, 4091);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(all.begin(), eos));
  EXPECT_EQ(r.completion_tokens, int(r.tokens.size()) + 1);
  EXPECT_EQ(r.text, d.text.tokenizer->decode(r.tokens));
  EXPECT_EQ(r.text.find("<|endoftext|>"), std::string::npos);
}

TEST(Generator, StopStringsAcrossTokenBoundariesAreNeverEmitted) {
  auto& d = demo();
  dq::Generator g(*d.engine, d.text);
  auto req = greedy_request("The best way to predict the future is", 60);
  req.stop_at_eos = false;
  auto full = g.generate(req, {});
  // Pick a stop string that starts inside one token and ends inside a later one.
  std::vector<size_t> ends;  // end offset of each token's text
  size_t off = 0;
  for (int32_t t : full.tokens) ends.push_back(off += d.text.tokenizer->decode(std::vector<int32_t>{t}).size());
  ASSERT_EQ(off, full.text.size());
  size_t a = 0, b = 0;
  for (size_t i = 5; i + 2 < ends.size(); ++i) {
    size_t len_i = ends[i] - ends[i - 1];
    if (len_i >= 2 && ends[i + 1] - ends[i] >= 1) {
      a = ends[i] - 1;  // last byte of token i
      b = ends[i + 1];  // through the end of token i+1
      if (full.text.find(full.text.substr(a, b - a)) == a) break;
    }
  }
  ASSERT_LT(a, b);
  const std::string stop = full.text.substr(a, b - a);
  req.stop = {"never-appears-in-this-text", stop};
  std::string streamed;
  auto r = g.generate(req, [&](std::string_view p) {
    streamed += p;
    return true;
  });
  EXPECT_EQ(r.finish_reason, "stop");
  EXPECT_EQ(r.stop_string, stop);
  EXPECT_EQ(r.text, full.text.substr(0, a));
  EXPECT_EQ(streamed, r.text);
  EXPECT_EQ(streamed.find(stop), std::string::npos);

  // A stop string that never completes: everything is emitted at the end, nothing lost.
  req.stop = {full.text.substr(a, 1) + "\x01"};
  auto r2 = g.generate(req, {});
  EXPECT_EQ(r2.finish_reason, "length");
  EXPECT_EQ(r2.text, full.text);
}

TEST(Generator, StopMatcherHoldsBackPrefixes) {
  dq::StopMatcher m({"abc", "", "bd"});
  EXPECT_EQ(m.push("xxa"), "xx");
  EXPECT_EQ(m.held(), 1u);
  EXPECT_EQ(m.push("b"), "");
  EXPECT_EQ(m.push("x"), "abx");
  EXPECT_EQ(m.push("ab"), "");
  EXPECT_EQ(m.push("d tail"), "a");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.matched_string(), "bd");
  EXPECT_EQ(m.push("more"), "");
  EXPECT_EQ(m.flush(), "");
  dq::StopMatcher n({"abc"});
  EXPECT_EQ(n.push("ab"), "");
  EXPECT_EQ(n.flush(), "ab");
  dq::StopMatcher none({});
  EXPECT_EQ(none.push("abc"), "abc");
}

TEST(Generator, MaxTokensAndContextEnd) {
  auto& d = demo();
  dq::Generator g(*d.engine, d.text);
  auto req = greedy_request("Hello", 7);
  req.stop_at_eos = false;
  auto r = g.generate(req, {});
  EXPECT_EQ(r.finish_reason, "length");
  EXPECT_EQ(r.completion_tokens, 7);
  EXPECT_EQ(r.tokens.size(), 7u);
  req.max_tokens = 0;
  auto z = g.generate(req, {});
  EXPECT_EQ(z.finish_reason, "length");
  EXPECT_EQ(z.completion_tokens, 0);

  // A small context: generation ends with "length" when it is full, never throws.
  dq::EngineOptions o;
  o.threads = 1;
  o.max_ctx = 24;
  auto small = dq::Engine::open(kDemo, o);
  dq::Generator gs(*small, d.text);
  req.max_tokens = 1000;
  auto c = gs.generate(req, {});
  EXPECT_EQ(c.finish_reason, "length");
  EXPECT_EQ(c.prompt_tokens + c.completion_tokens, 24 + 1);  // the last token needs no step
  req.prompt.assign(25, 300);
  EXPECT_THROW(gs.generate(req, {}), dq::Error);
  req.prompt.clear();
  EXPECT_THROW(gs.generate(req, {}), dq::Error);
  req.prompt = {5000};
  EXPECT_THROW(gs.generate(req, {}), dq::Error);
}

TEST(Generator, OnTextFalseOrKeepGoingFalseCancels) {
  auto& d = demo();
  dq::Generator g(*d.engine, d.text);
  auto req = greedy_request("The best way to predict the future is", 100);
  req.stop_at_eos = false;
  int pieces = 0;
  auto r = g.generate(req, [&](std::string_view) { return ++pieces < 3; });
  EXPECT_EQ(r.finish_reason, "cancelled");
  EXPECT_EQ(pieces, 3);
  EXPECT_LT(r.completion_tokens, 10);
  int steps = 0;
  auto k = g.generate(req, {}, [&] { return ++steps <= 5; });
  EXPECT_EQ(k.finish_reason, "cancelled");
  EXPECT_EQ(k.completion_tokens, 5);
  auto k0 = g.generate(req, {}, [] { return false; });
  EXPECT_EQ(k0.finish_reason, "cancelled");
  EXPECT_EQ(k0.completion_tokens, 0);
}

TEST(Generator, SeedsReproduceSampledText) {
  auto& d = demo();
  dq::Generator g(*d.engine, d.text);
  auto req = greedy_request("Love is", 40);
  req.stop_at_eos = false;
  req.sampling.temperature = 0.9f;
  req.sampling.top_p = 0.95f;
  req.sampling.seed = 1234;
  auto a = g.generate(req, {});
  auto b = g.generate(req, {});
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.text, b.text);
  req.sampling.seed = 99;
  auto c = g.generate(req, {});
  EXPECT_NE(a.tokens, c.tokens);
  EXPECT_EQ(c.text, d.text.tokenizer->decode(c.tokens));
}

TEST(Generator, TopLogitsPathEqualsWholeRowPath) {
  // With top_k set the generator brings back only the top logits (op::TopK); a penalty too small
  // to change any float forces the whole-row path. Same seed: the same tokens.
  auto& d = demo();
  dq::Generator g(*d.engine, d.text);
  for (uint64_t seed : {7u, 8u, 9u}) {
    auto req = sampled_request(seed);
    req.sampling.top_k = 20;
    req.sampling.top_p = 0.9f;
    auto top = g.generate(req, {});
    req.sampling.presence_penalty = 1e-30f;
    auto row = g.generate(req, {});
    EXPECT_EQ(top.tokens, row.tokens) << "seed " << seed;
  }
}

TEST(Generator, DrawnOnTheBackendEqualsTheHostDraw) {
  // Temperature alone: the generator has the engine draw (Engine::step_draw), one uniform per
  // token; the host's Sampler::sample on each whole row, with the same seed, takes the same ids.
  auto& d = demo();
  dq::Generator g(*d.engine, d.text);
  for (float min_p : {0.0f, 0.1f}) {
    auto req = sampled_request(21);
    req.sampling.min_p = min_p;
    auto drawn = g.generate(req, {});
    ASSERT_EQ(drawn.tokens.size(), 40u);
    dq::Sampler s(req.sampling);
    std::vector<float> logits;
    d.engine->reset();
    int32_t tok = d.engine->feed(req.prompt, &logits);
    std::vector<int32_t> host;
    for (int i = 0; i < 40; ++i) {
      tok = s.sample(logits, {}, 0);
      host.push_back(tok);
      d.engine->step(tok, &logits);
    }
    EXPECT_EQ(drawn.tokens, host) << "min_p " << min_p;
  }
}

TEST(Generator, TopPFromTheTopLogitsEqualsWholeRowPath) {
  // Top-p without top_k: the generator brings back the top 256 logits and the row's weight sum
  // (decided there when the top_p mass lies within them: the demo model is peaked); a penalty
  // too small to change any float forces the whole-row path. Same seed: the same tokens.
  auto& d = demo();
  dq::Generator g(*d.engine, d.text);
  for (float top_p : {0.5f, 0.9f, 0.99f}) {
    auto req = sampled_request(5);
    req.sampling.top_p = top_p;
    auto top = g.generate(req, {});
    req.sampling.presence_penalty = 1e-30f;
    auto row = g.generate(req, {});
    EXPECT_EQ(top.tokens, row.tokens) << "top_p " << top_p;
  }
}

TEST(Generator, APromptThatExtendsTheHistoryFeedsOnlyTheNewTokens) {
  // The next turn of a conversation: the last prompt, the answer, and more. The engine keeps its
  // state and feeds only the new tokens; the result is the same as from a fresh start.
  auto& d = demo();
  dq::Generator g(*d.engine, d.text);
  for (bool sampled : {false, true}) {
    auto req = greedy_request("A fool and his money", 12);
    req.stop_at_eos = false;
    if (sampled) {
      req.sampling.temperature = 0.8f;
      req.sampling.seed = 3;
    }
    auto first = g.generate(req, {});
    ASSERT_EQ(first.tokens.size(), 12u);
    EXPECT_EQ(first.cached_tokens, 0);
    auto next = req;
    next.prompt.insert(next.prompt.end(), first.tokens.begin(), first.tokens.end());
    const auto more = d.text.tokenizer->encode(" are soon parted.");
    next.prompt.insert(next.prompt.end(), more.begin(), more.end());
    auto continued = g.generate(next, {});
    // Every prompt token and every answer token but the last (never fed: it ended the answer).
    EXPECT_EQ(continued.cached_tokens, int(req.prompt.size() + first.tokens.size() - 1));
    EXPECT_EQ(d.engine->history().size(), next.prompt.size() + continued.tokens.size() - 1);
    g.generate(greedy_request("Unrelated", 3), {});  // the history no longer matches
    auto fresh = g.generate(next, {});
    EXPECT_EQ(fresh.cached_tokens, 0);
    EXPECT_EQ(fresh.tokens, continued.tokens) << (sampled ? "sampled" : "greedy");
    EXPECT_EQ(fresh.text, continued.text);
    // The same prompt again is not an extension (at least one token must be fed): fresh start.
    auto again = g.generate(next, {});
    EXPECT_EQ(again.cached_tokens, 0);
    EXPECT_EQ(again.tokens, fresh.tokens);
  }
}

// Two engines on one model: a plain one and one whose CPU queue reports overlap as CUDA's does
// (DELTAQ_CPU_OVERLAP=1: steps are issued ahead, and run at the waits).
struct EnginePair {
  std::unique_ptr<dq::Engine> plain, overlapping;
};
static EnginePair plain_and_overlapping(const std::string& model, int max_ctx) {
  dq::EngineOptions o;
  o.threads = 1;
  o.max_ctx = max_ctx;
  setenv("DELTAQ_CPU_OVERLAP", "1", 1);
  EnginePair p;
  p.overlapping = dq::Engine::open(model, o);
  unsetenv("DELTAQ_CPU_OVERLAP");
  p.plain = dq::Engine::open(model, o);
  EXPECT_TRUE(p.overlapping->queue().overlaps());
  EXPECT_FALSE(p.plain->queue().overlaps());
  return p;
}

// The pipelined draw (Engine::step_draw_ahead) on a CPU queue that reports overlap as CUDA's
// does (DELTAQ_CPU_OVERLAP=1: steps are issued ahead, and run at the waits): the ids and
// uniforms of step_draw; another token rebuilds the state and the draw taken back lends its
// uniform to the next; the context's end where the plain engine's is; and through the
// generator, the same text as the plain engine.
TEST(Generator, PipelinedDrawEqualsThePlainDraw) {
  auto [a, b] = plain_and_overlapping(kDemo, 40);
  const int max_ctx = 40;
  const int V = a->config().vocab_size;
  std::mt19937_64 ra(3), rb(3);
  auto uni = [](std::mt19937_64& r) { return double(r() >> 11) * 0x1.0p-53; };
  auto next_b = [&] { return uni(rb); };
  const std::vector<int32_t> prompt = {5, 9, 2, 6, 5, 3};
  int32_t ta = a->feed(prompt), tb = b->feed(prompt);
  ASSERT_EQ(ta, tb);
  for (float min_p : {0.0f, 0.05f})
    for (int i = 0; i < 8; ++i) {
      const double ua = uni(ra);
      double ub = -1;
      ta = a->step_draw(ta, 0.9f, min_p, ua);
      tb = b->step_draw_ahead(tb, 0.9f, min_p, next_b, &ub);
      ASSERT_EQ(ta, tb) << "draw " << i << " min_p " << min_p;
      ASSERT_EQ(ua, ub) << "draw " << i;
      ASSERT_GE(ta, 0);
    }
  // Top-k draws (op::TopDraw from op::TopK's pairs) pipelined the same way, the parameters
  // changing between draws (a draw of other parameters issued ahead is taken back).
  for (int i = 0; i < 9; ++i) {
    const dq::DrawParams d = i % 3 == 2 ? dq::DrawParams{0.9f, 0.0f} : dq::DrawParams{0.9f, i % 2 ? 0.05f : 0.0f, 20, 0.9f};
    const double ua = uni(ra);
    double ub = -1;
    ta = a->step_draw(ta, d, ua);
    tb = b->step_draw_ahead(tb, d, next_b, &ub);
    ASSERT_EQ(ta, tb) << "top draw " << i;
    ASSERT_EQ(ua, ub) << "top draw " << i;
    ASSERT_GE(ta, 0);
  }
  // Another token than the one drawn (fed ahead on b): the state without it, the same logits.
  std::vector<float> la, lb;
  const int32_t other = (ta + 1) % V;
  ta = a->step(other, &la);
  tb = b->step(other, &lb);
  ASSERT_EQ(ta, tb);
  ASSERT_EQ(la, lb);
  // Draws again, to the end of the context: b reuses the uniform of the draw it took back.
  double ua = 0, ub = -1;
  lockstep::to_context_end([&] { return ta = a->step_draw(ta, 0.7f, 0.0f, ua = uni(ra)); },
                           [&] { return tb = b->step_draw_ahead(tb, 0.7f, 0.0f, next_b, &ub); }, "draw",
                           [&](int i) { ASSERT_EQ(ua, ub) << "draw " << i; });
  EXPECT_EQ(a->position(), max_ctx);
  EXPECT_EQ(b->position(), max_ctx);
  b->sync();
  EXPECT_EQ(a->history(), b->history());
  // The generator on each (temperature alone: its draw path), the same seeded text.
  auto text = dq::text::TextConfig::load(kDemo);
  dq::Generator ga(*a, text), gb(*b, text);
  auto req = sampled_request(33);
  req.max_tokens = 30;
  a->reset();
  b->reset();
  const auto ra_ = ga.generate(req, {}), rb_ = gb.generate(req, {});
  EXPECT_EQ(ra_.tokens, rb_.tokens);
  EXPECT_EQ(ra_.text, rb_.text);
}

// A copy of tiny-q4 whose tied embedding / head rows `rows` have the largest bf16 bias in their
// first group (and none in the others): their logits are the first group's sum of x times
// 3.39e38, +inf or -inf with its sign, all together, so that about every other draw declines
// (the row holds +inf).
static std::string overflowing_model(const std::vector<int>& rows) {
  namespace fs = std::filesystem;
  const std::string src = std::string(DQ_TEST_DATA) + "/tiny-q4";
  const std::string dir = std::string(::testing::TempDir()) + "/overflowing-head";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors", "model.safetensors.index.json"})
    fs::copy_file(src + "/" + f, dir + "/" + f);
  size_t biases = 0, row_bytes = 0;
  {
    auto st = dq::SafetensorsFile::open(dir + "/model.safetensors");
    const dq::TensorInfo* b = st->find("language_model.model.embed_tokens.biases");
    if (!b || b->dtype != dq::DType::BF16 || b->shape.size() != 2) throw std::runtime_error("tiny-q4 layout changed");
    biases = b->file_offset, row_bytes = size_t(b->shape[1]) * 2;
  }
  std::fstream f(dir + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  for (int r : rows)
    for (size_t k = 0; k < row_bytes; k += 2) {
      const char big[2] = {'\x7f', '\x7f'}, zero[2] = {0, 0};  // bf16 3.39e38 and +0 (little endian)
      f.seekp(long(biases + size_t(r) * row_bytes + k));
      f.write(k == 0 ? big : zero, 2);
    }
  return dir;
}

// read_logits() after a prompt fed as one prefill chunk: that chunk's last row (it was the
// decode step's buffer, whatever the last step had left there).
TEST(Generator, ReadLogitsAfterAFeedIsThePromptsLastRow) {
  dq::EngineOptions o;
  o.threads = 1;
  auto e = dq::Engine::open(kDemo, o);
  std::vector<float> fed, read, stepped;
  e->step(7, &stepped);  // a step first: its row sits in the step's buffer
  e->reset();
  e->feed(std::vector<int32_t>{5, 9, 2, 6, 5, 3}, &fed);
  e->read_logits(&read);
  ASSERT_EQ(fed.size(), read.size());
  EXPECT_EQ(0, std::memcmp(fed.data(), read.data(), fed.size() * 4));
  EXPECT_NE(0, std::memcmp(stepped.data(), read.data(), read.size() * 4));
}

// The pipelined draw's decline path: the draw issued ahead returns -1 (a row with +inf, then rows
// with no number), the step issued after it is taken back, and the host's fallback on the row's
// logits continues; on a CPU queue that overlaps, the ids, uniforms and history of the plain
// step_draw with the same fallback.
TEST(Generator, PipelinedDrawDeclinesAsThePlainDraw) {
  const std::string model = overflowing_model({3, 100, 257, 400, 511, 640, 777, 901, 1000, 1023});
  auto [a, b] = plain_and_overlapping(model, 80);
  dq::SamplingParams sp;
  sp.temperature = 0.8f;
  dq::Sampler fallback(sp);
  std::mt19937_64 ra(5), rb(5);
  auto uni = [](std::mt19937_64& r) { return double(r() >> 11) * 0x1.0p-53; };
  const std::vector<int32_t> prompt = {5, 9, 2, 6};
  int32_t ta = a->feed(prompt), tb = b->feed(prompt);
  ASSERT_EQ(ta, tb);
  std::vector<float> la, lb;
  // 30 draws of d on both engines; a declined draw falls back to `fallback` on the row with the
  // draw's uniform. Counts the declined and the drawn ones.
  auto draws = [&](const dq::DrawParams& d, const std::function<int32_t(std::span<const float>, double)>& fallback,
                   const char* what, int& declined, int& drawn) {
    for (int i = 0; i < 30; ++i) {
      const double ua = uni(ra);
      double ub = -1;
      const int32_t da = a->step_draw(ta, d, ua);
      const int32_t db = b->step_draw_ahead(tb, d, [&] { return uni(rb); }, &ub);
      ASSERT_EQ(da, db) << what << " step " << i;
      ASSERT_EQ(ua, ub) << what << " step " << i;
      if (da < 0) {
        ++declined;
        a->read_logits(&la);
        b->read_logits(&lb);
        ASSERT_EQ(la.size(), lb.size());
        ASSERT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * 4)) << what << " step " << i;  // NaN rows too
        ta = fallback(la, ua);
        tb = fallback(lb, ub);
      } else {
        ++drawn;
        ta = da, tb = db;
      }
      ASSERT_EQ(ta, tb);
    }
  };
  int declined = 0, drawn = 0;
  draws(dq::DrawParams{sp.temperature, 0.0f}, [&](std::span<const float> l, double u) { return fallback.sample_declined(l, u); },
        "plain", declined, drawn);
  EXPECT_GT(declined, 3) << "the overflowing rows should make draws decline";
  EXPECT_GT(drawn, 3);
  // The same with top-k draws (op::TopDraw declines when the top value is +inf): the fallback is
  // the sampler's choice from the row with the draw's uniform.
  sp.top_k = 20, sp.top_p = 0.9f;
  dq::Sampler top_fallback(sp);
  int top_declined = 0, top_drawn = 0;
  draws(dq::DrawParams{sp.temperature, 0.0f, 20, 0.9f},
        [&](std::span<const float> l, double u) { return top_fallback.sample_with(l, u); }, "top", top_declined, top_drawn);
  EXPECT_GT(top_declined, 3);
  EXPECT_GT(top_drawn, 3);
  // The last token fed on both (b may hold it fed ahead already): the same logits and history.
  a->step(ta, &la);
  b->step(tb, &lb);
  ASSERT_EQ(la.size(), lb.size());
  EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * 4));
  b->sync();
  EXPECT_EQ(a->history(), b->history());
  EXPECT_EQ(a->position(), b->position());
}

// The pipelined greedy decode (Engine::step_greedy issuing the step that feeds each returned
// token) on a CPU queue that reports overlap: the plain engine's ids, the step fed ahead taken
// by a call with its token, a rebuild for another token, the context's end at the same place.
TEST(Generator, PipelinedGreedyEqualsThePlainGreedy) {
  auto [a, b] = plain_and_overlapping(kDemo, 32);
  const int V = a->config().vocab_size;
  const std::vector<int32_t> prompt = {5, 9, 2, 6, 5, 3};
  int32_t ta = a->feed(prompt), tb = b->feed(prompt);
  ASSERT_EQ(ta, tb);
  for (int i = 0; i < 6; ++i) ASSERT_EQ(a->step_greedy(), b->step_greedy()) << i;
  std::vector<float> la, lb;
  const int32_t ga = a->step_greedy(), gb = b->step_greedy();
  ASSERT_EQ(ga, gb);
  ta = a->step(ga, &la);
  tb = b->step(gb, &lb);  // the token just returned: b fed it ahead
  ASSERT_EQ(ta, tb);
  ASSERT_EQ(la, lb);
  const int32_t other = (ta + 1) % V;
  ASSERT_EQ(a->step(other, &la), b->step(other, &lb));
  ASSERT_EQ(la, lb);
  lockstep::to_context_end([&] { return a->step_greedy(); }, [&] { return b->step_greedy(); }, "greedy");
  b->sync();
  EXPECT_EQ(a->history(), b->history());
}
