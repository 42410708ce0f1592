// Runtime values of the template engine, with Python semantics (what jinja2 delegates to).
// Values are immutable and shared (the HF sandbox is immutable); only namespace() objects and
// loop objects are mutable. Containers record their nesting depth, which is capped, so every
// recursive walk (repr, json, equality, destruction) is bounded.
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "chat/template.h"

namespace dq::chat {

struct Node;
struct Scope;

// A runtime failure without a position; the interpreter prefixes "chat template:LINE:COL: ".
struct EvalError {
  std::string msg;
};
template <class... A>
[[noreturn]] void efail(fmt::format_string<A...> f, A&&... a) {
  throw EvalError{fmt::format(f, std::forward<A>(a)...)};
}

// Containers nested deeper than this are refused (JSON input or built by a template).
constexpr uint32_t kMaxValueDepth = 256;

// Iter: a lazy Python iterator (what |map, |select, |unique, |items, |reverse return).
enum class Type : uint8_t { Undefined, None, Bool, Int, Float, Str, List, Dict, Namespace, Callable, Loop, Iter };

class Value;
using List = std::vector<Value>;
struct ListData;
struct DictData;
struct NamespaceData;
struct LoopData;
struct CallableData;
struct IterData;

class Value {
 public:
  // Str: kMarkup (a markupsafe.Markup). List: kTuple or a dict view. Undefined: kUnsafe (a
  // sandbox SecurityError when used).
  enum Flag : uint8_t {
    kMarkup = 1, kTuple = 1, kUnsafe = 1,
    kItemsView = 4, kKeysView = 8, kValuesView = 16,  // dict.items() / keys() / values()
  };

  Value() : i_(0) {}
  static Value undefined(std::string hint = {}, bool unsafe = false);
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double f);
  static Value string(std::string s, bool markup = false);
  static Value list(List items, uint8_t flags = 0);
  static Value tuple(List items) { return list(std::move(items), kTuple); }
  static Value dict(std::shared_ptr<const DictData> d);
  static Value ns(std::shared_ptr<NamespaceData> n);
  static Value loop(std::shared_ptr<LoopData> l);
  static Value callable(std::shared_ptr<const CallableData> c);
  static Value iter(std::shared_ptr<IterData> it);

  Type type() const { return type_; }
  bool is(Type t) const { return type_ == t; }
  bool is_undefined() const { return type_ == Type::Undefined; }
  bool is_none() const { return type_ == Type::None; }
  bool is_str() const { return type_ == Type::Str; }
  bool is_list() const { return type_ == Type::List; }
  bool is_dict() const { return type_ == Type::Dict; }
  bool is_int() const { return type_ == Type::Int || type_ == Type::Bool; }  // Python int (bool too)
  bool is_number() const { return is_int() || type_ == Type::Float; }

  bool b() const { return i_ != 0; }
  int64_t i() const { return i_; }  // Int and Bool
  double f() const { return f_; }
  double as_double() const { return type_ == Type::Float ? f_ : static_cast<double>(i_); }
  const std::string& s() const;  // Str, and the hint of an Undefined ("" when none)
  bool markup() const { return type_ == Type::Str && (flags_ & kMarkup); }
  bool unsafe() const { return type_ == Type::Undefined && (flags_ & kUnsafe); }
  const List& items() const;
  bool tuple() const { return type_ == Type::List && (flags_ & kTuple); }
  bool view() const { return type_ == Type::List && (flags_ & (kItemsView | kKeysView | kValuesView)); }
  // A real list or tuple: subscriptable, sliceable, JSON-serialisable.
  bool sequence() const { return type_ == Type::List && !(flags_ & ~kTuple); }
  uint8_t flags() const { return flags_; }
  const DictData& dict() const;
  NamespaceData& ns() const;
  LoopData& loop() const;
  const CallableData& fn() const;
  IterData& iter() const;
  const void* identity() const { return p_.get(); }

  uint32_t depth() const;      // container nesting (0 for scalars)
  bool holds_ref() const;      // is or contains a namespace/loop (mutable, could form a cycle)

 private:
  Type type_ = Type::Undefined;
  uint8_t flags_ = 0;
  union {
    int64_t i_;
    double f_;
  };
  std::shared_ptr<const void> p_;
};

struct ListData {
  List items;
  uint32_t depth = 1;
  bool refs = false;
};

// An insertion-ordered dict with Python key equality (1 == 1.0 == True).
struct DictData {
  std::vector<std::pair<Value, Value>> items;
  std::unordered_map<std::string, size_t> index;  // string keys, built for larger dicts
  uint32_t depth = 1;
  bool refs = false;

