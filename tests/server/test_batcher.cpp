// Batcher (runtime/batcher.h): several sequences decoded together. Each slot's logits are the
// bytes a lone sequence gets from Engine::feed / Engine::step, whatever the batch holds beside it,
// on the demo model (models/demo-fortunes/mlx-4bit: GDN and attention layers) and tiny-q4.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/batcher.h"
#include "runtime/engine.h"

namespace {

const std::string kDemo = std::string(DQ_SOURCE_DIR) + "/models/demo-fortunes/mlx-4bit";
const std::string kTinyQ4 = std::string(DQ_TEST_DATA) + "/tiny-q4";

std::unique_ptr<dq::Engine> open(const std::string& dir, int ctx = 256, bool use_graph = true) {
  dq::EngineOptions o;
  o.threads = 2;
  o.max_ctx = ctx;
  o.use_graph = use_graph;
  return dq::Engine::open(dir, o);
}

std::vector<int32_t> ids(int n, int seed, int vocab) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = int32_t((uint32_t(i) * 2654435761u + uint32_t(seed) * 97u + 17u) % uint32_t(vocab));
  return v;
}

bool same_bytes(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * 4) == 0; }

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const dq::Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A lone sequence on the reference engine: the logits after its prompt and after each of its
// tokens, and their argmaxes.
struct Lone {
  std::vector<std::vector<float>> rows;
  std::vector<int32_t> argmax;
};
Lone lone(dq::Engine& e, const std::vector<int32_t>& prompt, const std::vector<int32_t>& tokens) {
  Lone r;
  e.reset();
  std::vector<float> l;
  r.argmax.push_back(e.feed(prompt, &l));
  r.rows.push_back(l);
  for (int32_t t : tokens) {
    r.argmax.push_back(e.step(t, &l));
    r.rows.push_back(l);
  }
  return r;
}

// use_graph: the batched steps recorded per list of slots and replayed (the default), or issued
// op by op.
void check_batched_equals_lone(const std::string& dir, bool use_graph) {
  SCOPED_TRACE(dir + (use_graph ? " (graphs)" : " (op by op)"));
  auto ref = open(dir);
  auto e = open(dir, 256, use_graph);
  const int V = e->config().vocab_size;
  // Prompts of 5 tokens, 70 (across the CPU's prefill chunk of 64) and 1.
  const std::vector<std::vector<int32_t>> prompts = {ids(5, 1, V), ids(70, 2, V), ids(1, 3, V)};
  std::vector<std::vector<int32_t>> tokens;
  std::vector<Lone> want;
  for (int k = 0; k < 3; ++k) {
    tokens.push_back(ids(6, 10 + k, V));
    want.push_back(lone(*ref, prompts[size_t(k)], tokens.back()));
  }
  dq::Batcher b(*e, 4);
  ASSERT_EQ(b.slots(), 4);
  EXPECT_GT(b.bytes(), 0u);
  // Sequence k in slot 3 - k (slot 0 stays empty).
  std::vector<float> l;
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(b.feed(3 - k, prompts[size_t(k)], &l), want[size_t(k)].argmax[0]);
    EXPECT_TRUE(same_bytes(l.data(), want[size_t(k)].rows[0].data(), size_t(V))) << "prompt " << k;
    EXPECT_EQ(b.position(3 - k), int(prompts[size_t(k)].size()));
  }
  // Batches of every composition and order; each sequence takes its tokens in turn.
  const std::vector<std::vector<int>> schedule = {{0, 1, 2}, {2, 0}, {1}, {1, 2, 0}, {0}, {2, 1}, {0, 1},
                                                  {2, 0, 1}, {0}, {1}, {2}, {1, 0, 2}};
  std::vector<int> at(3, 0);
  for (const auto& seqs : schedule) {
    std::vector<int> which;
    std::vector<int32_t> toks;
    for (int k : seqs) {
      if (at[size_t(k)] >= 6) continue;
      which.push_back(3 - k);
      toks.push_back(tokens[size_t(k)][size_t(at[size_t(k)])]);
    }
    if (which.empty()) continue;
    std::vector<int32_t> next;
    b.step(which, toks, &next, &l);
    ASSERT_EQ(next.size(), which.size());
    ASSERT_EQ(l.size(), which.size() * size_t(V));
    for (size_t i = 0; i < which.size(); ++i) {
      const int k = 3 - which[i];
      const int row = ++at[size_t(k)];
      EXPECT_TRUE(same_bytes(l.data() + i * size_t(V), want[size_t(k)].rows[size_t(row)].data(), size_t(V)))
          << "sequence " << k << " token " << row << " in a batch of " << which.size();
      EXPECT_EQ(next[i], want[size_t(k)].argmax[size_t(row)]);
    }
  }
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(at[size_t(k)], 6);
    std::vector<int32_t> h = prompts[size_t(k)];
    h.insert(h.end(), tokens[size_t(k)].begin(), tokens[size_t(k)].end());
    EXPECT_EQ(b.history(3 - k), h);
  }
  EXPECT_TRUE(b.history(0).empty());
  // The argmaxes alone (no rows read back) are the same.
  std::vector<int32_t> next;
  b.step(std::vector<int>{3}, std::vector<int32_t>{want[0].argmax[6]}, &next);
  ref->reset();
  std::vector<int32_t> all = prompts[0];
  all.insert(all.end(), tokens[0].begin(), tokens[0].end());
  ref->feed(all);
  EXPECT_EQ(next[0], ref->step(want[0].argmax[6]));
}

}  // namespace

