// Python methods reachable from templates (str, list, tuple, dict, loop) and the globals.
#include <algorithm>
#include <ctime>

#include "chat/builtins.h"
#include "chat/interp.h"
#include "chat/text.h"

namespace dq::chat {

namespace {

Value keep(const Value& like, std::string s) { return Value::string(std::move(s), like.markup()); }

bool in_list(std::string_view name, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Every str method Python has; the ones not implemented fail when called.
const std::initializer_list<std::string_view> kStrMethods = {
    "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find", "format",
    "format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier",
    "islower", "isnumeric", "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower",
    "lstrip", "maketrans", "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex",
    "rjust", "rpartition", "rsplit", "rstrip", "split", "splitlines", "startswith", "strip",
    "swapcase", "title", "translate", "upper", "zfill"};

const std::string& need_str(const Value& v, const char* fn, const char* what = "argument") {
  if (!v.is_str()) efail("{}() {} must be str, not {}", fn, what, type_name(v));
  return v.s();
}

// Python's optional start/end arguments of find/count/startswith, as a code-point window
// translated to byte offsets of s.
std::pair<size_t, size_t> window(const std::string& s, const Value* start, const Value* end) {
  bool ascii = text::is_ascii(s);
  auto len = static_cast<int64_t>(ascii ? s.size() : text::cp_count(s));
  auto clamp = [&](const Value* v, int64_t def) {
    if (!v || v->is_none()) return def;
    if (!v->is_int()) efail("slice indices must be integers or None or have an __index__ method");
    int64_t x = v->i();
    if (x < 0) x = std::max<int64_t>(0, x + len);
    return std::min(x, len);
  };
  int64_t a = clamp(start, 0), b = clamp(end, len);
  if (b < a) b = a;
  auto off = [&](int64_t cp) { return ascii ? static_cast<size_t>(cp) : text::byte_offset(s, static_cast<size_t>(cp)); };
  return {off(a), off(b)};
}

int64_t cp_index(const std::string& s, size_t byte) {
  return static_cast<int64_t>(text::cp_count(std::string_view(s).substr(0, byte)));
}

List split_ws(const std::string& s, int64_t maxsplit, const Value& like) {
  std::u32string u = text::decode(s);
  List out;
  size_t i = 0, n = u.size();
  while (true) {
    while (i < n && text::is_space(u[i])) ++i;
    if (i >= n) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      size_t end = n;
      out.push_back(keep(like, text::encode(std::u32string_view(u).substr(i, end - i))));
      break;
    }
    size_t j = i;
    while (j < n && !text::is_space(u[j])) ++j;
    out.push_back(keep(like, text::encode(std::u32string_view(u).substr(i, j - i))));
    i = j;
  }
  return out;
}

List rsplit_ws(const std::string& s, int64_t maxsplit, const Value& like) {
  std::u32string u = text::decode(s);
  List out;
  size_t j = u.size();
  while (true) {
    while (j > 0 && text::is_space(u[j - 1])) --j;
    if (j == 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      out.push_back(keep(like, text::encode(std::u32string_view(u).substr(0, j))));
      break;
    }
    size_t i = j;
    while (i > 0 && !text::is_space(u[i - 1])) --i;
    out.push_back(keep(like, text::encode(std::u32string_view(u).substr(i, j - i))));
    j = i;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

Value str_split(Interp& in, const Value& self, Args& a, bool right) {
  Params p(right ? "rsplit" : "split", a, {"sep", "maxsplit"});
  int64_t maxsplit = -1;
  if (const Value* m = p.get(1)) {
    if (!m->is_int()) efail("'{}' object cannot be interpreted as an integer", type_name(*m));
    maxsplit = m->i();
  }
  const std::string& s = self.s();
  in.budget.charge_items(s.size() / 8 + 1);
  if (!p.get(0) || p.get(0)->is_none())
    return Value::list(right ? rsplit_ws(s, maxsplit, self) : split_ws(s, maxsplit, self));
  const std::string& sep = need_str(*p.get(0), "split", "separator");
  if (sep.empty()) efail("empty separator");
  List out;
  if (!right) {
    size_t i = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      size_t j = s.find(sep, i);
      if (j == std::string::npos) break;
      out.push_back(keep(self, s.substr(i, j - i)));
      i = j + sep.size();
    }
    out.push_back(keep(self, s.substr(i)));
  } else {
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep.size()) break;
      size_t j = s.rfind(sep, end - sep.size());
      if (j == std::string::npos) break;
      out.push_back(keep(self, s.substr(j + sep.size(), end - j - sep.size())));
      end = j;
    }
    out.push_back(keep(self, s.substr(0, end)));
    std::reverse(out.begin(), out.end());
  }
  return Value::list(std::move(out));
}

Value str_strip(const Value& self, Args& a, const char* fn, bool left, bool right) {
  Params p(fn, a, {"chars"});
  if (p.get(0) && !p.get(0)->is_none()) {
    std::u32string chars = text::decode(need_str(*p.get(0), fn, "arg"));
    return keep(self, text::strip(self.s(), &chars, left, right));
  }
  return keep(self, text::strip(self.s(), nullptr, left, right));
}

Value str_affix(const Value& self, Args& a, bool start) {
  const char* fn = start ? "startswith" : "endswith";
  Params p(fn, a, {"prefix", "start", "end"}, 1);
  auto [lo, hi] = window(self.s(), p.get(1), p.get(2));
  std::string_view s = std::string_view(self.s()).substr(lo, hi - lo);
  auto test = [&](const Value& x) {
    const std::string& t = x.s();
    if (t.size() > s.size()) return false;
    return start ? s.substr(0, t.size()) == t : s.substr(s.size() - t.size()) == t;
  };
  const Value& pre = *p.get(0);
  if (pre.is_str()) return Value::boolean(test(pre));
  if (pre.tuple()) {
    for (const Value& x : pre.items()) {
      if (!x.is_str())
        efail("tuple for {} must only contain str, not {}", fn, type_name(x));
      if (test(x)) return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  efail("{} first arg must be str or a tuple of str, not {}", fn, type_name(pre));
}

Value str_find(const Value& self, Args& a, const char* fn, bool right, bool raise) {
  Params p(fn, a, {"sub", "start", "end"}, 1);
  const std::string& sub = need_str(*p.get(0), fn);
  const std::string& s = self.s();
  auto [lo, hi] = window(s, p.get(1), p.get(2));
  size_t pos = std::string::npos;
  if (sub.size() <= hi - lo) {
    std::string_view w = std::string_view(s).substr(lo, hi - lo);
    size_t r = right ? w.rfind(sub) : w.find(sub);
    if (r != std::string_view::npos) pos = lo + r;
  }
  if (pos == std::string::npos) {
    if (raise) efail("substring not found");
    return Value::integer(-1);
  }
  return Value::integer(cp_index(s, pos));
}

Value str_count(const Value& self, Args& a) {
  Params p("count", a, {"sub", "start", "end"}, 1);
  const std::string& sub = need_str(*p.get(0), "count");
  auto [lo, hi] = window(self.s(), p.get(1), p.get(2));
  std::string_view w = std::string_view(self.s()).substr(lo, hi - lo);
  if (sub.empty()) return Value::integer(static_cast<int64_t>(text::cp_count(w)) + 1);
  int64_t n = 0;
  for (size_t i = w.find(sub); i != std::string_view::npos; i = w.find(sub, i + sub.size())) ++n;
  return Value::integer(n);
}

Value str_join(Interp& in, const Value& self, Args& a) {
  Params p("join", a, {"iterable"}, 1);
  List items = iterate(in.budget, *p.get(0));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    const Value& x = items[i];
    if (!x.is_str()) efail("sequence item {}: expected str instance, {} found", i, type_name(x));
    if (i) out += self.s();
    out += self.markup() && !x.markup() ? text::html_escape(x.s()) : x.s();
    if (out.size() > in.budget.limits.max_output_bytes) in.budget.over_size(out.size());
  }
  in.budget.charge_bytes(out.size());
  return keep(self, std::move(out));
}

Value str_pad(Interp& in, const Value& self, Args& a, const char* fn) {
  std::string_view name(fn);
  Params p(fn, a, name == "zfill" ? std::initializer_list<const char*>{"width"}
                                  : std::initializer_list<const char*>{"width", "fillchar"}, 1);
  if (!p.get(0)->is_int()) efail("'{}' object cannot be interpreted as an integer", type_name(*p.get(0)));
  int64_t width = p.get(0)->i();
  std::string fill = " ";
  if (name != "zfill" && p.get(1)) {
    fill = need_str(*p.get(1), fn, "fill character");
    if (text::cp_count(fill) != 1) efail("The fill character must be exactly one character long");
    if (self.markup()) fill = text::html_escape(fill);
  }
  const std::string& s = self.s();
  auto len = static_cast<int64_t>(text::cp_count(s));
  if (width <= len) return self;
  in.budget.charge_bytes(static_cast<size_t>(std::min<int64_t>(width, 1 << 30)) * fill.size());
  auto pad = static_cast<size_t>(width - len);
  std::string out;
  auto rep = [&](size_t n) {
    for (size_t k = 0; k < n; ++k) out += fill;
  };
  if (name == "ljust") {
    out = s;
    rep(pad);
  } else if (name == "rjust") {
    rep(pad);
    out += s;
  } else if (name == "zfill") {
    size_t sign = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
    out = s.substr(0, sign) + std::string(pad, '0') + s.substr(sign);
  } else {  // center
    int64_t marg = width - len, left = marg / 2 + (marg & width & 1);
    rep(static_cast<size_t>(left));
    out += s;
    rep(static_cast<size_t>(marg - left));
  }
  return keep(self, std::move(out));
}

Value str_partition(const Value& self, Args& a, bool right) {
  Params p(right ? "rpartition" : "partition", a, {"sep"}, 1);
  const std::string& sep = need_str(*p.get(0), "partition");
  if (sep.empty()) efail("empty separator");
  const std::string& s = self.s();
  size_t j = right ? s.rfind(sep) : s.find(sep);
  if (j == std::string::npos) {
    return right ? Value::tuple({keep(self, ""), keep(self, ""), self})
                 : Value::tuple({self, keep(self, ""), keep(self, "")});
  }
  return Value::tuple({keep(self, s.substr(0, j)), keep(self, sep), keep(self, s.substr(j + sep.size()))});
}

Value str_splitlines(const Value& self, Args& a) {
  Params p("splitlines", a, {"keepends"});
  bool keepends = p.get(0) && truthy(*p.get(0));
  std::u32string u = text::decode(self.s());
  List out;
  size_t start = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    if (!text::is_linebreak(u[i])) continue;
    size_t eol = i;
    if (u[i] == '\r' && i + 1 < u.size() && u[i + 1] == '\n') ++i;
    out.push_back(keep(self, text::encode(std::u32string_view(u).substr(start, (keepends ? i + 1 : eol) - start))));
    start = i + 1;
  }
  if (start < u.size()) out.push_back(keep(self, text::encode(std::u32string_view(u).substr(start))));
  return Value::list(std::move(out));
}

template <bool (*Pred)(char32_t)>
Value str_is(const Value& self, Args& a, const char* fn) {
  Params p(fn, a, {});
  const std::string& s = self.s();
  if (s.empty()) return Value::boolean(false);
  for (size_t i = 0; i < s.size();)
    if (!Pred(text::next_cp(s, i))) return Value::boolean(false);
  return Value::boolean(true);
}

Value str_case_is(const Value& self, Args& a, bool upper) {
  Params p(upper ? "isupper" : "islower", a, {});
  bool cased = false;
  const std::string& s = self.s();
  for (size_t i = 0; i < s.size();) {
    char32_t c = text::next_cp(s, i);
    if (upper ? text::is_lower_cp(c) : text::is_upper_cp(c)) return Value::boolean(false);
    cased = cased || (upper ? text::is_upper_cp(c) : text::is_lower_cp(c));
  }
  return Value::boolean(cased);
}

Value call_str_method(Interp& in, const Value& self, std::string_view name, Args& a) {
  auto plain = [&](const char* fn, std::string s) {
    Params p(fn, a, {});
    in.budget.charge_bytes(s.size());
    return keep(self, std::move(s));
  };
  if (name == "upper") return plain("upper", text::upper(self.s()));
  if (name == "lower" || name == "casefold") return plain("lower", text::lower(self.s()));
  if (name == "title") return plain("title", text::title(self.s()));
  if (name == "capitalize") return plain("capitalize", text::capitalize(self.s()));
  if (name == "swapcase") return plain("swapcase", text::swapcase(self.s()));
  if (name == "strip") return str_strip(self, a, "strip", true, true);
  if (name == "lstrip") return str_strip(self, a, "lstrip", true, false);
  if (name == "rstrip") return str_strip(self, a, "rstrip", false, true);
  if (name == "split") return str_split(in, self, a, false);
  if (name == "rsplit") return str_split(in, self, a, true);
  if (name == "splitlines") return str_splitlines(self, a);
  if (name == "startswith") return str_affix(self, a, true);
  if (name == "endswith") return str_affix(self, a, false);
  if (name == "find") return str_find(self, a, "find", false, false);
  if (name == "rfind") return str_find(self, a, "rfind", true, false);
  if (name == "index") return str_find(self, a, "index", false, true);
  if (name == "rindex") return str_find(self, a, "rindex", true, true);
  if (name == "count") return str_count(self, a);
  if (name == "join") return str_join(in, self, a);
  if (name == "replace") {
    Params p("replace", a, {"old", "new", "count"}, 2);
    int64_t count = -1;
    if (const Value* c = p.get(2)) {
      if (!c->is_int()) efail("'{}' object cannot be interpreted as an integer", type_name(*c));
      count = c->i();
    }
    const std::string& old = need_str(*p.get(0), "replace");
    std::string rep = need_str(*p.get(1), "replace");
    if (self.markup() && !p.get(1)->markup()) rep = text::html_escape(rep);
    // Defined in filters.cpp's terms: Python str.replace.
    std::string out;
    const std::string& s = self.s();
    if (old.empty()) {
      int64_t n = 0;
      for (size_t i = 0;;) {
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
        if (out.size() > in.budget.limits.max_output_bytes) in.budget.over_size(out.size());
      }
    } else {
      size_t i = 0;
      for (int64_t n = 0; count < 0 || n < count; ++n) {
        size_t j = s.find(old, i);
        if (j == std::string::npos) break;
        out.append(s, i, j - i);
        out += rep;
        i = j + old.size();
        if (out.size() > in.budget.limits.max_output_bytes) in.budget.over_size(out.size());
      }
      out.append(s, i, std::string::npos);
    }
    in.budget.charge_bytes(out.size());
    return keep(self, std::move(out));
  }
  if (name == "center" || name == "ljust" || name == "rjust" || name == "zfill")
    return str_pad(in, self, a, std::string(name).c_str());
  if (name == "partition") return str_partition(self, a, false);
  if (name == "rpartition") return str_partition(self, a, true);
  if (name == "removeprefix" || name == "removesuffix") {
    bool pre = name == "removeprefix";
    Params p(pre ? "removeprefix" : "removesuffix", a, {"affix"}, 1);
    const std::string& t = need_str(*p.get(0), pre ? "removeprefix" : "removesuffix");
    const std::string& s = self.s();
    if (t.size() <= s.size() && (pre ? s.compare(0, t.size(), t) == 0 : s.compare(s.size() - t.size(), t.size(), t) == 0))
      return keep(self, pre ? s.substr(t.size()) : s.substr(0, s.size() - t.size()));
    return self;
  }
  if (name == "isdigit") return str_is<text::is_digit>(self, a, "isdigit");
  if (name == "isdecimal") return str_is<text::is_decimal>(self, a, "isdecimal");
  if (name == "isnumeric") return str_is<text::is_numeric>(self, a, "isnumeric");
  if (name == "isalpha") return str_is<text::is_alpha>(self, a, "isalpha");
  if (name == "isalnum") return str_is<text::is_alnum>(self, a, "isalnum");
  if (name == "isspace") return str_is<text::is_space>(self, a, "isspace");
  if (name == "isprintable") {
    Params p("isprintable", a, {});
    const std::string& s = self.s();
    for (size_t i = 0; i < s.size();)
      if (!text::is_printable(text::next_cp(s, i))) return Value::boolean(false);
    return Value::boolean(true);
  }
  if (name == "isascii") {
    Params p("isascii", a, {});
    return Value::boolean(text::is_ascii(self.s()));
  }
  if (name == "isupper") return str_case_is(self, a, true);
  if (name == "islower") return str_case_is(self, a, false);
  efail("str.{}() is not supported by this engine", name);
}

Value call_seq_method(Interp&, const Value& self, std::string_view name, Args& a) {
  const List& xs = self.items();
  if (name == "count") {
    Params p("count", a, {"value"}, 1);
    int64_t n = 0;
    for (const Value& x : xs) n += py_eq(x, *p.get(0)) ? 1 : 0;
    return Value::integer(n);
  }
  if (name == "index") {
    Params p("index", a, {"value"}, 1);
    for (size_t i = 0; i < xs.size(); ++i)
      if (py_eq(xs[i], *p.get(0))) return Value::integer(static_cast<int64_t>(i));
    efail("{} is not in list", py_repr(*p.get(0)));
  }
  if (name == "copy") {
    Params p("copy", a, {});
    return Value::list(xs);
  }
  efail("list.{}() is not supported: lists are immutable in this engine", name);
}

Value call_dict_method(Interp& in, const Value& self, std::string_view name, Args& a) {
  const DictData& d = self.dict();
  if (name == "items" || name == "keys" || name == "values") {
    Params p(std::string(name).c_str(), a, {});
    List out;
    out.reserve(d.items.size());
    in.budget.charge_items(d.items.size());
    for (const auto& [k, v] : d.items)
      out.push_back(name == "items" ? Value::tuple({k, v}) : name == "keys" ? k : v);
    return Value::list(std::move(out), name == "items" ? Value::kItemsView : name == "keys" ? Value::kKeysView : Value::kValuesView);
  }
  if (name == "get") {
    Params p("get", a, {"key", "default"}, 1);
    if (const Value* v = d.find(*p.get(0))) return *v;
    return p.get_or(1, Value::none());
  }
  if (name == "copy") {
    Params p("copy", a, {});
    return self;
  }
  efail("dict.{}() is not supported by this engine", name);
}

Value call_loop_method(const Value& self, std::string_view name, Args& a) {
  LoopData& l = self.loop();
  if (!a.kw.empty()) efail("loop.{}() takes no keyword arguments", name);
  if (name == "cycle") {
    if (a.pos.empty()) efail("no items for cycling given");
    return a.pos[l.index0 % a.pos.size()];
  }
  Value now = Value::tuple(a.pos);
  if (now.holds_ref()) efail("loop.changed() cannot track namespace or loop objects");
  if (!l.has_changed || !py_eq(l.last_changed, now)) {
    l.has_changed = true;
    l.last_changed = now;
    return Value::boolean(true);
  }
  return Value::boolean(false);
}

}  // namespace

