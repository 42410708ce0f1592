// jinja2's builtin filters (jinja2/filters.py) with HF's tojson.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <unordered_map>

#include "chat/builtins.h"
#include "chat/interp.h"
#include "chat/text.h"

namespace dq::chat {

namespace {

using FilterFn = Value (*)(Interp&, const Value&, Args&);

Value str(std::string s) { return Value::string(std::move(s)); }
// markupsafe.soft_str: keeps a Markup, str() for everything else.
Value soft_str(const Value& v) { return v.is_str() ? v : str(py_str(v)); }
// A str method applied through soft_str keeps the Markup flag.
Value keep(const Value& like, std::string s) { return Value::string(std::move(s), like.markup()); }

int64_t as_int(const Value& v, const char* what) {
  if (!v.is_int()) efail("'{}' object cannot be interpreted as an integer ({})", type_name(v), what);
  return v.i();
}

Value ignore_case(const Value& v) { return v.is_str() ? keep(v, text::lower(v.s())) : v; }

// make_attrgetter / make_multi_attrgetter: "a.b.0" paths, integer parts as indexes.
std::vector<Value> attribute_parts(const Value& attr) {
  std::vector<Value> parts;
  if (attr.is_none()) return parts;
  if (!attr.is_str()) return {attr};
  const std::string& s = attr.s();
  size_t start = 0;
  while (true) {
    size_t dot = s.find('.', start);
    std::string part = s.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits && part.size() < 18) parts.push_back(Value::integer(std::stoll(part)));
    else parts.push_back(str(part));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

Value get_path(Interp& in, Value item, const std::vector<Value>& parts, const Value* def) {
  for (const Value& p : parts) {
    item = in.getitem(item, p);
    if (def && !def->is_none() && item.is_undefined()) item = *def;
  }
  return item;
}

// A stable merge sort that only uses `less` and never trusts it to be consistent.
template <class Less>
void merge_sort(Interp& in, std::vector<size_t>& idx, Less less) {
  std::vector<size_t> tmp(idx.size());
  for (size_t width = 1; width < idx.size(); width *= 2) {
    for (size_t lo = 0; lo < idx.size(); lo += 2 * width) {
      size_t mid = std::min(lo + width, idx.size()), hi = std::min(lo + 2 * width, idx.size());
      size_t i = lo, j = mid, k = lo;
      while (i < mid && j < hi) {
        in.budget.charge(1);
        tmp[k++] = less(idx[j], idx[i]) ? idx[j++] : idx[i++];
      }
      while (i < mid) tmp[k++] = idx[i++];
      while (j < hi) tmp[k++] = idx[j++];
    }
    idx.swap(tmp);
  }
}

// Python sorted(items, key=keys[i], reverse=reverse), stable.
List sorted_by(Interp& in, const List& items, const List& keys, bool reverse) {
  std::vector<size_t> idx(items.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  merge_sort(in, idx, [&](size_t a, size_t b) {
    return reverse ? py_lt(keys[b], keys[a]) : py_lt(keys[a], keys[b]);
  });
  List out;
  out.reserve(items.size());
  for (size_t i : idx) out.push_back(items[i]);
  return out;
}

// Python's int(str, base) and float(str).
bool parse_py_int(std::string_view s0, int base, int64_t& out) {
  std::string s = text::strip(s0, nullptr, true, true);
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  if (i + 1 < s.size() && s[i] == '0') {
    char p = static_cast<char>(tolower(static_cast<unsigned char>(s[i + 1])));
    if ((p == 'x' && base == 16) || (p == 'o' && base == 8) || (p == 'b' && base == 2)) {
      i += 2;
      if (i < s.size() && s[i] == '_') ++i;
    }
  }
  if (i >= s.size()) return false;
  unsigned __int128 v = 0;
  bool prev_digit = false;
  for (; i < s.size(); ++i) {
    char c = static_cast<char>(tolower(static_cast<unsigned char>(s[i])));
    if (c == '_') {
      if (!prev_digit || i + 1 >= s.size()) return false;
      prev_digit = false;
      continue;
    }
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'z' ? c - 'a' + 10 : 99;
    if (d >= base) return false;
    v = v * static_cast<unsigned>(base) + static_cast<unsigned>(d);
    if (v > static_cast<unsigned __int128>(INT64_MAX) + 1) efail("integer too large");
    prev_digit = true;
  }
  if (!prev_digit) return false;
  if (!neg && v > static_cast<unsigned __int128>(INT64_MAX)) efail("integer too large");
  out = neg ? static_cast<int64_t>(0 - static_cast<uint64_t>(v)) : static_cast<int64_t>(v);
  return true;
}

bool parse_py_float(std::string_view s0, double& out) {
  std::string s = text::strip(s0, nullptr, true, true), t;
  std::string low = text::lower(s);
  size_t i = 0;
  if (i < low.size() && (low[i] == '+' || low[i] == '-')) ++i;
  std::string_view rest = std::string_view(low).substr(i);
  if (rest == "inf" || rest == "infinity" || rest == "nan") {
    out = rest == "nan" ? NAN : INFINITY;
    if (low[0] == '-') out = -out;
    return true;
  }
  // digits with single underscores between digits, optional fraction and exponent
  auto digits = [&](size_t& j) {
    size_t start = j;
    while (j < s.size()) {
      if (isdigit(static_cast<unsigned char>(s[j]))) {
        t += s[j++];
      } else if (s[j] == '_' && j > start && j + 1 < s.size() && isdigit(static_cast<unsigned char>(s[j - 1])) &&
                 isdigit(static_cast<unsigned char>(s[j + 1]))) {
        ++j;
      } else {
        break;
      }
    }
    return j > start;
  };
  size_t j = 0;
  if (j < s.size() && (s[j] == '+' || s[j] == '-')) t += s[j++];
  bool int_part = digits(j), frac_part = false;
  if (j < s.size() && s[j] == '.') {
    t += s[j++];
    frac_part = digits(j);
  }
  if (!int_part && !frac_part) return false;
  if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
    t += s[j++];
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) t += s[j++];
    if (!digits(j)) return false;
  }
  if (j != s.size()) return false;
  out = std::strtod(t.c_str(), nullptr);
  return true;
}

// Python round(x, ndigits) for floats: correctly rounded (half-even on the exact value).
double py_round(double x, int64_t nd) {
  if (!std::isfinite(x) || nd > 323) return x;
  if (nd < -308) return 0.0 * x;
  if (nd >= 0) {
    char buf[400];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(nd), x);
    return std::strtod(buf, nullptr);
  }
  double p = std::pow(10.0, static_cast<double>(-nd));
  double y = x / p, z = std::nearbyint(y);
  return z * p;
}

// ---- filters ---------------------------------------------------------------------------------

Value f_abs(Interp&, const Value& v, Args& a) {
  no_args("abs", a);
  if (v.is(Type::Float)) return Value::number(std::fabs(v.f()));
  if (v.is_int()) {
    if (v.i() == INT64_MIN) efail("integer overflow in abs");
    return Value::integer(v.i() < 0 ? -v.i() : v.i());
  }
  if (v.is_undefined()) undefined_fail(v);
  efail("bad operand type for abs(): '{}'", type_name(v));
}

Value f_attr(Interp& in, const Value& v, Args& a) {
  Params p("attr", a, {"name"}, 1);
  if (!p.get(0)->is_str()) return Value::undefined();
  return in.getattr_only(v, p.get(0)->s());
}

Value f_capitalize(Interp&, const Value& v, Args& a) {
  no_args("capitalize", a);
  Value s = soft_str(v);
  return keep(s, text::capitalize(s.s()));
}

std::string py_center(const std::string& s, int64_t width, const std::string& fill) {
  auto len = static_cast<int64_t>(text::cp_count(s));
  if (width <= len) return s;
  int64_t marg = width - len;
  int64_t left = marg / 2 + (marg & width & 1);
  std::string out;
  for (int64_t k = 0; k < left; ++k) out += fill;
  out += s;
  for (int64_t k = 0; k < marg - left; ++k) out += fill;
  return out;
}

Value f_center(Interp& in, const Value& v, Args& a) {
  Params p("center", a, {"width"});
  int64_t width = p.get(0) ? as_int(*p.get(0), "width") : 80;
  Value s = soft_str(v);
  in.budget.charge_bytes(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(width, 1 << 30))));
  return keep(s, py_center(s.s(), width, " "));
}

