// The tree-walking interpreter: statements, expressions, scopes, macros, attribute access.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chat/ast.h"
#include "chat/stack_guard.h"
#include "chat/value.h"

namespace dq::chat {

// Variables of one scope; lookups walk the parent chain. A for-loop iteration, a macro call,
// a with/filter/set block each get a scope of their own, as jinja2's frames do.
struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;

  explicit Scope(std::shared_ptr<Scope> p = nullptr) : parent(std::move(p)) {}
  const Value* find_local(std::string_view name) const;
  const Value* find(std::string_view name) const;
  void set(std::string_view name, Value v);
};
using ScopePtr = std::shared_ptr<Scope>;

class Interp {
 public:
  Interp(const Program& prog, const Limits& limits);
  // Renders the program with `scope` as the template's top-level scope.
  std::string render(const ScopePtr& scope);

  Budget budget;

  // Python/jinja2 semantics used by the builtins as well.
  Value getattr(const Value& obj, std::string_view name);
  Value getattr_only(const Value& obj, std::string_view name);  // no item fallback (|attr)
  Value getitem(const Value& obj, const Value& key);
  Value call(const Value& callee, Args& args);

 private:
  enum class Flow { Normal, Break, Continue };

  const Program& prog_;
  std::string* out_ = nullptr;
  int depth_ = 0;
  int macro_depth_ = 0;
  StackGuard stack_;

  [[noreturn]] void fail_at(const Node& n, const std::string& msg) const;

  void emit(std::string_view s);
  Flow exec_body(const Body& body, const ScopePtr& scope);
  Flow exec(const Node& n, const ScopePtr& scope);
  Flow exec_node(const Node& n, const ScopePtr& scope);
  Flow exec_for(const Node& n, const ScopePtr& scope);
  std::string capture(const Body& body, const ScopePtr& scope);
  void assign(const Node& target, const Value& v, Scope& scope);

  Value eval(const Node& n, const ScopePtr& scope);
  Value eval_node(const Node& n, const ScopePtr& scope);
  void eval_args(const Node& n, const ScopePtr& scope, Args& args);
  Value eval_compare(const Node& n, const ScopePtr& scope);
  Value eval_slice(const Value& obj, const Node& slice, const ScopePtr& scope);
  Value apply_filter_chain(const Node& filter, Value subject, const ScopePtr& scope);
  Value call_macro(const Value& macro, Args& args);
  Value loop_attr(const Value& loop, std::string_view name);
  Value undefined_attr(const Value& obj, const Value& name) const;
};

}  // namespace dq::chat