MethodKind method_kind(const Value& v, std::string_view name) {
  switch (v.type()) {
    case Type::Str: return in_list(name, kStrMethods) ? MethodKind::Safe : MethodKind::None;
    case Type::List:
      if (!v.sequence()) return MethodKind::None;
      if (v.tuple()) return in_list(name, {"count", "index"}) ? MethodKind::Safe : MethodKind::None;
      if (in_list(name, {"count", "index", "copy", "pop", "clear"})) return MethodKind::Safe;
      if (in_list(name, {"append", "extend", "insert", "remove", "reverse", "sort"})) return MethodKind::Unsafe;
      return MethodKind::None;
    case Type::Dict:
      if (in_list(name, {"items", "keys", "values", "get", "copy", "fromkeys"})) return MethodKind::Safe;
      if (in_list(name, {"clear", "pop", "popitem", "setdefault", "update"})) return MethodKind::Unsafe;
      return MethodKind::None;
    case Type::Loop: return in_list(name, {"cycle", "changed"}) ? MethodKind::Safe : MethodKind::None;
    default: return MethodKind::None;
  }
}

Value call_method(Interp& in, const Value& self, std::string_view name, Args& args) {
  // Every method is at most linear in its object (and arguments, charged where they matter).
  if (self.is_str()) in.budget.charge(1 + self.s().size() / 16);
  if (self.is_list()) in.budget.charge(1 + self.items().size() / 8);
  switch (self.type()) {
    case Type::Str: return call_str_method(in, self, name, args);
    case Type::List: return call_seq_method(in, self, name, args);
    case Type::Dict: return call_dict_method(in, self, name, args);
    case Type::Loop: return call_loop_method(self, name, args);
    default: efail("'{}' object has no attribute '{}'", type_name(self), name);
  }
}