Value f_length(Interp&, const Value& v, Args& a) {
  no_args("length", a);
  return Value::integer(static_cast<int64_t>(py_len(v)));
}

Value f_default(Interp&, const Value& v, Args& a) {
  Params p("default", a, {"default_value", "boolean"});
  if (v.is_undefined() || (as_bool(p.get(1), false) && !truthy(v))) return p.get_or(0, str(""));
  return v;
}

Value f_dictsort(Interp& in, const Value& v, Args& a) {
  Params p("dictsort", a, {"case_sensitive", "by", "reverse"});
  bool cs = as_bool(p.get(0), false);
  std::string by = p.get(1) ? py_str(*p.get(1)) : "key";
  size_t pos = by == "key" ? 0 : by == "value" ? 1 : 2;
  if (pos == 2) efail("You can only sort by either \"key\" or \"value\"");
  if (!v.is_dict()) efail("'{}' object has no attribute 'items'", type_name(v));
  List items, keys;
  for (const auto& [k, x] : v.dict().items) {
    items.push_back(Value::tuple({k, x}));
    const Value& key = pos == 0 ? k : x;
    keys.push_back(cs ? key : ignore_case(key));
  }
  return Value::list(sorted_by(in, items, keys, as_bool(p.get(2), false)));
}

Value f_escape(Interp&, const Value& v, Args& a) {
  no_args("escape", a);
  if (v.markup()) return v;
  return Value::string(text::html_escape(py_str(v)), true);
}

