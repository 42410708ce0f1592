#include "text/utf8.h"

namespace dq::text {

bool is_valid_utf8(std::string_view s) {
  auto p = reinterpret_cast<const uint8_t*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    char32_t cp;
    int bad;
    int len = utf8_step(p + i, n - i, cp, bad);
    if (len == 0) return false;
    i += size_t(len);
  }
  return true;
}

void append_repaired_utf8(std::string_view s, std::string& out) {
  auto p = reinterpret_cast<const uint8_t*>(s.data());
  size_t n = s.size(), i = 0, run = 0;  // s[run, i) is valid and not yet copied
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    char32_t cp;
    int bad;
    int len = utf8_step(p + i, n - i, cp, bad);
    if (len > 0) {
      i += size_t(len);
      continue;
    }
    out.append(s.data() + run, i - run);
    out.append(kReplacementChar);
    i += size_t(bad);
    run = i;
  }
  out.append(s.data() + run, n - run);
}

std::string_view repair_utf8(std::string_view s, std::string& scratch) {
  if (is_valid_utf8(s)) return s;
  scratch.clear();
  scratch.reserve(s.size() + 16);
  append_repaired_utf8(s, scratch);
  return scratch;
}

size_t incomplete_utf8_tail(std::string_view s) {
  auto p = reinterpret_cast<const uint8_t*>(s.data());
  size_t n = s.size();
  for (size_t k = 1; k <= 3 && k <= n; ++k) {
    uint8_t b = p[n - k];
    if (b < 0x80) return 0;
    if (b < 0xC0) continue;  // continuation byte: look further back
    // A lead byte k bytes from the end: held back if all k bytes are a valid prefix.
    char32_t cp;
    int bad;
    int len = utf8_step(p + n - k, k, cp, bad);
    if (len == 0 && size_t(bad) == k) return k;
    return 0;
  }
  return 0;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

bool is_white_space(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

}  // namespace dq::text
