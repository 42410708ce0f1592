#include "chat/text.h"

#include <utf8proc.h>

#include "chat/value.h"  // charge_ambient: decoding is charged to the running render

namespace dq::chat::text {

char32_t next_cp(std::string_view s, size_t& i) {
  auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) {
    ++i;
    return b;
  }
  int len = b >= 0xF0 && b < 0xF5 ? 4 : b >= 0xE0 ? 3 : b >= 0xC2 && b < 0xE0 ? 2 : 0;
  if (len == 0 || i + len > s.size()) {
    ++i;
    return 0xDC00 + b;  // invalid byte: escaped as a lone surrogate
  }
  char32_t c = b & (0x7F >> len);
  for (int k = 1; k < len; ++k) {
    auto cb = static_cast<unsigned char>(s[i + k]);
    if ((cb & 0xC0) != 0x80) {
      ++i;
      return 0xDC00 + b;
    }
    c = (c << 6) | (cb & 0x3F);
  }
  // Reject overlong forms and UTF-16 surrogates.
  if ((len == 3 && c < 0x800) || (len == 4 && (c < 0x10000 || c > 0x10FFFF)) ||
      (c >= 0xD800 && c <= 0xDFFF)) {
    ++i;
    return 0xDC00 + b;
  }
  i += len;
  return c;
}

void append_cp(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c >= 0xDC80 && c <= 0xDCFF) {
    out += static_cast<char>(c - 0xDC00);  // an escaped invalid byte goes back as it was
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::u32string decode(std::string_view s) {
  charge_ambient(1 + s.size() / 4);
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) out += next_cp(s, i);
  return out;
}

std::string encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_cp(out, c);
  return out;
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

size_t cp_count(std::string_view s) {
  if (is_ascii(s)) return s.size();
  charge_ambient(1 + s.size() / 16);
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) next_cp(s, i);
  return n;
}

size_t byte_offset(std::string_view s, size_t cp) {
  charge_ambient(1 + cp / 16);
  size_t i = 0;
  for (size_t k = 0; k < cp && i < s.size(); ++k) next_cp(s, i);
  return i;
}

namespace {
utf8proc_category_t cat(char32_t c) {
  if (c > 0x10FFFF) return UTF8PROC_CATEGORY_CN;
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}
}  // namespace

bool is_space(char32_t c) {
  if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_printable(char32_t c) {
  if (c < 0x80) return c >= 0x20 && c < 0x7F;
  switch (cat(c)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

bool is_alpha(char32_t c) {
  if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
  auto k = cat(c);
  return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}
bool is_decimal(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return cat(c) == UTF8PROC_CATEGORY_ND;
}
bool is_digit(char32_t c) {
  if (is_decimal(c)) return true;
  return c == 0xB2 || c == 0xB3 || c == 0xB9 || (c >= 0x2070 && c <= 0x2079 && c != 0x2071 &&
                                                  c != 0x2072 && c != 0x2073) ||
         (c >= 0x2080 && c <= 0x2089) || (c >= 0x2460 && c <= 0x2468) ||
         (c >= 0x2474 && c <= 0x247C) || (c >= 0x2488 && c <= 0x2490);
}
bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  auto k = cat(c);
  return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}
bool is_alnum(char32_t c) { return is_alpha(c) || is_numeric(c); }
bool is_word(char32_t c) { return c == '_' || is_alnum(c); }
bool is_cased(char32_t c) {
  auto k = cat(c);
  return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
         (c < 0x110000 && (utf8proc_isupper(static_cast<utf8proc_int32_t>(c)) ||
                           utf8proc_islower(static_cast<utf8proc_int32_t>(c))));
}
bool is_upper_cp(char32_t c) {
  if (c < 0x80) return c >= 'A' && c <= 'Z';
  return c < 0x110000 && (cat(c) == UTF8PROC_CATEGORY_LU ||
                          utf8proc_isupper(static_cast<utf8proc_int32_t>(c)));
}
bool is_lower_cp(char32_t c) {
  if (c < 0x80) return c >= 'a' && c <= 'z';
  return c < 0x110000 && (cat(c) == UTF8PROC_CATEGORY_LL ||
                          utf8proc_islower(static_cast<utf8proc_int32_t>(c)));
}
bool is_linebreak(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
         c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
}
bool is_ident_start(char32_t c) {
  if (c < 0x80) return c == '_' || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
  auto k = cat(c);
  return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || k == UTF8PROC_CATEGORY_NL;
}
bool is_ident_char(char32_t c) {
  if (c < 0x80) return is_ident_start(c) || (c >= '0' && c <= '9');
  auto k = cat(c);
  return is_ident_start(c) || k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC ||
         k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_PC || c == 0xB7 || c == 0x387 ||
         (c >= 0x1369 && c <= 0x1371) || c == 0x19DA;  // Other_ID_Continue
}

namespace {
char32_t to_upper(char32_t c) {
  if (c < 0x80) return c >= 'a' && c <= 'z' ? c - 32 : c;
  if (c >= 0xDC80 && c <= 0xDCFF) return c;
  return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}
char32_t to_lower(char32_t c) {
  if (c < 0x80) return c >= 'A' && c <= 'Z' ? c + 32 : c;
  if (c >= 0xDC80 && c <= 0xDCFF) return c;
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}
char32_t to_title(char32_t c) {
  if (c < 0x80) return to_upper(c);
  if (c >= 0xDC80 && c <= 0xDCFF) return c;
  return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c)));
}
void append_upper(std::string& out, char32_t c) {
  if (c == 0xDF) {
    out += "SS";  // the one full mapping worth having (German sharp s)
    return;
  }
  append_cp(out, to_upper(c));
}
void append_title(std::string& out, char32_t c) {
  if (c == 0xDF) {
    out += "Ss";
    return;
  }
  append_cp(out, to_title(c));
}
}  // namespace

