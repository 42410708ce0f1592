// Text tools: tokenize, template, perplexity.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "app/cli_common.h"
#include "chat/template.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "runtime/perplexity.h"
#include "text/model_text.h"

namespace dq::app {

namespace {

text::TextConfig load_text(const std::string& dir) { return text::TextConfig::load(dir); }

// "true"/"false" flags as the issue spells them.
bool parse_bool(const std::string& v, const char* flag) {
  if (v == "true" || v == "1") return true;
  if (v == "false" || v == "0") return false;
  fail("{}: expected true or false, got \"{}\"", flag, v);
}

}  // namespace

Command add_tokenize(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenize", "print the token ids of a text as a JSON array");
  auto dir = std::make_shared<std::string>();
  auto textarg = std::make_shared<std::string>();
  auto no_special = std::make_shared<bool>(false);
  cmd->add_option("-m,--model", *dir, "model folder (only tokenizer.json is needed)")->required();
  cmd->add_option("TEXT", *textarg, "the text")->required();
  cmd->add_flag("--no-special", *no_special, "treat special-token strings as plain text");
  return {cmd, [dir, textarg, no_special]() {
            auto tok = text::Tokenizer::load(*dir + "/tokenizer.json");
            auto ids = tok.encode(*textarg, !*no_special);
            std::printf("%s\n", nlohmann::json(ids).dump().c_str());
            return 0;
          }};
}

Command add_template(CLI::App& app) {
  auto* cmd = app.add_subcommand("template", "render a conversation with the model's chat template");
  auto dir = std::make_shared<std::string>();
  auto messages = std::make_shared<std::string>();
  auto gen = std::make_shared<std::string>("true");
  auto think = std::make_shared<std::string>();
  cmd->add_option("-m,--model", *dir, "model folder")->required();
  cmd->add_option("--messages", *messages, "JSON file: a list of messages, or {\"messages\": [...], \"tools\": [...]}")
      ->required();
  cmd->add_option("--add-generation-prompt", *gen, "true or false (default true)");
  cmd->add_option("--enable-thinking", *think, "true or false (default: not passed to the template)");
  return {cmd, [dir, messages, gen, think]() {
            auto tc = load_text(*dir);
            if (tc.chat_template.empty()) fail("{}: the model has no chat template (tokenizer_config.json)", *dir);
            chat::Json in;
            try {
              in = chat::Json::parse(read_text_file(*messages));
            } catch (const chat::Json::exception& e) {
              fail("{}: not valid JSON: {}", *messages, e.what());
            }
            chat::ChatInput ci;
            if (in.is_array()) {
              ci.messages = in;
            } else if (in.is_object() && in.contains("messages")) {
              ci.messages = in["messages"];
              if (in.contains("tools")) ci.tools = in["tools"];
            } else {
              fail("{}: expected a list of messages or an object with \"messages\"", *messages);
            }
            if (!ci.messages.is_array()) fail("{}: \"messages\" must be a list", *messages);
            ci.add_generation_prompt = parse_bool(*gen, "--add-generation-prompt");
            if (!think->empty()) ci.enable_thinking = parse_bool(*think, "--enable-thinking");
            ci.bos_token = tc.bos_token.value_or("");
            ci.eos_token = tc.eos_token.value_or("");
            std::string out = chat::apply(chat::Template::parse(tc.chat_template), ci);
            std::fwrite(out.data(), 1, out.size(), stdout);
            return 0;
          }};
}

Command add_perplexity(CLI::App& app) {
  auto* cmd = app.add_subcommand("perplexity", "mean negative log-likelihood and perplexity of a text file");
  auto f = std::make_shared<EngineFlags>();
  auto file = std::make_shared<std::string>();
  auto window = std::make_shared<int>(256);
  f->add(cmd);
  cmd->add_option("FILE", *file, "text file")->required();
  cmd->add_option("--window", *window, "tokens per window; each full window is scored from a fresh state")
      ->check(CLI::Range(2, 1 << 20));
  return {cmd, [f, file, window]() {
            auto tc = load_text(f->model);
            std::string txt = read_text_file(*file, size_t(1) << 30);
            std::vector<int32_t> ids = tc.tokenizer->encode(txt);
            EngineOptions opt = f->options();
            opt.max_ctx = std::max(opt.max_ctx, *window);
            auto e = Engine::open(f->model, opt);
            NllResult r = mean_nll(*e, ids, *window);
            std::printf("%s: %zu tokens, %zu windows of %d, %zu predictions\n", file->c_str(), ids.size(), r.windows,
                        *window, r.predictions);
            std::printf("mean NLL %.6f nats/token, perplexity %.2f (%s)\n", r.mean_nll, std::exp(r.mean_nll),
                        e->backend().name().c_str());
            return 0;
          }};
}

}  // namespace dq::app
