// Helpers for the server tests: a demo model folder with a chat template, an in-process server,
// raw HTTP over a socket, and a small SSE client on httplib.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/server.h"

namespace dq::server::testing {

using Json = nlohmann::ordered_json;

std::string demo_dir();
// The Qwen3 template (tests/data/chat/tokenizer_config.json) and the Qwen3.5-style one
// (tests/data/chat/templates/qwen35_style.jinja, whose generation prompt opens <think>).
std::string qwen3_template();
std::string qwen35_template();
// A copy of the demo model in a fresh temp folder with `chat_template` added to its
// tokenizer_config.json (none when empty). Removed at process exit.
std::string make_model_dir(const std::string& chat_template);

// A server on 127.0.0.1 and a free port, loaded before the constructor returns (unless
// opt.before_load blocks it and wait is false).
struct TestServer {
  explicit TestServer(ServerOptions opt, bool wait = true);
  ~TestServer();
  int port() const { return srv->port(); }
  std::unique_ptr<Server> srv;
};
ServerOptions default_options(const std::string& model_dir);

struct HttpResult {
  int status = 0;  // 0: no response
  std::string headers;
  std::string body;
  Json json() const;  // the body parsed (null if it is not JSON)
};
// Sends the bytes as they are and reads until the server closes or `timeout_ms` passes.
HttpResult raw_http(int port, const std::string& bytes, int timeout_ms = 3000);
// A well-formed request (Content-Length set, Connection: close).
HttpResult http(int port, const std::string& method, const std::string& path, const std::string& body = {},
                const std::vector<std::pair<std::string, std::string>>& headers = {});

// A streamed response: every `data:` payload in order, and whether [DONE] came.
struct SseResult {
  int status = 0;
  std::vector<Json> events;
  bool done = false;
  std::string error;  // transport problem
};
// on_event (optional) sees each event; returning false closes the connection at once.
SseResult sse_post(int port, const std::string& path, const Json& body,
                   const std::function<bool(const Json&)>& on_event = {}, const std::string& api_key = {});

// Concatenated delta content / reasoning of a chat stream, or text of a completions stream.
std::string stream_text(const SseResult& r, const char* field = "content");

// The value of a Prometheus sample (exact line prefix, e.g. `deltaq_jobs_total{outcome="cancelled"}`).
double metric(int port, const std::string& sample);

bool healthy(int port);

}  // namespace dq::server::testing