Value f_forceescape(Interp&, const Value& v, Args& a) {
  no_args("forceescape", a);
  return Value::string(text::html_escape(py_str(v)), true);
}

Value f_first(Interp&, const Value& v, Args& a) {
  no_args("first", a);
  Cursor cur(v);  // next(iter(seq)): takes one item of an iterator
  Value x;
  if (!cur.next(x)) return Value::undefined("No first item, sequence was empty.");
  return x;
}

Value f_last(Interp& in, const Value& v, Args& a) {
  no_args("last", a);
  if (!v.is_str() && !v.is_list() && !v.is_dict() && !v.is_undefined())
    efail("'{}' object is not reversible", type_name(v));
  if (v.is_str()) {
    if (v.s().empty()) return Value::undefined("No last item, sequence was empty.");
    std::u32string last(1, text::decode(v.s()).back());
    return str(text::encode(last));
  }
  List items = iterate(in.budget, v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_float(Interp&, const Value& v, Args& a) {
  Params p("float", a, {"default"});
  Value def = p.get_or(0, Value::number(0.0));
  if (v.is_undefined()) undefined_fail(v);
  if (v.is_number()) return Value::number(v.as_double());
  double d;
  if (v.is_str() && parse_py_float(v.s(), d)) return Value::number(d);
  return def;
}

Value f_format(Interp& in, const Value& v, Args& a) {
  if (!a.pos.empty() && !a.kw.empty()) efail("can't handle positional and keyword arguments at the same time");
  Value args;
  if (!a.kw.empty()) {
    auto d = std::make_shared<DictData>();
    for (auto& [k, x] : a.kw) d->set(str(k), x);
    d->finish();
    args = Value::dict(std::move(d));
  } else {
    args = Value::tuple(a.pos);
  }
  Value s = soft_str(v);
  return keep(s, percent_format(in.budget, s, args));
}

Value f_indent(Interp& in, const Value& v, Args& a) {
  Params p("indent", a, {"width", "first", "blank"});
  std::string ind;
  if (p.get(0) && p.get(0)->is_str()) {
    ind = p.get(0)->s();
  } else {
    int64_t w = p.get(0) ? as_int(*p.get(0), "width") : 4;
    if (w > 0) {
      in.budget.charge_bytes(static_cast<size_t>(std::min<int64_t>(w, 1 << 30)));
      ind.assign(static_cast<size_t>(w), ' ');
    }
  }
  if (v.is_undefined()) undefined_fail(v);
  if (!v.is_str()) efail("unsupported operand type(s) for +=: '{}' and 'str'", type_name(v));
  std::u32string s = text::decode(v.s() + "\n");
  // str.splitlines
  std::vector<std::u32string> lines;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (!text::is_linebreak(s[i])) continue;
    lines.push_back(s.substr(start, i - start));
    if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
    start = i + 1;
  }
  if (start < s.size()) lines.push_back(s.substr(start));
  std::string rv;
  bool blank = as_bool(p.get(2), false);
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) rv += "\n";
    std::string line = text::encode(lines[i]);
    if (i > 0 && (blank || !line.empty())) rv += ind;
    rv += line;
    if (rv.size() > in.budget.limits.max_output_bytes) in.budget.over_size(rv.size());
  }
  if (as_bool(p.get(1), false)) rv = ind + rv;
  in.budget.charge_bytes(rv.size());
  return keep(v, std::move(rv));
}

Value f_int(Interp&, const Value& v, Args& a) {
  Params p("int", a, {"default", "base"});
  Value def = p.get_or(0, Value::integer(0));
  int64_t base = p.get(1) ? as_int(*p.get(1), "base") : 10;
  if (v.is_undefined()) undefined_fail(v);
  if (v.is_int()) return Value::integer(v.i());
  if (v.is(Type::Float)) {
    if (std::isnan(v.f())) return def;
    if (std::isinf(v.f())) efail("cannot convert float infinity to integer");
    if (std::fabs(v.f()) >= 9.2e18) efail("integer too large");
    return Value::integer(static_cast<int64_t>(v.f()));
  }
  if (v.is_str()) {
    if (base < 2 || base > 36) efail("int() base must be >= 2 and <= 36");
    int64_t i;
    if (parse_py_int(v.s(), static_cast<int>(base), i)) return Value::integer(i);
    double d;
    if (parse_py_float(v.s(), d)) {
      if (std::isnan(d)) return def;
      if (std::isinf(d)) efail("cannot convert float infinity to integer");
      if (std::fabs(d) >= 9.2e18) efail("integer too large");
      return Value::integer(static_cast<int64_t>(d));
    }
  }
  return def;
}

