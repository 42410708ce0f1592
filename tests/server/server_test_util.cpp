#include "server_test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <httplib.h>

namespace fs = std::filesystem;

namespace dq::server::testing {

namespace {
std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct TempDirs {
  std::vector<std::string> dirs;
  ~TempDirs() {
    for (auto& d : dirs) {
      std::error_code ec;
      fs::remove_all(d, ec);
    }
  }
};
TempDirs& temp_dirs() {
  static TempDirs t;
  return t;
}
}  // namespace

std::string demo_dir() { return std::string(DQ_SOURCE_DIR) + "/models/demo-fortunes/mlx-4bit"; }

std::string qwen3_template() {
  return Json::parse(read_file(std::string(DQ_TEST_DATA) + "/chat/tokenizer_config.json"))["chat_template"];
}

std::string qwen35_template() { return read_file(std::string(DQ_TEST_DATA) + "/chat/templates/qwen35_style.jinja"); }

std::string make_model_dir(const std::string& chat_template) {
  std::string tmpl = (fs::temp_directory_path() / "deltaq-server-test-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  temp_dirs().dirs.push_back(tmpl);
  for (const auto& e : fs::directory_iterator(demo_dir()))
    if (e.path().filename() != "reference.safetensors") fs::copy(e.path(), fs::path(tmpl) / e.path().filename());
  if (!chat_template.empty()) {
    const std::string p = tmpl + "/tokenizer_config.json";
    Json cfg = Json::parse(read_file(p));
    cfg["chat_template"] = chat_template;
    std::ofstream(p) << cfg.dump(2);
  }
  return tmpl;
}

ServerOptions default_options(const std::string& model_dir) {
  ServerOptions o;
  o.model_dir = model_dir;
  o.port = 0;
  o.engine.threads = 1;
  o.max_queue = 64;
  return o;
}

TestServer::TestServer(ServerOptions opt, bool wait) : srv(std::make_unique<Server>(std::move(opt))) {
  srv->start();
  if (wait && !srv->wait_loaded()) throw std::runtime_error("test server: load failed: " + srv->load_error());
}

TestServer::~TestServer() { srv->stop(); }

Json HttpResult::json() const { return Json::parse(body, nullptr, false); }

HttpResult raw_http(int port, const std::string& bytes, int timeout_ms) {
  HttpResult r;
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return r;
  }
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may refuse and close before reading everything
    off += size_t(n);
  }
  std::string in;
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now()).count();
    if (left <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, int(left)) <= 0) break;
    char buf[8192];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    in.append(buf, size_t(n));
    // A complete Content-Length response is enough (the connection may stay open).
    size_t he = in.find("\r\n\r\n");
    if (he != std::string::npos) {
      size_t cl = in.find("Content-Length: ");
      if (cl != std::string::npos && cl < he) {
        size_t len = std::stoul(in.substr(cl + 16));
        if (in.size() >= he + 4 + len) break;
      }
    }
  }
  ::close(fd);
  if (in.rfind("HTTP/1.1 ", 0) == 0) r.status = std::atoi(in.c_str() + 9);
  size_t he = in.find("\r\n\r\n");
  if (he != std::string::npos) {
    r.headers = in.substr(0, he);
    r.body = in.substr(he + 4);
  }
  return r;
}

HttpResult http(int port, const std::string& method, const std::string& path, const std::string& body,
                const std::vector<std::pair<std::string, std::string>>& headers) {
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  for (const auto& [k, v] : headers) req += k + ": " + v + "\r\n";
  if (method != "GET" || !body.empty())
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  return raw_http(port, req, 30000);
}

SseResult sse_post(int port, const std::string& path, const Json& body, const std::function<bool(const Json&)>& on_event,
                   const std::string& api_key) {
  SseResult out;
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(60, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  if (!api_key.empty()) req.set_header("Authorization", "Bearer " + api_key);
  std::string buf, raw;
  bool stop = false;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    raw.append(data, n);
    buf.append(data, n);
    size_t p;
    while ((p = buf.find("\n\n")) != std::string::npos) {
      std::string ev = buf.substr(0, p);
      buf.erase(0, p + 2);
      if (ev.rfind("data: ", 0) != 0) continue;  // comments (keep-alive)
      std::string d = ev.substr(6);
      if (d == "[DONE]") {
        out.done = true;
        continue;
      }
      out.events.push_back(Json::parse(d, nullptr, false));
      if (on_event && !on_event(out.events.back())) {
        stop = true;
        return false;
      }
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  cli.send(req, res, err);
  out.status = res.status;
  if (err != httplib::Error::Success && !stop) out.error = httplib::to_string(err);
  if (out.status != 200 && out.events.empty()) out.events.push_back(Json::parse(raw + res.body, nullptr, false));
  return out;
}

std::string stream_text(const SseResult& r, const char* field) {
  std::string s;
  for (const auto& e : r.events) {
    if (!e.contains("choices") || e["choices"].empty()) continue;
    const Json& c = e["choices"][0];
    if (c.contains("delta")) {
      if (c["delta"].contains(field)) s += c["delta"][field].get<std::string>();
    } else if (c.contains("text") && std::string(field) == "content") {
      s += c["text"].get<std::string>();
    }
  }
  return s;
}

double metric(int port, const std::string& sample) {
  HttpResult r = http(port, "GET", "/metrics");
  std::istringstream in(r.body);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(sample + " ", 0) == 0) return std::stod(line.substr(sample.size() + 1));
  return -1;
}

bool healthy(int port) { return http(port, "GET", "/health").status == 200; }

}  // namespace dq::server::testing
