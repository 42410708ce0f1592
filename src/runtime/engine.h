// The engine: one model folder loaded on one backend, with a sequence state and a queue.
// It is what the CLI and the server use; everything below it is backend-neutral.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_runner.h"
#include "format/checkpoint.h"
#include "model/qwen35.h"
#include "runtime/prompt_cache.h"

namespace dq {

struct EngineOptions {
  std::string device = "cpu";  // "cpu", "cuda" (device 0) or "cuda:N" (parse_device)
  CpuKernels cpu_kernels = CpuKernels::Auto;
  int threads = 0;            // CPU threads, 0 = all
  int max_ctx = 4096;         // KV cache length (clamped to the model's max_position_embeddings)
  int prefill_chunk = 0;      // tokens per prefill forward; 0: the backend's (CPU 64, CUDA 256)
  bool use_graph = true;      // replay the recorded decode step (off: issue its ops one by one)
};

// A --device value: "cpu", "cuda" (CUDA device 0) or "cuda:N" (device N, 0 <= N < 1024).
struct DeviceSpec {
  bool cuda = false;
  int index = 0;  // the CUDA device number
};
// Throws dq::Error naming the value and the accepted forms when it is none of them.
DeviceSpec parse_device(const std::string& device);

// Makes the backend named by opt.device; throws dq::Error with a clear message when it is unavailable.
std::unique_ptr<Backend> make_backend(const EngineOptions& opt);
bool cuda_available(std::string* why = nullptr, int device = 0);

// A draw the engine makes on the backend: temperature and min-p over the whole row
// (op::SampleDraw), or with top_k >= 1 (and top_p) from op::TopK's pairs (op::TopDraw).
struct DrawParams {
  float temperature = 1.0f, min_p = 0.0f;
  int top_k = 0;       // 0: none
  float top_p = 1.0f;  // 1: none
  bool plain() const { return top_k <= 0 && !(top_p < 1.0f); }
  bool operator==(const DrawParams&) const = default;
};

// Enqueues a draw from one logits row on the backend (op::SampleDraw for a plain draw, else
// op::TopK then op::TopDraw) into drawn (i32; -1: declined, the row decides) and out2 when set.
// top_ids / top_vals hold op::TopK::kMax entries (unused by a plain draw); top_k must be in
// [1, TopK::kMax - 1] unless the draw is plain (Engine::check_draw).
void enqueue_draw(Queue& q, Ref logits, int vocab, const DrawParams& d, double u, Ref top_ids, Ref top_vals,
                  Ref drawn, Ref out2);
// Throws dq::Error when the backend cannot draw with d (top_k out of that range).
void check_draw(const DrawParams& d, int vocab);

class Engine {
 public:
  static std::unique_ptr<Engine> open(const std::string& dir, const EngineOptions& opt = {});
  ~Engine();

  const Checkpoint& checkpoint() const { return ck_; }
  const ModelConfig& config() const { return ck_.config(); }
  // Tokens per prefill forward (EngineOptions::prefill_chunk, 0 resolved by the backend).
  int prefill_chunk() const { return opt_.prefill_chunk; }
  bool uses_graph() const { return opt_.use_graph; }
  const Qwen35& model() const { return *model_; }
  Backend& backend() { return *be_; }
  Queue& queue() { return *q_; }
  int position() const { return pos_; }
  int max_ctx() const { return model_->max_ctx(); }
  size_t state_bytes() const { return state_.bytes + act_.bytes + act1_.bytes; }

  // Starts a new sequence.
  void reset();
  // The tokens the sequence state holds, in order (positions 0 .. position() - 1).
  const std::vector<int32_t>& history() const { return history_; }
  // Prefix reuse: when ids extends history() by at least one token, keeps the state and returns
  // history().size() (the caller feeds only the rest); otherwise resets and returns 0. (The
  // recurrent state cannot be rewound, so only a whole-history prefix is reused.)
  int reuse_prefix(std::span<const int32_t> ids);
  // A copy of the sequence state in host memory, with the history it holds (any step issued
  // ahead is accounted first), in `storage` when it is large enough (PromptCache::take_spare).
  std::shared_ptr<StateSnapshot> snapshot(std::vector<uint8_t> storage = {});
  // Makes the state a snapshot's (of this model: its size is checked): history() is then its
  // tokens. As after reset(), the next call feeds at least one token.
  void restore(const StateSnapshot& s);
  // Teacher-forced logits of a fresh sequence: row i = logits after ids[0..i]. [n][vocab]
  std::vector<float> score(std::span<const int32_t> ids);
  // Feeds tokens at the current position; returns the argmax after the last one and, if asked,
  // its logits.
  int32_t feed(std::span<const int32_t> ids, std::vector<float>* last_logits = nullptr);
  // One decode step (the recorded graph): feeds one token, returns the argmax of the next.
  int32_t step(int32_t token, std::vector<float>* logits = nullptr);
  // One greedy decode step whose input is the previous argmax, already on the device. On a
  // backend whose queue overlaps (CUDA), the step that feeds the returned token is issued before
  // this returns (the device never waits for the host between tokens): the state then holds
  // that token too, which history() shows once any other call has waited for it. A later call
  // that feeds the same token takes that step's result; one that feeds another token rebuilds
  // the state without it (a prefill of the history).
  int32_t step_greedy();
  // Waits for a step step_greedy() issued ahead: the history then ends with the token it fed
  // (what later calls continue from).
  void sync();
  // One decode step that brings back only the n largest logits (op::TopK: ids and values,
  // descending, ties by the lower id; n <= 256) instead of the whole row; with `total`, also the
  // row's weight sum at `temperature` (op::SampleDraw's total, for top-p).
  void step_top(int32_t token, int n, std::vector<int32_t>* ids, std::vector<float>* vals, double* total = nullptr,
                float temperature = 1.0f);
  // One decode step that draws the next token on the backend (op::SampleDraw: plain temperature
  // sampling with the uniform u); only the id comes back, or -1 when the draw declines.
  int32_t step_draw(int32_t token, float temperature, float min_p, double u);
  // The same with top_k (>= 1, then op::TopK's top_k + 1 pairs and op::TopDraw: the id, or -1
  // when they do not decide it) and top_p.
  int32_t step_draw(int32_t token, const DrawParams& d, double u);
  // step_draw pipelined as step_greedy is: the draw also writes its id as the next step's input
  // on the device, and on a queue that overlaps (CUDA) the step feeding the returned id is
  // issued, with its own draw, before this returns. A later call with that id takes that step;
  // another id rebuilds the state. Uniforms come from next_u in draw order (*u: the one of the
  // returned draw); a draw issued ahead and then taken back keeps its uniform for the next
  // draw, so the ids are step_draw's with the same uniforms on every backend. -1 when the draw
  // declines (the state then holds `token` and read_logits() gives its row).
  int32_t step_draw_ahead(int32_t token, float temperature, float min_p, const std::function<double()>& next_u,
                          double* u);
  int32_t step_draw_ahead(int32_t token, const DrawParams& d, const std::function<double()>& next_u, double* u);
  // The whole logits row of the last step (after step_top, when its values did not decide).
  void read_logits(std::vector<float>* logits);
  // Residual stream of a fresh prefill of ids: [0] embeddings, [i] after layer i-1 ([L+1][n][H]).
  std::vector<std::vector<float>> layer_outputs(std::span<const int32_t> ids);