std::string upper(std::string_view s) {
  charge_ambient(1 + s.size() / 8);
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) append_upper(out, next_cp(s, i));
  return out;
}

std::string lower(std::string_view s) {
  charge_ambient(1 + s.size() / 8);
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) append_cp(out, to_lower(next_cp(s, i)));
  return out;
}

std::string title(std::string_view s) {
  charge_ambient(1 + s.size() / 8);
  std::string out;
  out.reserve(s.size());
  bool prev_cased = false;
  for (size_t i = 0; i < s.size();) {
    char32_t c = next_cp(s, i);
    if (prev_cased)
      append_cp(out, to_lower(c));
    else
      append_title(out, c);
    prev_cased = is_cased(c);
  }
  return out;
}

std::string capitalize(std::string_view s) {
  charge_ambient(1 + s.size() / 8);
  std::string out;
  out.reserve(s.size());
  bool first = true;
  for (size_t i = 0; i < s.size();) {
    char32_t c = next_cp(s, i);
    if (first)
      append_title(out, c);
    else
      append_cp(out, to_lower(c));
    first = false;
  }
  return out;
}

std::string swapcase(std::string_view s) {
  charge_ambient(1 + s.size() / 8);
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t c = next_cp(s, i);
    if (is_upper_cp(c))
      append_cp(out, to_lower(c));
    else if (is_lower_cp(c))
      append_upper(out, c);
    else
      append_cp(out, c);
  }
  return out;
}

std::string strip(std::string_view s, const std::u32string* chars, bool left, bool right) {
  auto strip_it = [&](char32_t c) {
    return chars ? chars->find(c) != std::u32string::npos : is_space(c);
  };
  if (is_ascii(s)) {
    size_t begin = 0, end = s.size();
    while (left && begin < end && strip_it(static_cast<unsigned char>(s[begin]))) ++begin;
    while (right && end > begin && strip_it(static_cast<unsigned char>(s[end - 1]))) --end;
    return std::string(s.substr(begin, end - begin));
  }
  std::u32string u = decode(s);
  size_t begin = 0, end = u.size();
  while (left && begin < end && strip_it(u[begin])) ++begin;
  while (right && end > begin && strip_it(u[end - 1])) --end;
  return encode(std::u32string_view(u).substr(begin, end - begin));
}

void repr_str(std::string& out, std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  static const char* hex = "0123456789abcdef";
  out += quote;
  for (size_t i = 0; i < s.size();) {
    char32_t c = next_cp(s, i);
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else if (c < 0x7F || is_printable(c)) {
      append_cp(out, c);
    } else {
      int digits = c <= 0xFF ? 2 : c <= 0xFFFF ? 4 : 8;
      out += digits == 2 ? "\\x" : digits == 4 ? "\\u" : "\\U";
      for (int k = digits - 1; k >= 0; --k) out += hex[(c >> (4 * k)) & 15];
    }
  }
  out += quote;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace dq::chat::text
