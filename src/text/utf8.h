// UTF-8 helpers for the tokenizer: validation, repair with U+FFFD, code point iteration.
//
// Repair follows the Unicode "maximal subpart" practice, which is what Python's
// bytes.decode("utf-8", "replace") and Rust's String::from_utf8_lossy do: every maximal
// invalid subsequence (a lead byte plus the continuation bytes that still fit, or one stray
// byte) becomes one U+FFFD.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dq::text {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Looks at the bytes at p[0..n) (n >= 1). Returns the length of the valid sequence there
// (1..4) and sets cp, or returns 0 and sets `bad` to the length of the maximal invalid
// subpart (1..3) that starts there.
inline int utf8_step(const uint8_t* p, size_t n, char32_t& cp, int& bad) {
  uint8_t b0 = p[0];
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  // Table 3-7 of the Unicode standard: the allowed range of the second byte depends on the
  // lead byte; later bytes are always 80..BF.
  int len;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    bad = 1;  // 80..BF, C0, C1, F5..FF never start a sequence
    return 0;
  }
  char32_t v = b0 & (0x7F >> len);
  for (int k = 1; k < len; ++k) {
    if (size_t(k) >= n) {
      bad = k;
      return 0;
    }
    uint8_t b = p[k];
    bool fits = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!fits) {
      bad = k;
      return 0;
    }
    v = v << 6 | (b & 0x3F);
  }
  cp = v;
  return len;
}

bool is_valid_utf8(std::string_view s);

// Appends `s` to `out` with every maximal invalid subsequence replaced by U+FFFD.
void append_repaired_utf8(std::string_view s, std::string& out);

// Returns `s` when it is valid UTF-8, else the repaired text stored in `scratch`.
std::string_view repair_utf8(std::string_view s, std::string& scratch);

// Number of bytes at the end of `s` (0..3) that start a valid but unfinished sequence:
// the bytes a streaming decoder must hold back until more arrive.
size_t incomplete_utf8_tail(std::string_view s);

// Decodes the code point at s[i] of VALID UTF-8 and advances i past it.
inline char32_t next_code_point(std::string_view s, size_t& i) {
  auto b0 = uint8_t(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  if (b0 < 0xE0) {
    char32_t cp = char32_t(b0 & 0x1F) << 6 | (uint8_t(s[i + 1]) & 0x3F);
    i += 2;
    return cp;
  }
  if (b0 < 0xF0) {
    char32_t cp = char32_t(b0 & 0x0F) << 12 | char32_t(uint8_t(s[i + 1]) & 0x3F) << 6 |
                  (uint8_t(s[i + 2]) & 0x3F);
    i += 3;
    return cp;
  }
  char32_t cp = char32_t(b0 & 0x07) << 18 | char32_t(uint8_t(s[i + 1]) & 0x3F) << 12 |
                char32_t(uint8_t(s[i + 2]) & 0x3F) << 6 | (uint8_t(s[i + 3]) & 0x3F);
  i += 4;
  return cp;
}

// Start of the code point that ends at s[i) of VALID UTF-8 (i > 0).
inline size_t prev_code_point_start(std::string_view s, size_t i) {
  do {
    --i;
  } while (i > 0 && (uint8_t(s[i]) & 0xC0) == 0x80);
  return i;
}

void append_utf8(std::string& out, char32_t cp);

// Unicode White_Space (what Rust's char::is_whitespace and regex \s use).
bool is_white_space(char32_t cp);

}  // namespace dq::text
