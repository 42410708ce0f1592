#include "chat/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "chat/text.h"

namespace dq::chat {

// ---- construction ----------------------------------------------------------------------------

namespace {
const std::string kEmpty;
}

Value Value::undefined(std::string hint, bool unsafe) {
  Value v;
  v.type_ = Type::Undefined;
  v.flags_ = unsafe ? kUnsafe : 0;
  if (!hint.empty()) v.p_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}
Value Value::none() {
  Value v;
  v.type_ = Type::None;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.type_ = Type::Bool;
  v.i_ = b ? 1 : 0;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.type_ = Type::Int;
  v.i_ = i;
  return v;
}
Value Value::number(double f) {
  Value v;
  v.type_ = Type::Float;
  v.f_ = f;
  return v;
}
Value Value::string(std::string s, bool markup) {
  Value v;
  v.type_ = Type::Str;
  v.flags_ = markup ? kMarkup : 0;
  v.p_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::list(List items, uint8_t flags) {
  auto d = std::make_shared<ListData>();
  uint32_t depth = 0;
  bool refs = false;
  for (const Value& x : items) {
    depth = std::max(depth, x.depth());
    refs = refs || x.holds_ref();
  }
  if (depth + 1 > kMaxValueDepth) efail("values nested deeper than {} levels", kMaxValueDepth);
  d->items = std::move(items);
  d->depth = depth + 1;
  d->refs = refs;
  Value v;
  v.type_ = Type::List;
  v.flags_ = flags;
  v.p_ = std::move(d);
  return v;
}
Value Value::dict(std::shared_ptr<const DictData> d) {
  Value v;
  v.type_ = Type::Dict;
  v.p_ = std::move(d);
  return v;
}
Value Value::ns(std::shared_ptr<NamespaceData> n) {
  Value v;
  v.type_ = Type::Namespace;
  v.p_ = std::move(n);
  return v;
}
Value Value::loop(std::shared_ptr<LoopData> l) {
  Value v;
  v.type_ = Type::Loop;
  v.p_ = std::move(l);
  return v;
}
Value Value::callable(std::shared_ptr<const CallableData> c) {
  Value v;
  v.type_ = Type::Callable;
  v.p_ = std::move(c);
  return v;
}

Value Value::iter(std::shared_ptr<IterData> it) {
  Value v;
  v.type_ = Type::Iter;
  v.p_ = std::move(it);
  return v;
}

bool IterData::next(Value& out) {
  if (exhausted) return false;
  try {
    if (next_fn(out)) return true;
  } catch (...) {
    exhausted = true;  // a Python generator that raised is finished
    next_fn = nullptr;
    throw;
  }
  exhausted = true;
  next_fn = nullptr;  // drop what the generator captured
  return false;
}

Cursor::Cursor(Value v) : v_(std::move(v)) {
  switch (v_.type()) {
    case Type::List: case Type::Dict: case Type::Str: case Type::Undefined: case Type::Iter: case Type::Loop: break;
    default: efail("'{}' object is not iterable", type_name(v_));
  }
}

bool Cursor::next(Value& out) {
  switch (v_.type()) {
    case Type::List:
      if (i_ >= v_.items().size()) return false;
      out = v_.items()[i_++];
      return true;
    case Type::Loop:
      if (i_ >= v_.loop().seq.items().size()) return false;
      out = v_.loop().seq.items()[i_++];
      return true;
    case Type::Dict:
      if (i_ >= v_.dict().items.size()) return false;
      out = v_.dict().items[i_++].first;
      return true;
    case Type::Str: {
      const std::string& s = v_.s();
      if (i_ >= s.size()) return false;
      size_t j = i_;
      text::next_cp(s, j);
      out = Value::string(s.substr(i_, j - i_));
      i_ = j;
      return true;
    }
    case Type::Iter: return v_.iter().next(out);
    default: return false;
  }
}

const std::string& Value::s() const {
  if (!p_) return kEmpty;
  return *static_cast<const std::string*>(p_.get());
}
const List& Value::items() const { return static_cast<const ListData*>(p_.get())->items; }
const DictData& Value::dict() const { return *static_cast<const DictData*>(p_.get()); }
NamespaceData& Value::ns() const {
  return *const_cast<NamespaceData*>(static_cast<const NamespaceData*>(p_.get()));
}
LoopData& Value::loop() const {
  return *const_cast<LoopData*>(static_cast<const LoopData*>(p_.get()));
}
const CallableData& Value::fn() const { return *static_cast<const CallableData*>(p_.get()); }
IterData& Value::iter() const {
  return *const_cast<IterData*>(static_cast<const IterData*>(p_.get()));
}

uint32_t Value::depth() const {
  if (type_ == Type::List) return static_cast<const ListData*>(p_.get())->depth;
  if (type_ == Type::Dict) return dict().depth;
  if (type_ == Type::Callable) return fn().self.depth();
  return 0;
}
bool Value::holds_ref() const {
  switch (type_) {
    case Type::Namespace: case Type::Loop: return true;
    case Type::List: return static_cast<const ListData*>(p_.get())->refs;
    case Type::Dict: return dict().refs;
    case Type::Callable: return fn().self.holds_ref();
    case Type::Iter: return iter().refs;
    default: return false;
  }
}

// ---- dict / namespace ------------------------------------------------------------------------

void check_hashable(const Value& key) {
  if (key.is_list() && !key.tuple()) efail("unhashable type: '{}'", type_name(key));
  if (key.is_dict()) efail("unhashable type: 'dict'");
  if (key.tuple())
    for (const Value& x : key.items()) check_hashable(x);
}

const Value* DictData::find(std::string_view key) const {
  if (!index.empty()) {
    auto it = index.find(std::string(key));
    return it == index.end() ? nullptr : &items[it->second].second;
  }
  for (const auto& [k, v] : items)
    if (k.is_str() && k.s() == key) return &v;
  return nullptr;
}

const Value* DictData::find(const Value& key) const {
  if (key.is_str()) return find(std::string_view(key.s()));
  check_hashable(key);
  charge_ambient(1 + items.size());
  for (const auto& [k, v] : items)
    if (!k.is_str() && py_eq(k, key)) return &v;
  return nullptr;
}

void DictData::set(Value key, Value value) {
  check_hashable(key);
  if (key.is_str()) {
    if (!index.empty() || items.size() >= 8) {
      if (index.empty())
        for (size_t i = 0; i < items.size(); ++i)
          if (items[i].first.is_str()) index.emplace(items[i].first.s(), i);
      auto [it, fresh] = index.emplace(key.s(), items.size());
      if (!fresh) {
        items[it->second].second = std::move(value);
        return;
      }
      items.emplace_back(std::move(key), std::move(value));
      return;
    }
    for (auto& [k, v] : items)
      if (k.is_str() && k.s() == key.s()) {
        v = std::move(value);
        return;
      }
  } else {
    for (auto& [k, v] : items)
      if (!k.is_str() && py_eq(k, key)) {
        v = std::move(value);
        return;
      }
  }
  items.emplace_back(std::move(key), std::move(value));
}

void DictData::finish() {
  uint32_t d = 0;
  bool r = false;
  for (const auto& [k, v] : items) {
    d = std::max({d, k.depth(), v.depth()});
    r = r || k.holds_ref() || v.holds_ref();
  }
  if (d + 1 > kMaxValueDepth) efail("values nested deeper than {} levels", kMaxValueDepth);
  depth = d + 1;
  refs = r;
}

const Value* NamespaceData::find(std::string_view name) const {
  for (const auto& [k, v] : attrs)
    if (k == name) return &v;
  return nullptr;
}
void NamespaceData::set(std::string_view name, Value v) {
  for (auto& [k, old] : attrs)
    if (k == name) {
      old = std::move(v);
      return;
    }
  attrs.emplace_back(std::string(name), std::move(v));
}

// ---- budget ----------------------------------------------------------------------------------

namespace {
thread_local Budget* tl_budget = nullptr;
}

BudgetScope::BudgetScope(Budget& b) : saved_(tl_budget) { tl_budget = &b; }
BudgetScope::~BudgetScope() { tl_budget = saved_; }

void charge_ambient(uint64_t n) {
  if (tl_budget) tl_budget->charge(n);
}

void check_ambient_size(size_t bytes) {
  if (tl_budget && bytes > tl_budget->limits.max_output_bytes) tl_budget->over_size(bytes);
}

void Budget::charge_items(size_t n) {
  // A Value is 32 bytes; lists are capped at an eighth of the output limit in items.
  if (n > limits.max_output_bytes / 8) efail("a list of {} items is too large", n);
  charge(1 + n);
}
void Budget::over_steps() const {
  throw TemplateError(TemplateError::Kind::Limit,
                      fmt::format("chat template: exceeded the step limit ({} steps)",
                                  limits.max_steps));
}
void Budget::over_size(size_t bytes) const {
  throw TemplateError(TemplateError::Kind::Limit,
                      fmt::format("chat template: a string of {} bytes exceeds the limit of {} bytes",
                                  bytes, limits.max_output_bytes));
}

// ---- truthiness, equality, ordering -----------------------------------------------------------

bool truthy(const Value& v) {
  switch (v.type()) {
    case Type::Undefined: case Type::None: return false;
    case Type::Bool: case Type::Int: return v.i() != 0;
    case Type::Float: return v.f() != 0.0;
    case Type::Str: return !v.s().empty();
    case Type::List: return !v.items().empty();
    case Type::Dict: return !v.dict().items.empty();
    case Type::Loop: return v.loop().length() != 0;
    default: return true;
  }
}

namespace {
// Three-way numeric comparison with Python's exact int/float semantics; nullopt for NaN.
std::optional<int> cmp_num(const Value& a, const Value& b) {
  auto sgn = [](auto x, auto y) { return x < y ? -1 : x > y ? 1 : 0; };
  if (a.is_int() && b.is_int()) return sgn(a.i(), b.i());
  if (a.is(Type::Float) && b.is(Type::Float)) {
    if (std::isnan(a.f()) || std::isnan(b.f())) return std::nullopt;
    return sgn(a.f(), b.f());
  }
  bool swap = a.is(Type::Float);
  int64_t i = swap ? b.i() : a.i();
  double d = swap ? a.f() : b.f();
  if (std::isnan(d)) return std::nullopt;
  int r;
  if (d >= 9223372036854775808.0) {
    r = -1;
  } else if (d < -9223372036854775808.0) {
    r = 1;
  } else {
    double t = std::trunc(d);
    auto ti = static_cast<int64_t>(t);
    r = i < ti ? -1 : i > ti ? 1 : (d > t ? -1 : d < t ? 1 : 0);
  }
  return swap ? -r : r;
}

const char* op_symbol(CmpOp op) {
  switch (op) {
    case CmpOp::Eq: return "==";
    case CmpOp::Ne: return "!=";
    case CmpOp::Lt: return "<";
    case CmpOp::Le: return "<=";
    case CmpOp::Gt: return ">";
    default: return ">=";
  }
}

bool apply_cmp(CmpOp op, int c) {
  switch (op) {
    case CmpOp::Lt: return c < 0;
    case CmpOp::Le: return c <= 0;
    case CmpOp::Gt: return c > 0;
    default: return c >= 0;
  }
}
}  // namespace

bool py_eq(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    auto c = cmp_num(a, b);
    return c && *c == 0;
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Type::Undefined: case Type::None: return true;
    case Type::Str:
      if (a.s().size() != b.s().size()) return false;
      charge_ambient(1 + a.s().size() / 64);
      return a.s() == b.s();
    case Type::List: {
      if (a.identity() == b.identity()) return true;
      if (a.flags() != b.flags() || (a.flags() & Value::kValuesView)) return false;
      const List &x = a.items(), &y = b.items();
      if (x.size() != y.size()) return false;
      charge_ambient(1 + x.size());
      for (size_t i = 0; i < x.size(); ++i)
        if (!py_eq(x[i], y[i])) return false;
      return true;
    }
    case Type::Dict: {
      if (a.identity() == b.identity()) return true;
      const DictData &x = a.dict(), &y = b.dict();
      if (x.items.size() != y.items.size()) return false;
      charge_ambient(1 + x.items.size());
      for (const auto& [k, v] : x.items) {
        const Value* w = y.find(k);
        if (!w || !py_eq(v, *w)) return false;
      }
      return true;
    }
    case Type::Callable: {
      const CallableData &x = a.fn(), &y = b.fn();
      if (&x == &y) return true;
      return x.kind == CallableData::Kind::Method && y.kind == x.kind && x.name == y.name &&
             x.self.identity() == y.self.identity() && x.self.type() == y.self.type();
    }
    default: return a.identity() == b.identity();
  }
}

bool compare(CmpOp op, const Value& a, const Value& b) {
  if (op == CmpOp::Eq) return py_eq(a, b);
  if (op == CmpOp::Ne) return !py_eq(a, b);
  if (a.is_undefined()) undefined_fail(a);
  if (b.is_undefined()) undefined_fail(b);
  if (a.is_number() && b.is_number()) {
    auto c = cmp_num(a, b);
    return c && apply_cmp(op, *c);
  }
  if (a.is_str() && b.is_str()) {
    charge_ambient(1 + std::min(a.s().size(), b.s().size()) / 64);
    return apply_cmp(op, a.s().compare(b.s()));
  }
  if (a.sequence() && b.sequence() && a.tuple() == b.tuple()) {
    const List &x = a.items(), &y = b.items();
    size_t n = std::min(x.size(), y.size());
    charge_ambient(1 + n);
    for (size_t i = 0; i < n; ++i)
      if (!py_eq(x[i], y[i])) return compare(op, x[i], y[i]);
    return apply_cmp(op, x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0);
  }
  efail("'{}' not supported between instances of '{}' and '{}'", op_symbol(op), type_name(a),
        type_name(b));
}

bool py_lt(const Value& a, const Value& b) { return compare(CmpOp::Lt, a, b); }

// ---- names and printing ----------------------------------------------------------------------

std::string type_name(const Value& v) {
  switch (v.type()) {
    case Type::Undefined: return "Undefined";
    case Type::None: return "NoneType";
    case Type::Bool: return "bool";
    case Type::Int: return "int";
    case Type::Float: return "float";
    case Type::Str: return v.markup() ? "Markup" : "str";
    case Type::List:
      if (v.flags() & Value::kItemsView) return "dict_items";
      if (v.flags() & Value::kKeysView) return "dict_keys";
      if (v.flags() & Value::kValuesView) return "dict_values";
      return v.tuple() ? "tuple" : "list";
    case Type::Dict: return "dict";
    case Type::Namespace: return "Namespace";
    case Type::Loop: return "LoopContext";
    case Type::Iter: return v.iter().kind;
    case Type::Callable:
      switch (v.fn().kind) {
        case CallableData::Kind::Macro: return "Macro";
        case CallableData::Kind::Method: return "builtin_function_or_method";
        default: return "function";
      }
  }
  return "object";
}

std::string object_type_repr(const Value& v) {
  switch (v.type()) {
    case Type::None: return "None";
    case Type::Undefined: return "jinja2.runtime.Undefined object";
    case Type::Namespace: return "jinja2.utils.Namespace object";
    case Type::Loop: return "jinja2.runtime.LoopContext object";
    case Type::Str:
      if (v.markup()) return "markupsafe.Markup object";
      break;
    case Type::Callable:
      if (v.fn().kind == CallableData::Kind::Macro) return "jinja2.runtime.Macro object";
      break;
    default: break;
  }
  return type_name(v) + " object";
}

void undefined_fail(const Value& u) {
  if (!u.s().empty()) throw EvalError{u.s()};
  throw EvalError{"value is undefined"};
}

std::string int_repr(int64_t i) { return std::to_string(i); }

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));  // "-1.2345e+15"
  std::string out;
  if (sci[0] == '-') {
    out += '-';
    sci.remove_prefix(1);
  }
  size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e))
    if (c != '.') digits += c;
  int exp10 = std::stoi(std::string(sci.substr(e + 1)));
  int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
  int n = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0.";
      out.append(static_cast<size_t>(-decpt), '0');
      out += digits;
    } else if (decpt >= n) {
      out += digits;
      out.append(static_cast<size_t>(decpt - n), '0');
      out += ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt));
      out += '.';
      out += digits.substr(static_cast<size_t>(decpt));
    }
  } else {
    out += digits[0];
    if (n > 1) {
      out += '.';
      out += digits.substr(1);
    }
    int x = decpt - 1;
    out += x < 0 ? "e-" : "e+";
    if (std::abs(x) < 10) out += '0';
    out += std::to_string(std::abs(x));
  }
  return out;
}

