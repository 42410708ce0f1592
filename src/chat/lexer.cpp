#include "chat/lexer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "chat/template.h"
#include "chat/text.h"

namespace dq::chat {

Source::Source(std::string_view raw) {
  if (raw.size() > (1u << 30)) throw TemplateError(TemplateError::Kind::Syntax, "chat template: template too large");
  text.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '\r') {
      text += '\n';
      if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
    } else {
      text += raw[i];
    }
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();  // keep_trailing_newline=False
  line_starts.push_back(0);
  for (size_t i = 0; i < text.size(); ++i)
    if (text[i] == '\n') line_starts.push_back(static_cast<uint32_t>(i + 1));
}

std::pair<int, int> Source::line_col(uint32_t pos) const {
  auto it = std::upper_bound(line_starts.begin(), line_starts.end(), pos);
  size_t line = static_cast<size_t>(it - line_starts.begin());  // 1-based
  uint32_t start = line_starts[line - 1];
  pos = std::min<uint32_t>(pos, static_cast<uint32_t>(text.size()));
  size_t col = text::cp_count(std::string_view(text).substr(start, pos - start)) + 1;
  return {static_cast<int>(line), static_cast<int>(col)};
}

void syntax_error(const Source& src, uint32_t pos, const std::string& msg) {
  auto [line, col] = src.line_col(pos);
  throw TemplateError(TemplateError::Kind::Syntax,
                      fmt::format("chat template:{}:{}: {}", line, col, msg), line, col);
}

namespace {

class Lexer {
 public:
  explicit Lexer(const Source& src) : src_(src), s_(src.text) {}

  std::vector<Token> run() {
    bool line_starting = true;  // did the previous match end with "\n"?
    size_t pos = 0;
    while (pos < s_.size()) {
      size_t k = find_tag(pos);
      if (k == std::string::npos) {
        emit_data(pos, s_.substr(pos));
        break;
      }
      char kind = s_[k + 1];
      size_t raw_end = kind == '%' ? match_raw_begin(k) : std::string::npos;
      char sign = k + 2 < s_.size() && (s_[k + 2] == '-' || s_[k + 2] == '+') ? s_[k + 2] : 0;
      std::string text = s_.substr(pos, k - pos);
      strip_before(text, sign, kind != '{', line_starting);
      emit_data(pos, std::move(text));
      if (raw_end != std::string::npos) {
        line_starting = s_[raw_end - 1] == '\n';
        pos = lex_raw(raw_end, line_starting);
        line_starting = s_[pos - 1] == '\n';
        continue;
      }
      size_t body = k + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        pos = skip_comment(k, body);
      } else {
        out_.push_back({kind == '%' ? Tok::BlockBegin : Tok::VarBegin, static_cast<uint32_t>(k), {}});
        pos = lex_tag(body, kind == '%');
        if (pos == std::string::npos) break;  // end of input inside a tag: the parser reports it
      }
      line_starting = s_[pos - 1] == '\n';
    }
    out_.push_back({Tok::Eof, static_cast<uint32_t>(s_.size()), {}});
    return std::move(out_);
  }

 private:
  const Source& src_;
  const std::string& s_;
  std::vector<Token> out_;

  [[noreturn]] void fail(size_t pos, const std::string& msg) {
    syntax_error(src_, static_cast<uint32_t>(pos), msg);
  }

  bool at(size_t pos, std::string_view lit) const { return s_.compare(pos, lit.size(), lit) == 0; }

  size_t skip_space(size_t i) const {
    while (i < s_.size()) {
      size_t j = i;
      if (!text::is_space(text::next_cp(s_, j))) break;
      i = j;
    }
    return i;
  }

  size_t find_tag(size_t pos) const {
    for (size_t k = s_.find('{', pos); k != std::string::npos; k = s_.find('{', k + 1))
      if (k + 1 < s_.size() && (s_[k + 1] == '{' || s_[k + 1] == '%' || s_[k + 1] == '#')) return k;
    return std::string::npos;
  }

  void emit_data(size_t pos, std::string text) {
    if (!text.empty()) out_.push_back({Tok::Data, static_cast<uint32_t>(pos), std::move(text)});
  }

