// A bounded load test over loopback: many concurrent streaming clients against one server.
// Every request must complete (or, past the queue limit, fail with a proper 429); none is lost,
// streams do not mix, and the server stays up. Prints requests/s and latency percentiles.
//
//   DQ_LOAD_CLIENTS (32), DQ_LOAD_REQUESTS (200), DQ_LOAD_TOKENS (32) change the sizes,
//   DQ_LOAD_PARALLEL the server's --parallel (default: serve's).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "server_test_util.h"

using namespace dq::server;
using namespace dq::server::testing;

namespace {

int env_int(const char* name, int def) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : def;
}

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = size_t(std::min<double>(double(v.size() - 1), std::ceil(p / 100.0 * double(v.size())) - 1));
  return v[i];
}

struct Outcome {
  int status = 0;
  bool complete = false;  // 200 with a finish_reason (and [DONE] when streamed)
  bool proper_error = false;
  std::string text;
  double seconds = 0, ttft = -1;
  int tokens = 0;
};

Json request_body(int i, int tokens, bool stream) {
  const bool chat = i % 2 == 0;
  Json b = chat ? Json{{"messages", Json::array({{{"role", "user"}, {"content", "Tell me fortune number " + std::to_string(i)}}})}}
                : Json{{"prompt", "Fortune " + std::to_string(i) + ":"}};
  b["max_tokens"] = tokens;
  b["seed"] = 1000 + i;
  b["temperature"] = 0.8;
  b["ignore_eos"] = true;
  b["stream"] = stream;
  if (stream) b["stream_options"] = {{"include_usage", true}};
  return b;
}

Outcome run_one(int port, int i, int tokens) {
  using clk = std::chrono::steady_clock;
  const bool chat = i % 2 == 0, stream = i % 5 != 4;  // one in five is not streamed
  const char* path = chat ? "/v1/chat/completions" : "/v1/completions";
  Outcome o;
  auto t0 = clk::now();
  if (stream) {
    SseResult s = sse_post(port, path, request_body(i, tokens, true), [&](const Json& e) {
      if (o.ttft < 0 && e.contains("choices") && !e["choices"].empty()) {
        const Json& c = e["choices"][0];
        if ((c.contains("delta") && c["delta"].contains("content") && !c["delta"]["content"].get<std::string>().empty()) ||
            (c.contains("text") && !c["text"].get<std::string>().empty()))
          o.ttft = std::chrono::duration<double>(clk::now() - t0).count();
      }
      return true;
    });
    o.status = s.status;
    o.text = stream_text(s);
    bool finished = false;
    for (const auto& e : s.events) {
      if (e.contains("choices") && !e["choices"].empty() && e["choices"][0]["finish_reason"].is_string()) finished = true;
      if (e.contains("usage") && e["usage"].is_object()) o.tokens = e["usage"]["completion_tokens"];
    }
    o.complete = s.status == 200 && s.done && finished && s.error.empty();
    o.proper_error = s.status == 429 && !s.events.empty() && s.events[0].contains("error");
  } else {
    HttpResult r = http(port, "POST", path, request_body(i, tokens, false).dump());
    o.status = r.status;
    Json j = r.json();
    if (r.status == 200 && j.is_object()) {
      const Json& c = j["choices"][0];
      o.text = chat ? c["message"]["content"].get<std::string>() : c["text"].get<std::string>();
      o.complete = c["finish_reason"].is_string();
      o.tokens = j["usage"]["completion_tokens"];
    }
    o.proper_error = r.status == 429 && j.is_object() && j.contains("error");
  }
  o.seconds = std::chrono::duration<double>(clk::now() - t0).count();
  return o;
}

