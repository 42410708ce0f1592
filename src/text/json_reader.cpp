#include "text/json_reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "core/error.h"
#include "text/utf8.h"

namespace dq::text {
namespace {

constexpr int kMaxDepth = 256;

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Shortens text for a message and makes control bytes (and bytes that are not UTF-8) visible.
std::string clip(std::string_view s, size_t max = 40) {
  std::string out;
  std::string_view head = s.substr(0, std::min(max, s.size()));
  bool utf8 = is_valid_utf8(head.substr(0, head.size() - incomplete_utf8_tail(head)));
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    auto c = uint8_t(s[i]);
    if (c < 0x20 || c == 0x7F || (c >= 0x80 && !utf8))
      out += fmt::format("\\x{:02x}", c);
    else
      out.push_back(char(c));
  }
  if (s.size() > max) out += "...";
  return out;
}

}  // namespace

JsonReader::JsonReader(std::string_view text, std::string file) : s_(text), file_(std::move(file)) {
  // A UTF-8 byte order mark is tolerated, as serde_json and Python do not write one.
  if (s_.substr(0, 3) == "\xEF\xBB\xBF") i_ = 3;
}

void JsonReader::syntax_error(std::string_view what) const {
  size_t line = 1, col = 1;
  for (size_t k = 0; k < i_ && k < s_.size(); ++k) {
    if (s_[k] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  fail("{}: invalid JSON at line {}, column {}: {}", file_, line, col, what);
}

void JsonReader::fail_field(std::string_view field, std::string_view what) const {
  fail("{}: {}: {}", file_, field, what);
}

void JsonReader::fail_type(std::string_view field, std::string_view expected) {
  std::string got = describe_next();
  fail("{}: {}: expected {}, got {}", file_, field, expected, got);
}

void JsonReader::skip_ws() {
  const size_t n = s_.size();
  if (i_ < n && uint8_t(s_[i_]) > ' ') return;  // most calls: no whitespace at all
#ifdef __SSE2__
  // Pretty-printed files (Qwen3's tokenizer.json is ~40% indentation) have runs of 7-9
  // whitespace bytes before most values: test 16 bytes at a time.
  const __m128i sp = _mm_set1_epi8(' '), nl = _mm_set1_epi8('\n'), cr = _mm_set1_epi8('\r'),
                tab = _mm_set1_epi8('\t');
  while (i_ + 16 <= n) {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s_.data() + i_));
    __m128i ws = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, sp), _mm_cmpeq_epi8(v, nl)),
                              _mm_or_si128(_mm_cmpeq_epi8(v, cr), _mm_cmpeq_epi8(v, tab)));
    auto not_ws = uint32_t(~_mm_movemask_epi8(ws)) & 0xFFFF;
    if (not_ws) {
      i_ += size_t(__builtin_ctz(not_ws));
      return;
    }
    i_ += 16;
  }
#endif
  while (i_ < n) {
    char c = s_[i_];
    if (c != ' ' && c != '\n' && c != '\r' && c != '\t') break;
    ++i_;
  }
}

char JsonReader::next_char() {
  skip_ws();
  return i_ < s_.size() ? s_[i_] : '\0';
}

void JsonReader::expect(char c, std::string_view what) {
  if (next_char() != c) {
    if (i_ >= s_.size()) syntax_error(fmt::format("unexpected end of file, expected {}", what));
    syntax_error(fmt::format("expected {}, found '{}'", what, clip(s_.substr(i_, 1))));
  }
  ++i_;
}

JsonReader::Kind JsonReader::peek() {
  switch (next_char()) {
    case '{': return Kind::Object;
    case '[': return Kind::Array;
    case '"': return Kind::String;
    case 't':
    case 'f': return Kind::Bool;
    case 'n': return Kind::Null;
    case '-':
    case '0': case '1': case '2': case '3': case '4':
    case '5': case '6': case '7': case '8': case '9': return Kind::Number;
    case '\0':
      if (i_ >= s_.size()) syntax_error("unexpected end of file, expected a value");
      [[fallthrough]];
    default: syntax_error(fmt::format("expected a value, found '{}'", clip(s_.substr(i_, 1))));
  }
}

void JsonReader::enter() {
  if (first_.size() >= size_t(kMaxDepth)) syntax_error("nesting deeper than 256 levels");
  first_.push_back(1);
}

void JsonReader::begin_object(std::string_view field) {
  if (peek() != Kind::Object) fail_type(field, "an object");
  ++i_;
  enter();
}

