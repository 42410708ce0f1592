// deltaq serve: the OpenAI-compatible HTTP server (docs/server.md).
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "app/cli_common.h"
#include "core/error.h"
#include "server/server.h"

namespace dq::app {

Command add_serve(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (docs/server.md)");
  auto f = std::make_shared<EngineFlags>();
  auto o = std::make_shared<server::ServerOptions>();
  auto no_reasoning = std::make_shared<bool>(false);
  f->add(cmd);
  cmd->add_option("--host", o->host, "address to listen on (default 127.0.0.1: this machine only)");
  cmd->add_option("--port", o->port, "port (0: any free port, printed at start)")->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", o->api_key, "require 'Authorization: Bearer KEY' (or set DELTAQ_API_KEY)");
  cmd->add_option("--model-name", o->model_name, "model id in /v1/models and responses (default: the folder's name)");
  cmd->add_option("--chat-template", o->chat_template_file, "Jinja chat template file (replaces the model's)");
  cmd->add_option("--max-queue", o->max_queue, "requests that may wait for the engine; more get 429")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--http-threads", o->http_threads, "connection threads (0: max-queue + 16)")->check(CLI::Range(0, 4096));
  cmd->add_option("--max-body", o->max_body_bytes, "request body limit in bytes (413)")->check(CLI::Range(1024, 1 << 30));
  cmd->add_option("--max-tokens", o->max_tokens, "largest max_tokens a request may ask for (0: the context)")
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--request-timeout", o->request_timeout_s, "seconds a request may take, queue included (504)")
      ->check(CLI::Range(1, 86400));
  cmd->add_option("--read-timeout", o->read_timeout_s, "seconds a client may stall while sending")
      ->check(CLI::Range(1, 3600));
  cmd->add_option("--write-timeout", o->write_timeout_s, "seconds a client may stall while receiving")
      ->check(CLI::Range(1, 3600));
  cmd->add_option("--parallel", o->parallel,
                  "requests decoded together, each in its own sequence state (1: one at a time)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  auto cache_mb = std::make_shared<size_t>(1024);
  cmd->add_option("--prompt-cache", *cache_mb,
                  "MB of host memory for states saved where prompts' messages end, so a conversation's next turn "
                  "feeds only its new tokens (0: off; default 1024)")
      ->check(CLI::Range(size_t(0), size_t(1) << 24));
  cmd->add_flag("--no-reasoning", *no_reasoning, "leave <think>...</think> in content (no reasoning_content)");
  cmd->add_flag("--verbose", o->log_requests, "log every request to stderr");
  return {cmd, [f, o, no_reasoning, cache_mb]() -> int {
            server::ServerOptions opt = *o;
            opt.prompt_cache_bytes = *cache_mb << 20;
            opt.model_dir = f->model;
            opt.engine = f->options();
            opt.reasoning = !*no_reasoning;
            if (opt.api_key.empty())
              if (const char* k = std::getenv("DELTAQ_API_KEY")) opt.api_key = k;

            // SIGINT / SIGTERM are taken by this thread (sigtimedwait) and by no other: block them
            // before any thread starts so every thread inherits the mask.
            sigset_t sigs;
            sigemptyset(&sigs);
            sigaddset(&sigs, SIGINT);
            sigaddset(&sigs, SIGTERM);
            pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

            server::Server srv(opt);
            srv.start();
            std::printf("deltaq serve: listening on http://%s:%d (model %s loading in the background)\n",
                        opt.host.c_str(), srv.port(), opt.model_dir.c_str());
            std::fflush(stdout);
            std::thread waiter([&] {
              if (srv.wait_loaded()) {
                std::printf("deltaq serve: model ready (%d request%s decoded together; --parallel)\n", opt.parallel,
                            opt.parallel == 1 ? "" : "s");
                std::fflush(stdout);
              }
            });
            int rc = 0;
            for (;;) {
              timespec ts{0, 200 * 1000 * 1000};
              int sig = sigtimedwait(&sigs, nullptr, &ts);
              if (sig == SIGINT || sig == SIGTERM) {
                std::fprintf(stderr, "deltaq serve: signal %d, shutting down\n", sig);
                break;
              }
              std::string why = srv.load_error();
              if (!why.empty()) {
                std::fprintf(stderr, "deltaq serve: error: the model failed to load: %s\n", why.c_str());
                rc = 1;
                break;
              }
            }
            srv.stop();
            waiter.join();
            return rc;
          }};
}

}  // namespace dq::app