void py_repr(std::string& out, const Value& v) {
  switch (v.type()) {
    case Type::Str:
      if (v.markup()) {
        out += "Markup(";
        text::repr_str(out, v.s());
        out += ')';
      } else {
        text::repr_str(out, v.s());
      }
      return;
    case Type::List: {
      if (v.view()) {  // dict_items([...])
        out += type_name(v) + "(";
        py_repr(out, Value::list(v.items()));
        out += ')';
        return;
      }
      const List& xs = v.items();
      out += v.tuple() ? '(' : '[';
      for (size_t i = 0; i < xs.size(); ++i) {
        if (i) out += ", ";
        py_repr(out, xs[i]);
        check_ambient_size(out.size());
      }
      if (v.tuple() && xs.size() == 1) out += ',';
      out += v.tuple() ? ')' : ']';
      return;
    }
    case Type::Dict: {
      out += '{';
      bool first = true;
      for (const auto& [k, x] : v.dict().items) {
        if (!first) out += ", ";
        first = false;
        py_repr(out, k);
        out += ": ";
        py_repr(out, x);
        check_ambient_size(out.size());
      }
      out += '}';
      return;
    }
    case Type::Undefined: out += "Undefined"; return;
    case Type::Iter: out += "<" + v.iter().kind + " object>"; return;
    default: out += py_str(v); return;
  }
}