// ---- globals ---------------------------------------------------------------------------------

namespace {
constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE

Value g_range(Interp& in, Args& a) {
  if (!a.kw.empty()) efail("range() takes no keyword arguments");
  if (a.pos.empty() || a.pos.size() > 3) efail("range expected at most 3 arguments, got {}", a.pos.size());
  for (const Value& v : a.pos)
    if (!v.is_int()) efail("'{}' object cannot be interpreted as an integer", type_name(v));
  int64_t start = 0, stop, step = 1;
  if (a.pos.size() == 1) {
    stop = a.pos[0].i();
  } else {
    start = a.pos[0].i();
    stop = a.pos[1].i();
    if (a.pos.size() == 3) step = a.pos[2].i();
  }
  if (step == 0) efail("range() arg 3 must not be zero");
  __int128 n = 0;
  if (step > 0 && start < stop) n = ((__int128)stop - start - 1) / step + 1;
  if (step < 0 && stop < start) n = ((__int128)start - stop - 1) / (-(__int128)step) + 1;
  if (n > kMaxRange) efail("Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).", kMaxRange);
  in.budget.charge_items(static_cast<size_t>(n));
  List out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t k = 0; k < static_cast<int64_t>(n); ++k) out.push_back(Value::integer(start + k * step));
  return Value::list(std::move(out));
}

