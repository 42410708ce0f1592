// The engine worker: one thread that loads the model, then runs queued jobs in arrival order
// (FIFO). HTTP threads build a Job, submit it, and read its events (text pieces, then the result
// or an error) as the worker produces them; each job streams on its own.
//
// With parallel = 1 it runs one job at a time through a Generator (the engine's own sequence).
// With parallel = N > 1 it keeps up to N jobs running (worker_batched.cpp): each in a slot of a
// Batcher, admitted from the same FIFO while a slot is free; every iteration feeds one prefill
// chunk of a newly admitted prompt and then one batched decode step for all running sequences.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "chat/template.h"
#include "runtime/batcher.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "server/api.h"
#include "text/model_text.h"

namespace dq::server {

using Clock = std::chrono::steady_clock;

// One generation request travelling from an HTTP thread to the worker and back.
struct Job {
  GenerateRequest req;
  Clock::time_point deadline;
  std::atomic<bool> cancelled{false};  // set by the HTTP side: client gone, timed out
  Clock::time_point submitted = Clock::now();

  std::mutex mu;
  std::condition_variable cv;
  // guarded by mu:
  std::deque<std::string> pieces;  // text not yet taken by the HTTP side
  bool started = false;
  bool finished = false;
  GenerateResult result;
  std::optional<ApiError> error;

  // Waits (up to `for_`) for news: a piece or the end. Returns true if there is any.
  bool wait_news(std::chrono::milliseconds for_);
};

// What the worker loaded.
struct Model {
  text::TextConfig text;
  std::string template_source;
  std::optional<chat::Template> tmpl;
  std::string template_error;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Batcher> batcher;  // --parallel > 1: its slots, allocated while loading
};

class Worker {
 public:
  struct Options {
    std::string model_dir;
    EngineOptions engine;
    std::string chat_template_file;  // replaces the checkpoint's template when set
    size_t max_queue = 64;           // waiting jobs; more are refused (429)
    size_t prompt_cache_bytes = 0;   // saved states at prompts' ends (PromptCache); 0: none
    int parallel = 1;                // sequences decoded together (Batcher slots); 1: one at a time
    std::function<void()> before_job;   // test hook: runs on the worker before each job
    std::function<void()> before_load;  // test hook: runs on the worker before loading
  };
  enum class State { Loading, Ready, Failed, Stopped };

  explicit Worker(Options opt);
  ~Worker();

  void start();  // starts the thread; loading begins at once
  void stop();   // cancels the running job, fails the queued ones (503), joins

  State state() const { return state_.load(); }
  std::string load_error() const;
  double load_progress() const { return progress_.load(); }
  std::string load_phase() const;
  double load_seconds() const;
  // Blocks until the model is ready or failed (or the worker stopped); true when ready.
  bool wait_loaded();

  // Valid once state() == Ready (they never change afterwards).
  const text::TextConfig& text() const;
  const chat::Template* chat_template() const;  // null when the model has none
  const std::string& chat_template_source() const;
  const std::string& chat_template_error() const;  // the parse error of a template that did not parse
  int max_ctx() const;
  int vocab_size() const;
  std::string backend_name() const;

  // Queues a job; false when the queue is full (or the worker is not ready).
  bool submit(const std::shared_ptr<Job>& job);
  size_t queue_depth() const;
  bool running() const { return running_.load() > 0; }
  int running_count() const { return running_.load(); }  // jobs being generated now

  // Cumulative counters of finished jobs.
  struct Stats {
    uint64_t jobs = 0, cancelled = 0, timed_out = 0, failed = 0;
    uint64_t prompt_tokens = 0, completion_tokens = 0;
    uint64_t cached_tokens = 0;    // prompt tokens not fed again (the engine's history or a saved state)
    uint64_t cache_restores = 0;   // prompts that continued from a saved state
    uint64_t cache_saves = 0;      // states saved at a prompt's end
    size_t cache_bytes = 0, cache_entries = 0;  // what the prompt cache holds now
    double prompt_seconds = 0, gen_seconds = 0;
    double last_prompt_tps = 0, last_gen_tps = 0;
  };
  Stats stats() const;

 private:
  void run();
  void run_batched(PromptCache& cache);  // parallel > 1 (worker_batched.cpp)
  // The job's keep_going: not cancelled, not past its deadline, the worker not stopping.
  bool keep_going(const Job& j) const { return !j.cancelled && !stopping_ && Clock::now() < j.deadline; }
  void load();
  void finish(Job& job, GenerateResult r);
  void finish(Job& job, GenerateResult r, const PromptCache& cache);  // also takes the cache's figures
  void fail(Job& job, ApiError e);

  Options opt_;
  std::thread thread_;
  std::atomic<State> state_{State::Loading};
  std::atomic<double> progress_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<int> running_{0};
  Clock::time_point load_start_, load_end_;

  mutable std::mutex mu_;  // guards queue_, stats_, load_error_, phase_
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  Stats stats_;
  std::string load_error_;
  std::string phase_ = "starting";
  std::unique_ptr<Model> model_;
};

}  // namespace dq::server