std::vector<Outcome> run_load(int port, int clients, int requests, int tokens, double* wall) {
  std::vector<Outcome> out(static_cast<size_t>(requests));
  std::atomic<int> next{0};
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (int c = 0; c < clients; ++c)
    ts.emplace_back([&] {
      for (int i; (i = next++) < requests;) out[size_t(i)] = run_one(port, i, tokens);
    });
  for (auto& t : ts) t.join();
  *wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace

TEST(ServerLoad, ConcurrentStreamingClients) {
  const int clients = env_int("DQ_LOAD_CLIENTS", 32), requests = env_int("DQ_LOAD_REQUESTS", 200),
            tokens = env_int("DQ_LOAD_TOKENS", 32);
  ServerOptions o = default_options(make_model_dir(qwen3_template()));
  o.engine.threads = 0;  // all cores, as deltaq serve runs by default
  o.max_queue = size_t(clients) + 8;
  o.parallel = env_int("DQ_LOAD_PARALLEL", o.parallel);
  TestServer srv(o);
  const int port = srv.port();

  double wall = 0;
  std::vector<Outcome> out = run_load(port, clients, requests, tokens, &wall);
  std::vector<double> lat, ttft;
  int ok = 0, tok = 0;
  std::map<int, int> statuses;
  for (size_t i = 0; i < out.size(); ++i) {
    ++statuses[out[i].status];
    EXPECT_TRUE(out[i].complete) << "request " << i << " status " << out[i].status;
    if (!out[i].complete) continue;
    ++ok;
    tok += out[i].tokens;
    EXPECT_EQ(out[i].tokens, tokens) << "request " << i;
    lat.push_back(out[i].seconds);
    if (out[i].ttft >= 0) ttft.push_back(out[i].ttft);
  }
  EXPECT_EQ(ok, requests);
  std::printf("LOAD parallel=%d clients=%d requests=%d max_tokens=%d ok=%d wall_s=%.2f req_s=%.2f gen_tok_s=%.1f "
              "latency_ms p50=%.0f p99=%.0f max=%.0f ttft_ms p50=%.0f p99=%.0f\n",
              o.parallel, clients, requests, tokens, ok, wall, requests / wall, tok / wall, 1e3 * pct(lat, 50), 1e3 * pct(lat, 99),
              1e3 * pct(lat, 100), 1e3 * pct(ttft, 50), 1e3 * pct(ttft, 99));
  std::fflush(stdout);

  // The streams did not mix: the same seed alone gives the same text.
  for (int i : {0, 1, 4, 7, requests - 1}) {
    Outcome again = run_one(port, i, tokens);
    EXPECT_EQ(again.text, out[size_t(i)].text) << "request " << i;
  }
  EXPECT_TRUE(healthy(port));
  EXPECT_EQ(metric(port, "deltaq_queue_depth"), 0);
  EXPECT_EQ(metric(port, "deltaq_jobs_total{outcome=\"completed\"}"), requests + 5);
}

TEST(ServerLoad, OverCapacityGetsProper429sAndNothingIsLost) {
  const int clients = 32, requests = 100;
  ServerOptions o = default_options(make_model_dir(qwen3_template()));
  o.max_queue = 4;
  TestServer srv(o);
  double wall = 0;
  std::vector<Outcome> out = run_load(srv.port(), clients, requests, 16, &wall);
  int ok = 0, busy = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_TRUE(out[i].complete || out[i].proper_error) << "request " << i << " status " << out[i].status;
    ok += out[i].complete;
    busy += out[i].proper_error;
  }
  std::printf("OVERLOAD clients=%d requests=%d max_queue=4 completed=%d refused_429=%d wall_s=%.2f\n", clients, requests,
              ok, busy, wall);
  EXPECT_EQ(ok + busy, requests);
  EXPECT_GT(ok, 0);
  EXPECT_GT(busy, 0);
  EXPECT_TRUE(healthy(srv.port()));
  EXPECT_EQ(metric(srv.port(), "deltaq_jobs_total{outcome=\"completed\"}"), ok);
}

// --parallel: requests decoded together in one batched step per token.

namespace {

// One request's reply as text and token count, streamed or not.
struct Reply {
  int status = 0;
  std::string text, finish;
  int tokens = 0;
};

Reply ask(int port, const Json& body) {
  const bool chat = body.contains("messages");
  const char* path = chat ? "/v1/chat/completions" : "/v1/completions";
  Reply r;
  if (body.value("stream", false)) {
    SseResult s = sse_post(port, path, body);
    r.status = s.status;
    r.text = stream_text(s);
    for (const auto& e : s.events) {
      if (e.contains("choices") && !e["choices"].empty() && e["choices"][0]["finish_reason"].is_string())
        r.finish = e["choices"][0]["finish_reason"];
      if (e.contains("usage") && e["usage"].is_object()) r.tokens = e["usage"]["completion_tokens"];
    }
    if (!s.done) r.status = -1;
    return r;
  }
  HttpResult h = http(port, "POST", path, body.dump());
  r.status = h.status;
  Json j = h.json();
  if (h.status == 200 && j.is_object()) {
    const Json& c = j["choices"][0];
    r.text = chat ? c["message"]["content"].get<std::string>() : c["text"].get<std::string>();
    r.finish = c["finish_reason"];
    r.tokens = j["usage"]["completion_tokens"];
  }
  return r;
}

// A mix: greedy and sampled (seeded; top_p, top_k), chat and completions, streamed or not, a stop
// string, prompts of different lengths (one longer than a prefill chunk), max_tokens 1 to 40.
std::vector<Json> mixed_requests() {
  std::vector<Json> out;
  for (int i = 0; i < 12; ++i) {
    Json b;
    if (i % 3 == 0)
      b["messages"] = Json::array({{{"role", "user"}, {"content", "Tell me fortune number " + std::to_string(i)}}});
    else
      b["prompt"] = i == 4 ? std::string(300, 'a') + " fortune" : "Fortune " + std::to_string(i) + ":";
    b["max_tokens"] = i == 5 ? 1 : 8 + 3 * i;
    if (i % 2 == 1) {
      b["temperature"] = 0.9;
      b["seed"] = 7 + i;
      if (i % 4 == 1) b["top_p"] = 0.8;
      if (i == 7) b["top_k"] = 5;
    } else {
      b["temperature"] = 0;
    }
    if (i == 6) b["stop"] = "e";
    if (i == 11) b["ignore_eos"] = true;
    b["stream"] = i % 4 != 2;
    if (b["stream"]) b["stream_options"] = {{"include_usage", true}};
    out.push_back(b);
  }
  return out;
}

}  // namespace