// A lazy iterator named `kind` whose next() is `fn`; refs says whether it captures a
// namespace or loop object (see Value::holds_ref).
Value make_iter(std::string kind, bool refs, std::function<bool(Value&)> fn) {
  auto it = std::make_shared<IterData>();
  it->kind = std::move(kind);
  it->refs = refs;
  it->next_fn = std::move(fn);
  return Value::iter(std::move(it));
}

bool args_refs(const Value& v, const Args& a) {
  bool r = v.holds_ref();
  for (const Value& x : a.pos) r = r || x.holds_ref();
  for (const auto& kv : a.kw) r = r || kv.second.holds_ref();
  return r;
}

Value f_items(Interp& in, const Value& v, Args& a) {
  no_args("items", a);
  std::optional<Cursor> keys;
  Interp* ip = &in;
  return make_iter("generator", v.holds_ref(), [ip, v, keys](Value& out) mutable {
    if (v.is_undefined()) return false;
    if (!v.is_dict()) efail("Can only get item pairs from a mapping.");
    if (!keys) keys.emplace(v);
    Value k;
    if (!keys->next(k)) return false;
    ip->budget.charge(1);
    out = Value::tuple({k, *v.dict().find(k)});
    return true;
  });
}

Value f_join(Interp& in, const Value& v, Args& a) {
  Params p("join", a, {"d", "attribute"});
  std::string sep = p.get(0) ? py_str(*p.get(0)) : "";
  List items = iterate(in.budget, v);
  std::vector<Value> parts;
  if (p.get(1) && !p.get(1)->is_none()) parts = attribute_parts(*p.get(1));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    Value x = parts.empty() ? items[i] : get_path(in, items[i], parts, nullptr);
    out += x.is_str() ? x.s() : py_str(x);
    if (out.size() > in.budget.limits.max_output_bytes) in.budget.over_size(out.size());
  }
  in.budget.charge_bytes(out.size());
  return str(std::move(out));
}

Value f_list(Interp& in, const Value& v, Args& a) {
  no_args("list", a);
  return Value::list(iterate(in.budget, v));
}

Value f_lower(Interp&, const Value& v, Args& a) {
  no_args("lower", a);
  Value s = soft_str(v);
  return keep(s, text::lower(s.s()));
}

Value f_upper(Interp&, const Value& v, Args& a) {
  no_args("upper", a);
  Value s = soft_str(v);
  return keep(s, text::upper(s.s()));
}

// |map: a generator; nothing runs until the first item is pulled (jinja2's sync_do_map).
Value f_map(Interp& in, const Value& v, Args& a) {
  Interp* ip = &in;
  bool started = false;
  std::optional<Cursor> cur;
  std::vector<Value> parts;
  Value def;
  bool by_attr = false;
  Value name;
  Args rest;
  return make_iter("generator", args_refs(v, a),
                   [=](Value& out) mutable {
    if (!started) {
      started = true;
      if (!truthy(v)) return false;
      if (a.pos.empty() && std::any_of(a.kw.begin(), a.kw.end(), [](auto& kv) { return kv.first == "attribute"; })) {
        Args kw = a;
        Params p("map", kw, {"attribute", "default"});
        parts = attribute_parts(*p.get(0));
        def = p.get_or(1, Value::none());
        by_attr = true;
      } else {
        if (a.pos.empty()) efail("map requires a filter argument");
        name = a.pos.front();
        rest.pos.assign(a.pos.begin() + 1, a.pos.end());
        rest.kw = a.kw;
      }
      cur.emplace(v);
    }
    if (!cur) return false;
    Value item;
    if (!cur->next(item)) return false;
    ip->budget.charge(1);
    if (by_attr) {
      out = get_path(*ip, item, parts, &def);
    } else {
      Args call = rest;
      out = apply_filter(*ip, py_str(name), item, call);
    }
    return true;
  });
}