std::string py_repr(const Value& v) {
  std::string out;
  py_repr(out, v);
  return out;
}

std::string py_str(const Value& v) {
  switch (v.type()) {
    case Type::Undefined: return "";
    case Type::None: return "None";
    case Type::Bool: return v.b() ? "True" : "False";
    case Type::Int: return int_repr(v.i());
    case Type::Float: return float_repr(v.f());
    case Type::Str: return v.s();
    case Type::Namespace: {
      std::string out = "<Namespace {";
      bool first = true;
      for (const auto& [k, x] : v.ns().attrs) {
        if (!first) out += ", ";
        first = false;
        text::repr_str(out, k);
        out += ": ";
        py_repr(out, x);
      }
      return out + "}>";
    }
    case Type::Loop: {
      const LoopData& l = v.loop();
      return fmt::format("<LoopContext {}/{}>", l.index0 + 1, l.length());
    }
    case Type::Callable: {
      const CallableData& c = v.fn();
      if (c.kind == CallableData::Kind::Macro) {
        std::string out = "<Macro ";
        text::repr_str(out, c.name);
        return out + ">";
      }
      if (c.kind == CallableData::Kind::Method)
        return fmt::format("<built-in method {} of {} object>", c.name, type_name(c.self));
      return fmt::format("<function {}>", c.name);
    }
    default: return py_repr(v);
  }
}

