// JSON in (nlohmann::ordered_json -> Value) and out (Python's json.dumps, which HF's tojson
// filter calls with ensure_ascii=False).
#include <algorithm>
#include <cmath>

#include "chat/text.h"
#include "chat/value.h"

namespace dq::chat {

namespace {

Value from_json_at(const Json& j, uint32_t depth) {
  if (depth > kMaxValueDepth) efail("input JSON nested deeper than {} levels", kMaxValueDepth);
  switch (j.type()) {
    case Json::value_t::null: return Value::none();
    case Json::value_t::boolean: return Value::boolean(j.get<bool>());
    case Json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case Json::value_t::number_unsigned: {
      auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) efail("input JSON integer {} is too large", u);
      return Value::integer(static_cast<int64_t>(u));
    }
    case Json::value_t::number_float: return Value::number(j.get<double>());
    case Json::value_t::string: return Value::string(j.get_ref<const std::string&>());
    case Json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const Json& x : j) items.push_back(from_json_at(x, depth + 1));
      return Value::list(std::move(items));
    }
    case Json::value_t::object: {
      auto d = std::make_shared<DictData>();
      for (auto it = j.begin(); it != j.end(); ++it)
        d->set(Value::string(it.key()), from_json_at(it.value(), depth + 1));
      d->finish();
      return Value::dict(std::move(d));
    }
    default: efail("unsupported JSON value (binary or discarded)");
  }
}

void dump_string(std::string& out, std::string_view s, bool ensure_ascii) {
  static const char* hex = "0123456789abcdef";
  auto u4 = [&](unsigned v) {
    out += "\\u";
    for (int k = 3; k >= 0; --k) out += hex[(v >> (4 * k)) & 15];
  };
  out += '"';
  for (size_t i = 0; i < s.size();) {
    char32_t c = text::next_cp(s, i);
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (c < 0x20) {
      u4(c);
    } else if (!ensure_ascii || (c >= 0x20 && c < 0x7F)) {
      text::append_cp(out, c);
    } else if (c < 0x10000) {
      u4(c);
    } else {
      char32_t v = c - 0x10000;
      u4(0xD800 + (v >> 10));
      u4(0xDC00 + (v & 0x3FF));
    }
  }
  out += '"';
}

std::string float_json(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return float_repr(d);
}

[[noreturn]] void not_serializable(const Value& v) {
  efail("Object of type {} is not JSON serializable", type_name(v));
}

struct Dumper {
  const DumpOptions& opt;
  Budget& budget;
  std::string& out;

  void newline(int level) {
    out += '\n';
    for (int k = 0; k < level; ++k) out += opt.indent;
    if (out.size() > budget.limits.max_output_bytes) budget.over_size(out.size());
  }

  std::string key_string(const Value& k) {
    switch (k.type()) {
      case Type::Str: return k.s();
      case Type::Float: return float_json(k.f());
      case Type::Bool: return k.b() ? "true" : "false";
      case Type::None: return "null";
      case Type::Int: return int_repr(k.i());
      default: efail("keys must be str, int, float, bool or None, not {}", type_name(k));
    }
  }

  void dump(const Value& v, int level) {
    if (out.size() > budget.limits.max_output_bytes) budget.over_size(out.size());
    switch (v.type()) {
      case Type::None: out += "null"; return;
      case Type::Bool: out += v.b() ? "true" : "false"; return;
      case Type::Int: out += int_repr(v.i()); return;
      case Type::Float: out += float_json(v.f()); return;
      case Type::Str: dump_string(out, v.s(), opt.ensure_ascii); return;
      case Type::List: {
        if (!v.sequence()) not_serializable(v);
        const List& xs = v.items();
        if (xs.empty()) {
          out += "[]";
          return;
        }
        out += '[';
        if (opt.has_indent) newline(level + 1);
        for (size_t i = 0; i < xs.size(); ++i) {
          if (i) {
            out += opt.item_sep;
            if (opt.has_indent) newline(level + 1);
          }
          dump(xs[i], level + 1);
        }
        if (opt.has_indent) newline(level);
        out += ']';
        return;
      }
      case Type::Dict: {
        const auto& items = v.dict().items;
        if (items.empty()) {
          out += "{}";
          return;
        }
        std::vector<const std::pair<Value, Value>*> order;
        order.reserve(items.size());
        for (const auto& kv : items) order.push_back(&kv);
        if (opt.sort_keys) {
          // Python sorts the (key, value) pairs; keys are unique so only keys compare.
          std::vector<const std::pair<Value, Value>*> tmp(order.size());
          merge_sort(order, tmp, 0, order.size());
        }
        out += '{';
        if (opt.has_indent) newline(level + 1);
        bool first = true;
        for (const auto* kv : order) {
          if (!first) {
            out += opt.item_sep;
            if (opt.has_indent) newline(level + 1);
          }
          first = false;
          dump_string(out, key_string(kv->first), opt.ensure_ascii);
          out += opt.key_sep;
          dump(kv->second, level + 1);
        }
        if (opt.has_indent) newline(level);
        out += '}';
        return;
      }
      default: not_serializable(v);
    }
  }

  // A plain merge sort: never relies on the comparison being consistent.
  void merge_sort(std::vector<const std::pair<Value, Value>*>& a,
                  std::vector<const std::pair<Value, Value>*>& tmp, size_t lo, size_t hi) {
    if (hi - lo < 2) return;
    size_t mid = lo + (hi - lo) / 2;
    merge_sort(a, tmp, lo, mid);
    merge_sort(a, tmp, mid, hi);
    size_t i = lo, j = mid, k = lo;
    while (i < mid && j < hi) {
      budget.charge(1);
      tmp[k++] = py_lt(a[j]->first, a[i]->first) ? a[j++] : a[i++];
    }
    while (i < mid) tmp[k++] = a[i++];
    while (j < hi) tmp[k++] = a[j++];
    std::copy(tmp.begin() + static_cast<ptrdiff_t>(lo), tmp.begin() + static_cast<ptrdiff_t>(hi),
              a.begin() + static_cast<ptrdiff_t>(lo));
  }
};

}  // namespace

Value from_json(const Json& j) { return from_json_at(j, 1); }

void json_dumps(std::string& out, const Value& v, const DumpOptions& opt, Budget& budget) {
  size_t start = out.size();
  Dumper{opt, budget, out}.dump(v, 0);
  budget.charge_bytes(out.size() - start);
}

}  // namespace dq::chat
