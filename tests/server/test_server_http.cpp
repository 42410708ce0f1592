// The server over loopback with raw HTTP: every error path answers an OpenAI-style error with the
// right status and the server stays up; streaming equals non-streaming; a client that disconnects
// cancels its generation; loading, queue-full and timeouts.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "server_test_util.h"

using namespace dq::server;
using namespace dq::server::testing;

namespace {

// One server for most tests: the demo model with the Qwen3 chat template.
TestServer& shared() {
  static std::unique_ptr<TestServer> s = [] {
    ServerOptions o = default_options(make_model_dir(qwen3_template()));
    o.max_body_bytes = 64 * 1024;
    o.engine.max_ctx = 512;
    o.max_tokens = 400;
    return std::make_unique<TestServer>(o);
  }();
  return *s;
}

Json chat_body(const std::string& user, int max_tokens, std::optional<uint64_t> seed = 1) {
  Json b = {{"model", "any"}, {"messages", Json::array({{{"role", "user"}, {"content", user}}})}, {"max_tokens", max_tokens}};
  if (seed) b["seed"] = *seed;
  return b;
}

void expect_error(const HttpResult& r, int status, const std::string& what) {
  EXPECT_EQ(r.status, status) << what << ": " << r.body;
  Json j = r.json();
  ASSERT_TRUE(j.is_object()) << what << ": body is not JSON: " << r.body;
  ASSERT_TRUE(j.contains("error")) << what << ": " << r.body;
  for (const char* k : {"message", "type", "param", "code"}) EXPECT_TRUE(j["error"].contains(k)) << what << " lacks " << k;
  EXPECT_TRUE(j["error"]["message"].is_string());
}

// A latch the engine thread waits on (the before_job / before_load hooks).
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  std::atomic<int> waiting{0};
  void wait() {
    ++waiting;
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return open; });
    --waiting;
  }
  void release() {
    {
      std::lock_guard<std::mutex> lk(mu);
      open = true;
    }
    cv.notify_all();
  }
};

}  // namespace

TEST(ServerHttp, ChatAndCompletionsAnswer) {
  const int port = shared().port();
  HttpResult r = http(port, "POST", "/v1/chat/completions", chat_body("Tell me a fortune", 16).dump());
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = r.json();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_TRUE(j["choices"][0]["message"]["content"].is_string());
  EXPECT_EQ(j["usage"]["completion_tokens"].get<int>() + j["usage"]["prompt_tokens"].get<int>(),
            j["usage"]["total_tokens"].get<int>());
  EXPECT_TRUE(j["timings"]["predicted_per_second"].is_number());

  Json c = {{"prompt", "The best way to predict the future is"}, {"max_tokens", 20}, {"temperature", 0}};
  HttpResult rc = http(port, "POST", "/v1/completions", c.dump());
  ASSERT_EQ(rc.status, 200) << rc.body;
  // The reference greedy continuation (models/demo-fortunes/README.md).
  EXPECT_EQ(rc.json()["choices"][0]["text"].get<std::string>().substr(0, 28), " to\nsure the way to the same");
  // token ids work as a prompt too
  HttpResult tk = http(port, "POST", "/tokenize", Json{{"prompt", "The best way to predict the future is"}}.dump());
  ASSERT_EQ(tk.status, 200);
  c["prompt"] = tk.json()["tokens"];
  HttpResult ri = http(port, "POST", "/v1/completions", c.dump());
  EXPECT_EQ(ri.json()["choices"][0]["text"], rc.json()["choices"][0]["text"]);
  HttpResult dt = http(port, "POST", "/detokenize", Json{{"tokens", tk.json()["tokens"]}}.dump());
  EXPECT_EQ(dt.json()["prompt"], "The best way to predict the future is");
}