Value min_or_max(Interp& in, const Value& v, Args& a, bool want_max, const char* fn) {
  Params p(fn, a, {"case_sensitive", "attribute"});
  List items = iterate(in.budget, v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  std::vector<Value> parts = p.get(1) ? attribute_parts(*p.get(1)) : std::vector<Value>{};
  bool cs = as_bool(p.get(0), false);
  auto key = [&](const Value& x) {
    Value k = get_path(in, x, parts, nullptr);
    return cs ? k : ignore_case(k);
  };
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key(items[i]);
    if (want_max ? compare(CmpOp::Gt, k, best_key) : compare(CmpOp::Lt, k, best_key)) {
      best = i;
      best_key = k;
    }
  }
  return items[best];
}
Value f_max(Interp& in, const Value& v, Args& a) { return min_or_max(in, v, a, true, "max"); }
Value f_min(Interp& in, const Value& v, Args& a) { return min_or_max(in, v, a, false, "min"); }

// |select, |reject, |selectattr, |rejectattr: generators (jinja2's select_or_reject).
Value select_or_reject(Interp& in, const Value& v, Args& a, bool lookup_attr, bool select) {
  Interp* ip = &in;
  bool started = false, has_test = false;
  std::optional<Cursor> cur;
  std::vector<Value> parts;
  Value test_name;
  Args rest;
  return make_iter("generator", args_refs(v, a), [=](Value& out) mutable {
    if (!started) {
      started = true;
      if (!truthy(v)) return false;
      size_t off = 0;
      if (lookup_attr) {
        if (a.pos.empty()) efail("Missing parameter for attribute name");
        parts = attribute_parts(a.pos[0]);
        off = 1;
      }
      has_test = a.pos.size() > off;
      if (has_test) {
        test_name = a.pos[off];
        rest.pos.assign(a.pos.begin() + static_cast<ptrdiff_t>(off + 1), a.pos.end());
        rest.kw = a.kw;
      }
      cur.emplace(v);
    }
    if (!cur) return false;
    Value x;
    while (cur->next(x)) {
      ip->budget.charge(1);
      Value t = lookup_attr ? get_path(*ip, x, parts, nullptr) : x;
      bool r;
      if (has_test) {
        Args call = rest;
        r = apply_test(*ip, py_str(test_name), t, call);
      } else {
        r = truthy(t);
      }
      if (r == select) {
        out = x;
        return true;
      }
    }
    return false;
  });
}

Value f_select(Interp& in, const Value& v, Args& a) { return select_or_reject(in, v, a, false, true); }
Value f_reject(Interp& in, const Value& v, Args& a) { return select_or_reject(in, v, a, false, false); }
Value f_selectattr(Interp& in, const Value& v, Args& a) { return select_or_reject(in, v, a, true, true); }
Value f_rejectattr(Interp& in, const Value& v, Args& a) { return select_or_reject(in, v, a, true, false); }

// Python str.replace with count (negative: all).
std::string py_replace(Budget& budget, const std::string& s, const std::string& old, const std::string& rep,
                       int64_t count) {
  std::string out;
  if (old.empty()) {
    int64_t n = 0;
    size_t i = 0;
    while (true) {
      if (count >= 0 && n >= count) {
        out.append(s, i, std::string::npos);
        break;
      }
      out += rep;
      ++n;
      if (i >= s.size()) break;
      size_t j = i;
      text::next_cp(s, j);
      out.append(s, i, j - i);
      i = j;
      if (out.size() > budget.limits.max_output_bytes) budget.over_size(out.size());
    }
  } else {
    size_t i = 0;
    int64_t n = 0;
    while (count < 0 || n < count) {
      size_t j = s.find(old, i);
      if (j == std::string::npos) break;
      out.append(s, i, j - i);
      out += rep;
      i = j + old.size();
      ++n;
      if (out.size() > budget.limits.max_output_bytes) budget.over_size(out.size());
    }
    out.append(s, i, std::string::npos);
  }
  budget.charge_bytes(out.size());
  return out;
}

Value f_replace(Interp& in, const Value& v, Args& a) {
  Params p("replace", a, {"old", "new", "count"}, 2);
  int64_t count = p.get(2) && !p.get(2)->is_none() ? as_int(*p.get(2), "count") : -1;
  return str(py_replace(in.budget, py_str(v), py_str(*p.get(0)), py_str(*p.get(1)), count));
}

