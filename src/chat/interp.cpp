#include "chat/interp.h"

#include <fmt/format.h>

#include "chat/builtins.h"
#include "chat/text.h"

namespace dq::chat {

namespace {

// Recursion cap for eval/exec across macro calls: about 1.5 MiB of stack in a release build
// (~500 bytes a level). StackGuard stops earlier where the thread's stack is smaller or the
// frames are larger (sanitizers).
constexpr int kMaxEvalDepth = 3000;

Value str_value(std::string s) { return Value::string(std::move(s)); }

}  // namespace

// ---- scopes ----------------------------------------------------------------------------------

const Value* Scope::find_local(std::string_view name) const {
  for (const auto& [k, v] : vars)
    if (k == name) return &v;
  return nullptr;
}

const Value* Scope::find(std::string_view name) const {
  for (const Scope* s = this; s; s = s->parent.get())
    if (const Value* v = s->find_local(name)) return v;
  return nullptr;
}

void Scope::set(std::string_view name, Value v) {
  for (auto& [k, old] : vars)
    if (k == name) {
      old = std::move(v);
      return;
    }
  vars.emplace_back(std::string(name), std::move(v));
}

// ---- driver ----------------------------------------------------------------------------------

Interp::Interp(const Program& prog, const Limits& limits) : prog_(prog) { budget.limits = limits; }

std::string Interp::render(const ScopePtr& scope) {
  BudgetScope ambient(budget);
  std::string out;
  out_ = &out;
  exec_body(prog_.body, scope);
  out_ = nullptr;
  return out;
}

void Interp::fail_at(const Node& n, const std::string& msg) const {
  auto [line, col] = prog_.source.line_col(n.pos);
  throw TemplateError(TemplateError::Kind::Runtime, fmt::format("chat template:{}:{}: {}", line, col, msg),
                      line, col);
}

namespace {
struct DepthGuard {
  int& depth;
  explicit DepthGuard(int& d) : depth(d) { ++depth; }
  ~DepthGuard() { --depth; }
};
}  // namespace

void Interp::emit(std::string_view s) {
  if (out_->size() + s.size() > budget.limits.max_output_bytes)
    throw TemplateError(TemplateError::Kind::Limit,
                        fmt::format("chat template: output exceeds the limit of {} bytes",
                                    budget.limits.max_output_bytes));
  budget.charge(1 + s.size() / 4);
  out_->append(s);
}

// ---- statements ------------------------------------------------------------------------------

Interp::Flow Interp::exec_body(const Body& body, const ScopePtr& scope) {
  for (const auto& n : body) {
    Flow f = exec(*n, scope);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Interp::Flow Interp::exec(const Node& n, const ScopePtr& scope) {
  DepthGuard guard(depth_);
  if (depth_ > kMaxEvalDepth || stack_.exhausted())
    throw TemplateError(TemplateError::Kind::Limit, "chat template: evaluation nested too deeply");
  budget.charge(1);
  try {
    return exec_node(n, scope);
  } catch (const EvalError& e) {
    fail_at(n, e.msg);
  }
}

std::string Interp::capture(const Body& body, const ScopePtr& scope) {
  std::string buf;
  std::string* saved = out_;
  out_ = &buf;
  try {
    exec_body(body, scope);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return buf;
}

void Interp::assign(const Node& target, const Value& v, Scope& scope) {
  switch (target.kind) {
    case NK::Name: scope.set(target.str, v); return;
    case NK::TupleLit: {
      List vals = iterate(budget, v);
      size_t want = target.list.size();
      if (vals.size() < want) efail("not enough values to unpack (expected {}, got {})", want, vals.size());
      if (vals.size() > want) efail("too many values to unpack (expected {})", want);
      for (size_t i = 0; i < want; ++i) assign(*target.list[i], vals[i], scope);
      return;
    }
    case NK::NsRef: {
      const Value* ns = scope.find(target.str);
      if (!ns || !ns->is(Type::Namespace)) efail("cannot assign attribute on non-namespace object");
      if (v.holds_ref()) efail("cannot store a namespace or loop object inside a namespace");
      ns->ns().set(target.str2, v);
      return;
    }
    default: efail("invalid assignment target");
  }
}

Interp::Flow Interp::exec_node(const Node& n, const ScopePtr& scope) {
  switch (n.kind) {
    case NK::Data: emit(n.str); return Flow::Normal;
    case NK::Output: {
      Value v = eval(*n.a, scope);
      if (v.is_str()) emit(v.s());
      else emit(py_str(v));
      return Flow::Normal;
    }
    case NK::If: {
      for (size_t i = 0; i < n.list.size(); ++i)
        if (truthy(eval(*n.list[i], scope))) return exec_body(n.bodies[i], scope);
      if (n.bodies.size() > n.list.size()) return exec_body(n.bodies.back(), scope);
      return Flow::Normal;
    }
    case NK::For: return exec_for(n, scope);
    case NK::Set: assign(*n.a, eval(*n.b, scope), *scope); return Flow::Normal;
    case NK::SetBlock: {
      auto inner = std::make_shared<Scope>(scope);
      Value v = str_value(capture(n.bodies[0], inner));
      if (n.b) v = apply_filter_chain(*n.b, v, scope);
      assign(*n.a, v, *scope);
      return Flow::Normal;
    }
    case NK::Macro: {
      auto c = std::make_shared<CallableData>();
      c->kind = CallableData::Kind::Macro;
      c->name = n.str;
      c->macro = &n;
      c->closure = scope;
      scope->set(n.str, Value::callable(std::move(c)));
      return Flow::Normal;
    }
    case NK::FilterBlock: {
      auto inner = std::make_shared<Scope>(scope);
      Value v = apply_filter_chain(*n.b, str_value(capture(n.bodies[0], inner)), scope);
      if (v.is_str()) emit(v.s());
      else emit(py_str(v));
      return Flow::Normal;
    }
    case NK::With: {
      auto inner = std::make_shared<Scope>(scope);
      for (size_t i = 0; i < n.list.size(); ++i) assign(*n.list[i], eval(*n.list2[i], scope), *inner);
      return exec_body(n.bodies[0], inner);
    }
    case NK::Break: return Flow::Break;
    case NK::Continue: return Flow::Continue;
    default: efail("internal error: expression used as a statement");
  }
}

Interp::Flow Interp::exec_for(const Node& n, const ScopePtr& scope) {
  Value iterable = eval(*n.b, scope);
  List items = iterate(budget, iterable);
  if (n.c) {
    List kept;
    for (Value& item : items) {
      budget.charge(1);
      auto tmp = std::make_shared<Scope>(scope);
      assign(*n.a, item, *tmp);
      if (truthy(eval(*n.c, tmp))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    if (n.bodies[1].empty()) return Flow::Normal;
    return exec_body(n.bodies[1], std::make_shared<Scope>(scope));
  }
  auto loop = std::make_shared<LoopData>();
  loop->seq = Value::list(std::move(items));
  Value loopv = Value::loop(loop);
  const List& seq = loop->seq.items();
  for (size_t k = 0; k < seq.size(); ++k) {
    budget.charge(1);
    loop->index0 = k;
    auto it = std::make_shared<Scope>(scope);
    it->vars.reserve(2);
    it->set("loop", loopv);
    assign(*n.a, seq[k], *it);
    if (exec_body(n.bodies[0], it) == Flow::Break) break;
  }
  return Flow::Normal;
}

// ---- expressions -----------------------------------------------------------------------------

Value Interp::eval(const Node& n, const ScopePtr& scope) {
  DepthGuard guard(depth_);
  if (depth_ > kMaxEvalDepth || stack_.exhausted())
    throw TemplateError(TemplateError::Kind::Limit, "chat template: evaluation nested too deeply");
  budget.charge(1);
  try {
    return eval_node(n, scope);
  } catch (const EvalError& e) {
    fail_at(n, e.msg);
  }
}

void Interp::eval_args(const Node& n, const ScopePtr& scope, Args& args) {
  for (const auto& a : n.list) args.pos.push_back(eval(*a, scope));
  for (size_t i = 0; i < n.names.size(); ++i) args.kw.emplace_back(n.names[i], eval(*n.list2[i], scope));
  if (n.b) {
    List extra = iterate(budget, eval(*n.b, scope));
    args.pos.insert(args.pos.end(), extra.begin(), extra.end());
  }
  if (n.c) {
    Value kw = eval(*n.c, scope);
    if (!kw.is_dict()) efail("argument after ** must be a mapping, not {}", type_name(kw));
    for (const auto& [k, v] : kw.dict().items) {
      if (!k.is_str()) efail("keywords must be strings");
      for (const auto& existing : args.kw)
        if (existing.first == k.s()) efail("got multiple values for keyword argument '{}'", k.s());
      args.kw.emplace_back(k.s(), v);
    }
  }
}

Value Interp::eval_compare(const Node& n, const ScopePtr& scope) {
  Value left = eval(*n.a, scope);
  for (size_t i = 0; i < n.cmp.size(); ++i) {
    Value right = eval(*n.list[i], scope);
    bool ok;
    switch (n.cmp[i]) {
      case CmpKind::Eq: ok = compare(CmpOp::Eq, left, right); break;
      case CmpKind::Ne: ok = compare(CmpOp::Ne, left, right); break;
      case CmpKind::Lt: ok = compare(CmpOp::Lt, left, right); break;
      case CmpKind::Le: ok = compare(CmpOp::Le, left, right); break;
      case CmpKind::Gt: ok = compare(CmpOp::Gt, left, right); break;
      case CmpKind::Ge: ok = compare(CmpOp::Ge, left, right); break;
      case CmpKind::In: ok = contains(right, left); break;
      default: ok = !contains(right, left); break;
    }
    if (!ok) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Interp::apply_filter_chain(const Node& f, Value subject, const ScopePtr& scope) {
  Value v = f.a ? apply_filter_chain(*f.a, std::move(subject), scope) : std::move(subject);
  Args args;
  eval_args(f, scope, args);
  try {
    return apply_filter(*this, f.str, v, args);
  } catch (const EvalError& e) {
    fail_at(f, e.msg);
  }
}

Value Interp::eval_node(const Node& n, const ScopePtr& scope) {
  switch (n.kind) {
    case NK::Const: return n.value;
    case NK::Name: {
      if (const Value* v = scope->find(n.str)) return *v;
      return Value::undefined(fmt::format("{} is undefined", py_repr(str_value(n.str))));
    }
    case NK::ListLit:
    case NK::TupleLit: {
      List items;
      items.reserve(n.list.size());
      for (const auto& c : n.list) items.push_back(eval(*c, scope));
      return Value::list(std::move(items), n.kind == NK::TupleLit ? Value::kTuple : 0);
    }
    case NK::DictLit: {
      auto d = std::make_shared<DictData>();
      for (size_t i = 0; i < n.list.size(); ++i) {
        Value k = eval(*n.list[i], scope);
        d->set(std::move(k), eval(*n.list2[i], scope));
      }
      d->finish();
      return Value::dict(std::move(d));
    }
    case NK::Getattr: return getattr(eval(*n.a, scope), n.str);
    case NK::Getitem: {
      Value obj = eval(*n.a, scope);
      if (n.b->kind == NK::Slice) return eval_slice(obj, *n.b, scope);
      return getitem(obj, eval(*n.b, scope));
    }
    case NK::Call: {
      Value callee = eval(*n.a, scope);
      Args args;
      eval_args(n, scope, args);
      return call(callee, args);
    }
    case NK::Filter: {
      Value v = eval(*n.a, scope);
      Args args;
      eval_args(n, scope, args);
      return apply_filter(*this, n.str, v, args);
    }
    case NK::Test: {
      Value v = eval(*n.a, scope);
      Args args;
      eval_args(n, scope, args);
      return Value::boolean(apply_test(*this, n.str, v, args));
    }
    case NK::Neg: return negate(eval(*n.a, scope));
    case NK::Pos: return unary_plus(eval(*n.a, scope));
    case NK::Not: return Value::boolean(!truthy(eval(*n.a, scope)));
    case NK::And: {
      Value a = eval(*n.a, scope);
      return truthy(a) ? eval(*n.b, scope) : a;
    }
    case NK::Or: {
      Value a = eval(*n.a, scope);
      return truthy(a) ? a : eval(*n.b, scope);
    }
    case NK::Bin: {
      Value a = eval(*n.a, scope);
      Value b = eval(*n.b, scope);
      return binop(budget, n.op, a, b);
    }
    case NK::Concat: {
      std::string s;
      for (const auto& c : n.list) {
        Value v = eval(*c, scope);
        if (v.is_str()) s += v.s();
        else s += py_str(v);
        if (s.size() > budget.limits.max_output_bytes) budget.over_size(s.size());
      }
      budget.charge_bytes(s.size());
      return str_value(std::move(s));
    }
    case NK::Compare: return eval_compare(n, scope);
    case NK::CondExpr: {
      if (truthy(eval(*n.a, scope))) return eval(*n.b, scope);
      if (n.c) return eval(*n.c, scope);
      return Value::undefined(fmt::format(
          "the inline if-expression on line {} evaluated to false and no else section was defined.",
          prog_.source.line_col(n.pos).first));
    }
    default: efail("internal error: unexpected node");
  }
}

// ---- attribute and item access (jinja2 sandbox getattr/getitem) -------------------------------

Value Interp::undefined_attr(const Value& obj, const Value& name) const {
  if (name.is_str())
    return Value::undefined(fmt::format("{} has no attribute {}", py_repr(str_value(object_type_repr(obj))),
                                        py_repr(name)));
  return Value::undefined(fmt::format("{} has no element {}", object_type_repr(obj), py_repr(name)));
}

namespace {
Value bound_method(const Value& self, std::string_view name) {
  auto c = std::make_shared<CallableData>();
  c->kind = CallableData::Kind::Method;
  c->name = std::string(name);
  c->self = self;
  return Value::callable(std::move(c));
}

Value unsafe_attr(const Value& obj, std::string_view name) {
  return Value::undefined(fmt::format("access to attribute {} of {} object is unsafe.",
                                      py_repr(Value::string(std::string(name))),
                                      py_repr(Value::string(type_name(obj)))),
                          true);
}

bool is_dunder(std::string_view name) {
  return name.size() > 4 && name.substr(0, 2) == "__" && name.substr(name.size() - 2) == "__";
}
}  // namespace

Value Interp::loop_attr(const Value& loopv, std::string_view name) {
  const LoopData& l = loopv.loop();
  auto len = static_cast<int64_t>(l.length());
  auto i0 = static_cast<int64_t>(l.index0);
  if (name == "index") return Value::integer(i0 + 1);
  if (name == "index0") return Value::integer(i0);
  if (name == "revindex") return Value::integer(len - i0);
  if (name == "revindex0") return Value::integer(len - i0 - 1);
  if (name == "first") return Value::boolean(i0 == 0);
  if (name == "last") return Value::boolean(i0 == len - 1);
  if (name == "length") return Value::integer(len);
  if (name == "depth") return Value::integer(l.depth0 + 1);
  if (name == "depth0") return Value::integer(l.depth0);
  if (name == "previtem")
    return i0 > 0 ? l.seq.items()[static_cast<size_t>(i0 - 1)] : Value::undefined("there is no previous item");
  if (name == "nextitem")
    return i0 + 1 < len ? l.seq.items()[static_cast<size_t>(i0 + 1)] : Value::undefined("there is no next item");
  if (name == "cycle" || name == "changed") return bound_method(loopv, name);
  return Value::undefined();
}

Value Interp::getattr_only(const Value& obj, std::string_view name) {
  if (is_dunder(name)) return unsafe_attr(obj, name);
  switch (obj.type()) {
    case Type::Undefined: undefined_fail(obj);
    case Type::Namespace:
      if (const Value* v = obj.ns().find(name)) return *v;
      break;
    case Type::Loop: {
      Value v = loop_attr(obj, name);
      if (!v.is_undefined() || !v.s().empty()) return v;
      break;
    }
    default: break;
  }
  if (is_dunder(name)) return unsafe_attr(obj, name);
  switch (method_kind(obj, name)) {
    case MethodKind::Safe: return bound_method(obj, name);
    case MethodKind::Unsafe: return unsafe_attr(obj, name);
    default: break;
  }
  return undefined_attr(obj, str_value(std::string(name)));
}

Value Interp::getattr(const Value& obj, std::string_view name) {
  if (obj.is_undefined() && !is_dunder(name)) undefined_fail(obj);
  Value v = getattr_only(obj, name);
  if (!v.is_undefined() || v.unsafe() || !obj.is_dict()) return v;
  if (const Value* found = obj.dict().find(name)) return *found;
  return v;
}

namespace {
// Python sequence index: bool and int accepted, negatives count from the end.
bool seq_index(const Value& key, size_t size, size_t& out) {
  if (!key.is_int()) return false;
  int64_t i = key.i();
  if (i < 0) i += static_cast<int64_t>(size);
  if (i < 0 || i >= static_cast<int64_t>(size)) return false;
  out = static_cast<size_t>(i);
  return true;
}
}  // namespace

Value Interp::getitem(const Value& obj, const Value& key) {
  switch (obj.type()) {
    case Type::Undefined: undefined_fail(obj);
    case Type::Dict: {
      bool hashable = !(key.is_dict() || (key.is_list() && !key.tuple()));
      if (hashable) {
        try {
          if (const Value* v = obj.dict().find(key)) return *v;
        } catch (const EvalError&) {  // an unhashable element inside a tuple key
        }
      }
      break;
    }
    case Type::List: {
      size_t i;
      if (obj.sequence() && seq_index(key, obj.items().size(), i)) return obj.items()[i];
      break;
    }
    case Type::Str: {
      if (!key.is_int()) break;
      const std::string& s = obj.s();
      if (text::is_ascii(s)) {
        size_t i;
        if (seq_index(key, s.size(), i)) return Value::string(s.substr(i, 1), obj.markup());
      } else {
        std::u32string u = text::decode(s);
        size_t i;
        if (seq_index(key, u.size(), i)) return Value::string(text::encode(u.substr(i, 1)), obj.markup());
      }
      break;
    }
    default: break;
  }
  if (key.is_str()) {
    Value v = getattr_only(obj, key.s());
    if (!v.is_undefined() || v.unsafe()) return v;
  }
  return undefined_attr(obj, key);
}

Value Interp::eval_slice(const Value& obj, const Node& sl, const ScopePtr& scope) {
  Value parts[3];
  const NodePtr* nodes[3] = {&sl.a, &sl.b, &sl.c};
  for (int k = 0; k < 3; ++k) parts[k] = *nodes[k] ? eval(**nodes[k], scope) : Value::none();
  // jinja2 compiles slices to a plain Python obj[a:b:c], bypassing the sandbox's getitem.
  if (obj.is_undefined()) undefined_fail(obj);
  if (obj.is_dict()) efail("unhashable type: 'slice'");
  if (!obj.is_str() && !obj.sequence()) efail("'{}' object is not subscriptable", type_name(obj));
  for (const Value& p : parts)
    if (!p.is_none() && !p.is_int()) efail("slice indices must be integers or None or have an __index__ method");
  int64_t step = parts[2].is_none() ? 1 : parts[2].i();
  if (step == 0) efail("slice step cannot be zero");
  std::u32string u;
  bool ascii = obj.is_str() && text::is_ascii(obj.s());
  if (obj.is_str() && !ascii) u = text::decode(obj.s());
  auto len = static_cast<int64_t>(obj.is_str() ? (ascii ? obj.s().size() : u.size()) : obj.items().size());
  // PySlice_AdjustIndices
  int64_t lower = step < 0 ? -1 : 0, upper = step < 0 ? len - 1 : len;
  auto adjust = [&](const Value& p, int64_t def) {
    if (p.is_none()) return def;
    int64_t x = p.i();
    if (x < 0) {
      x += len;
      if (x < lower) x = lower;
    } else if (x > upper) {
      x = upper;
    }
    return x;
  };
  int64_t start = adjust(parts[0], step < 0 ? upper : lower);
  int64_t stop = adjust(parts[1], step < 0 ? lower : upper);
  int64_t count = 0;
  if (step > 0 && start < stop) count = (stop - start - 1) / step + 1;
  if (step < 0 && stop < start) count = (start - stop - 1) / (-step) + 1;
  budget.charge_items(static_cast<size_t>(count));
  if (obj.is_str()) {
    if (ascii) {
      std::string out;
      out.reserve(static_cast<size_t>(count));
      for (int64_t k = 0, i = start; k < count; ++k, i += step) out += obj.s()[static_cast<size_t>(i)];
      return Value::string(std::move(out), obj.markup());
    }
    std::u32string out;
    for (int64_t k = 0, i = start; k < count; ++k, i += step) out += u[static_cast<size_t>(i)];
    return Value::string(text::encode(out), obj.markup());
  }
  List out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t k = 0, i = start; k < count; ++k, i += step) out.push_back(obj.items()[static_cast<size_t>(i)]);
  return Value::list(std::move(out), obj.flags());
}

// ---- calls -----------------------------------------------------------------------------------

Value Interp::call(const Value& callee, Args& args) {
  if (callee.is_undefined()) undefined_fail(callee);
  if (!callee.is(Type::Callable)) efail("'{}' object is not callable", type_name(callee));
  const CallableData& c = callee.fn();
  switch (c.kind) {
    case CallableData::Kind::Macro: return call_macro(callee, args);
    case CallableData::Kind::Method: return call_method(*this, c.self, c.name, args);
    default: return call_global(*this, c.name, args);
  }
}

Value Interp::call_macro(const Value& macro, Args& args) {
  const CallableData& c = macro.fn();
  const Node& def = *c.macro;
  if (macro_depth_ + 1 > budget.limits.max_recursion)
    throw TemplateError(TemplateError::Kind::Limit,
                        fmt::format("chat template: macro calls nested deeper than {} (recursion?)",
                                    budget.limits.max_recursion));
  DepthGuard guard(macro_depth_);
  ScopePtr closure = c.closure.lock();
  if (!closure) efail("macro '{}' called after the scope it was defined in ended", c.name);
  auto s = std::make_shared<Scope>(closure);
  size_t np = def.names.size(), npos = args.pos.size();
  for (size_t i = 0; i < std::min(np, npos); ++i) s->set(def.names[i], args.pos[i]);
  List varargs;
  if (npos > np) {
    if (!def.catch_varargs) efail("macro '{}' takes not more than {} argument(s)", c.name, np);
    varargs.assign(args.pos.begin() + static_cast<ptrdiff_t>(np), args.pos.end());
  }
  for (size_t i = npos; i < np; ++i) {
    auto it = std::find_if(args.kw.begin(), args.kw.end(), [&](const auto& kv) { return kv.first == def.names[i]; });
    if (it != args.kw.end()) {
      s->set(def.names[i], it->second);
      args.kw.erase(it);
    } else if (def.list[i]) {
      s->set(def.names[i], eval(*def.list[i], s));
    } else {
      s->set(def.names[i], Value::undefined(fmt::format("parameter {} was not provided",
                                                        py_repr(str_value(def.names[i])))));
    }
  }
  if (def.catch_varargs) s->set("varargs", Value::tuple(std::move(varargs)));
  if (def.catch_kwargs) {
    auto d = std::make_shared<DictData>();
    for (auto& [k, v] : args.kw) d->set(str_value(k), v);
    d->finish();
    s->set("kwargs", Value::dict(std::move(d)));
  } else if (!args.kw.empty()) {
    efail("macro '{}' takes no keyword argument '{}'", c.name, args.kw.front().first);
  }
  return str_value(capture(def.bodies[0], s));
}

}  // namespace dq::chat