  const Value* find(std::string_view key) const;
  const Value* find(const Value& key) const;  // throws "unhashable type" for lists and dicts
  // Inserts or overwrites (Python keeps the first position).
  void set(Value key, Value value);
  void finish();  // computes depth/refs; call once after the last set
};

struct NamespaceData {
  std::vector<std::pair<std::string, Value>> attrs;
  const Value* find(std::string_view name) const;
  void set(std::string_view name, Value v);
};

struct LoopData {
  Value seq;  // the materialised items (a List)
  size_t index0 = 0;
  uint32_t depth0 = 0;
  bool has_changed = false;
  Value last_changed;
  size_t length() const { return seq.items().size(); }
};

struct CallableData {
  enum class Kind : uint8_t { Builtin, Method, Macro };
  Kind kind = Kind::Builtin;
  std::string name;             // builtin or method name, or the macro's name
  Value self;                   // Method: the bound object
  const Node* macro = nullptr;  // Macro: its definition (owned by the Template)
  std::weak_ptr<Scope> closure; // Macro: the scope it was defined in
};

// A Python iterator: pulls items one at a time; once exhausted (or failed) it stays empty.
struct IterData {
  std::string kind;                     // Python's type name: "generator", "list_reverseiterator"...
  std::function<bool(Value&)> next_fn;  // stores the next item; false at the end
  bool exhausted = false;
  bool refs = false;  // captures a namespace/loop object
  bool next(Value& out);
};

// Python's iter(v): list/tuple items, dict keys, str characters, iterator items; Undefined is
// empty. Throws "'int' object is not iterable" for everything else.
class Cursor {
 public:
  explicit Cursor(Value v);
  bool next(Value& out);

 private:
  Value v_;
  size_t i_ = 0;
};

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

// Step and size accounting shared by the interpreter and the value operations.
struct Budget {
  Limits limits;
  uint64_t steps = 0;
  void charge(uint64_t n) {
    steps += n;
    if (steps > limits.max_steps) over_steps();
  }
  // A new string of `bytes` bytes is about to be built.
  void charge_bytes(size_t bytes) {
    if (bytes > limits.max_output_bytes) over_size(bytes);
    charge(1 + bytes / 4);
  }
  void charge_items(size_t n);
  [[noreturn]] void over_steps() const;
  [[noreturn]] void over_size(size_t bytes) const;
};

// The budget of the render running on this thread, for work deep inside value operations
// (==, <, in, repr) that has no budget parameter: comparing two big lists is charged per
// element, so no single step can hide unbounded work.
class BudgetScope {
 public:
  explicit BudgetScope(Budget& b);
  ~BudgetScope();

 private:
  Budget* saved_;
};
void charge_ambient(uint64_t n);     // no-op outside a render
void check_ambient_size(size_t bytes);  // a string being built has grown to `bytes`

// ---- Python semantics ------------------------------------------------------------------------
bool truthy(const Value& v);
bool py_eq(const Value& a, const Value& b);
bool py_lt(const Value& a, const Value& b);  // a < b; TypeError between unordered types
enum class CmpOp : uint8_t { Eq, Ne, Lt, Le, Gt, Ge };
bool compare(CmpOp op, const Value& a, const Value& b);
std::string type_name(const Value& v);         // Python's type(v).__name__
std::string object_type_repr(const Value& v);  // jinja2's object_type_repr
std::string py_str(const Value& v);            // str(v)
void py_repr(std::string& out, const Value& v);
std::string py_repr(const Value& v);
std::string float_repr(double d);
std::string int_repr(int64_t i);
// Throws UndefinedError-style EvalError for an Undefined operand.
[[noreturn]] void undefined_fail(const Value& u);
void check_hashable(const Value& key);

enum class BinOp : uint8_t { Add, Sub, Mul, Div, FloorDiv, Mod, Pow };
Value binop(Budget& budget, BinOp op, const Value& a, const Value& b);
Value negate(const Value& a);
Value unary_plus(const Value& a);
bool contains(const Value& container, const Value& needle);  // `needle in container`
// Python iteration: list/tuple items, dict keys, str characters, Undefined -> nothing.
List iterate(Budget& budget, const Value& v);
// Python len(); error for values without one.
size_t py_len(const Value& v);
// Python str % args (printf-style formatting).
std::string percent_format(Budget& budget, const Value& fmt, const Value& args);

// ---- JSON ------------------------------------------------------------------------------------
Value from_json(const Json& j);
struct DumpOptions {
  bool ensure_ascii = false;
  std::string indent;  // used when has_indent
  bool has_indent = false;
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
};
// Python json.dumps(v, ...).
void json_dumps(std::string& out, const Value& v, const DumpOptions& opt, Budget& budget);

}  // namespace dq::chat
