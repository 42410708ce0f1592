// deltaq's OpenAI-compatible HTTP server (cpp-httplib): see docs/server.md for the API.
//
// Threads: httplib's pool serves connections (one thread per open connection); the Worker
// (worker.h) owns the engine. A request is parsed, validated and tokenized on its HTTP thread, then
// queued to the worker; the HTTP thread streams the job's pieces out as they arrive.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "runtime/engine.h"

namespace dq::server {

struct ServerOptions {
  std::string model_dir;
  EngineOptions engine;
  std::string model_name;          // the id in /v1/models and responses; default: the folder's name
  std::string chat_template_file;  // replaces the model's chat template
  std::string host = "127.0.0.1";
  int port = 8080;                 // 0: any free port (see Server::port())
  std::string api_key;             // empty: no authentication
  int http_threads = 0;            // 0: max_queue + 16
  size_t max_queue = 64;           // requests waiting for the engine; more get 429
  size_t prompt_cache_bytes = size_t(1024) << 20;  // saved states at prompts' ends (docs/server.md); 0: none
  int parallel = 4;                // requests decoded together (docs/server.md); 1: one at a time
  size_t max_body_bytes = 2 << 20; // request body limit (413)
  size_t max_headers = 64;         // header lines per request (431)
  int max_tokens = 0;              // per-request limit on max_tokens; 0: the context length
  int request_timeout_s = 600;     // queue wait + generation (504)
  int read_timeout_s = 30;         // a client that stops sending
  int write_timeout_s = 30;        // a client that stops reading
  int keep_alive_timeout_s = 5;    // an idle keep-alive connection
  bool reasoning = true;           // split <think>...</think> into reasoning_content
  bool log_requests = false;       // one stderr line per request
  std::function<void()> before_job;   // test hook: runs on the engine thread before each job
  std::function<void()> before_load;  // test hook: runs on the engine thread before loading
};

class Server {
 public:
  explicit Server(ServerOptions opt);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the port and starts serving at once; the model loads in the background (/health answers
  // 503 until it is ready). Throws dq::Error when the address cannot be bound.
  void start();
  int port() const;
  // Blocks until the model is loaded (true) or failed to load (false).
  bool wait_loaded();
  std::string load_error() const;
  // Stops accepting, cancels running and queued work, joins every thread. Idempotent.
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dq::server
