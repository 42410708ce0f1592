// Python printf-style formatting: str % args (also the `format` filter).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "chat/text.h"
#include "chat/value.h"

namespace dq::chat {

namespace {

std::string ascii_repr(const Value& v) {
  std::string r = py_repr(v), out;
  static const char* hex = "0123456789abcdef";
  for (size_t i = 0; i < r.size();) {
    char32_t c = text::next_cp(r, i);
    if (c < 0x80) {
      out += static_cast<char>(c);
      continue;
    }
    int digits = c <= 0xFF ? 2 : c <= 0xFFFF ? 4 : 8;
    out += digits == 2 ? "\\x" : digits == 4 ? "\\u" : "\\U";
    for (int k = digits - 1; k >= 0; --k) out += hex[(c >> (4 * k)) & 15];
  }
  return out;
}

struct Spec {
  bool left = false, plus = false, space = false, alt = false, zero = false;
  int width = -1, prec = -1;
  char conv = 's';
};

// Pads `body` (already signed and prefixed) to the width; zero padding goes after sign/prefix.
std::string pad(const Spec& sp, std::string body, bool numeric, size_t prefix_len) {
  size_t len = text::cp_count(body);
  if (sp.width < 0 || len >= static_cast<size_t>(sp.width)) return body;
  size_t fill = static_cast<size_t>(sp.width) - len;
  if (sp.left) return body + std::string(fill, ' ');
  if (sp.zero && numeric) return body.substr(0, prefix_len) + std::string(fill, '0') + body.substr(prefix_len);
  return std::string(fill, ' ') + body;
}

std::string format_int(const Spec& sp, const Value& v) {
  int64_t x;
  char c = sp.conv;
  if (v.is_int()) {
    x = v.i();
  } else if (v.is(Type::Float) && (c == 'd' || c == 'i' || c == 'u')) {
    if (std::isnan(v.f())) efail("cannot convert float NaN to integer");
    if (std::isinf(v.f())) efail("cannot convert float infinity to integer");
    if (std::fabs(v.f()) >= 9.2e18) efail("integer overflow in % formatting");
    x = static_cast<int64_t>(v.f());
  } else if (c == 'd' || c == 'i' || c == 'u') {
    efail("%{} format: a real number is required, not {}", c, type_name(v));
  } else {
    efail("%{} format: an integer is required, not {}", c, type_name(v));
  }
  bool neg = x < 0;
  uint64_t mag = neg ? 0 - static_cast<uint64_t>(x) : static_cast<uint64_t>(x);
  std::string digits;
  if (c == 'x' || c == 'X' || c == 'o') {
    int base = c == 'o' ? 8 : 16;
    const char* dig = c == 'X' ? "0123456789ABCDEF" : "0123456789abcdef";
    do {
      digits.insert(digits.begin(), dig[mag % base]);
      mag /= base;
    } while (mag);
  } else {
    digits = std::to_string(mag);
  }
  if (sp.prec >= 0 && digits.size() < static_cast<size_t>(sp.prec))
    digits.insert(0, static_cast<size_t>(sp.prec) - digits.size(), '0');
  std::string prefix = neg ? "-" : sp.plus ? "+" : sp.space ? " " : "";
  if (sp.alt && c == 'o') prefix += "0o";
  if (sp.alt && c == 'x') prefix += "0x";
  if (sp.alt && c == 'X') prefix += "0X";
  return pad(sp, prefix + digits, true, prefix.size());
}

std::string format_float(const Spec& sp, const Value& v) {
  if (!v.is_number()) efail("must be real number, not {}", type_name(v));
  double d = v.as_double();
  char c = sp.conv;
  bool upper = c == 'E' || c == 'F' || c == 'G';
  std::string prefix = std::signbit(d) && !std::isnan(d) ? "-" : sp.plus ? "+" : sp.space ? " " : "";
  std::string body;
  if (std::isnan(d) || std::isinf(d)) {
    body = std::isnan(d) ? (upper ? "NAN" : "nan") : (upper ? "INF" : "inf");
    Spec s2 = sp;
    s2.zero = false;
    return pad(s2, prefix + body, false, 0);
  }
  int prec = sp.prec < 0 ? 6 : std::min(sp.prec, 300);
  char fmtbuf[16];
  std::snprintf(fmtbuf, sizeof fmtbuf, "%%%s.%d%c", sp.alt ? "#" : "", prec, c);
  int n = std::snprintf(nullptr, 0, fmtbuf, std::fabs(d));
  body.resize(static_cast<size_t>(n) + 1);
  std::snprintf(body.data(), body.size(), fmtbuf, std::fabs(d));
  body.resize(static_cast<size_t>(n));
  return pad(sp, prefix + body, true, prefix.size());
}

}  // namespace

std::string percent_format(Budget& budget, const Value& fmtv, const Value& args) {
  const std::string& f = fmtv.s();
  bool markup = fmtv.markup();
  const List* tuple = args.tuple() ? &args.items() : nullptr;
  // PyMapping_Check: anything with __getitem__ but a tuple or str (dict, list, Undefined).
  const Value* mapping = (args.is_dict() || (args.is_list() && !args.tuple()) || args.is_undefined()) ? &args : nullptr;
  size_t next = 0;
  bool used_single = false;
  auto take = [&]() -> Value {
    if (tuple) {
      if (next >= tuple->size()) efail("not enough arguments for format string");
      return (*tuple)[next++];
    }
    if (used_single) efail("not enough arguments for format string");
    used_single = true;
    return args;
  };
  std::string out;
  for (size_t i = 0; i < f.size();) {
    if (f[i] != '%') {
      size_t j = f.find('%', i);
      if (j == std::string::npos) j = f.size();
      out.append(f, i, j - i);
      i = j;
      continue;
    }
    ++i;
    if (i >= f.size()) efail("incomplete format");
    Spec sp;
    const Value* keyed = nullptr;
    Value keyed_val;
    if (f[i] == '(') {
      if (args.is_undefined()) undefined_fail(args);
      if (!args.is_dict()) efail("format requires a mapping");
      int level = 1;
      size_t start = ++i;
      while (i < f.size() && level > 0) {
        if (f[i] == '(') ++level;
        if (f[i] == ')') --level;
        ++i;
      }
      if (level > 0) efail("incomplete format key");
      std::string key = f.substr(start, i - 1 - start);
      const Value* found = args.dict().find(std::string_view(key));
      if (!found) efail("KeyError: {}", py_repr(Value::string(key)));
      keyed_val = *found;
      keyed = &keyed_val;
    }
    for (; i < f.size(); ++i) {
      char c = f[i];
      if (c == '-') sp.left = true;
      else if (c == '+') sp.plus = true;
      else if (c == ' ') sp.space = true;
      else if (c == '#') sp.alt = true;
      else if (c == '0') sp.zero = true;
      else break;
    }
    auto read_num = [&](int& dst) {
      if (i < f.size() && f[i] == '*') {
        Value w = take();
        if (!w.is_int()) efail("* wants int");
        dst = static_cast<int>(std::clamp<int64_t>(w.i(), -100000, 100000));
        ++i;
        return;
      }
      int64_t n = -1;
      while (i < f.size() && f[i] >= '0' && f[i] <= '9') {
        n = (n < 0 ? 0 : n) * 10 + (f[i] - '0');
        if (n > 100000) efail("width too big");
        ++i;
      }
      dst = static_cast<int>(n);
    };
    read_num(sp.width);
    if (sp.width < -1) {
      sp.left = true;
      sp.width = -sp.width;
    }
    if (i < f.size() && f[i] == '.') {
      ++i;
      read_num(sp.prec);
      if (sp.prec < 0) sp.prec = 0;
    }
    while (i < f.size() && (f[i] == 'h' || f[i] == 'l' || f[i] == 'L')) ++i;
    if (i >= f.size()) efail("incomplete format");
    sp.conv = f[i++];
    if (sp.conv == '%') {
      out += '%';
      continue;
    }
    Value v = keyed ? *keyed : take();
    std::string piece;
    switch (sp.conv) {
      case 's': case 'r': case 'a': {
        std::string s = sp.conv == 's' ? py_str(v) : sp.conv == 'r' ? py_repr(v) : ascii_repr(v);
        if (markup && !(sp.conv == 's' && v.markup())) s = text::html_escape(s);
        if (sp.prec >= 0) s = s.substr(0, text::byte_offset(s, static_cast<size_t>(sp.prec)));
        piece = pad(sp, s, false, 0);
        break;
      }
      case 'c': {
        std::string s;
        if (v.is_int()) {
          if (v.i() < 0 || v.i() > 0x10FFFF) efail("%c arg not in range(0x110000)");
          text::append_cp(s, static_cast<char32_t>(v.i()));
        } else if (v.is_str() && text::cp_count(v.s()) == 1) {
          s = v.s();
        } else {
          efail("%c requires int or char");
        }
        piece = pad(sp, s, false, 0);
        break;
      }
      case 'd': case 'i': case 'u': case 'o': case 'x': case 'X': piece = format_int(sp, v); break;
      case 'e': case 'E': case 'f': case 'F': case 'g': case 'G': piece = format_float(sp, v); break;
      default:
        efail("unsupported format character '{}' (0x{:x}) at index {}", sp.conv,
              static_cast<unsigned char>(sp.conv), i - 1);
    }
    out += piece;
    if (out.size() > budget.limits.max_output_bytes) budget.over_size(out.size());
  }
  budget.charge_bytes(out.size());
  if (tuple && next < tuple->size()) efail("not all arguments converted during string formatting");
  if (!tuple && !mapping && !used_single) efail("not all arguments converted during string formatting");
  return out;
}

}  // namespace dq::chat