 private:
  Engine(Checkpoint ck) : ck_(std::move(ck)) {}
  void check_ids(std::span<const int32_t> ids) const;
  int32_t run_step(std::vector<float>* logits, int32_t token);
  // Writes `token` as the step's input, issues the step and the read of its argmax into *next.
  // Returns false (and issues only the read) when step_greedy() already fed `token` ahead.
  bool issue_step(int32_t token, int32_t* next);
  // Waits for the step step_greedy() issued ahead, if any, and accounts it (position, history).
  void settle();
  // The same for the step ending at `mark` (it fed last_next_; its argmax is ahead_next_[slot]).
  void take_step_ahead(uint64_t mark, int slot);
  // Before a call feeds `token` next: settles; true when the state already holds `token` fed
  // ahead (its step's results are the ones in act1_); rebuilds the state without the token
  // fed ahead when it is another one.
  bool consume_ahead(int32_t token);
  // Issues the decode step fed from the device (the last argmax) and the read of its argmax.
  void issue_ahead();
  // The same for a draw: the step fed from the device, its draw (op::SampleDraw writing the
  // next input) with uniform u, and the read of the drawn id.
  void issue_draw_ahead(const DrawParams& d, double u);
  // The draw's ops on the step's logits into drawn_[slot] (feed: also as the next step's input).
  void issue_draw(const DrawParams& d, double u, bool feed, int slot = 0);
  // Issues the decode step (the recorded graph of `slot`, or the forward): its argmax lands in
  // step_next_[slot].
  void replay_step(int slot);
  void check_draw(const DrawParams& d) const;
  // After settle(): the state without the token fed ahead (a prefill of the history).
  void drop_ahead();
  // The end of a step issued by issue_step: accounts it when it was new, else just waits.
  void finish_step(bool fresh, int32_t token);
  // Waits for the stage that fed `fed` at position() (the state then holds them).
  void wait_fed(std::span<const int32_t> fed);
  void write_tokens(const Activations& a, std::span<const int32_t> ids);

  Checkpoint ck_;
  EngineOptions opt_;
  std::unique_ptr<Backend> be_;
  std::unique_ptr<Qwen35> model_;
  std::unique_ptr<Queue> q_;
  SequenceState state_;
  Activations act_;   // prefill chunks
  Activations act1_;  // decode step (its graph is recorded once)
  // The decode step recorded twice, its argmax into step_next_[0] (act1_.next) or [1]: two
  // steps in flight read theirs back from different readback buffers (Backend::alloc_readback:
  // the host copies them at the wait, after the next step may have started).
  std::unique_ptr<Graph> step_graph_[2];
  Ref step_next_[2];
  int last_slot_ = 0;  // the slot of the last step issued
  Buffer top_ids_, top_vals_;  // op::TopK results of a step
  Buffer drawn_[2], total_;    // op::SampleDraw results of a step (readback; [1]: issued ahead in turn)
  int pos_ = 0;
  std::vector<int32_t> history_;  // tokens the state holds
  bool history_ok_ = true;        // false while (or after) a call that changes the state failed
  int32_t last_next_ = 0;         // the last argmax: step_greedy's input, already on the device
  // The pipelined greedy decode (step_greedy on a queue that overlaps).
  bool ahead_ = false;       // a step feeding last_next_ is issued and not yet waited for
  bool logits_in_chunk_ = false;  // the last forward was a prefill chunk (its row is in act_)
  bool fed_ahead_ = false;   // the state holds (or will) the last token step_greedy returned
  uint64_t ahead_mark_ = 0;  // the queue mark after that step
  int ahead_slot_ = 0;       // which of ahead_next_ its argmax lands in
  int32_t ahead_next_[2] = {0, 0};
  // The same for step_draw_ahead: the steps issued ahead draw (ahead_next_ gets the drawn id).
  bool ahead_draw_ = false;
  DrawParams ahead_params_;
  double ahead_u_[2] = {0, 0};       // each slot's uniform
  std::optional<double> spare_u_;    // the uniform of a draw taken back, for the next one
};

}  // namespace dq
