// Saved sequence states (runtime/prompt_cache.h, Engine::snapshot/restore) and the generator's
// prompt cache, on the demo model (models/demo-fortunes/mlx-4bit: GDN and attention layers) and
// the tiny-q4 fixture: a restored state continues with the same logits bytes as a fresh prefill.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "runtime/prompt_cache.h"
#include "text/model_text.h"

namespace {

const std::string kDemo = std::string(DQ_SOURCE_DIR) + "/models/demo-fortunes/mlx-4bit";
const std::string kTinyQ4 = std::string(DQ_TEST_DATA) + "/tiny-q4";

std::shared_ptr<const dq::StateSnapshot> snap(std::vector<int32_t> tokens, size_t bytes) {
  auto s = std::make_shared<dq::StateSnapshot>();
  s->tokens = std::move(tokens);
  s->bytes.resize(bytes);
  return s;
}

std::unique_ptr<dq::Engine> open(const std::string& dir, bool overlapping = false, int ctx = 256) {
  dq::EngineOptions o;
  o.threads = 1;
  o.max_ctx = ctx;
  if (overlapping) setenv("DELTAQ_CPU_OVERLAP", "1", 1);
  auto e = dq::Engine::open(dir, o);
  unsetenv("DELTAQ_CPU_OVERLAP");
  EXPECT_EQ(e->queue().overlaps(), overlapping);
  return e;
}

std::vector<int32_t> ids(int n, int seed, int vocab) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = int32_t((uint32_t(i) * 2654435761u + uint32_t(seed) * 97u + 17u) % uint32_t(vocab));
  return v;
}

std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace

TEST(PromptCache, FindsTheLongestProperPrefix) {
  dq::PromptCache c(1 << 20);
  c.put(snap({1, 2}, 10));
  c.put(snap({1, 2, 3, 4}, 10));
  c.put(snap({1, 2, 9}, 10));
  c.put(snap({7}, 10));
  const std::vector<int32_t> p = {1, 2, 3, 4, 5};
  ASSERT_TRUE(c.find(p));
  EXPECT_EQ(c.find(p)->tokens, (std::vector<int32_t>{1, 2, 3, 4}));
  // A proper prefix only: at least one token is left to feed.
  EXPECT_EQ(c.find(std::vector<int32_t>{1, 2, 3, 4})->tokens, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(c.find(std::vector<int32_t>{1, 2, 9, 9})->tokens, (std::vector<int32_t>{1, 2, 9}));
  EXPECT_FALSE(c.find(std::vector<int32_t>{2, 1, 3}));
  EXPECT_FALSE(c.find(std::vector<int32_t>{7}));
  EXPECT_FALSE(c.find(std::vector<int32_t>{}));
  EXPECT_TRUE(c.contains(std::vector<int32_t>{1, 2, 9}));
  EXPECT_FALSE(c.contains(std::vector<int32_t>{1, 2, 3}));
}

TEST(PromptCache, DropsTheLeastRecentlyUsedBeyondTheBudgetOrCount) {
  const size_t each = 100 + 2 * sizeof(int32_t);  // bytes + tokens (vectors made to size: capacity = size)
  dq::PromptCache c(3 * each);
  c.put(snap({1, 1}, 100));
  c.put(snap({2, 2}, 100));
  c.put(snap({3, 3}, 100));
  EXPECT_EQ(c.count(), 3u);
  EXPECT_EQ(c.bytes(), 3 * each);
  ASSERT_TRUE(c.find(std::vector<int32_t>{1, 1, 5}));  // a hit makes {1, 1} the most recent
  c.put(snap({4, 4}, 100));                            // drops {2, 2}, the least recently used
  EXPECT_EQ(c.count(), 3u);
  EXPECT_TRUE(c.contains(std::vector<int32_t>{1, 1}));
  EXPECT_FALSE(c.contains(std::vector<int32_t>{2, 2}));
  EXPECT_TRUE(c.contains(std::vector<int32_t>{3, 3}));
  // The same tokens again replace the old snapshot rather than adding one.
  c.put(snap({3, 3}, 100));
  EXPECT_EQ(c.count(), 3u);
  EXPECT_EQ(c.bytes(), 3 * each);
  // Larger than the whole budget: not kept, nothing dropped.
  EXPECT_FALSE(c.fits(4 * each));
  EXPECT_FALSE(c.put(snap({5, 5}, 4 * each)));
  EXPECT_EQ(c.count(), 3u);
  // A bigger one that fits drops as many as needed.
  EXPECT_TRUE(c.put(snap({6, 6}, 2 * each - 2 * sizeof(int32_t))));
  EXPECT_EQ(c.count(), 2u);
  EXPECT_LE(c.bytes(), c.budget());
  // A count of one keeps the newest.
  dq::PromptCache one(1 << 20, 1);
  one.put(snap({1}, 8));
  one.put(snap({2}, 8));
  EXPECT_EQ(one.count(), 1u);
  EXPECT_TRUE(one.contains(std::vector<int32_t>{2}));
  // A dropped snapshot's storage is kept for the next save, unless someone else still holds it.
  dq::PromptCache two(1 << 20, 2);
  auto held = snap({1}, 1000);
  two.put(held);
  two.put(snap({2}, 2000));
  two.put(snap({3}, 10));  // drops {1}: held here, so no spare
  EXPECT_TRUE(two.take_spare().empty());
  two.put(snap({4}, 10));  // drops {2}: its 2000 bytes become the spare
  auto spare = two.take_spare();
  EXPECT_GE(spare.capacity(), 2000u);
  EXPECT_TRUE(two.take_spare().empty());  // taken
  dq::PromptCache none(1 << 20, 0);
  EXPECT_FALSE(none.put(snap({1}, 8)));
  EXPECT_EQ(none.count(), 0u);
}

// A state saved after a prefix and restored later (after other work, on another engine of the
// same model, on an engine whose queue issues steps ahead) continues with the same logits bytes
// as a fresh prefill of the whole sequence.
TEST(Engine, ARestoredStateContinuesWithTheSameLogits) {
  for (const std::string& dir : {kDemo, kTinyQ4}) {
    SCOPED_TRACE(dir);
    auto a = open(dir), b = open(dir, true);
    const int V = a->config().vocab_size;
    // Crosses the prefill chunk (64) and the attention layers' rows.
    const auto prefix = ids(70, 1, V), rest = ids(9, 2, V);
    std::vector<float> fresh, restored;
    a->reset();
    const int32_t want = a->feed(cat(prefix, rest), &fresh);

    a->reset();
    a->feed(prefix);
    auto s = a->snapshot();
    EXPECT_EQ(s->tokens, prefix);
    EXPECT_EQ(s->bytes.size(), a->model().state_bytes_at(int(prefix.size())));
    a->reset();
    a->feed(ids(30, 3, V));  // something else in between
    a->restore(*s);
    EXPECT_EQ(a->history(), prefix);
    EXPECT_EQ(a->position(), int(prefix.size()));
    EXPECT_EQ(a->feed(rest, &restored), want);
    EXPECT_TRUE(same_bytes(fresh, restored));

    // On another engine, which issues steps ahead and has one in flight when it restores.
    b->feed(ids(5, 4, V));
    b->step_greedy();
    b->restore(*s);
    restored.clear();
    EXPECT_EQ(b->feed(rest, &restored), want);
    EXPECT_TRUE(same_bytes(fresh, restored));

    // Saved with a step issued ahead: the snapshot holds that token too.
    b->reset();
    const int32_t t0 = b->feed(prefix);
    const int32_t t1 = b->step_greedy();  // fed t0; the step feeding t1 is issued ahead
    auto s2 = b->snapshot();
    EXPECT_EQ(s2->tokens, cat(prefix, {t0, t1}));
    const std::vector<int32_t> x = {int32_t(V / 3)};
    std::vector<float> fresh2, restored2;
    a->reset();
    const int32_t want2 = a->feed(cat(cat(prefix, {t0, t1}), x), &fresh2);
    a->restore(*s2);
    EXPECT_EQ(a->feed(x, &restored2), want2);
    EXPECT_TRUE(same_bytes(fresh2, restored2));
    // And the engine that saved it goes on from there too.
    b->restore(*s2);
    restored2.clear();
    EXPECT_EQ(b->feed(x, &restored2), want2);
    EXPECT_TRUE(same_bytes(fresh2, restored2));
  }
}

// A snapshot of another model, too long for the context or with bad ids is refused with a clear
// error, and the engine's state is left as it was.
TEST(Engine, RestoreRefusesAStateThatDoesNotFit) {
  auto a = open(kDemo, false, 64), t = open(kTinyQ4, false, 64);
  const int V = a->config().vocab_size;
  const auto p = ids(10, 5, V);
  a->feed(p);
  auto s = a->snapshot();
  const auto other = t->snapshot();  // tiny-q4's empty state: a size of another model
  auto expect_error = [&](const dq::StateSnapshot& bad, const std::string& what) {
    try {
      a->restore(bad);
      ADD_FAILURE() << "no error for " << what;
    } catch (const dq::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_EQ(a->history(), p);  // untouched
  };
  dq::StateSnapshot wrong = *s;
  wrong.bytes.pop_back();
  expect_error(wrong, "has " + std::to_string(s->bytes.size() - 1) + " bytes; this model's state there has " +
                          std::to_string(s->bytes.size()));
  dq::StateSnapshot foreign = *other;
  foreign.tokens = {1, 2};
  expect_error(foreign, "saved from another model");
  dq::StateSnapshot bad_id = *s;
  bad_id.tokens[3] = V;
  expect_error(bad_id, "token " + std::to_string(V) + " (position 3) is out of range");
  dq::StateSnapshot too_long;
  too_long.tokens.assign(65, 1);
  expect_error(too_long, "does not fit the context of 64 tokens");
  // Still usable: the next token after the kept state.
  std::vector<float> after, fresh;
  a->feed(std::vector<int32_t>{7}, &after);
  a->reset();
  a->feed(cat(p, {7}), &fresh);
  EXPECT_TRUE(same_bytes(after, fresh));
}

namespace {

struct Demo {
  std::unique_ptr<dq::Engine> engine;
  dq::text::TextConfig text;
};

Demo demo() {
  Demo d;
  d.engine = open(kDemo, false, 512);
  d.text = dq::text::TextConfig::load(kDemo);
  return d;
}

dq::GenerateRequest request(const Demo& d, const std::string& prompt, int max_tokens, bool sampled) {
  dq::GenerateRequest r;
  r.prompt = d.text.tokenizer->encode(prompt);
  r.max_tokens = max_tokens;
  r.stop_at_eos = false;
  r.sampling.temperature = sampled ? 0.8f : 0.0f;
  r.sampling.seed = 11;
  return r;
}

dq::GenerateRequest extended(const dq::GenerateRequest& r, const std::vector<int32_t>& more) {
  dq::GenerateRequest x = r;
  x.prompt.insert(x.prompt.end(), more.begin(), more.end());
  return x;
}

}  // namespace

// Two conversations interleaved, each turn's prompt starting with the last prompt of its
// conversation (as a chat template that drops the reply's reasoning renders it): with a cache,
// each turn continues from its conversation's saved state and feeds only the new tokens; the
// text is the same as from a fresh start, greedy and sampled.
TEST(Generator, InterleavedConversationsContinueFromTheirSavedStates) {
  Demo d = demo();
  Demo ref = demo();
  for (bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "sampled" : "greedy");
    dq::PromptCache cache(size_t(256) << 20);
    dq::Generator g(*d.engine, d.text, &cache), plain(*ref.engine, ref.text);
    const auto more = d.text.tokenizer->encode(" And then the fortune said");
    auto a1 = request(d, "A fool and his money", 12, sampled);
    auto b1 = request(d, "Love is", 12, sampled);
    auto a2 = extended(a1, more), b2 = extended(b1, more);
    auto a3 = extended(a2, more);
    for (const auto* r : {&a1, &b1, &a2, &b2, &a3}) {
      SCOPED_TRACE(d.text.tokenizer->decode(r->prompt));
      auto got = g.generate(*r, {});
      ref.engine->reset();
      auto want = plain.generate(*r, {});
      EXPECT_EQ(want.cached_tokens, 0);
      EXPECT_EQ(got.tokens, want.tokens);
      EXPECT_EQ(got.text, want.text);
      EXPECT_TRUE(got.cache_saved);
      const bool turn = r == &a2 || r == &b2 || r == &a3;
      EXPECT_EQ(got.cache_restored, turn);
      const size_t last = r == &a2 ? a1.prompt.size() : r == &b2 ? b1.prompt.size() : r == &a3 ? a2.prompt.size() : 0;
      EXPECT_EQ(got.cached_tokens, int(last));
    }
    EXPECT_EQ(cache.count(), 5u);
    cache.clear();
  }
}

// The engine's own history wins when it is the longer prefix (the last turn's prompt and
// answer); a prompt equal to a saved one feeds its last token again; without a cache nothing is
// saved and an interleaved turn starts afresh.
TEST(Generator, TheEnginesHistoryIsPreferredWhenLonger) {
  Demo d = demo();
  dq::PromptCache cache(size_t(256) << 20);
  dq::Generator g(*d.engine, d.text, &cache);
  auto a1 = request(d, "A fool and his money", 6, false);
  auto r1 = g.generate(a1, {});
  auto a2 = extended(a1, r1.tokens);  // prompt + answer: the engine holds all but the last answer token
  auto r2 = g.generate(a2, {});
  EXPECT_FALSE(r2.cache_restored);
  EXPECT_EQ(r2.cached_tokens, int(a1.prompt.size() + r1.tokens.size() - 1));
  auto r3 = g.generate(a1, {});  // the same prompt again: the saved state is not a proper prefix
  EXPECT_FALSE(r3.cache_restored);
  EXPECT_EQ(r3.cached_tokens, 0);
  EXPECT_EQ(r3.tokens, r1.tokens);

  dq::Generator nocache(*d.engine, d.text);
  nocache.generate(a1, {});
  nocache.generate(request(d, "Love is", 3, false), {});
  auto r4 = nocache.generate(extended(a1, {5}), {});
  EXPECT_FALSE(r4.cache_saved);
  EXPECT_FALSE(r4.cache_restored);
  EXPECT_EQ(r4.cached_tokens, 0);
}

// A request's save point inside the prompt (a chat's messages end before the generation
// prompt): the prompt is fed in two parts, the state saved between them; the reply is the same
// as fed in one, and a prompt that shares only the part before the save point continues there.
TEST(Generator, SavesTheStateWhereTheRequestSays) {
  Demo d = demo();
  Demo ref = demo();
  dq::PromptCache cache(size_t(256) << 20);
  dq::Generator g(*d.engine, d.text, &cache), plain(*ref.engine, ref.text);
  for (bool sampled : {false, true}) {
    cache.clear();
    auto r1 = request(d, "A fool and his money are soon parted, said the cookie", 10, sampled);
    const int k = int(r1.prompt.size()) - 3;
    r1.save_at = k;
    auto got = g.generate(r1, {});
    ref.engine->reset();
    auto want = plain.generate(r1, {});
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_TRUE(got.cache_saved);
    ASSERT_EQ(cache.count(), 1u);
    EXPECT_TRUE(cache.contains(std::span<const int32_t>(r1.prompt).first(size_t(k))));
    // Shares the first k tokens only.
    dq::GenerateRequest r2 = r1;
    r2.prompt.resize(size_t(k));
    const auto more = d.text.tokenizer->encode(" in the end");
    r2.prompt.insert(r2.prompt.end(), more.begin(), more.end());
    r2.save_at = 1 << 30;  // past the end: the prompt's end
    auto got2 = g.generate(r2, {});
    EXPECT_TRUE(got2.cache_restored);
    EXPECT_EQ(got2.cached_tokens, k);
    EXPECT_TRUE(cache.contains(r2.prompt));
    ref.engine->reset();
    auto want2 = plain.generate(r2, {});
    EXPECT_EQ(got2.tokens, want2.tokens);
    EXPECT_EQ(got2.text, want2.text);
  }
}