std::shared_ptr<DictData> dict_from_args(Interp& in, Args& a, const char* fn) {
  auto d = std::make_shared<DictData>();
  if (a.pos.size() > 1) efail("{} expected at most 1 argument, got {}", fn, a.pos.size());
  if (a.pos.size() == 1) {
    const Value& src = a.pos[0];
    if (src.is_dict()) {
      for (const auto& [k, v] : src.dict().items) d->set(k, v);
    } else {
      for (const Value& pair : iterate(in.budget, src)) {
        List kv = iterate(in.budget, pair);
        if (kv.size() != 2)
          efail("dictionary update sequence element has length {}; 2 is required", kv.size());
        d->set(kv[0], kv[1]);
      }
    }
  }
  for (auto& [k, v] : a.kw) d->set(Value::string(k), v);
  return d;
}

Value g_dict(Interp& in, Args& a) {
  auto d = dict_from_args(in, a, "dict");
  d->finish();
  return Value::dict(std::move(d));
}

Value g_namespace(Interp& in, Args& a) {
  auto d = dict_from_args(in, a, "namespace");
  auto ns = std::make_shared<NamespaceData>();
  for (auto& [k, v] : d->items) {
    if (!k.is_str()) efail("keywords must be strings");
    ns->set(k.s(), v);
  }
  return Value::ns(std::move(ns));
}