// ---- operators -------------------------------------------------------------------------------

namespace {
[[noreturn]] void bad_operands(const char* sym, const Value& a, const Value& b) {
  efail("unsupported operand type(s) for {}: '{}' and '{}'", sym, type_name(a), type_name(b));
}

const char* bin_symbol(BinOp op) {
  switch (op) {
    case BinOp::Add: return "+";
    case BinOp::Sub: return "-";
    case BinOp::Mul: return "*";
    case BinOp::Div: return "/";
    case BinOp::FloorDiv: return "//";
    case BinOp::Mod: return "%";
    default: return "** or pow()";
  }
}

Value repeat(Budget& budget, const Value& seq, int64_t n) {
  if (n <= 0) return seq.is_str() ? Value::string("", seq.markup()) : Value::list({}, seq.flags());
  if (seq.is_str()) {
    size_t total = seq.s().size() * static_cast<uint64_t>(n);
    if (!seq.s().empty() && total / seq.s().size() != static_cast<uint64_t>(n)) budget.over_size(SIZE_MAX);
    budget.charge_bytes(total);
    std::string out;
    out.reserve(total);
    for (int64_t k = 0; k < n; ++k) out += seq.s();
    return Value::string(std::move(out), seq.markup());
  }
  size_t total = seq.items().size() * static_cast<uint64_t>(n);
  if (n > 0 && !seq.items().empty() && total / seq.items().size() != static_cast<uint64_t>(n))
    budget.charge_items(SIZE_MAX);
  budget.charge_items(total);
  List out;
  out.reserve(total);
  for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return Value::list(std::move(out), seq.flags());
}

// Python float divmod (Objects/floatobject.c).
void float_divmod(double vx, double wx, double& floordiv, double& mod) {
  mod = std::fmod(vx, wx);
  double div = (vx - mod) / wx;
  if (mod != 0) {
    if ((wx < 0) != (mod < 0)) {
      mod += wx;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, wx);
  }
  if (div != 0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, vx / wx);
  }
}

