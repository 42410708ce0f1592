#include "server/server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>

#include "chat/template.h"
#include "core/error.h"
#include "server/api.h"
#include "server/metrics.h"
#include "server/worker.h"

namespace dq::server {

namespace {

// httplib keeps the listening socket protected; the backlog it uses (5) drops bursts of
// connections, so the server listens again with a larger one.
class HttpServer : public httplib::Server {
 public:
  int listen_fd() const { return int(svr_sock_.load()); }
};

using httplib::Request;
using httplib::Response;
using HR = httplib::Server::HandlerResponse;

thread_local Clock::time_point t_request_start;

void send_json(Response& res, int status, const Json& j) {
  res.status = status;
  res.set_content(dump(j), "application/json");
}

void send_error(Response& res, const ApiError& e) {
  send_json(res, e.status, e.to_json());
  if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
  if (e.status == 401) res.set_header("WWW-Authenticate", "Bearer");
}

std::string sse(const Json& j) { return "data: " + dump(j) + "\n\n"; }

// Compares without an early exit on the first differing byte (the length is not secret).
bool consttime_equal(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

std::string random_hex(size_t n) {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lk(mu);
  std::string s;
  while (s.size() < n) s += fmt::format("{:016x}", rng());
  return s.substr(0, n);
}

// httplib 0.11 gives a plain handler no handle on its connection. The connection's socket is found
// by its two ports (this thread serves it, so it stays open while the handler runs) to notice a
// client that hangs up while it waits for a non-streamed answer. -1 when not found.
int connection_fd(const Request& req) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int found = -1;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long fd = std::strtol(e->d_name, &end, 10);
    if (*end || end == e->d_name || fd == dirfd(d)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof local, pl = sizeof peer;
    if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;
    if (getpeername(int(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    auto port_of = [](const sockaddr_storage& a) {
      if (a.ss_family == AF_INET) return int(ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port));
      if (a.ss_family == AF_INET6) return int(ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port));
      return -1;
    };
    if (port_of(local) == req.local_port && port_of(peer) == req.remote_port) {
      found = int(fd);
      break;
    }
  }
  closedir(d);
  return found;
}

// True once the peer has closed its side (or the socket failed). Pipelined data is not a hang-up.
bool peer_closed(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

std::string folder_name(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  size_t p = dir.rfind('/');
  return p == std::string::npos ? dir : dir.substr(p + 1);
}

}  // namespace

// How a generation request is answered: its kind, ids and output shape.
struct Reply {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  bool think = false, think_inside = false;  // reasoning split settings
  std::string id;
  int64_t created = 0;
};

struct Server::Impl {
  ServerOptions opt;
  Worker worker;
  HttpServer http;
  Metrics metrics;
  ApiLimits limits;
  std::thread listener;
  std::atomic<bool> stopping{false};
  std::atomic<bool> started{false};
  int port = -1;
  int64_t start_time = std::time(nullptr);

  explicit Impl(ServerOptions o)
      : opt(std::move(o)), worker(Worker::Options{opt.model_dir, opt.engine, opt.chat_template_file, opt.max_queue,
                                                   opt.prompt_cache_bytes, opt.parallel,
                                                   opt.before_job, opt.before_load}) {
    if (opt.model_name.empty()) opt.model_name = folder_name(opt.model_dir);
  }

  void setup();
  void ensure_ready() const;
  bool authorized(const Request& req) const;
  void handle_generation(const Request& req, Response& res, bool chat);
  void respond(const Request& req, Response& res, const std::shared_ptr<Job>& job, Reply reply);
  Json chunk(const Reply& r, Json choice) const;
  Json final_json(const Reply& r, const GenerateResult& g) const;
  void tokenize(const Request& req, Response& res);
  void detokenize(const Request& req, Response& res);
  void health(Response& res);
  void models(const Request& req, Response& res);
  std::string render_chat(const CompletionRequest& cr, bool generation_prompt = true) const;
};

// ---- checks ------------------------------------------------------------------------------------

void Server::Impl::ensure_ready() const {
  switch (worker.state()) {
    case Worker::State::Ready: return;
    case Worker::State::Loading:
      throw_api(503, fmt::format("the model is still loading ({}, {:.0f}%)", worker.load_phase(),
                                 100 * worker.load_progress()),
                {}, "model_loading", "server_error");
    case Worker::State::Failed:
      throw_api(503, "the model failed to load: " + worker.load_error(), {}, "model_load_failed", "server_error");
    case Worker::State::Stopped: throw_api(503, "the server is shutting down", {}, "shutting_down", "server_error");
  }
}

bool Server::Impl::authorized(const Request& req) const {
  if (opt.api_key.empty()) return true;
  std::string h = req.get_header_value("Authorization");
  const std::string bearer = "Bearer ";
  if (h.size() <= bearer.size() || h.compare(0, bearer.size(), bearer) != 0) return false;
  return consttime_equal(h.substr(bearer.size()), opt.api_key);
}

// ---- generation --------------------------------------------------------------------------------

std::string Server::Impl::render_chat(const CompletionRequest& cr, bool generation_prompt) const {
  const chat::Template* tmpl = worker.chat_template();
  if (!tmpl) {
    if (!worker.chat_template_error().empty())
      throw_api(500, "the model's chat template does not parse: " + worker.chat_template_error(), {},
                "chat_template_error", "server_error");
    throw_api(400,
              "this model has no chat template, so messages cannot be turned into a prompt: use /v1/completions, "
              "or start the server with --chat-template FILE",
              "messages", "no_chat_template");
  }
  const text::TextConfig& t = worker.text();
  chat::ChatInput in;
  in.messages = cr.messages;
  in.add_generation_prompt = generation_prompt;
  in.enable_thinking = cr.enable_thinking;
  in.extra = cr.template_kwargs;
  if (t.bos_token) in.bos_token = *t.bos_token;
  if (t.eos_token) in.eos_token = *t.eos_token;
  try {
    return chat::apply(*tmpl, in);
  } catch (const chat::TemplateError& e) {
    throw_api(400, fmt::format("the chat template rejected the messages: {}", e.what()), "messages",
              "chat_template_error");
  }
}

void Server::Impl::handle_generation(const Request& req, Response& res, bool chat) {
  CompletionRequest cr = parse_completion_request(req.body, chat, limits);
  ensure_ready();
  const text::TextConfig& text = worker.text();
  Reply reply;
  reply.chat = chat;
  reply.stream = cr.stream;
  reply.include_usage = cr.stream && cr.include_usage;
  reply.id = (chat ? "chatcmpl-" : "cmpl-") + random_hex(24);
  reply.created = std::time(nullptr);

  GenerateRequest g;
  if (chat) {
    const std::string prompt = render_chat(cr);
    g.prompt = text.tokenizer->encode(prompt, true);
    // The prompt cache saves the state where the messages end: the next turn's prompt goes on
    // from there (the state at the prompt's end, after the generation prompt, is no prefix of it
    // when the template renders a reply without what the generation prompt opened).
    if (opt.prompt_cache_bytes) try {
        g.save_at = chat_messages_end(g.prompt, text.tokenizer->encode(render_chat(cr, false), true));
      } catch (const std::exception&) {
        // a template that cannot render the messages alone: save at the prompt's end
      }
    const std::string& src = worker.chat_template_source();
    reply.think = opt.reasoning && src.find("</think>") != std::string::npos;
    reply.think_inside = reply.think && ThinkSplitter::prompt_opens_think(prompt);
    // The template's end-of-turn token ends the reply even when the checkpoint does not list it.
    if (src.find("<|im_end|>") != std::string::npos)
      if (auto id = text.tokenizer->token_to_id("<|im_end|>")) g.stop_ids.push_back(*id);
  } else if (cr.prompt_text) {
    g.prompt = text.tokenizer->encode(*cr.prompt_text, true);
  } else {
    const int V = worker.vocab_size();
    for (size_t i = 0; i < cr.prompt_ids.size(); ++i)
      if (cr.prompt_ids[i] >= V)
        throw_api(400, fmt::format("'prompt[{}]' is token id {}, outside the vocabulary [0, {})", i, cr.prompt_ids[i], V),
                  "prompt", "invalid_token_id");
    g.prompt = std::move(cr.prompt_ids);
  }
  if (g.prompt.empty()) throw_api(400, "the prompt is empty after tokenization", chat ? "messages" : "prompt");

  const int64_t ctx = worker.max_ctx();
  const int64_t limit = opt.max_tokens > 0 ? std::min<int64_t>(opt.max_tokens, ctx) : ctx;
  const int64_t n = int64_t(g.prompt.size());
  if (n >= ctx)
    throw_api(400, fmt::format("the prompt has {} tokens; the context holds {} (prompt + max_tokens)", n, ctx),
              chat ? "messages" : "prompt", "context_length_exceeded");
  int64_t max_tokens = std::min(limit, ctx - n);
  if (cr.max_tokens) {
    const char* name = "max_tokens";
    if (*cr.max_tokens > limit)
      throw_api(400, fmt::format("max_tokens is {}; this server's limit is {}", *cr.max_tokens, limit), name);
    if (n + *cr.max_tokens > ctx)
      throw_api(400,
                fmt::format("the prompt ({} tokens) plus max_tokens ({}) exceeds the context of {} tokens", n,
                            *cr.max_tokens, ctx),
                name, "context_length_exceeded");
    max_tokens = *cr.max_tokens;
  }
  g.max_tokens = int(max_tokens);
  g.sampling = cr.sampling;
  g.stop = std::move(cr.stop);
  if (cr.ignore_eos) {
    g.stop_at_eos = false;
    g.stop_ids.clear();
  }

  auto job = std::make_shared<Job>();
  job->req = std::move(g);
  job->deadline = Clock::now() + std::chrono::seconds(opt.request_timeout_s);
  if (!worker.submit(job)) {
    ensure_ready();
    throw_api(429, fmt::format("the server is busy: {} requests are already waiting (--max-queue)", opt.max_queue), {},
              "queue_full", "rate_limit_error");
  }
  respond(req, res, job, std::move(reply));
}

Json Server::Impl::chunk(const Reply& r, Json choice) const {
  Json j = Json::object();
  j["id"] = r.id;
  j["object"] = r.chat ? "chat.completion.chunk" : "text_completion";
  j["created"] = r.created;
  j["model"] = opt.model_name;
  j["choices"] = choice.is_null() ? Json::array() : Json::array({std::move(choice)});
  if (r.include_usage) j["usage"] = nullptr;
  return j;
}

Json Server::Impl::final_json(const Reply& r, const GenerateResult& g) const {
  Json j = Json::object();
  j["id"] = r.id;
  j["object"] = r.chat ? "chat.completion" : "text_completion";
  j["created"] = r.created;
  j["model"] = opt.model_name;
  Json choice = Json::object();
  choice["index"] = 0;
  if (r.chat) {
    ThinkSplitter sp(r.think, r.think_inside);
    std::string reasoning, content;
    sp.push(g.text, reasoning, content);
    sp.finish(reasoning, content);
    Json msg = Json::object();
    msg["role"] = "assistant";
    msg["content"] = content;
    if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
    choice["message"] = msg;
  } else {
    choice["text"] = g.text;
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = g.finish_reason;
  j["choices"] = Json::array({choice});
  j["usage"] = usage_json(g);
  j["timings"] = timings_json(g);
  return j;
}

void Server::Impl::respond(const Request& req, Response& res, const std::shared_ptr<Job>& job, Reply reply) {
  if (!reply.stream) {
    // Waits for the result, watching the connection: a client that hangs up cancels its job.
    const int fd = connection_fd(req);
    std::unique_lock<std::mutex> lk(job->mu);
    while (!job->finished) {
      if (Clock::now() >= job->deadline) {
        job->cancelled = true;
        throw_api(504, "the request timed out (--request-timeout)", {}, "timeout", "server_error");
      }
      if (peer_closed(fd)) {
        job->cancelled = true;
        throw_api(499, "the client closed the connection", {}, "client_closed");
      }
      job->cv.wait_for(lk, std::chrono::milliseconds(100));
    }
    if (job->error) throw *job->error;
    send_json(res, 200, final_json(reply, job->result));
    return;
  }

  struct StreamState {
    std::shared_ptr<Job> job;
    Reply reply;
    ThinkSplitter split;
    Clock::time_point last_write = Clock::now();
  };
  auto st = std::make_shared<StreamState>(StreamState{job, reply, ThinkSplitter(reply.think, reply.think_inside)});
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, st](size_t, httplib::DataSink& sink) {
        Job& j = *st->job;
        const Reply& r = st->reply;
        auto write = [&](const std::string& s) {
          if (!sink.write(s.data(), s.size())) {
            j.cancelled = true;  // the client is gone: stop generating for it
            return false;
          }
          st->last_write = Clock::now();
          return true;
        };
        auto text_chunk = [&](const std::string& reasoning, const std::string& content) {
          Json choice = Json::object();
          choice["index"] = 0;
          if (r.chat) {
            Json delta = Json::object();
            if (!reasoning.empty()) delta["reasoning_content"] = reasoning;
            if (!content.empty()) delta["content"] = content;
            choice["delta"] = delta;
          } else {
            choice["text"] = content;
          }
          choice["logprobs"] = nullptr;
          choice["finish_reason"] = nullptr;
          return sse(chunk(r, choice));
        };
        auto end_with_error = [&](const ApiError& e) {
          write(sse(e.to_json()));
          write("data: [DONE]\n\n");
          sink.done();
          return true;
        };
        if (r.chat) {
          Json choice = {{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                         {"finish_reason", nullptr}};
          if (!write(sse(chunk(r, choice)))) return false;
        }
        for (;;) {
          j.wait_news(std::chrono::milliseconds(200));
          std::deque<std::string> pieces;
          bool finished;
          {
            std::lock_guard<std::mutex> lk(j.mu);
            pieces.swap(j.pieces);
            finished = j.finished;
          }
          for (const auto& p : pieces) {
            std::string reasoning, content;
            if (r.chat) st->split.push(p, reasoning, content);
            else content = p;
            if ((!reasoning.empty() || !content.empty()) && !write(text_chunk(reasoning, content))) return false;
          }
          if (finished) {
            if (j.error) return end_with_error(*j.error);
            const GenerateResult& g = j.result;
            std::string reasoning, content;
            if (r.chat) st->split.finish(reasoning, content);
            if ((!reasoning.empty() || !content.empty()) && !write(text_chunk(reasoning, content))) return false;
            Json choice = Json::object();
            choice["index"] = 0;
            if (r.chat) choice["delta"] = Json::object();
            else choice["text"] = "";
            choice["logprobs"] = nullptr;
            choice["finish_reason"] = g.finish_reason;
            Json last = chunk(r, choice);
            last["timings"] = timings_json(g);
            if (!write(sse(last))) return false;
            if (r.include_usage) {
              Json u = chunk(r, nullptr);
              u["usage"] = usage_json(g);
              if (!write(sse(u))) return false;
            }
            if (!write("data: [DONE]\n\n")) return false;
            sink.done();
            return true;
          }
          if (stopping) {
            j.cancelled = true;
            return end_with_error(ApiError{503, "the server is shutting down", "server_error", "", "shutting_down"});
          }
          if (Clock::now() >= j.deadline + std::chrono::seconds(1)) {
            j.cancelled = true;
            return end_with_error(ApiError{504, "the request timed out (--request-timeout)", "server_error", "", "timeout"});
          }
          // While waiting (queued, or a long prefill), an SSE comment keeps proxies from timing out
          // and reveals a client that went away (the second write to a closed socket fails).
          if (Clock::now() - st->last_write > std::chrono::seconds(1) && !write(": keep-alive\n\n")) return false;
        }
      },
      [st](bool) {
        std::lock_guard<std::mutex> lk(st->job->mu);
        if (!st->job->finished) st->job->cancelled = true;
      });
}

// ---- other endpoints ---------------------------------------------------------------------------

void Server::Impl::tokenize(const Request& req, Response& res) {
  Json j = parse_json_object(req.body, limits);
  ensure_ready();
  std::string text;
  if (j.contains("messages") && !j["messages"].is_null()) {
    std::string chat_body = dump(Json{{"messages", j["messages"]}});
    CompletionRequest cr = parse_completion_request(chat_body, true, limits);
    bool generation_prompt = true;
    if (auto g = j.find("add_generation_prompt"); g != j.end()) {
      if (!g->is_boolean()) throw_api(400, "'add_generation_prompt' must be a boolean", "add_generation_prompt");
      generation_prompt = g->get<bool>();
    }
    text = render_chat(cr, generation_prompt);
  } else {
    const char* key = j.contains("prompt") ? "prompt" : "content";
    auto it = j.find(key);
    if (it == j.end() || !it->is_string())
      throw_api(400, "'prompt' (or 'content') must be a string, or send 'messages'", "prompt");
    text = it->get<std::string>();
  }
  auto ids = worker.text().tokenizer->encode(text, true);
  send_json(res, 200, Json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", worker.max_ctx()}});
}

void Server::Impl::detokenize(const Request& req, Response& res) {
  Json j = parse_json_object(req.body, limits);
  ensure_ready();
  auto it = j.find("tokens");
  if (it == j.end() || !it->is_array()) throw_api(400, "'tokens' must be an array of token ids", "tokens");
  const int V = worker.vocab_size();
  std::vector<int32_t> ids;
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& t = (*it)[i];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= V ||
        (t.is_number_unsigned() && t.get<uint64_t>() >= uint64_t(V)))
      throw_api(400, fmt::format("'tokens[{}]' is {}, expected a token id in [0, {})", i, t.dump(), V), "tokens");
    ids.push_back(int32_t(t.get<int64_t>()));
  }
  send_json(res, 200, Json{{"prompt", worker.text().tokenizer->decode(ids)}});
}

void Server::Impl::health(Response& res) {
  Json j = Json::object();
  switch (worker.state()) {
    case Worker::State::Ready:
      j = {{"status", "ok"}, {"model", opt.model_name}, {"backend", worker.backend_name()},
           {"max_model_len", worker.max_ctx()}, {"load_seconds", worker.load_seconds()}};
      send_json(res, 200, j);
      return;
    case Worker::State::Loading:
      j = {{"status", "loading"}, {"phase", worker.load_phase()}, {"progress", worker.load_progress()},
           {"elapsed_seconds", worker.load_seconds()}};
      break;
    case Worker::State::Failed: j = {{"status", "error"}, {"error", worker.load_error()}}; break;
    case Worker::State::Stopped: j = {{"status", "stopping"}}; break;
  }
  send_json(res, 503, j);
  res.set_header("Retry-After", "1");
}

void Server::Impl::models(const Request& req, Response& res) {
  Json m = {{"id", opt.model_name}, {"object", "model"}, {"created", start_time}, {"owned_by", "deltaq"}};
  if (worker.state() == Worker::State::Ready) m["max_model_len"] = worker.max_ctx();
  if (req.matches.size() > 1) {
    if (req.matches[1].str() != opt.model_name)
      throw_api(404, fmt::format("no model '{}' here; this server serves '{}'", req.matches[1].str(), opt.model_name),
                "model", "model_not_found");
    send_json(res, 200, m);
    return;
  }
  send_json(res, 200, Json{{"object", "list"}, {"data", Json::array({m})}});
}

// ---- routes ------------------------------------------------------------------------------------

void Server::Impl::setup() {
  const size_t threads = opt.http_threads > 0 ? size_t(opt.http_threads) : opt.max_queue + 16;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(opt.max_body_bytes);
  http.set_read_timeout(opt.read_timeout_s, 0);
  http.set_write_timeout(opt.write_timeout_s, 0);
  http.set_keep_alive_timeout(opt.keep_alive_timeout_s);
  http.set_keep_alive_max_count(1000);
  http.set_tcp_nodelay(true);

  // Checks that must happen before the body is read. A refused body is left unread, so the
  // connection is marked to close.
  http.set_pre_routing_handler([this](const Request& req, Response& res) {
    t_request_start = Clock::now();
    auto refuse = [&](ApiError e) {
      send_error(res, e);
      res.set_header("Connection", "close");
      return HR::Handled;
    };
    if (req.headers.size() > opt.max_headers)
      return refuse({431, fmt::format("too many header lines ({}, the limit is {})", req.headers.size(), opt.max_headers),
                     "invalid_request_error", "", "headers_too_large"});
    const std::string te = req.get_header_value("Transfer-Encoding");
    if (!te.empty() && te != "identity")
      return refuse({411, "chunked request bodies are not accepted: send Content-Length", "invalid_request_error", "",
                     "length_required"});
    const std::string cl = req.get_header_value("Content-Length");
    if (!cl.empty()) {
      char* end = nullptr;
      errno = 0;
      unsigned long long n = std::strtoull(cl.c_str(), &end, 10);
      if (errno || *end || cl[0] == '-')
        return refuse({400, "Content-Length is not a number", "invalid_request_error", "", "bad_content_length"});
      if (n > opt.max_body_bytes)
        return refuse({413, fmt::format("the request body is {} bytes; the limit is {} (--max-body)", n, opt.max_body_bytes),
                       "invalid_request_error", "", "body_too_large"});
    }
    if (req.path != "/health" && req.path != "/metrics" && !authorized(req)) {
      ApiError e{401, "missing or incorrect API key (send 'Authorization: Bearer KEY')", "invalid_request_error", "",
                 "invalid_api_key"};
      if (cl.empty() || cl == "0") {
        send_error(res, e);
        return HR::Handled;
      }
      return refuse(e);
    }
    return HR::Unhandled;
  });

  // Bodies for the errors httplib itself produces (malformed request, 404, 413, 414, ...).
  http.set_error_handler(httplib::Server::HandlerWithResponse([](const Request& req, Response& res) {
    if (!res.body.empty()) return HR::Unhandled;
    ApiError e;
    e.status = res.status;
    switch (res.status) {
      case 404: e.message = fmt::format("no such endpoint: {} {}", req.method, req.path); e.code = "not_found"; break;
      case 413: e.message = "the request body is too large"; e.code = "body_too_large"; break;
      case 414: e.message = "the request URI is too long"; break;
      case 400: e.message = "malformed HTTP request"; break;
      default: e.message = fmt::format("HTTP {}", res.status); if (res.status >= 500) e.type = "server_error";
    }
    send_error(res, e);
    return HR::Handled;
  }));
  http.set_exception_handler([](const Request&, Response& res, std::exception_ptr ep) {
    ApiError e{500, "internal error", "server_error", "", ""};
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& x) {
      e.message = std::string("internal error: ") + x.what();
    } catch (...) {
    }
    send_error(res, e);
  });
  http.set_logger([this](const Request& req, const Response& res) {
    double s = std::chrono::duration<double>(Clock::now() - t_request_start).count();
    if (t_request_start == Clock::time_point{}) s = 0;
    metrics.record(Metrics::endpoint_label(req.path), res.status, s);
    if (opt.log_requests)
      std::fprintf(stderr, "deltaq serve: %s %s %d %.3f s\n", req.method.c_str(), req.path.c_str(), res.status, s);
    t_request_start = {};
  });

