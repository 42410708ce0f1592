// deltaq chat: an interactive chat with the checkpoint's own chat template. Multi-line input
// (end a line with \ to continue), /reset, /think and /nothink, Ctrl-C stops a reply (Ctrl-C or
// Ctrl-D at the prompt quits), tok/s after each reply.
#include <csignal>

#include <atomic>
#include <cstdio>
#include <iostream>
#include <string>

#include "app/cli_common.h"
#include "chat/template.h"
#include "core/error.h"
#include "runtime/generator.h"
#include "text/model_text.h"

namespace dq::app {

namespace {

std::atomic<bool> g_generating{false};
std::atomic<bool> g_interrupted{false};

void on_sigint(int) {
  if (g_generating.load()) {
    g_interrupted.store(true);
  } else {
    std::signal(SIGINT, SIG_DFL);
    raise(SIGINT);
  }
}

// Reads one message: lines ending with a backslash continue it. False at end of input.
bool read_message(std::string* out) {
  out->clear();
  std::string line;
  std::fputs("> ", stdout);
  std::fflush(stdout);
  while (std::getline(std::cin, line)) {
    if (!line.empty() && line.back() == '\\') {
      line.pop_back();
      *out += line + "\n";
      std::fputs(". ", stdout);
      std::fflush(stdout);
      continue;
    }
    *out += line;
    return true;
  }
  return !out->empty();
}

}  // namespace

Command add_chat(CLI::App& app) {
  auto* cmd = app.add_subcommand("chat", "interactive chat with the model's chat template");
  auto f = std::make_shared<EngineFlags>();
  auto sp = std::make_shared<SamplingFlags>();
  auto system = std::make_shared<std::string>();
  auto think = std::make_shared<std::string>();
  auto n = std::make_shared<int>(2048);
  f->add(cmd);
  sp->add(cmd);
  cmd->add_option("--system", *system, "system message");
  cmd->add_option("--think", *think, "on or off: enable_thinking for the template (default: the template's own)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("-n,--max-tokens", *n, "tokens per reply")->check(CLI::Range(1, 1 << 24));
  auto cache_mb = std::make_shared<size_t>(1024);
  cmd->add_option("--prompt-cache", *cache_mb,
                  "MB of host memory for the state saved where the last prompt's messages end: the next turn "
                  "continues from there even when the template drops the reply's reasoning (0: off; default 1024)")
      ->check(CLI::Range(size_t(0), size_t(1) << 24));
  return {cmd, [f, sp, system, think, n, cache_mb]() {
            auto tc = text::TextConfig::load(f->model);
            if (tc.chat_template.empty())
              fail("{}: this model has no chat template (tokenizer_config.json); use deltaq run -p for plain text",
                   f->model);
            auto tmpl = chat::Template::parse(tc.chat_template);
            auto e = Engine::open(f->model, f->options());
            // One conversation: only the last prompt's state is a prefix of the next turn.
            PromptCache cache(*cache_mb << 20, 1);
            Generator gen(*e, tc, *cache_mb ? &cache : nullptr);
            std::optional<bool> thinking;
            if (!think->empty()) thinking = *think == "on";
            chat::Json history = chat::Json::array();
            auto reset = [&] {
              history = chat::Json::array();
              if (!system->empty()) history.push_back({{"role", "system"}, {"content", *system}});
            };
            reset();
            // <|im_end|> ends an assistant turn in Qwen templates even where config.json lists another eos.
            std::vector<int32_t> stop_ids;
            if (auto id = tc.tokenizer->token_to_id("<|im_end|>")) stop_ids.push_back(*id);
            std::signal(SIGINT, on_sigint);
            std::printf("deltaq chat: %s on %s\n/reset clears the conversation, /think and /nothink switch thinking, "
                        "a line ending in \\ continues, Ctrl-C stops a reply, Ctrl-D quits.\n",
                        f->model.c_str(), e->backend().name().c_str());
            std::string msg;
            while (read_message(&msg)) {
              if (msg.empty()) continue;
              if (msg == "/quit" || msg == "/exit") break;
              if (msg == "/reset") {
                reset();
                std::printf("(conversation cleared)\n");
                continue;
              }
              if (msg == "/think" || msg == "/nothink") {
                thinking = msg == "/think";
                std::printf("(thinking %s)\n", *thinking ? "on" : "off");
                continue;
              }
              history.push_back({{"role", "user"}, {"content", msg}});
              chat::ChatInput in;
              in.messages = history;
              in.enable_thinking = thinking;
              in.bos_token = tc.bos_token.value_or("");
              in.eos_token = tc.eos_token.value_or("");
              GenerateRequest req;
              req.prompt = tc.tokenizer->encode(chat::apply(tmpl, in));
              if (*cache_mb) {  // saved where the messages end: the next turn goes on from there
                in.add_generation_prompt = false;
                try {
                  req.save_at = chat_messages_end(req.prompt, tc.tokenizer->encode(chat::apply(tmpl, in)));
                } catch (const std::exception&) {
                }
              }
              req.sampling = sp->params();
              req.max_tokens = *n;
              req.stop = sp->stop;
              req.stop_ids = stop_ids;
              g_interrupted = false;
              g_generating = true;
              GenerateResult r;
              try {
                r = gen.generate(
                    req,
                    [](std::string_view piece) {
                      std::fwrite(piece.data(), 1, piece.size(), stdout);
                      std::fflush(stdout);
                      return true;
                    },
                    [] { return !g_interrupted.load(); });
              } catch (const Error& err) {
                g_generating = false;
                std::printf("\n(error: %s)\n", err.what());
                history.erase(history.size() - 1);
                continue;
              }
              g_generating = false;
              std::printf("\n[%d tokens, %.1f tok/s; prompt %d tokens, %d of them reused%s]\n",
                          r.completion_tokens, r.completion_tokens / std::max(r.gen_seconds, 1e-9), r.prompt_tokens,
                          r.cached_tokens,
                          r.finish_reason == "cancelled" ? ", stopped" : r.finish_reason == "length" ? ", length limit" : "");
              history.push_back({{"role", "assistant"}, {"content", r.text}});
            }
            std::printf("\n");
            return 0;
          }};
}

}  // namespace dq::app