TEST(Batcher, EachSlotsLogitsAreTheBytesOfALoneSequence) {
  check_batched_equals_lone(kDemo, true);
  check_batched_equals_lone(kDemo, false);
  check_batched_equals_lone(kTinyQ4, true);
}

TEST(Batcher, PrefixReuseAndSavedStatesPerSlot) {
  auto e = open(kDemo);
  auto ref = open(kDemo);
  const int V = e->config().vocab_size;
  const auto p = ids(12, 5, V), more = ids(4, 6, V);
  std::vector<int32_t> whole = p;
  whole.insert(whole.end(), more.begin(), more.end());
  std::vector<float> want, got;
  ref->feed(whole, &want);

  dq::Batcher b(*e, 2);
  b.feed(0, p);
  // A prompt that extends slot 0's history feeds only the rest.
  ASSERT_EQ(b.reuse_prefix(0, whole), 12);
  b.feed(0, std::span(whole).subspan(12), &got);
  EXPECT_TRUE(same_bytes(got.data(), want.data(), size_t(V)));
  // One that does not starts afresh.
  EXPECT_EQ(b.reuse_prefix(0, more), 0);
  EXPECT_EQ(b.position(0), 0);
  // A slot's state saved and restored into the other slot and into an engine continues alike.
  b.feed(0, p);
  auto snap = b.snapshot(0);
  EXPECT_EQ(snap->tokens, p);
  b.restore(1, *snap);
  EXPECT_EQ(b.history(1), p);
  b.feed(1, more, &got);
  EXPECT_TRUE(same_bytes(got.data(), want.data(), size_t(V)));
  ref->restore(*snap);
  ref->feed(more, &got);
  EXPECT_TRUE(same_bytes(got.data(), want.data(), size_t(V)));
  // And an engine's state into a slot.
  ref->reset();
  ref->feed(p);
  b.restore(0, *ref->snapshot());
  b.feed(0, more, &got);
  EXPECT_TRUE(same_bytes(got.data(), want.data(), size_t(V)));
}