  // Every handler turns ApiError into its JSON answer; anything else is a 500.
  auto guarded = [](auto fn) {
    return [fn](const Request& req, Response& res) {
      try {
        fn(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const std::exception& e) {
        send_error(res, ApiError{500, std::string("internal error: ") + e.what(), "server_error", "", ""});
      }
    };
  };
  http.Post("/v1/chat/completions", guarded([this](const Request& q, Response& r) { handle_generation(q, r, true); }));
  http.Post("/v1/completions", guarded([this](const Request& q, Response& r) { handle_generation(q, r, false); }));
  http.Post("/tokenize", guarded([this](const Request& q, Response& r) { tokenize(q, r); }));
  http.Post("/detokenize", guarded([this](const Request& q, Response& r) { detokenize(q, r); }));
  http.Get("/v1/models", guarded([this](const Request& q, Response& r) { models(q, r); }));
  http.Get("/v1/models/(.+)", guarded([this](const Request& q, Response& r) { models(q, r); }));
  http.Get("/health", guarded([this](const Request&, Response& r) { health(r); }));
  http.Get("/metrics", guarded([this](const Request&, Response& r) {
             r.set_content(metrics.render(worker), "text/plain; version=0.0.4");
           }));

  // The wrong method on a known path: 405 with Allow.
  auto not_allowed = [](const char* allow) {
    return [allow](const Request& req, Response& res) {
      send_error(res, ApiError{405, fmt::format("{} is not allowed on {} (use {})", req.method, req.path, allow),
                               "invalid_request_error", "", "method_not_allowed"});
      res.set_header("Allow", allow);
    };
  };
  for (const char* p : {"/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"}) {
    http.Get(p, not_allowed("POST"));
    http.Put(p, not_allowed("POST"));
    http.Patch(p, not_allowed("POST"));
    http.Delete(p, not_allowed("POST"));
  }
  for (const char* p : {"/v1/models", "/v1/models/(.+)", "/health", "/metrics"}) {
    http.Post(p, not_allowed("GET"));
    http.Put(p, not_allowed("GET"));
    http.Patch(p, not_allowed("GET"));
    http.Delete(p, not_allowed("GET"));
  }
}

// ---- Server ------------------------------------------------------------------------------------

Server::Server(ServerOptions opt) : impl_(std::make_unique<Impl>(std::move(opt))) {}

Server::~Server() { stop(); }

void Server::start() {
  Impl& s = *impl_;
  if (s.started.exchange(true)) return;
  // A write to a socket the client closed must fail with EPIPE, not kill the process.
  std::signal(SIGPIPE, SIG_IGN);
  s.setup();
  if (s.opt.port == 0) {
    s.port = s.http.bind_to_any_port(s.opt.host);
  } else {
    s.port = s.http.bind_to_port(s.opt.host, s.opt.port) ? s.opt.port : -1;
  }
  if (s.port <= 0) fail("cannot listen on {}:{} (address in use, or not an address of this machine?)", s.opt.host, s.opt.port);
  ::listen(s.http.listen_fd(), 512);
  s.listener = std::thread([&s] { s.http.listen_after_bind(); });
  s.worker.start();
}

int Server::port() const { return impl_->port; }

bool Server::wait_loaded() { return impl_->worker.wait_loaded(); }

std::string Server::load_error() const { return impl_->worker.load_error(); }

void Server::stop() {
  Impl& s = *impl_;
  if (!s.started || s.stopping.exchange(true)) return;
  s.worker.stop();
  s.http.stop();
  if (s.listener.joinable()) s.listener.join();
}

}  // namespace dq::server