bool JsonReader::next_key(std::string_view& key) {
  char c = next_char();
  if (c == '}') {
    ++i_;
    first_.pop_back();
    return false;
  }
  if (!first_.back()) {
    expect(',', "',' or '}'");
    c = next_char();
  }
  first_.back() = 0;
  if (c != '"') syntax_error(i_ >= s_.size() ? "unexpected end of file in an object" : "expected a key string");
  key = parse_string(key_scratch_);
  expect(':', "':'");
  return true;
}

void JsonReader::begin_array(std::string_view field) {
  if (peek() != Kind::Array) fail_type(field, "an array");
  ++i_;
  enter();
}

bool JsonReader::next_element() {
  char c = next_char();
  if (c == ']') {
    ++i_;
    first_.pop_back();
    return false;
  }
  if (!first_.back()) expect(',', "',' or ']'");
  first_.back() = 0;
  return true;
}

std::string_view JsonReader::parse_string(std::string& scratch) {
  // s_[i_] is the opening quote. Strings without escapes are returned in place.
  size_t start = ++i_;
  const size_t n = s_.size();
#ifdef __SSE2__
  // 16 bytes at a time: stop at a quote, a backslash or a control byte.
  const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\');
  while (i_ + 16 <= n) {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s_.data() + i_));
    // Control bytes: v < 0x20 as unsigned, i.e. min(v, 0x1F) == v.
    __m128i ctrl = _mm_cmpeq_epi8(_mm_min_epu8(v, _mm_set1_epi8(0x1F)), v);
    __m128i stop = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)), ctrl);
    auto mask = uint32_t(_mm_movemask_epi8(stop));
    if (mask) {
      i_ += size_t(__builtin_ctz(mask));
      break;
    }
    i_ += 16;
  }
#endif
  while (i_ < n) {
    char c = s_[i_];
    if (c == '"') return s_.substr(start, i_++ - start);
    if (c == '\\') break;
    if (uint8_t(c) < 0x20) syntax_error("control character in a string");
    ++i_;
  }
  if (i_ >= n) syntax_error("unterminated string");
  scratch.assign(s_.data() + start, i_ - start);
  while (i_ < n) {
    char c = s_[i_];
    if (c == '"') {
      ++i_;
      return scratch;
    }
    if (uint8_t(c) < 0x20) syntax_error("control character in a string");
    if (c != '\\') {
      scratch.push_back(c);
      ++i_;
      continue;
    }
    if (i_ + 1 >= n) break;
    char e = s_[i_ + 1];
    i_ += 2;
    switch (e) {
      case '"': scratch.push_back('"'); break;
      case '\\': scratch.push_back('\\'); break;
      case '/': scratch.push_back('/'); break;
      case 'b': scratch.push_back('\b'); break;
      case 'f': scratch.push_back('\f'); break;
      case 'n': scratch.push_back('\n'); break;
      case 'r': scratch.push_back('\r'); break;
      case 't': scratch.push_back('\t'); break;
      case 'u': {
        auto hex4 = [&](size_t at) -> int {
          if (at + 4 > n) return -1;
          int v = 0;
          for (size_t k = 0; k < 4; ++k) {
            int h = hex_value(s_[at + k]);
            if (h < 0) return -1;
            v = v * 16 + h;
          }
          return v;
        };
        int u = hex4(i_);
        if (u < 0) syntax_error("bad \\u escape");
        i_ += 4;
        char32_t cp = char32_t(u);
        if (u >= 0xDC00 && u <= 0xDFFF) syntax_error("unpaired surrogate in a \\u escape");
        if (u >= 0xD800 && u <= 0xDBFF) {
          int lo = (i_ + 1 < n && s_[i_] == '\\' && s_[i_ + 1] == 'u') ? hex4(i_ + 2) : -1;
          if (lo < 0xDC00 || lo > 0xDFFF) syntax_error("unpaired surrogate in a \\u escape");
          cp = 0x10000 + ((char32_t(u) - 0xD800) << 10) + (char32_t(lo) - 0xDC00);
          i_ += 6;
        }
        append_utf8(scratch, cp);
        break;
      }
      default: --i_; syntax_error(fmt::format("bad escape '\\{}'", clip(std::string_view(&e, 1))));
    }
  }
  syntax_error("unterminated string");
}

std::string_view JsonReader::read_string(std::string_view field) {
  if (peek() != Kind::String) fail_type(field, "a string");
  return parse_string(str_scratch_);
}