Value f_reverse(Interp& in, const Value& v, Args& a) {
  no_args("reverse", a);
  if (v.is_str()) {
    std::u32string u = text::decode(v.s());
    std::reverse(u.begin(), u.end());
    return keep(v, text::encode(u));
  }
  if (v.is(Type::Iter)) {  // reversed() refuses iterators: jinja2 falls back to list(value)
    List items = iterate(in.budget, v);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (!v.is_list() && !v.is_dict() && !v.is_undefined()) efail("argument must be iterable");
  List items = iterate(in.budget, v);
  std::reverse(items.begin(), items.end());
  std::string kind = v.is_dict() ? "dict_reversekeyiterator"
                     : v.view() ? "dict_reverseiterator"
                     : v.is_list() && !v.tuple() ? "list_reverseiterator" : "reversed";
  size_t i = 0;
  return make_iter(kind, v.holds_ref(), [items = std::move(items), i](Value& out) mutable {
    if (i >= items.size()) return false;
    out = items[i++];
    return true;
  });
}

Value f_round(Interp&, const Value& v, Args& a) {
  Params p("round", a, {"precision", "method"});
  int64_t prec = p.get(0) ? as_int(*p.get(0), "precision") : 0;
  std::string method = p.get(1) ? py_str(*p.get(1)) : "common";
  if (method != "common" && method != "ceil" && method != "floor")
    efail("method must be common, ceil or floor");
  if (v.is_undefined()) undefined_fail(v);
  if (!v.is_number()) efail("type {} doesn't define __round__ method", type_name(v));
  if (method == "common") {
    if (v.is_int()) {
      if (prec >= 0) return Value::integer(v.i());
      if (prec < -18) return Value::integer(0);
      int64_t p10 = 1;
      for (int64_t k = 0; k < -prec; ++k) p10 *= 10;
      int64_t q = v.i() / p10, r = v.i() % p10;
      if (r < 0) {
        r += p10;
        q -= 1;
      }
      if (2 * r > p10 || (2 * r == p10 && (q & 1))) q += 1;
      return Value::integer(q * p10);
    }
    return Value::number(py_round(v.f(), prec));
  }
  double scale = std::pow(10.0, static_cast<double>(prec));
  double x = v.as_double() * scale;
  x = method == "ceil" ? std::ceil(x) : std::floor(x);
  return Value::number(x / scale);
}

Value f_safe(Interp&, const Value& v, Args& a) {
  no_args("safe", a);
  if (v.markup()) return v;
  return Value::string(py_str(v), true);
}

Value f_sort(Interp& in, const Value& v, Args& a) {
  Params p("sort", a, {"reverse", "case_sensitive", "attribute"});
  bool cs = as_bool(p.get(1), false);
  List items = iterate(in.budget, v);
  // make_multi_attrgetter: "a,b" sorts by several attributes; the key is a list.
  std::vector<std::vector<Value>> paths;
  if (p.get(2) && p.get(2)->is_str()) {
    const std::string& s = p.get(2)->s();
    size_t start = 0;
    while (true) {
      size_t comma = s.find(',', start);
      paths.push_back(attribute_parts(str(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start))));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  } else {
    paths.push_back(p.get(2) ? attribute_parts(*p.get(2)) : std::vector<Value>{});
  }
  List keys;
  keys.reserve(items.size());
  for (const Value& x : items) {
    List k;
    for (const auto& path : paths) {
      Value kv = get_path(in, x, path, nullptr);
      k.push_back(cs ? kv : ignore_case(kv));
    }
    keys.push_back(Value::list(std::move(k)));
  }
  return Value::list(sorted_by(in, items, keys, as_bool(p.get(0), false)));
}

Value f_string(Interp&, const Value& v, Args& a) {
  no_args("string", a);
  return soft_str(v);
}

Value f_sum(Interp& in, const Value& v, Args& a) {
  Params p("sum", a, {"attribute", "start"});
  Value total = p.get_or(1, Value::integer(0));
  if (total.is_str()) efail("sum() can't sum strings [use ''.join(seq) instead]");
  std::vector<Value> parts = p.get(0) && !p.get(0)->is_none() ? attribute_parts(*p.get(0)) : std::vector<Value>{};
  for (const Value& x : iterate(in.budget, v)) total = binop(in.budget, BinOp::Add, total, get_path(in, x, parts, nullptr));
  return total;
}

Value f_title(Interp&, const Value& v, Args& a) {
  no_args("title", a);
  std::u32string u = text::decode(py_str(v));
  std::string out;
  auto is_sep = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || text::is_space(c);
  };
  for (size_t i = 0; i < u.size();) {
    size_t j = i;
    bool sep = is_sep(u[i]);
    while (j < u.size() && is_sep(u[j]) == sep) ++j;
    std::string item = text::encode(std::u32string_view(u).substr(i, j - i));
    if (sep) {
      out += item;
    } else {
      size_t k = 0;
      text::next_cp(item, k);
      out += text::upper(item.substr(0, k)) + text::lower(item.substr(k));
    }
    i = j;
  }
  return str(std::move(out));
}

