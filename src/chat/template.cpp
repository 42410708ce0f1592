#include "chat/template.h"

#include "chat/ast.h"
#include "chat/builtins.h"
#include "chat/interp.h"

namespace dq::chat {

Template Template::parse(std::string_view source) {
  Template t;
  t.program_ = parse_program(source);
  return t;
}

namespace {

ScopePtr globals_scope() {
  auto g = std::make_shared<Scope>();
  for (const char* name : {"range", "dict", "namespace", "raise_exception", "strftime_now", "lipsum", "cycler", "joiner"}) {
    auto c = std::make_shared<CallableData>();
    c->kind = CallableData::Kind::Builtin;
    c->name = name;
    g->set(name, Value::callable(std::move(c)));
  }
  return g;
}

[[noreturn]] void input_error(const std::string& msg) {
  throw TemplateError(TemplateError::Kind::Runtime, "chat template: " + msg);
}

std::string render_scope(const Program& prog, const ScopePtr& scope, const Limits& limits) {
  Interp in(prog, limits);
  try {
    return in.render(scope);
  } catch (const EvalError& e) {  // not attributed to a node (should not happen)
    input_error(e.msg);
  }
}

}  // namespace

std::string Template::render(const Json& context, const Limits& limits) const {
  if (!context.is_object()) input_error("the render context must be a JSON object");
  auto scope = std::make_shared<Scope>(globals_scope());
  try {
    for (auto it = context.begin(); it != context.end(); ++it) scope->set(it.key(), from_json(it.value()));
  } catch (const EvalError& e) {
    input_error(e.msg);
  }
  return render_scope(*program_, scope, limits);
}

std::string apply(const Template& tmpl, const ChatInput& in, const Limits& limits) {
  if (!in.messages.is_array()) input_error("messages must be a JSON array");
  if (!in.tools.is_null() && !in.tools.is_array()) input_error("tools must be a JSON array or null");
  if (!in.extra.is_object()) input_error("extra chat_template_kwargs must be a JSON object");
  // HF: render(messages=..., tools=..., documents=..., add_generation_prompt=...,
  //            **special_tokens_map, **kwargs); kwargs override the special tokens.
  Json ctx = Json::object();
  if (!in.bos_token.empty()) ctx["bos_token"] = in.bos_token;
  if (!in.eos_token.empty()) ctx["eos_token"] = in.eos_token;
  for (auto it = in.extra.begin(); it != in.extra.end(); ++it) {
    const std::string& k = it.key();
    if (k == "messages" || k == "tools" || k == "documents" || k == "add_generation_prompt")
      input_error("chat_template_kwargs may not set '" + k + "'");
    ctx[k] = it.value();
  }
  if (in.enable_thinking) ctx["enable_thinking"] = *in.enable_thinking;
  ctx["messages"] = in.messages;
  ctx["tools"] = in.tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = in.add_generation_prompt;
  return tmpl.render(ctx, limits);
}

}  // namespace dq::chat