Value int_pow(int64_t base, int64_t exp) {
  int64_t result = 1;
  while (exp > 0) {
    if (exp & 1)
      if (__builtin_mul_overflow(result, base, &result)) efail("integer overflow in **");
    exp >>= 1;
    if (exp > 0 && __builtin_mul_overflow(base, base, &base)) efail("integer overflow in **");
  }
  return Value::integer(result);
}
}  // namespace

Value binop(Budget& budget, BinOp op, const Value& a, const Value& b) {
  // str.__mod__ accepts any right operand (an Undefined is a mapping that is never read).
  if (op == BinOp::Mod && a.is_str()) return Value::string(percent_format(budget, a, b), a.markup());
  if (a.is_undefined()) undefined_fail(a);
  if (b.is_undefined()) undefined_fail(b);
  const char* sym = bin_symbol(op);
  if (a.is_number() && b.is_number()) {
    bool ints = a.is_int() && b.is_int();
    int64_t x = a.i(), y = b.i(), r = 0;
    double p = a.as_double(), q = b.as_double();
    switch (op) {
      case BinOp::Add:
        if (!ints) return Value::number(p + q);
        if (__builtin_add_overflow(x, y, &r)) efail("integer overflow in +");
        return Value::integer(r);
      case BinOp::Sub:
        if (!ints) return Value::number(p - q);
        if (__builtin_sub_overflow(x, y, &r)) efail("integer overflow in -");
        return Value::integer(r);
      case BinOp::Mul:
        if (!ints) return Value::number(p * q);
        if (__builtin_mul_overflow(x, y, &r)) efail("integer overflow in *");
        return Value::integer(r);
      case BinOp::Div:
        if (q == 0) efail("{}", ints ? "division by zero" : "float division by zero");
        return Value::number(p / q);
      case BinOp::FloorDiv:
      case BinOp::Mod:
        if (ints) {
          if (y == 0) efail("integer division or modulo by zero");
          if (x == INT64_MIN && y == -1) efail("integer overflow in //");
          int64_t d = x / y, m = x % y;
          if (m != 0 && ((m < 0) != (y < 0))) {
            d -= 1;
            m += y;
          }
          return Value::integer(op == BinOp::FloorDiv ? d : m);
        } else {
          if (q == 0) efail("{}", op == BinOp::Mod ? "float modulo" : "float floor division by zero");
          double fd, fm;
          float_divmod(p, q, fd, fm);
          return Value::number(op == BinOp::FloorDiv ? fd : fm);
        }
      case BinOp::Pow:
        if (ints && y >= 0) return int_pow(x, y);
        if (p == 0 && q < 0) efail("0.0 cannot be raised to a negative power");
        if (p < 0 && q != std::floor(q)) efail("negative number cannot be raised to a fractional power");
        return Value::number(std::pow(p, q));
    }
  }
  if (op == BinOp::Add) {
    if (a.is_str() && b.is_str()) {
      budget.charge_bytes(a.s().size() + b.s().size());
      if (a.markup() || b.markup()) {  // markupsafe escapes the plain side
        std::string l = a.markup() ? a.s() : text::html_escape(a.s());
        std::string r = b.markup() ? b.s() : text::html_escape(b.s());
        budget.charge_bytes(l.size() + r.size());
        return Value::string(l + r, true);
      }
      return Value::string(a.s() + b.s());
    }
    if (a.sequence() && b.sequence() && a.tuple() == b.tuple()) {
      budget.charge_items(a.items().size() + b.items().size());
      List out = a.items();
      out.insert(out.end(), b.items().begin(), b.items().end());
      return Value::list(std::move(out), a.flags());
    }
    if (a.is_str() && !b.is_str()) efail("can only concatenate str (not \"{}\") to str", type_name(b));
    if (a.sequence() && !a.tuple())
      efail("can only concatenate list (not \"{}\") to list", type_name(b));
    bad_operands(sym, a, b);
  }
  if (op == BinOp::Mul) {
    if ((a.is_str() || a.sequence()) && b.is_int()) return repeat(budget, a, b.i());
    if ((b.is_str() || b.sequence()) && a.is_int()) return repeat(budget, b, a.i());
    if ((a.is_str() || a.is_list()) && b.is_number())
      efail("can't multiply sequence by non-int of type '{}'", type_name(b));
  }
  bad_operands(sym, a, b);
}