TEST(Batcher, BadCallsAreClearErrorsAndLeaveTheSlotsUsable) {
  auto e = open(kDemo, 16);
  const int V = e->config().vocab_size;
  EXPECT_NE(error_of([&] { dq::Batcher(*e, 0); }).find("at least 1, got 0"), std::string::npos);
  dq::Batcher b(*e, 2);
  std::vector<int32_t> next;
  EXPECT_NE(error_of([&] { b.feed(2, ids(3, 1, V)); }).find("slot 2 does not exist (there are 2)"), std::string::npos);
  EXPECT_NE(error_of([&] { b.feed(-1, ids(3, 1, V)); }).find("slot -1 does not exist"), std::string::npos);
  EXPECT_NE(error_of([&] { b.feed(0, {}); }).find("no tokens"), std::string::npos);
  EXPECT_NE(error_of([&] { b.feed(0, std::vector<int32_t>{V}); }).find("out of range"), std::string::npos);
  EXPECT_NE(error_of([&] { b.feed(0, ids(17, 1, V)); }).find("exceed the context of 16"), std::string::npos);
  b.feed(0, ids(3, 1, V));
  b.feed(1, ids(15, 2, V));
  EXPECT_NE(error_of([&] { b.step(std::vector<int>{0, 0}, std::vector<int32_t>{1, 2}, &next); }).find("twice"),
            std::string::npos);
  EXPECT_NE(error_of([&] { b.step(std::vector<int>{0, 1}, std::vector<int32_t>{1}, &next); }).find("2 slots with 1 tokens"),
            std::string::npos);
  EXPECT_NE(error_of([&] { b.step(std::vector<int>{}, std::vector<int32_t>{}, &next); }).find("0 slots"),
            std::string::npos);
  EXPECT_NE(error_of([&] { b.step(std::vector<int>{0}, std::vector<int32_t>{-3}, &next); }).find("out of range"),
            std::string::npos);
  // Slot 1 is one token from the context's end: its second step is refused before anything runs.
  b.step(std::vector<int>{0, 1}, std::vector<int32_t>{4, 5}, &next);
  EXPECT_NE(error_of([&] { b.step(std::vector<int>{0, 1}, std::vector<int32_t>{4, 5}, &next); })
                .find("16 tokens + 1 new exceed the context of 16"),
            std::string::npos);
  EXPECT_EQ(b.position(0), 4);
  EXPECT_EQ(b.position(1), 16);
  // A saved state that does not fit this model is refused (the sizes named); the slot stays as it was.
  dq::StateSnapshot bad;
  bad.tokens = ids(3, 1, V);
  bad.bytes.resize(7);
  EXPECT_NE(error_of([&] { b.restore(0, bad); }).find("has 7 bytes"), std::string::npos);
  EXPECT_EQ(b.position(0), 4);
  b.step(std::vector<int>{0}, std::vector<int32_t>{6}, &next);
  EXPECT_EQ(b.position(0), 5);
}

// More lists of slots than the Batcher keeps graphs for (the least recently used are dropped and
// recorded again when they come back): the same bytes as issuing every step op by op.
TEST(Batcher, RecordedStepsPastTheGraphLimitEqualOpByOp) {
  auto g = open(kDemo, 256, true), o = open(kDemo, 256, false);
  const int V = g->config().vocab_size, S = 8;
  dq::Batcher bg(*g, S), bo(*o, S);
  std::vector<float> lg, lo;
  for (int s = 0; s < S; ++s) {
    bg.feed(s, ids(3 + s, 20 + s, V));
    bo.feed(s, ids(3 + s, 20 + s, V));
  }
  const int steps = int(dq::Batcher::kMaxGraphs) + 40;
  for (int i = 0; i < steps; ++i) {
    // 70 different subsets of the 8 slots (ascending), then the first 34 again (evicted, recorded anew)
    const int mask = 1 + ((i % 70) * 37) % 255;
    std::vector<int> which;
    std::vector<int32_t> toks;
    for (int s = 0; s < S; ++s)
      if (mask >> s & 1) which.push_back(s), toks.push_back(int32_t((i * 131 + s * 7) % V));
    std::vector<int32_t> ng, no;
    bg.step(which, toks, &ng, &lg);
    bo.step(which, toks, &no, &lo);
    ASSERT_EQ(ng, no) << "step " << i;
    ASSERT_TRUE(same_bytes(lg.data(), lo.data(), lg.size())) << "step " << i;
  }
}