TEST(ServerHttp, StreamEqualsNonStreamForASeed) {
  const int port = shared().port();
  for (bool chat : {true, false}) {
    Json body = chat ? chat_body("Tell me a fortune", 40, 77)
                     : Json{{"prompt", "Love is"}, {"max_tokens", 40}, {"seed", 77}, {"top_p", 0.9}};
    body["stop"] = Json::array({"zzz", "\n\n"});
    const char* path = chat ? "/v1/chat/completions" : "/v1/completions";
    HttpResult plain = http(port, "POST", path, body.dump());
    ASSERT_EQ(plain.status, 200);
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    SseResult s = sse_post(port, path, body);
    ASSERT_EQ(s.status, 200);
    ASSERT_TRUE(s.done);
    Json pj = plain.json();
    const std::string want = chat ? pj["choices"][0]["message"]["content"].get<std::string>()
                                  : pj["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(stream_text(s), want);
    // The last two events: finish_reason, then usage with no choices.
    ASSERT_GE(s.events.size(), 3u);
    const Json& fin = s.events[s.events.size() - 2];
    EXPECT_EQ(fin["choices"][0]["finish_reason"], pj["choices"][0]["finish_reason"]);
    EXPECT_TRUE(fin.contains("timings"));
    Json usage = s.events.back();
    EXPECT_TRUE(usage["choices"].empty());
    // The same counts; cached_tokens may differ (the second request finds the first's saved state).
    usage["usage"].erase("prompt_tokens_details");
    pj["usage"].erase("prompt_tokens_details");
    EXPECT_EQ(usage["usage"], pj["usage"]);
    for (size_t i = 0; i + 1 < s.events.size(); ++i) EXPECT_TRUE(s.events[i]["usage"].is_null());
    if (chat) {
      EXPECT_EQ(s.events[0]["choices"][0]["delta"]["role"], "assistant");
    }
  }
}

TEST(ServerHttp, StopStringsAreNotEmitted) {
  const int port = shared().port();
  Json c = {{"prompt", "The best way to predict the future is"}, {"max_tokens", 30}, {"temperature", 0}};
  std::string full = http(port, "POST", "/v1/completions", c.dump()).json()["choices"][0]["text"];
  ASSERT_NE(full.find("the way"), std::string::npos);
  c["stop"] = "the way";
  HttpResult r = http(port, "POST", "/v1/completions", c.dump());
  EXPECT_EQ(r.json()["choices"][0]["text"], full.substr(0, full.find("the way")));
  EXPECT_EQ(r.json()["choices"][0]["finish_reason"], "stop");
  c["stream"] = true;
  SseResult s = sse_post(port, "/v1/completions", c);
  EXPECT_EQ(stream_text(s), full.substr(0, full.find("the way")));
}

TEST(ServerHttp, ReasoningContentFromAThinkingTemplate) {
  // The Qwen3.5-style template opens <think> in the generation prompt: the demo model's output is all
  // reasoning (it never closes the block), streamed as delta.reasoning_content.
  ServerOptions o = default_options(make_model_dir(qwen35_template()));
  TestServer srv(o);
  Json b = chat_body("Tell me a fortune", 24, 5);
  HttpResult plain = http(srv.port(), "POST", "/v1/chat/completions", b.dump());
  ASSERT_EQ(plain.status, 200) << plain.body;
  Json msg = plain.json()["choices"][0]["message"];
  ASSERT_TRUE(msg.contains("reasoning_content")) << msg.dump();
  EXPECT_FALSE(msg["reasoning_content"].get<std::string>().empty());
  b["stream"] = true;
  SseResult s = sse_post(srv.port(), "/v1/chat/completions", b);
  EXPECT_EQ(stream_text(s, "reasoning_content"), msg["reasoning_content"]);
  EXPECT_EQ(stream_text(s, "content"), msg["content"]);
  // enable_thinking=false closes the block in the prompt: everything is content.
  b["stream"] = false;
  b["chat_template_kwargs"] = {{"enable_thinking", false}};
  Json m2 = http(srv.port(), "POST", "/v1/chat/completions", b.dump()).json()["choices"][0]["message"];
  EXPECT_FALSE(m2.contains("reasoning_content"));
  EXPECT_FALSE(m2["content"].get<std::string>().empty());
}

TEST(ServerHttp, ErrorPathsAnswerAndTheServerStaysUp) {
  const int port = shared().port();
  const std::string good = chat_body("hi", 4).dump();
  struct Case {
    std::string what, method, path, body;
    int status;
  };
  std::string bad_utf8 = R"({"messages":[{"role":"user","content":"\xff\xfe"}]})";
  bad_utf8 = std::string("{\"messages\":[{\"role\":\"user\",\"content\":\"") + "\xc3\x28" + "\"}]}";
  const std::vector<Case> cases = {
      {"bad JSON", "POST", "/v1/chat/completions", "{\"messages\": [", 400},
      {"not an object", "POST", "/v1/chat/completions", "[1,2,3]", 400},
      {"empty body", "POST", "/v1/chat/completions", "", 400},
      {"wrong type", "POST", "/v1/chat/completions", chat_body("hi", 4).dump().replace(1, 0, "\"temperature\":\"hot\","), 400},
      {"wrong type (messages)", "POST", "/v1/chat/completions", R"({"messages":"hello"})", 400},
      {"invalid UTF-8", "POST", "/v1/chat/completions", bad_utf8, 400},
      {"max_tokens over the limit", "POST", "/v1/chat/completions", chat_body("hi", 100000).dump(), 400},
      {"max_tokens over the context", "POST", "/v1/completions",
       Json{{"prompt", "hello"}, {"max_tokens", 400}, {"temperature", 0}}.dump().replace(1, 0, "\"x\":1,"), 200},
      {"prompt + max_tokens over the context", "POST", "/v1/completions",
       Json{{"prompt", Json(std::vector<int>(300, 300))}, {"max_tokens", 300}}.dump(), 400},
      {"prompt over the context", "POST", "/v1/completions", Json{{"prompt", Json(std::vector<int>(600, 300))}}.dump(), 400},
      {"token id outside the vocabulary", "POST", "/v1/completions", R"({"prompt":[1,2,99999]})", 400},
      {"absurd temperature", "POST", "/v1/chat/completions", chat_body("hi", 4).dump().replace(1, 0, "\"temperature\":1e308,"), 400},
      {"absurd seed", "POST", "/v1/chat/completions", chat_body("hi", 4).dump().replace(1, 0, "\"seed\":1e999,"), 400},
      {"n = 5", "POST", "/v1/chat/completions", chat_body("hi", 4).dump().replace(1, 0, "\"n\":5,"), 400},
      {"deep nesting", "POST", "/v1/chat/completions", std::string(20000, '[') + std::string(20000, ']'), 400},
      {"unknown field is ignored", "POST", "/v1/chat/completions", chat_body("hi", 4).dump().replace(1, 0, "\"frobnicate\":[1,{}],"), 200},
      {"unknown endpoint", "GET", "/v2/nothing", "", 404},
      {"unknown endpoint (POST)", "POST", "/v1/embeddings", "{}", 404},
      {"wrong method (GET on chat)", "GET", "/v1/chat/completions", "", 405},
      {"wrong method (DELETE on models)", "DELETE", "/v1/models", "", 405},
      {"wrong method (POST on health)", "POST", "/health", "{}", 405},
      {"unknown model id", "GET", "/v1/models/gpt-4", "", 404},
      {"tokenize without text", "POST", "/tokenize", "{\"prompt\":5}", 400},
      {"detokenize bad ids", "POST", "/detokenize", "{\"tokens\":[1,-1]}", 400},
      {"body over the limit", "POST", "/v1/chat/completions", std::string(100 * 1024, ' ') + good, 413},
  };
  for (const auto& c : cases) {
    HttpResult r = http(port, c.method, c.path, c.body);
    if (c.status == 200) {
      EXPECT_EQ(r.status, 200) << c.what << ": " << r.body;
    } else {
      expect_error(r, c.status, c.what);
    }
    if (c.status == 405) {
      EXPECT_NE(r.headers.find("Allow: "), std::string::npos) << c.what;
    }
    ASSERT_TRUE(healthy(port)) << "the server went down after: " << c.what;
  }
}

TEST(ServerHttp, RawProtocolAbuse) {
  const int port = shared().port();
  // A body larger than the limit is refused before it is read.
  HttpResult big = raw_http(port, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000000\r\n\r\n{");
  expect_error(big, 413, "declared huge body");
  // A chunked body is refused (its size is not known up front).
  HttpResult ch = raw_http(port,
                           "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
  expect_error(ch, 411, "chunked body");
  // Too many header lines.
  std::string many = "GET /v1/models HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 100; ++i) many += "X-H" + std::to_string(i) + ": v\r\n";
  expect_error(raw_http(port, many + "\r\n"), 431, "header lines");
  // Garbage instead of a request line, a bad Content-Length, a truncated body, a silent client.
  EXPECT_EQ(raw_http(port, "\x01\x02garbage\r\n\r\n").status, 400);
  expect_error(raw_http(port, "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"), 400, "bad length");
  raw_http(port, "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{\"pro", 300);
  raw_http(port, "", 200);
  // A very long URI.
  EXPECT_EQ(raw_http(port, "GET /" + std::string(20000, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n").status, 414);
  EXPECT_TRUE(healthy(port));
}

TEST(ServerHttp, ApiKey) {
  ServerOptions o = default_options(make_model_dir(qwen3_template()));
  o.api_key = "sekrit-key";
  TestServer srv(o);
  const std::string body = chat_body("hi", 4).dump();
  expect_error(http(srv.port(), "POST", "/v1/chat/completions", body), 401, "no key");
  expect_error(http(srv.port(), "POST", "/v1/chat/completions", body, {{"Authorization", "Bearer wrong"}}), 401, "wrong key");
  expect_error(http(srv.port(), "POST", "/v1/chat/completions", body, {{"Authorization", "sekrit-key"}}), 401, "no Bearer");
  expect_error(http(srv.port(), "GET", "/v1/models", "", {{"Authorization", "Bearer sekrit-keyX"}}), 401, "longer key");
  EXPECT_EQ(http(srv.port(), "POST", "/v1/chat/completions", body, {{"Authorization", "Bearer sekrit-key"}}).status, 200);
  EXPECT_EQ(http(srv.port(), "GET", "/v1/models", "", {{"Authorization", "Bearer sekrit-key"}}).status, 200);
  EXPECT_EQ(sse_post(srv.port(), "/v1/completions", Json{{"prompt", "a"}, {"max_tokens", 3}, {"stream", true}}, {},
                     "sekrit-key").status, 200);
  // health and metrics stay open (for probes)
  EXPECT_TRUE(healthy(srv.port()));
  EXPECT_EQ(http(srv.port(), "GET", "/metrics").status, 200);
}

TEST(ServerHttp, NoChatTemplateIsA400WithAClearMessage) {
  ServerOptions o = default_options(demo_dir());  // the demo model has no chat template
  TestServer srv(o);
  HttpResult r = http(srv.port(), "POST", "/v1/chat/completions", chat_body("hi", 4).dump());
  expect_error(r, 400, "no template");
  EXPECT_EQ(r.json()["error"]["code"], "no_chat_template");
  EXPECT_EQ(http(srv.port(), "POST", "/v1/completions", R"({"prompt":"hi","max_tokens":3})").status, 200);
}

TEST(ServerHttp, HealthIs503WhileLoading) {
  Gate gate;
  ServerOptions o = default_options(make_model_dir(qwen3_template()));
  o.before_load = [&] { gate.wait(); };
  TestServer srv(o, false);
  while (gate.waiting == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  HttpResult h = http(srv.port(), "GET", "/health");
  EXPECT_EQ(h.status, 503);
  EXPECT_EQ(h.json()["status"], "loading");
  EXPECT_TRUE(h.json()["progress"].is_number());
  expect_error(http(srv.port(), "POST", "/v1/chat/completions", chat_body("hi", 4).dump()), 503, "loading");
  EXPECT_EQ(http(srv.port(), "GET", "/v1/models").status, 200);
  gate.release();
  ASSERT_TRUE(srv.srv->wait_loaded());
  EXPECT_TRUE(healthy(srv.port()));
}

TEST(ServerHttp, LoadFailureIsReported) {
  ServerOptions o = default_options("/nonexistent/model/folder");
  TestServer srv(o, false);
  EXPECT_FALSE(srv.srv->wait_loaded());
  EXPECT_FALSE(srv.srv->load_error().empty());
  HttpResult h = http(srv.port(), "GET", "/health");
  EXPECT_EQ(h.status, 503);
  EXPECT_EQ(h.json()["status"], "error");
}

TEST(ServerHttp, QueueFullIs429AndQueuedRequestsStillComplete) {
  Gate gate;
  ServerOptions o = default_options(make_model_dir(qwen3_template()));
  o.max_queue = 2;
  o.before_job = [&] { gate.wait(); };
  TestServer srv(o);
  const int port = srv.port();
  const std::string body = Json{{"prompt", "Hello"}, {"max_tokens", 4}}.dump();
  std::vector<std::thread> ts;
  std::vector<int> status(3, 0);
  // One running (held at the gate) and two queued.
  ts.emplace_back([&] { status[0] = http(port, "POST", "/v1/completions", body).status; });
  while (gate.waiting == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  for (int i = 1; i < 3; ++i) ts.emplace_back([&, i] { status[size_t(i)] = http(port, "POST", "/v1/completions", body).status; });
  while (metric(port, "deltaq_queue_depth") < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  HttpResult r = http(port, "POST", "/v1/completions", body);
  expect_error(r, 429, "queue full");
  EXPECT_NE(r.headers.find("Retry-After"), std::string::npos);
  SseResult s = sse_post(port, "/v1/completions", Json{{"prompt", "Hello"}, {"max_tokens", 4}, {"stream", true}});
  EXPECT_EQ(s.status, 429);
  EXPECT_EQ(metric(port, "deltaq_requests_running"), 1);
  gate.release();
  for (auto& t : ts) t.join();
  EXPECT_EQ(status, (std::vector<int>{200, 200, 200}));
}

TEST(ServerHttp, ClientDisconnectCancelsTheGeneration) {
  ServerOptions o = default_options(make_model_dir(qwen3_template()));
  TestServer srv(o);
  const int port = srv.port();
  const double before = metric(port, "deltaq_completion_tokens_total");
  int events = 0;
  // 4000 tokens take seconds; the client leaves after 3 events.
  SseResult s = sse_post(port, "/v1/completions",
                         Json{{"prompt", "Hello"}, {"max_tokens", 4000}, {"ignore_eos", true}, {"stream", true}},
                         [&](const Json&) { return ++events < 3; });
  EXPECT_EQ(events, 3);
  auto t0 = std::chrono::steady_clock::now();
  while (metric(port, "deltaq_jobs_total{outcome=\"cancelled\"}") < 1) {
    ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10)) << "the generation was not cancelled";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_LT(metric(port, "deltaq_completion_tokens_total") - before, 2000);
  EXPECT_TRUE(healthy(port));
}

TEST(ServerHttp, ClientDisconnectCancelsANonStreamedGeneration) {
  ServerOptions o = default_options(make_model_dir(qwen3_template()));
  TestServer srv(o);
  const int port = srv.port();
  const std::string body = Json{{"prompt", "Hello"}, {"max_tokens", 4000}, {"ignore_eos", true}}.dump();
  // The client waits 300 ms for an answer that takes seconds, then hangs up.
  HttpResult r = raw_http(port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body, 300);
  EXPECT_EQ(r.status, 0);
  auto t0 = std::chrono::steady_clock::now();
  while (metric(port, "deltaq_jobs_total{outcome=\"cancelled\"}") < 1) {
    ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10)) << "the generation was not cancelled";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_LT(metric(port, "deltaq_completion_tokens_total"), 3000);
  EXPECT_TRUE(healthy(port));
}

TEST(ServerHttp, RequestTimeout) {
  Gate gate;
  ServerOptions o = default_options(make_model_dir(qwen3_template()));
  o.request_timeout_s = 1;
  std::atomic<int> jobs{0};
  o.before_job = [&] {
    if (jobs++ == 0) gate.wait();
  };
  TestServer srv(o);
  const int port = srv.port();
  std::thread first([&] { http(port, "POST", "/v1/completions", R"({"prompt":"a","max_tokens":2})"); });
  while (gate.waiting == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // Queued behind the held job past its deadline: 504 (plain) and an error event (stream).
  expect_error(http(port, "POST", "/v1/completions", R"({"prompt":"a","max_tokens":2})"), 504, "timeout");
  SseResult s = sse_post(port, "/v1/completions", Json{{"prompt", "a"}, {"max_tokens", 2}, {"stream", true}});
  ASSERT_FALSE(s.events.empty());
  EXPECT_TRUE(s.events.back().contains("error"));
  EXPECT_TRUE(s.done);
  gate.release();
  first.join();
  EXPECT_TRUE(healthy(port));
}

// Two users' chats interleaved: each next turn (the template drops the reply's reasoning)
// continues from the state saved where its conversation's last messages ended (before the
// generation prompt, which Qwen3.5's template opens with "<think>"); the reply is the one a
// server without the cache gives. With --parallel 4 the first conversation's slot may still hold
// its reply (Qwen3's template renders it back as it was generated): then the next turn continues
// from there, past the saved state.
TEST(ServerHttp, ChatTurnsContinueFromTheSavedPromptState) {
  for (const int parallel : {1, 4})
  for (const std::string& tmpl : {qwen3_template(), qwen35_template()}) {
    SCOPED_TRACE("parallel " + std::to_string(parallel));
    ServerOptions o = default_options(make_model_dir(tmpl));
    o.engine.max_ctx = 512;
    o.parallel = parallel;
    TestServer srv(o);
    ServerOptions off = o;
    off.prompt_cache_bytes = 0;
    TestServer plain(off);
    auto messages = [](const std::vector<std::string>& said) {
      Json m = Json::array();
      for (size_t i = 0; i < said.size(); ++i) m.push_back({{"role", i % 2 ? "assistant" : "user"}, {"content", said[i]}});
      return m;
    };
    auto turn = [&](const std::vector<std::string>& said) {
      return Json{{"model", "any"}, {"max_tokens", 8}, {"temperature", 0}, {"messages", messages(said)}}.dump();
    };
    auto post = [&](const TestServer& s, const std::string& body) {
      HttpResult r = http(s.port(), "POST", "/v1/chat/completions", body);
      EXPECT_EQ(r.status, 200) << r.body;
      return r.json();
    };
    const std::vector<std::string> a1_said = {"Tell me a fortune"};
    const Json a1 = post(srv, turn(a1_said));
    post(srv, turn({"What does the cookie say?"}));  // another user's
    const std::string a1_reply = a1["choices"][0]["message"]["content"];
    const std::string a2_body = turn({a1_said[0], "<think>\nhm\n</think>\n\n" + a1_reply, "And another"});
    const Json a2 = post(srv, a2_body);
    // The tokens of the first turn's messages without the generation prompt.
    const Json msgs = http(srv.port(), "POST", "/tokenize",
                           Json{{"messages", messages(a1_said)}, {"add_generation_prompt", false}}.dump())
                          .json();
    const int saved = msgs["count"];
    EXPECT_GT(saved, 0);
    EXPECT_LT(saved, a1["usage"]["prompt_tokens"].get<int>());
    const int cached = a2["usage"]["prompt_tokens_details"]["cached_tokens"];
    const bool from_slot = parallel > 1 && cached > saved;
    if (!from_slot) EXPECT_EQ(cached, saved) << a2.dump();
    if (parallel > 1 && tmpl == qwen3_template()) EXPECT_TRUE(from_slot) << a2.dump();
    const Json want = post(plain, a2_body);
    EXPECT_EQ(want["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    EXPECT_EQ(a2["choices"][0]["message"]["content"], want["choices"][0]["message"]["content"]);
    EXPECT_EQ(metric(srv.port(), "deltaq_prompt_cache_restores_total"), from_slot ? 0 : 1);
    EXPECT_EQ(metric(srv.port(), "deltaq_prompt_cache_saves_total"), 3);
    EXPECT_EQ(metric(srv.port(), "deltaq_prompt_cache_entries"), 3);
    EXPECT_GT(metric(srv.port(), "deltaq_prompt_cache_bytes"), 0);
    EXPECT_EQ(metric(srv.port(), "deltaq_prompt_cached_tokens_total"), cached);
    EXPECT_EQ(metric(plain.port(), "deltaq_prompt_cache_saves_total"), 0);
  }
  // /tokenize's add_generation_prompt must be a boolean.
  HttpResult bad = http(shared().port(), "POST", "/tokenize",
                        R"({"messages":[{"role":"user","content":"x"}],"add_generation_prompt":"no"})");
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("add_generation_prompt"), std::string::npos);
}

TEST(ServerHttp, MetricsAndModels) {
  const int port = shared().port();
  http(port, "GET", "/v1/models");
  // A request is counted just after its response is written: poll briefly.
  HttpResult m;
  for (int i = 0; i < 100; ++i) {
    m = http(port, "GET", "/metrics");
    ASSERT_EQ(m.status, 200);
    if (m.body.find("endpoint=\"/v1/models\",status=\"200\"") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (const char* s : {"deltaq_requests_total{endpoint=\"/v1/models\",status=\"200\"}", "deltaq_prompt_tokens_total",
                        "deltaq_completion_tokens_total", "deltaq_queue_depth", "deltaq_requests_running",
                        "deltaq_generation_tokens_per_second", "deltaq_request_duration_seconds_bucket"})
    EXPECT_NE(m.body.find(s), std::string::npos) << s;
  Json models = http(port, "GET", "/v1/models").json();
  ASSERT_EQ(models["data"].size(), 1u);
  const std::string id = models["data"][0]["id"];
  EXPECT_EQ(http(port, "GET", "/v1/models/" + id).json()["id"], id);
}
