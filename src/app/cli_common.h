// Shared pieces of the deltaq command line: engine flags, id lists, measurements.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace dq::app {

// Registers -m/--model and the engine flags (--device, --threads, --kernels, --ctx) on `cmd`.
struct EngineFlags {
  std::string model;
  std::string device = "cpu";
  std::string kernels = "auto";
  int threads = 0;
  int ctx = 4096;
  int prefill_chunk = 0;  // 0: the backend's (CPU 64, CUDA 256)
  void add(CLI::App* cmd, bool model_required = true);
  EngineOptions options() const;
};

// Sampling flags shared by run and chat (--temp 0 = greedy, the default).
struct SamplingFlags {
  float temperature = 0.0f, top_p = 1.0f, min_p = 0.0f, presence = 0.0f, frequency = 0.0f, repetition = 1.0f;
  int top_k = 0;
  int64_t seed = -1;
  std::vector<std::string> stop;
  void add(CLI::App* cmd);
  SamplingParams params() const;
};

// "5,17,42" -> {5, 17, 42}; throws dq::Error naming the bad entry.
std::vector<int32_t> parse_ids(const std::string& s);
std::string join_ids(const std::vector<int32_t>& ids);

// Peak resident memory of this process, in bytes.
size_t peak_rss_bytes();
// The built-in demo model folder (models/demo-fortunes/mlx-4bit), or DELTAQ_DEMO_MODEL.
std::string demo_model_dir();

// Each command registers itself on the app; the returned pointer is checked after parsing.
using Runner = std::function<int()>;
struct Command {
  CLI::App* app;
  Runner run;
};
Command add_inspect(CLI::App& app);
Command add_score(CLI::App& app);
Command add_run(CLI::App& app);
Command add_make_model(CLI::App& app);
Command add_bench(CLI::App& app);
Command add_demo(CLI::App& app);
Command add_serve(CLI::App& app);     // when built with the server
Command add_tokenize(CLI::App& app);  // text commands: when built with the tokenizer
Command add_template(CLI::App& app);
Command add_perplexity(CLI::App& app);
Command add_chat(CLI::App& app);

}  // namespace dq::app