Value negate(const Value& a) {
  if (a.is_undefined()) undefined_fail(a);
  if (a.is(Type::Float)) return Value::number(-a.f());
  if (a.is_int()) {
    if (a.i() == INT64_MIN) efail("integer overflow in unary -");
    return Value::integer(-a.i());
  }
  efail("bad operand type for unary -: '{}'", type_name(a));
}

Value unary_plus(const Value& a) {
  if (a.is_undefined()) undefined_fail(a);
  if (a.is(Type::Float)) return a;
  if (a.is_int()) return Value::integer(a.i());
  efail("bad operand type for unary +: '{}'", type_name(a));
}

bool contains(const Value& c, const Value& needle) {
  switch (c.type()) {
    case Type::Str:
      if (!needle.is_str())
        efail("'in <string>' requires string as left operand, not {}", type_name(needle));
      charge_ambient(1 + c.s().size() / 64);
      return c.s().find(needle.s()) != std::string::npos;
    case Type::List:
      charge_ambient(1 + c.items().size());
      for (const Value& x : c.items())
        if (py_eq(x, needle)) return true;
      return false;
    case Type::Dict: return c.dict().find(needle) != nullptr;
    case Type::Undefined: return false;
    case Type::Loop:
      for (const Value& x : c.loop().seq.items())
        if (py_eq(x, needle)) return true;
      return false;
    case Type::Iter: {  // consumes up to the match, as Python does
      Value x;
      while (c.iter().next(x)) {
        charge_ambient(1);
        if (py_eq(x, needle)) return true;
      }
      return false;
    }
    default: efail("argument of type '{}' is not iterable", type_name(c));
  }
}

