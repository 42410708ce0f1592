// jinja2's builtin tests (jinja2/tests.py): `x is defined`, `x is string`, `x is divisibleby 3`...
// and the argument binding the builtins share.
#include <algorithm>
#include <unordered_map>

#include "chat/builtins.h"
#include "chat/interp.h"
#include "chat/text.h"

namespace dq::chat {

// ---- argument binding ------------------------------------------------------------------------

Params::Params(std::string_view fn, Args& args, std::initializer_list<const char*> names, size_t required) {
  std::vector<const char*> nm(names);
  slots_.resize(nm.size());
  if (args.pos.size() > nm.size())
    efail("{}() takes at most {} argument(s) ({} given)", fn, nm.size(), args.pos.size());
  for (size_t i = 0; i < args.pos.size(); ++i) slots_[i] = {args.pos[i], true};
  for (auto& [k, v] : args.kw) {
    auto it = std::find_if(nm.begin(), nm.end(), [&](const char* n) { return k == n; });
    if (it == nm.end()) efail("{}() got an unexpected keyword argument '{}'", fn, k);
    auto j = static_cast<size_t>(it - nm.begin());
    if (slots_[j].set) efail("{}() got multiple values for argument '{}'", fn, k);
    slots_[j] = {v, true};
  }
  for (size_t i = 0; i < required; ++i)
    if (!slots_[i].set) efail("{}() missing required argument '{}'", fn, nm[i]);
}

uint64_t scan_cost(const Value& v) {
  if (v.is_str()) return v.s().size() / 16;
  if (v.is_list()) return v.items().size() / 8;
  if (v.is_dict()) return v.dict().items.size() / 8;
  return 0;
}

namespace {

using TestFn = bool (*)(Interp&, const Value&, Args&);

const Value& arg1(const char* fn, Args& a, Value& slot) {
  Params p(fn, a, {"other"}, 1);
  slot = *p.get(0);
  return slot;
}

bool t_odd(Interp& in, const Value& v, Args& a) {
  no_args("odd", a);
  return py_eq(binop(in.budget, BinOp::Mod, v, Value::integer(2)), Value::integer(1));
}
bool t_even(Interp& in, const Value& v, Args& a) {
  no_args("even", a);
  return py_eq(binop(in.budget, BinOp::Mod, v, Value::integer(2)), Value::integer(0));
}
bool t_divisibleby(Interp& in, const Value& v, Args& a) {
  Params p("divisibleby", a, {"num"}, 1);
  return py_eq(binop(in.budget, BinOp::Mod, v, *p.get(0)), Value::integer(0));
}
bool t_defined(Interp&, const Value& v, Args& a) { no_args("defined", a); return !v.is_undefined(); }
bool t_undefined(Interp&, const Value& v, Args& a) { no_args("undefined", a); return v.is_undefined(); }
bool t_none(Interp&, const Value& v, Args& a) { no_args("none", a); return v.is_none(); }
bool t_boolean(Interp&, const Value& v, Args& a) { no_args("boolean", a); return v.is(Type::Bool); }
bool t_false(Interp&, const Value& v, Args& a) { no_args("false", a); return v.is(Type::Bool) && !v.b(); }
bool t_true(Interp&, const Value& v, Args& a) { no_args("true", a); return v.is(Type::Bool) && v.b(); }
bool t_integer(Interp&, const Value& v, Args& a) { no_args("integer", a); return v.is(Type::Int); }
bool t_float(Interp&, const Value& v, Args& a) { no_args("float", a); return v.is(Type::Float); }
bool t_number(Interp&, const Value& v, Args& a) { no_args("number", a); return v.is_number(); }
bool t_string(Interp&, const Value& v, Args& a) { no_args("string", a); return v.is_str(); }
bool t_mapping(Interp&, const Value& v, Args& a) { no_args("mapping", a); return v.is_dict(); }
bool t_sequence(Interp&, const Value& v, Args& a) {
  no_args("sequence", a);
  return v.is_str() || v.is_dict() || v.is_undefined() || v.sequence();
}
bool t_iterable(Interp&, const Value& v, Args& a) {
  no_args("iterable", a);
  return v.is_str() || v.is_dict() || v.is_list() || v.is_undefined() || v.is(Type::Loop) || v.is(Type::Iter);
}
bool t_callable(Interp&, const Value& v, Args& a) {
  no_args("callable", a);
  return v.is(Type::Callable) || v.is_undefined();
}
bool t_escaped(Interp&, const Value& v, Args& a) { no_args("escaped", a); return v.markup(); }
bool t_lower(Interp&, const Value& v, Args& a) {
  no_args("lower", a);
  std::string s = py_str(v);
  bool cased = false;
  for (size_t i = 0; i < s.size();) {
    char32_t c = text::next_cp(s, i);
    if (text::is_upper_cp(c)) return false;
    cased = cased || text::is_lower_cp(c);
  }
  return cased;
}
bool t_upper(Interp&, const Value& v, Args& a) {
  no_args("upper", a);
  std::string s = py_str(v);
  bool cased = false;
  for (size_t i = 0; i < s.size();) {
    char32_t c = text::next_cp(s, i);
    if (text::is_lower_cp(c)) return false;
    cased = cased || text::is_upper_cp(c);
  }
  return cased;
}
bool t_sameas(Interp&, const Value& v, Args& a) {
  Value o;
  arg1("sameas", a, o);
  if (v.type() != o.type()) return false;
  switch (v.type()) {
    case Type::None: return true;
    case Type::Bool: return v.b() == o.b();
    case Type::Int: return v.i() == o.i() && v.i() >= -5 && v.i() <= 256;  // CPython's small ints
    case Type::Float: case Type::Undefined: return false;
    default: return v.identity() == o.identity();
  }
}
bool t_in(Interp&, const Value& v, Args& a) {
  Params p("in", a, {"seq"}, 1);
  return contains(*p.get(0), v);
}
bool t_filter(Interp&, const Value& v, Args& a) { no_args("filter", a); return v.is_str() && is_filter_name(v.s()); }
bool t_test(Interp&, const Value& v, Args& a) { no_args("test", a); return v.is_str() && is_test_name(v.s()); }

template <CmpOp Op>
bool t_cmp(Interp&, const Value& v, Args& a) {
  Value o;
  arg1("compare", a, o);
  return compare(Op, v, o);
}

const std::unordered_map<std::string_view, TestFn>& tests() {
  static const std::unordered_map<std::string_view, TestFn> table = {
      {"odd", t_odd}, {"even", t_even}, {"divisibleby", t_divisibleby}, {"defined", t_defined},
      {"undefined", t_undefined}, {"filter", t_filter}, {"test", t_test}, {"none", t_none},
      {"boolean", t_boolean}, {"false", t_false}, {"true", t_true}, {"integer", t_integer},
      {"float", t_float}, {"lower", t_lower}, {"upper", t_upper}, {"string", t_string},
      {"mapping", t_mapping}, {"number", t_number}, {"sequence", t_sequence}, {"iterable", t_iterable},
      {"callable", t_callable}, {"sameas", t_sameas}, {"escaped", t_escaped}, {"in", t_in},
      {"==", t_cmp<CmpOp::Eq>}, {"eq", t_cmp<CmpOp::Eq>}, {"equalto", t_cmp<CmpOp::Eq>},
      {"!=", t_cmp<CmpOp::Ne>}, {"ne", t_cmp<CmpOp::Ne>},
      {">", t_cmp<CmpOp::Gt>}, {"gt", t_cmp<CmpOp::Gt>}, {"greaterthan", t_cmp<CmpOp::Gt>},
      {">=", t_cmp<CmpOp::Ge>}, {"ge", t_cmp<CmpOp::Ge>},
      {"<", t_cmp<CmpOp::Lt>}, {"lt", t_cmp<CmpOp::Lt>}, {"lessthan", t_cmp<CmpOp::Lt>},
      {"<=", t_cmp<CmpOp::Le>}, {"le", t_cmp<CmpOp::Le>},
  };
  return table;
}

}  // namespace

bool is_test_name(std::string_view name) { return tests().count(name) != 0; }

bool apply_test(Interp& in, std::string_view name, const Value& v, Args& args) {
  in.budget.charge(1 + scan_cost(v));
  auto it = tests().find(name);
  if (it == tests().end()) efail("No test named '{}' found.", name);
  return it->second(in, v, args);
}

}  // namespace dq::chat