Value f_tojson(Interp& in, const Value& v, Args& a) {
  Params p("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  DumpOptions opt;
  opt.ensure_ascii = as_bool(p.get(0), false);
  opt.sort_keys = as_bool(p.get(3), false);
  if (const Value* ind = p.get(1); ind && !ind->is_none()) {
    opt.has_indent = true;
    if (ind->is_str()) {
      opt.indent = ind->s();
    } else if (ind->is_int()) {
      if (ind->i() > 0) opt.indent.assign(static_cast<size_t>(std::min<int64_t>(ind->i(), 1 << 20)), ' ');
    } else {
      efail("can't multiply sequence by non-int of type '{}'", type_name(*ind));
    }
    opt.item_sep = ",";
  }
  if (const Value* sep = p.get(2); sep && !sep->is_none()) {
    if (!sep->sequence() || sep->items().size() != 2 || !sep->items()[0].is_str() ||
        !sep->items()[1].is_str())
      efail("separators must be a pair of strings");
    opt.item_sep = sep->items()[0].s();
    opt.key_sep = sep->items()[1].s();
  }
  std::string out;
  json_dumps(out, v, opt, in.budget);
  return str(std::move(out));
}

Value f_trim(Interp&, const Value& v, Args& a) {
  Params p("trim", a, {"chars"});
  Value s = soft_str(v);
  if (p.get(0) && !p.get(0)->is_none()) {
    if (!p.get(0)->is_str()) efail("strip arg must be None or str");
    std::u32string chars = text::decode(p.get(0)->s());
    return keep(s, text::strip(s.s(), &chars, true, true));
  }
  return keep(s, text::strip(s.s(), nullptr, true, true));
}

// |batch(linecount, fill_with=None): a generator of lists (jinja2's sync_do_batch).
Value f_batch(Interp& in, const Value& v, Args& a) {
  Params p("batch", a, {"linecount", "fill_with"}, 1);
  Value count = *p.get(0), fill = p.get_or(1, Value::none());
  Interp* ip = &in;
  std::optional<Cursor> cur;
  bool done = false;
  return make_iter("generator", v.holds_ref() || fill.holds_ref(), [=](Value& out) mutable {
    if (done) return false;
    if (!cur) cur.emplace(v);
    if (!count.is_int() || count.i() <= 0) efail("batch size must be a positive integer");
    List tmp;
    Value x;
    while (static_cast<int64_t>(tmp.size()) < count.i() && cur->next(x)) {
      ip->budget.charge(1);
      tmp.push_back(std::move(x));
    }
    if (static_cast<int64_t>(tmp.size()) < count.i()) {
      done = true;
      if (tmp.empty()) return false;
      if (!fill.is_none()) {
        ip->budget.charge_items(static_cast<size_t>(count.i()));
        while (static_cast<int64_t>(tmp.size()) < count.i()) tmp.push_back(fill);
      }
    }
    out = Value::list(std::move(tmp));
    return true;
  });
}

// |slice(slices, fill_with=None): a generator of `slices` lists (jinja2's sync_do_slice).
Value f_slice(Interp& in, const Value& v, Args& a) {
  Params p("slice", a, {"slices", "fill_with"}, 1);
  if (!p.get(0)->is_int()) efail("'{}' object cannot be interpreted as an integer", type_name(*p.get(0)));
  int64_t slices = p.get(0)->i();
  Value fill = p.get_or(1, Value::none());
  Interp* ip = &in;
  bool started = false;
  List seq;
  int64_t number = 0, offset = 0;
  return make_iter("generator", v.holds_ref() || fill.holds_ref(), [=](Value& out) mutable {
    if (!started) {
      started = true;
      seq = iterate(ip->budget, v);
      if (slices == 0) efail("integer division or modulo by zero");
    }
    if (number >= slices) return false;
    auto len = static_cast<int64_t>(seq.size());
    // Python floor division and modulo (slices may be negative: then nothing is yielded).
    int64_t per = len / slices, extra = len % slices;
    if (extra != 0 && ((extra < 0) != (slices < 0))) {
      per -= 1;
      extra += slices;
    }
    int64_t start = offset + number * per;
    if (number < extra) ++offset;
    int64_t end = offset + (number + 1) * per;
    List tmp;
    for (int64_t i = std::max<int64_t>(start, 0); i < std::min(end, len); ++i) tmp.push_back(seq[static_cast<size_t>(i)]);
    if (!fill.is_none() && number >= extra) tmp.push_back(fill);
    ++number;
    ip->budget.charge(1 + tmp.size());
    out = Value::list(std::move(tmp));
    return true;
  });
}

// |truncate(length=255, killwords=False, end='...', leeway=5): jinja2 measures and returns the
// value itself (not its str) when it is short enough.
Value f_truncate(Interp& in, const Value& v, Args& a) {
  Params p("truncate", a, {"length", "killwords", "end", "leeway"});
  int64_t length = p.get(0) ? as_int(*p.get(0), "length") : 255;
  bool killwords = as_bool(p.get(1), false);
  Value end = p.get_or(2, str("..."));
  int64_t leeway = p.get(3) && !p.get(3)->is_none() ? as_int(*p.get(3), "leeway") : 5;
  auto end_len = static_cast<int64_t>(py_len(end));
  if (length < end_len) efail("expected length >= {}, got {}", end_len, length);
  if (leeway < 0) efail("expected leeway >= 0, got {}", leeway);
  if (static_cast<int64_t>(py_len(v)) <= length + leeway) return v;
  if (!v.is_str()) {
    if (killwords) efail("can only concatenate {} (not \"{}\") to {}", type_name(v), type_name(end), type_name(v));
    efail("'{}' object has no attribute 'rsplit'", type_name(v));
  }
  std::u32string u = text::decode(v.s());
  std::u32string head = u.substr(0, static_cast<size_t>(length - end_len));
  if (!killwords) {
    size_t sp = head.rfind(U' ');
    if (sp != std::u32string::npos) head.resize(sp);
  }
  return binop(in.budget, BinOp::Add, keep(v, text::encode(head)), end);
}

// |unique: a generator of the first item of each key (jinja2's sync_do_unique).
Value f_unique(Interp& in, const Value& v, Args& a) {
  Params p("unique", a, {"case_sensitive", "attribute"});
  bool cs = as_bool(p.get(0), false);
  std::vector<Value> parts = p.get(1) ? attribute_parts(*p.get(1)) : std::vector<Value>{};
  Interp* ip = &in;
  std::optional<Cursor> cur;
  List seen;
  return make_iter("generator", v.holds_ref(), [=](Value& out) mutable {
    if (!cur) cur.emplace(v);
    Value x;
    while (cur->next(x)) {
      Value k = get_path(*ip, x, parts, nullptr);
      if (!cs) k = ignore_case(k);
      check_hashable(k);
      bool dup = false;
      for (const Value& s : seen) {
        ip->budget.charge(1);
        if (py_eq(s, k)) {
          dup = true;
          break;
        }
      }
      if (!dup) {
        seen.push_back(k);
        out = x;
        return true;
      }
    }
    return false;
  });
}

Value f_wordcount(Interp&, const Value& v, Args& a) {
  no_args("wordcount", a);
  std::string s = py_str(v);
  int64_t n = 0;
  bool in_word = false;
  for (size_t i = 0; i < s.size();) {
    bool w = text::is_word(text::next_cp(s, i));
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

const std::unordered_map<std::string_view, FilterFn>& filters() {
  static const std::unordered_map<std::string_view, FilterFn> table = {
      {"abs", f_abs}, {"attr", f_attr}, {"batch", f_batch}, {"slice", f_slice}, {"truncate", f_truncate}, {"capitalize", f_capitalize}, {"center", f_center},
      {"count", f_length}, {"d", f_default}, {"default", f_default}, {"dictsort", f_dictsort},
      {"e", f_escape}, {"escape", f_escape}, {"first", f_first}, {"float", f_float},
      {"forceescape", f_forceescape}, {"format", f_format}, {"indent", f_indent}, {"int", f_int},
      {"items", f_items}, {"join", f_join}, {"last", f_last}, {"length", f_length}, {"list", f_list},
      {"lower", f_lower}, {"map", f_map}, {"max", f_max}, {"min", f_min}, {"reject", f_reject},
      {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse}, {"round", f_round},
      {"safe", f_safe}, {"select", f_select}, {"selectattr", f_selectattr}, {"sort", f_sort},
      {"string", f_string}, {"sum", f_sum}, {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim},
      {"unique", f_unique}, {"upper", f_upper}, {"wordcount", f_wordcount},
  };
  return table;
}

// jinja2 filters this engine does not implement: known names, so they fail only when used.
constexpr std::string_view kUnsupportedFilters[] = {
    "filesizeformat", "groupby", "pprint", "random", "striptags", "urlencode", "urlize", "wordwrap",
    "xmlattr"};

}  // namespace

bool is_filter_name(std::string_view name) {
  if (filters().count(name)) return true;
  for (std::string_view u : kUnsupportedFilters)
    if (u == name) return true;
  return false;
}

Value apply_filter(Interp& in, std::string_view name, const Value& v, Args& args) {
  in.budget.charge(1 + scan_cost(v));
  auto it = filters().find(name);
  if (it == filters().end()) {
    if (!is_filter_name(name)) efail("No filter named '{}' found.", name);
    efail("the '{}' filter is not supported by this engine", name);
  }
  return it->second(in, v, args);
}

}  // namespace dq::chat