  // OptionalLStrip: '-' strips all whitespace before the tag; otherwise lstrip_blocks strips
  // the spaces between the last newline and a block/comment tag.
  void strip_before(std::string& text, char sign, bool lstrip_kind, bool line_starting) const {
    if (sign == '-') {
      text = text::strip(text, nullptr, false, true);
      return;
    }
    if (sign == '+' || !lstrip_kind) return;
    size_t nl = text.rfind('\n');
    size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos == 0 && !line_starting) return;
    if (l_pos >= text.size()) return;  // \s+ needs at least one character
    for (size_t i = l_pos; i < text.size();)
      if (!text::is_space(text::next_cp(text, i))) return;
    text.resize(l_pos);
  }

  // {%[-+]?\s*raw\s*(-%}\s*|%}) at k; returns the end of the match or npos.
  size_t match_raw_begin(size_t k) const {
    size_t i = k + 2;
    if (i < s_.size() && (s_[i] == '-' || s_[i] == '+')) ++i;
    i = skip_space(i);
    if (!at(i, "raw")) return std::string::npos;
    i = skip_space(i + 3);
    if (at(i, "-%}")) return skip_space(i + 3);
    if (at(i, "%}")) return i + 2;
    return std::string::npos;
  }

  size_t lex_raw(size_t pos, bool line_starting) {
    for (size_t k = s_.find("{%", pos); k != std::string::npos; k = s_.find("{%", k + 1)) {
      size_t i = k + 2;
      char sign = 0;
      if (i < s_.size() && (s_[i] == '-' || s_[i] == '+')) sign = s_[i++];
      i = skip_space(i);
      if (!at(i, "endraw")) continue;
      i = skip_space(i + 6);
      size_t end;
      if (at(i, "+%}")) end = i + 3;
      else if (at(i, "-%}")) end = skip_space(i + 3);
      else if (at(i, "%}")) end = i + 2 + (at(i + 2, "\n") ? 1 : 0);
      else continue;
      std::string text = s_.substr(pos, k - pos);
      strip_before(text, sign, true, line_starting);
      emit_data(pos, std::move(text));
      return end;
    }
    // jinja2's failure rule needs one more character: a raw tag ending the input is accepted.
    if (pos >= s_.size()) return s_.size();
    fail(pos, "Missing end of raw directive");
  }

  size_t skip_comment(size_t tag, size_t body) {
    size_t k = s_.find("#}", body);
    if (k == std::string::npos) {
      if (body >= s_.size()) return s_.size();  // "{#" ending the input is accepted, as in jinja2
      fail(tag, "Missing end of comment tag");
    }
    if (k > body && s_[k - 1] == '+') return k + 2;
    if (k > body && s_[k - 1] == '-') return skip_space(k + 2);
    return k + 2 + (at(k + 2, "\n") ? 1 : 0);
  }

  // Lexes the inside of a {% %} or {{ }} tag from `pos`; returns the position after the end
  // delimiter, or npos at end of input.
  size_t lex_tag(size_t pos, bool block) {
    std::vector<char> balance;
    while (true) {
      if (balance.empty()) {
        if (block) {
          if (at(pos, "+%}")) return end_tag(pos, pos + 3, true);
          if (at(pos, "-%}")) return end_tag(pos, skip_space(pos + 3), true);
          if (at(pos, "%}")) return end_tag(pos, pos + 2 + (at(pos + 2, "\n") ? 1 : 0), true);
        } else {
          if (at(pos, "-}}")) return end_tag(pos, skip_space(pos + 3), false);
          if (at(pos, "}}")) return end_tag(pos, pos + 2, false);
        }
      }
      size_t ws = skip_space(pos);
      if (ws != pos) {
        pos = ws;
        continue;
      }
      if (pos >= s_.size()) return std::string::npos;
      unsigned char c = static_cast<unsigned char>(s_[pos]);
      size_t after = pos;
      char32_t cp = text::next_cp(s_, after);
      if (c >= '0' && c <= '9') {
        pos = lex_number(pos);
      } else if (text::is_ident_start(cp)) {
        size_t j = after;
        while (j < s_.size()) {
          size_t k = j;
          if (!text::is_ident_char(text::next_cp(s_, k))) break;
          j = k;
        }
        out_.push_back({Tok::Name, static_cast<uint32_t>(pos), s_.substr(pos, j - pos)});
        pos = j;
      } else if (c == '\'' || c == '"') {
        pos = lex_string(pos);
      } else {
        pos = lex_operator(pos, balance);
      }
    }
  }

  size_t end_tag(size_t pos, size_t end, bool block) {
    out_.push_back({block ? Tok::BlockEnd : Tok::VarEnd, static_cast<uint32_t>(pos), {}});
    return end;
  }

  // A run of digits with single underscores between them: (\d+_)*\d+
  size_t digits(size_t i) const {
    if (i >= s_.size() || !isdigit(static_cast<unsigned char>(s_[i]))) return std::string::npos;
    while (true) {
      while (i < s_.size() && isdigit(static_cast<unsigned char>(s_[i]))) ++i;
      if (i + 1 < s_.size() && s_[i] == '_' && isdigit(static_cast<unsigned char>(s_[i + 1])))
        ++i;
      else
        return i;
    }
  }

  size_t exponent(size_t i) const {
    if (i >= s_.size() || (s_[i] != 'e' && s_[i] != 'E')) return std::string::npos;
    ++i;
    if (i < s_.size() && (s_[i] == '+' || s_[i] == '-')) ++i;
    return digits(i);
  }

  size_t lex_number(size_t pos) {
    // float_re first (not directly after a '.'), then integer_re.
    size_t end = std::string::npos;
    if (pos == 0 || s_[pos - 1] != '.') {
      size_t ip = digits(pos);
      size_t frac = at(ip, ".") ? digits(ip + 1) : std::string::npos;
      if (frac != std::string::npos) end = exponent(frac);
      if (end == std::string::npos) end = exponent(ip);
      if (end == std::string::npos) end = frac;
    }
    if (end != std::string::npos) {
      std::string t;
      for (size_t i = pos; i < end; ++i)
        if (s_[i] != '_') t += s_[i];
      Token tok{Tok::Float, static_cast<uint32_t>(pos), {}};
      tok.fval = std::strtod(t.c_str(), nullptr);
      out_.push_back(std::move(tok));
      return end;
    }
    int base = 10;
    size_t i = pos;
    auto is_digit_of = [&](char ch) {
      ch = static_cast<char>(tolower(static_cast<unsigned char>(ch)));
      if (base == 2) return ch == '0' || ch == '1';
      if (base == 8) return ch >= '0' && ch <= '7';
      if (base == 16) return isxdigit(static_cast<unsigned char>(ch)) != 0;
      return ch >= '0' && ch <= '9';
    };
    std::string t;
    if (s_[pos] == '0' && pos + 2 < s_.size() && strchr("bBoOxX", s_[pos + 1])) {
      base = tolower(s_[pos + 1]) == 'b' ? 2 : tolower(s_[pos + 1]) == 'o' ? 8 : 16;
      size_t j = pos + 2;
      while (true) {  // (_?digit)+
        size_t q = j + (j < s_.size() && s_[j] == '_' ? 1 : 0);
        if (q < s_.size() && is_digit_of(s_[q])) {
          t += s_[q];
          j = q + 1;
        } else {
          break;
        }
      }
      if (!t.empty()) i = j;
      else base = 10;
    }
    if (base == 10) {
      t.clear();
      bool zero = s_[pos] == '0';
      size_t j = pos + 1;
      t += s_[pos];
      while (true) {  // [1-9](_?\d)*  or  0(_?0)*
        size_t q = j + (j < s_.size() && s_[j] == '_' ? 1 : 0);
        if (q < s_.size() && (zero ? s_[q] == '0' : isdigit(static_cast<unsigned char>(s_[q])))) {
          t += s_[q];
          j = q + 1;
        } else {
          break;
        }
      }
      i = j;
    }
    errno = 0;
    unsigned long long v = std::strtoull(t.c_str(), nullptr, base);
    if (errno == ERANGE || v > static_cast<unsigned long long>(INT64_MAX))
      fail(pos, "integer literal too large");
    Token tok{Tok::Int, static_cast<uint32_t>(pos), {}};
    tok.ival = static_cast<int64_t>(v);
    out_.push_back(std::move(tok));
    return i;
  }

  size_t lex_string(size_t pos) {
    char q = s_[pos];
    size_t i = pos + 1;
    while (i < s_.size() && s_[i] != q) {
      if (s_[i] == '\\') ++i;
      ++i;
    }
    if (i >= s_.size()) {
      std::string r;
      text::repr_str(r, std::string(1, q));
      fail(pos, fmt::format("unexpected char {} at {}", r, pos));
    }
    out_.push_back({Tok::String, static_cast<uint32_t>(pos), unescape(pos, s_.substr(pos + 1, i - pos - 1))});
    return i + 1;
  }

  // Python's str.encode('ascii', 'backslashreplace').decode('unicode-escape').
  std::string unescape(size_t pos, const std::string& in) {
    std::string out;
    static const char* hex = "0123456789abcdef";
    for (size_t i = 0; i < in.size();) {
      if (in[i] != '\\') {
        size_t j = i;
        text::next_cp(in, j);
        out.append(in, i, j - i);
        i = j;
        continue;
      }
      if (i + 1 >= in.size()) fail(pos, "\\ at end of string");
      unsigned char c = static_cast<unsigned char>(in[i + 1]);
      i += 2;
      auto hexval = [&](int n) -> char32_t {
        char32_t v = 0;
        for (int k = 0; k < n; ++k) {
          if (i >= in.size() || !isxdigit(static_cast<unsigned char>(in[i])))
            fail(pos, n == 2 ? "truncated \\xXX escape" : n == 4 ? "truncated \\uXXXX escape"
                                                                  : "truncated \\UXXXXXXXX escape");
          char h = static_cast<char>(tolower(static_cast<unsigned char>(in[i++])));
          v = v * 16 + static_cast<char32_t>(h <= '9' ? h - '0' : h - 'a' + 10);
        }
        return v;
      };
      switch (c) {
        case '\n': break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x': text::append_cp(out, hexval(2)); break;
        case 'u': text::append_cp(out, hexval(4)); break;
        case 'U': {
          char32_t v = hexval(8);
          if (v > 0x10FFFF) fail(pos, "illegal Unicode character");
          text::append_cp(out, v);
          break;
        }
        case 'N': fail(pos, "\\N{...} escapes are not supported");
        default:
          if (c >= '0' && c <= '7') {
            char32_t v = c - '0';
            for (int k = 0; k < 2 && i < in.size() && in[i] >= '0' && in[i] <= '7'; ++k)
              v = v * 8 + static_cast<char32_t>(in[i++] - '0');
            text::append_cp(out, v);
          } else if (c >= 0x80) {
            // backslashreplace turned the character into \xNN / \uNNNN / \UNNNNNNNN, and the
            // escaped backslash before it made that text literal.
            size_t j = i - 1;
            char32_t cp = text::next_cp(in, j);
            i = j;
            out += '\\';
            int n = cp <= 0xFF ? 2 : cp <= 0xFFFF ? 4 : 8;
            out += n == 2 ? 'x' : n == 4 ? 'u' : 'U';
            for (int k = n - 1; k >= 0; --k) out += hex[(cp >> (4 * k)) & 15];
          } else {
            out += '\\';
            out += static_cast<char>(c);
          }
      }
    }
    return out;
  }

  size_t lex_operator(size_t pos, std::vector<char>& balance) {
    static const char* two[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : two)
      if (at(pos, op)) {
        out_.push_back({Tok::Op, static_cast<uint32_t>(pos), op});
        return pos + 2;
      }
    char c = s_[pos];
    if (!strchr("+-/*%~[](){}><=.:|,;", c) || c == 0) {
      size_t j = pos;
      char32_t cp = text::next_cp(s_, j);
      std::string r;
      text::repr_str(r, s_.substr(pos, j - pos));
      (void)cp;
      fail(pos, fmt::format("unexpected char {} at {}", r, pos));
    }
    if (c == '(' || c == '[' || c == '{') {
      balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (balance.empty()) fail(pos, fmt::format("unexpected '{}'", c));
      char want = balance.back();
      balance.pop_back();
      if (want != c) fail(pos, fmt::format("unexpected '{}', expected '{}'", c, want));
    }
    out_.push_back({Tok::Op, static_cast<uint32_t>(pos), std::string(1, c)});
    return pos + 1;
  }
};

}  // namespace

std::vector<Token> lex(const Source& src) { return Lexer(src).run(); }

}  // namespace dq::chat