Value g_raise_exception(Interp&, Args& a) {
  Params p("raise_exception", a, {"message"}, 1);
  throw TemplateError(TemplateError::Kind::Raised, py_str(*p.get(0)));
}

Value g_strftime_now(Interp&, Args& a) {
  Params p("strftime_now", a, {"format"}, 1);
  const std::string& f = need_str(*p.get(0), "strftime_now", "format");
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  std::string out(256 + f.size() * 8, '\0');
  size_t n = std::strftime(out.data(), out.size(), f.c_str(), &tm);
  if (n == 0 && !f.empty()) efail("strftime_now: format produced no output");
  out.resize(n);
  return Value::string(std::move(out));
}
}  // namespace

bool is_global_function(std::string_view name) {
  return in_list(name, {"range", "dict", "namespace", "raise_exception", "strftime_now", "lipsum", "cycler", "joiner"});
}

Value call_global(Interp& in, std::string_view name, Args& args) {
  if (name == "range") return g_range(in, args);
  if (name == "dict") return g_dict(in, args);
  if (name == "namespace") return g_namespace(in, args);
  if (name == "raise_exception") return g_raise_exception(in, args);
  if (name == "strftime_now") return g_strftime_now(in, args);
  efail("{}() is not supported by this engine", name);
}

}  // namespace dq::chat
