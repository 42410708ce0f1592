#include "server/worker.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace dq::server {

bool Job::wait_news(std::chrono::milliseconds for_) {
  std::unique_lock<std::mutex> lk(mu);
  return cv.wait_for(lk, for_, [&] { return !pieces.empty() || finished; });
}

Worker::Worker(Options opt) : opt_(std::move(opt)) {}

Worker::~Worker() { stop(); }

void Worker::start() {
  load_start_ = Clock::now();
  thread_ = std::thread([this] { run(); });
}

void Worker::stop() {
  stopping_ = true;
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::deque<std::shared_ptr<Job>> left;
  {
    std::lock_guard<std::mutex> lk(mu_);
    left.swap(queue_);
  }
  ApiError e{503, "the server is shutting down", "server_error", "", "shutting_down"};
  for (auto& j : left) fail(*j, e);
  if (state_ != State::Failed) state_ = State::Stopped;
}

std::string Worker::load_error() const {
  std::lock_guard<std::mutex> lk(mu_);
  return load_error_;
}

std::string Worker::load_phase() const {
  std::lock_guard<std::mutex> lk(mu_);
  return phase_;
}

double Worker::load_seconds() const {
  auto end = state_ == State::Loading ? Clock::now() : load_end_;
  return std::chrono::duration<double>(end - load_start_).count();
}

bool Worker::wait_loaded() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return state_ != State::Loading; });
  return state_ == State::Ready;
}

const text::TextConfig& Worker::text() const { return model_->text; }
const chat::Template* Worker::chat_template() const { return model_->tmpl ? &*model_->tmpl : nullptr; }
const std::string& Worker::chat_template_source() const { return model_->template_source; }
const std::string& Worker::chat_template_error() const { return model_->template_error; }
int Worker::max_ctx() const { return model_->engine->max_ctx(); }
int Worker::vocab_size() const { return model_->engine->config().vocab_size; }
std::string Worker::backend_name() const { return model_->engine->backend().name(); }

size_t Worker::queue_depth() const {
  std::lock_guard<std::mutex> lk(mu_);
  return queue_.size();
}

Worker::Stats Worker::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

bool Worker::submit(const std::shared_ptr<Job>& job) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (state_ != State::Ready || stopping_ || queue_.size() >= opt_.max_queue) return false;
    queue_.push_back(job);
  }
  cv_.notify_all();
  return true;
}

void Worker::load() {
  if (opt_.before_load) opt_.before_load();
  auto m = std::make_unique<Model>();
  auto phase = [&](const char* p, double progress) {
    std::lock_guard<std::mutex> lk(mu_);
    phase_ = p;
    progress_ = progress;
  };
  phase("tokenizer", 0.05);
  m->text = text::TextConfig::load(opt_.model_dir);
  m->template_source = m->text.chat_template;
  if (!opt_.chat_template_file.empty()) {
    std::ifstream f(opt_.chat_template_file, std::ios::binary);
    if (!f) dq::fail("--chat-template: cannot read {}", opt_.chat_template_file);
    std::stringstream ss;
    ss << f.rdbuf();
    m->template_source = ss.str();
  }
  if (!m->template_source.empty()) {
    try {
      m->tmpl = chat::Template::parse(m->template_source);
    } catch (const chat::TemplateError& e) {
      if (!opt_.chat_template_file.empty()) throw;  // the operator asked for this one: fail loudly
      m->template_error = e.what();
      std::fprintf(stderr, "deltaq serve: warning: the model's chat template does not parse (%s); "
                   "/v1/chat/completions will answer 500\n", e.what());
    }
  }
  phase("weights", 0.15);
  m->engine = Engine::open(opt_.model_dir, opt_.engine);
  if (opt_.parallel > 1) {  // a failure here (memory) is a load error, not a dead worker later
    phase("slots", 0.95);
    m->batcher = std::make_unique<Batcher>(*m->engine, opt_.parallel);
  }
  phase("ready", 1.0);
  model_ = std::move(m);
}

void Worker::run() {
  try {
    load();
    std::lock_guard<std::mutex> lk(mu_);
    load_end_ = Clock::now();
    state_ = State::Ready;
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lk(mu_);
    load_end_ = Clock::now();
    load_error_ = e.what();
    phase_ = "failed";
    state_ = State::Failed;
  }
  cv_.notify_all();
  if (state_ != State::Ready) return;

  PromptCache cache(opt_.prompt_cache_bytes);
  if (opt_.parallel > 1) return run_batched(cache);
  Generator gen(*model_->engine, model_->text, opt_.prompt_cache_bytes ? &cache : nullptr);
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      running_ = 1;
    }
    if (opt_.before_job) opt_.before_job();
    Job& j = *job;
    {
      std::lock_guard<std::mutex> lk(j.mu);
      j.started = true;
    }
    auto keep_going = [&] { return this->keep_going(j); };
    if (!keep_going()) {
      GenerateResult r;
      r.finish_reason = "cancelled";
      r.prompt_tokens = int(j.req.prompt.size());
      finish(j, std::move(r));
    } else {
      try {
        GenerateResult r = gen.generate(
            j.req,
            [&](std::string_view piece) {
              {
                std::lock_guard<std::mutex> lk(j.mu);
                j.pieces.emplace_back(piece);
              }
              j.cv.notify_all();
              return keep_going();
            },
            keep_going);
        finish(j, std::move(r), cache);
      } catch (const std::exception& e) {
        fail(j, ApiError{500, std::string("generation failed: ") + e.what(), "server_error", "", "generation_failed"});
      }
    }
    running_ = 0;
  }
}

void Worker::finish(Job& job, GenerateResult r, const PromptCache& cache) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.cached_tokens += uint64_t(r.cached_tokens);
    stats_.cache_restores += r.cache_restored;
    stats_.cache_saves += r.cache_saved;
    stats_.cache_bytes = cache.bytes();
    stats_.cache_entries = cache.count();
  }
  finish(job, std::move(r));
}

void Worker::finish(Job& job, GenerateResult r) {
  const bool timed_out = r.finish_reason == "cancelled" && !job.cancelled && Clock::now() >= job.deadline;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.jobs;
    if (r.finish_reason == "cancelled") ++(timed_out ? stats_.timed_out : stats_.cancelled);
    stats_.prompt_tokens += uint64_t(r.prompt_tokens);
    stats_.completion_tokens += uint64_t(r.completion_tokens);
    stats_.prompt_seconds += r.prompt_seconds;
    stats_.gen_seconds += r.gen_seconds;
    if (r.prompt_seconds > 0) stats_.last_prompt_tps = r.prompt_tokens / r.prompt_seconds;
    if (r.gen_seconds > 0) stats_.last_gen_tps = r.completion_tokens / r.gen_seconds;
  }
  {
    std::lock_guard<std::mutex> lk(job.mu);
    if (timed_out)
      job.error = ApiError{504, "the request timed out (--request-timeout)", "server_error", "", "timeout"};
    else if (r.finish_reason == "cancelled" && stopping_)
      job.error = ApiError{503, "the server is shutting down", "server_error", "", "shutting_down"};
    job.result = std::move(r);
    job.finished = true;
  }
  job.cv.notify_all();
}

void Worker::fail(Job& job, ApiError e) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.jobs;
    ++stats_.failed;
  }
  {
    std::lock_guard<std::mutex> lk(job.mu);
    job.error = std::move(e);
    job.finished = true;
  }
  job.cv.notify_all();
}

}  // namespace dq::server
