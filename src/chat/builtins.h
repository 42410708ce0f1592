// Filters, tests, Python methods and global functions available to templates.
#pragma once
#include <string_view>

#include "chat/value.h"

namespace dq::chat {

class Interp;

// Names jinja2 (plus HF's tojson) knows; the parser rejects others as jinja2 does. A known
// but unimplemented filter fails when it runs, naming itself.
bool is_filter_name(std::string_view name);
bool is_test_name(std::string_view name);

Value apply_filter(Interp& in, std::string_view name, const Value& v, Args& args);
bool apply_test(Interp& in, std::string_view name, const Value& v, Args& args);

// Python attribute lookup of a method on v: None (no such method), Safe (a bound method) or
// Unsafe (the immutable sandbox refuses it, e.g. list.append).
enum class MethodKind { None, Safe, Unsafe };
MethodKind method_kind(const Value& v, std::string_view name);
Value call_method(Interp& in, const Value& self, std::string_view name, Args& args);

// Global functions: range, dict, namespace, raise_exception, strftime_now, lipsum, cycler, joiner.
bool is_global_function(std::string_view name);
Value call_global(Interp& in, std::string_view name, Args& args);

// A filter or test is at most linear in its subject (str: bytes/16, containers: items/8);
// charging that up front keeps every step bounded.
uint64_t scan_cost(const Value& v);

// Binds call arguments to named parameters, Python style.
class Params {
 public:
  Params(std::string_view fn, Args& args, std::initializer_list<const char*> names, size_t required = 0);
  const Value* get(size_t i) const { return i < slots_.size() && slots_[i].set ? &slots_[i].v : nullptr; }
  Value get_or(size_t i, Value def) const { return get(i) ? *get(i) : std::move(def); }

 private:
  struct Slot {
    Value v;
    bool set = false;
  };
  std::vector<Slot> slots_;
};

inline void no_args(std::string_view fn, Args& args) { Params p(fn, args, {}); }
inline bool as_bool(const Value* v, bool def) { return v ? truthy(*v) : def; }

}  // namespace dq::chat