std::string_view JsonReader::scan_number() {
  size_t start = i_;
  const size_t n = s_.size();
  auto digits = [&] {
    size_t d = i_;
    while (i_ < n && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
    return i_ - d;
  };
  if (i_ < n && s_[i_] == '-') ++i_;
  if (i_ < n && s_[i_] == '0') {
    ++i_;
  } else if (digits() == 0) {
    syntax_error("bad number");
  }
  if (i_ < n && s_[i_] == '.') {
    ++i_;
    if (digits() == 0) syntax_error("bad number");
  }
  if (i_ < n && (s_[i_] == 'e' || s_[i_] == 'E')) {
    ++i_;
    if (i_ < n && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
    if (digits() == 0) syntax_error("bad number");
  }
  return s_.substr(start, i_ - start);
}

int64_t JsonReader::read_integer(std::string_view field, int64_t lo, int64_t hi) {
  if (peek() != Kind::Number) fail_type(field, "an integer");
  size_t start = i_;
  std::string_view t = scan_number();
  bool neg = t[0] == '-';
  std::string_view d = t.substr(neg ? 1 : 0);
  bool integral = d.find_first_of(".eE") == std::string_view::npos;
  if (!integral || d.size() > 18) {
    i_ = start;
    if (!integral) fail_type(field, "an integer");
    fail_field(field, fmt::format("{} is out of range [{}, {}]", clip(t), lo, hi));
  }
  int64_t v = 0;
  for (char c : d) v = v * 10 + (c - '0');
  if (neg) v = -v;
  if (v < lo || v > hi) fail_field(field, fmt::format("{} is out of range [{}, {}]", v, lo, hi));
  return v;
}

bool JsonReader::try_read_index(int64_t& v) {
  skip_ws();
  size_t k = i_, n = s_.size();
  if (k >= n || s_[k] < '0' || s_[k] > '9') return false;
  int64_t x = 0;
  size_t digits = 0;
  while (k < n && s_[k] >= '0' && s_[k] <= '9') {
    x = x * 10 + (s_[k++] - '0');
    if (++digits > 10) return false;
  }
  if (k < n && (s_[k] == '.' || s_[k] == 'e' || s_[k] == 'E')) return false;
  if ((digits > 1 && s_[i_] == '0') || x >= (int64_t(1) << 31)) return false;
  i_ = k;
  v = x;
  return true;
}

bool JsonReader::read_bool(std::string_view field) {
  if (peek() != Kind::Bool) fail_type(field, "true or false");
  bool v = s_[i_] == 't';
  skip_literal(v ? "true" : "false");
  return v;
}

bool JsonReader::read_null() {
  if (next_char() != 'n') return false;
  skip_literal("null");
  return true;
}

void JsonReader::skip_literal(std::string_view word) {
  if (s_.substr(i_, word.size()) != word) syntax_error(fmt::format("expected '{}'", word));
  i_ += word.size();
}

void JsonReader::skip_value_at(int depth) {
  if (depth > kMaxDepth) syntax_error("nesting deeper than 256 levels");
  switch (peek()) {
    case Kind::Object: {
      ++i_;
      bool first = true;
      while (true) {
        char c = next_char();
        if (c == '}') {
          ++i_;
          return;
        }
        if (!first) {
          expect(',', "',' or '}'");
          c = next_char();
        }
        first = false;
        if (c != '"') syntax_error(i_ >= s_.size() ? "unexpected end of file in an object" : "expected a key string");
        parse_string(key_scratch_);
        expect(':', "':'");
        skip_value_at(depth + 1);
      }
    }
    case Kind::Array: {
      ++i_;
      bool first = true;
      while (true) {
        char c = next_char();
        if (c == ']') {
          ++i_;
          return;
        }
        if (!first) expect(',', "',' or ']'");
        first = false;
        skip_value_at(depth + 1);
      }
    }
    case Kind::String: parse_string(str_scratch_); return;
    case Kind::Number: scan_number(); return;
    case Kind::Bool: skip_literal(s_[i_] == 't' ? "true" : "false"); return;
    case Kind::Null: skip_literal("null"); return;
  }
}

std::string_view JsonReader::skip_value() {
  skip_ws();
  size_t start = i_;
  skip_value_at(int(first_.size()));
  return s_.substr(start, i_ - start);
}

void JsonReader::finish() {
  if (next_char() != '\0' || i_ < s_.size()) syntax_error("unexpected text after the top-level value");
}

std::string JsonReader::describe_next() {
  size_t save = i_;
  std::string out;
  switch (peek()) {
    case Kind::Object: out = "an object"; break;
    case Kind::Array: out = "an array"; break;
    default: {
      // Scalars are shown as written; a malformed one is shown raw.
      size_t start = i_;
      try {
        skip_value_at(0);
        out = clip(s_.substr(start, i_ - start));
      } catch (const Error&) {
        out = clip(s_.substr(start, 40));
      }
    }
  }
  i_ = save;
  return out;
}

}  // namespace dq::text