// Slots that would not fit the host's memory at their full context are refused up front, with
// the numbers (on the CPU a state's pages fill as its context does: later would be the OOM killer).
TEST(Batcher, SlotsBeyondTheMemoryAreAClearError) {
  EXPECT_EQ(dq::slots_unfit_reason(4, 4096, 120'000'000, 8'000'000'000), "");
  EXPECT_EQ(dq::slots_unfit_reason(256, 4096, 120'000'000, 0), "");  // unknown: no check
  const std::string e = dq::slots_unfit_reason(256, 4096, 120'000'000, 8'000'000'000);
  EXPECT_NE(e.find("256 parallel sequences at a context of 4096 tokens need 30.72 GB"), std::string::npos) << e;
  EXPECT_NE(e.find("120.0 MB each"), std::string::npos) << e;
  EXPECT_NE(e.find("8.00 GB of memory is available (lower --parallel or --ctx)"), std::string::npos) << e;
}

// Samples drawn on the backend per row (temperature alone; top_k with top_p) are the ids a lone
// sequence's Engine::step_draw takes with the same uniforms; rows without a draw give -1, and
// read_row gives the row's logits bytes.
TEST(Batcher, DrawsPerRowEqualALoneSequencesDraws) {
  auto e = open(kDemo), ref = open(kDemo);
  const int V = e->config().vocab_size;
  dq::Batcher b(*e, 3);
  const std::vector<std::vector<int32_t>> prompts = {ids(4, 30, V), ids(9, 31, V), ids(2, 32, V)};
  for (int s = 0; s < 3; ++s) b.feed(s, prompts[size_t(s)]);
  std::vector<dq::Batcher::Draw> draws(3);
  draws[0] = {true, dq::DrawParams{0.8f, 0.0f}, 0.37};
  draws[1] = {false, {}, 0};
  draws[2] = {true, dq::DrawParams{0.7f, 0.05f, 5, 0.9f}, 0.81};
  std::vector<int32_t> next, drawn, toks = {11, 12, 13};
  for (int round = 0; round < 4; ++round) {
    for (auto& d : draws) d.u = std::fmod(d.u + 0.29, 1.0);
    b.step(std::vector<int>{0, 1, 2}, toks, &next, draws, &drawn);
    ASSERT_EQ(drawn.size(), 3u);
    EXPECT_EQ(drawn[1], -1);
    for (int s : {0, 2}) {
      ref->reset();
      std::vector<int32_t> h = b.history(s);
      h.pop_back();
      ref->feed(h);
      EXPECT_EQ(drawn[size_t(s)], ref->step_draw(toks[size_t(s)], draws[size_t(s)].params, draws[size_t(s)].u))
          << "slot " << s << " round " << round;
      EXPECT_GE(drawn[size_t(s)], 0);
    }
    std::vector<float> row, want;
    b.read_row(1, &row);
    ref->reset();
    std::vector<int32_t> h = b.history(1);
    h.pop_back();
    ref->feed(h);
    ref->step(toks[1], &want);
    EXPECT_TRUE(same_bytes(row.data(), want.data(), size_t(V))) << "round " << round;
    for (int s = 0; s < 3; ++s) toks[size_t(s)] = drawn[size_t(s)] >= 0 ? drawn[size_t(s)] : next[size_t(s)];
  }
  EXPECT_NE(error_of([&] { b.read_row(3, nullptr); }).find("row 3 of a step of 3 rows"), std::string::npos);
  draws[2].params.top_k = 300;
  EXPECT_NE(error_of([&] { b.step(std::vector<int>{0, 1, 2}, toks, &next, draws, &drawn); }).find("top_k"),
            std::string::npos);
  EXPECT_NE(error_of([&] { b.step(std::vector<int>{0, 1}, std::vector<int32_t>{1, 2}, &next, draws, &drawn); })
                .find("3 draws"),
            std::string::npos);
}