List iterate(Budget& budget, const Value& v) {
  switch (v.type()) {
    case Type::List:
      budget.charge(1 + v.items().size() / 8);
      return v.items();
    case Type::Dict: {
      List out;
      out.reserve(v.dict().items.size());
      for (const auto& kv : v.dict().items) out.push_back(kv.first);
      budget.charge(1 + out.size() / 8);
      return out;
    }
    case Type::Str: {
      List out;
      const std::string& s = v.s();
      budget.charge_items(s.size());
      for (size_t i = 0; i < s.size();) {
        size_t j = i;
        text::next_cp(s, j);
        out.push_back(Value::string(s.substr(i, j - i)));
        i = j;
      }
      return out;
    }
    case Type::Undefined: return {};
    case Type::Loop: return v.loop().seq.items();
    case Type::Iter: {
      List out;
      Value x;
      while (v.iter().next(x)) {
        out.push_back(std::move(x));
        budget.charge(1);
        if (out.size() > budget.limits.max_output_bytes / 8) budget.charge_items(out.size());
      }
      return out;
    }
    default: efail("'{}' object is not iterable", type_name(v));
  }
}

size_t py_len(const Value& v) {
  switch (v.type()) {
    case Type::Str: return text::cp_count(v.s());
    case Type::List: return v.items().size();
    case Type::Dict: return v.dict().items.size();
    case Type::Undefined: return 0;
    case Type::Loop: return v.loop().length();
    default: break;
  }
  efail("object of type '{}' has no len()", type_name(v));
}

}  // namespace dq::chat