TEST(ServerParallel, SameRepliesAsOneAtATime) {
  const std::string dir = make_model_dir(qwen3_template());
  const std::vector<Json> reqs = mixed_requests();
  std::vector<Reply> alone;
  {
    ServerOptions o = default_options(dir);
    o.parallel = 1;
    o.prompt_cache_bytes = 0;
    TestServer srv(o);
    for (const Json& b : reqs) alone.push_back(ask(srv.port(), b));
  }
  for (int parallel : {3, 8}) {
    ServerOptions o = default_options(dir);
    o.parallel = parallel;
    TestServer srv(o);
    std::vector<Reply> together(reqs.size());
    std::vector<std::thread> ts;
    for (size_t i = 0; i < reqs.size(); ++i) ts.emplace_back([&, i] { together[i] = ask(srv.port(), reqs[i]); });
    for (auto& t : ts) t.join();
    for (size_t i = 0; i < reqs.size(); ++i) {
      SCOPED_TRACE("parallel " + std::to_string(parallel) + ", request " + std::to_string(i) + ": " + reqs[i].dump());
      ASSERT_EQ(alone[i].status, 200);
      EXPECT_EQ(together[i].status, 200);
      EXPECT_EQ(together[i].text, alone[i].text);
      EXPECT_EQ(together[i].finish, alone[i].finish);
      EXPECT_EQ(together[i].tokens, alone[i].tokens);
    }
    // The same requests again: prefixes in the slots and the prompt cache, the same replies.
    for (size_t i : {size_t(0), size_t(4), size_t(9)}) EXPECT_EQ(ask(srv.port(), reqs[i]).text, alone[i].text);
    EXPECT_EQ(metric(srv.port(), "deltaq_jobs_total{outcome=\"completed\"}"), double(reqs.size() + 3));
    EXPECT_EQ(metric(srv.port(), "deltaq_requests_running"), 0);
  }
  // The mix is not trivial: lengths differ, the stop string and max_tokens 1 took effect.
  EXPECT_EQ(alone[5].tokens, 1);
  EXPECT_EQ(alone[6].finish, "stop");
  EXPECT_EQ(alone[11].finish, "length");
  EXPECT_EQ(alone[11].tokens, 41);
}

TEST(ServerParallel, AShortRequestFinishesWhileALongOneStreams) {
  ServerOptions o = default_options(make_model_dir(qwen3_template()));
  o.parallel = 2;
  TestServer srv(o);
  const int port = srv.port();
  std::atomic<bool> long_started{false}, long_finished{false};
  std::atomic<int> running_seen{0};
  Json long_body{{"prompt", "Fortune:"}, {"max_tokens", 1000}, {"ignore_eos", true}, {"temperature", 0}, {"stream", true}};
  Reply long_reply;
  std::thread t([&] {
    SseResult s = sse_post(port, "/v1/completions", long_body, [&](const Json& e) {
      long_started = true;
      if (e.contains("choices") && !e["choices"].empty() && e["choices"][0]["finish_reason"].is_string())
        long_finished = true;
      return true;
    });
    long_reply.status = s.status;
    for (const auto& e : s.events)
      if (e.contains("choices") && !e["choices"].empty() && e["choices"][0]["finish_reason"].is_string())
        long_reply.finish = e["choices"][0]["finish_reason"];
  });
  while (!long_started) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  Reply short_reply = ask(port, Json{{"prompt", "Fortune 2:"}, {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true}});
  running_seen = int(metric(port, "deltaq_requests_running"));
  const bool long_still_running = !long_finished;  // after the metric: it saw the long one running
  t.join();
  EXPECT_EQ(short_reply.status, 200);
  EXPECT_EQ(short_reply.tokens, 4);
  EXPECT_TRUE(long_still_running) << "the short request waited for the long one";
  EXPECT_EQ(running_seen, long_still_running ? 1 : 0);
  EXPECT_EQ(long_reply.status, 200);
  EXPECT_EQ(long_reply.finish, "length");
}

TEST(ServerParallel, ACancelledStreamFreesItsSlot) {
  ServerOptions o = default_options(make_model_dir(qwen3_template()));
  o.parallel = 2;
  TestServer srv(o);
  const int port = srv.port();
  Json body{{"prompt", "Fortune:"}, {"max_tokens", 2000}, {"ignore_eos", true}, {"stream", true}};
  for (int i = 0; i < 3; ++i) {  // more cancellations than slots: each must give its slot back
    int events = 0;
    SseResult s = sse_post(port, "/v1/completions", body, [&](const Json&) { return ++events < 3; });
    EXPECT_EQ(s.status, 200);
    EXPECT_FALSE(s.done);
  }
  Reply r = ask(port, Json{{"prompt", "Fortune 3:"}, {"max_tokens", 5}, {"ignore_eos", true}});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.tokens, 5);
  for (int i = 0; i < 200 && metric(port, "deltaq_jobs_total{outcome=\"cancelled\"}") < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(metric(port, "deltaq_jobs_total{outcome=\"cancelled\"}"), 3);
  EXPECT_EQ(metric(port, "deltaq_requests_running"), 0);
}
