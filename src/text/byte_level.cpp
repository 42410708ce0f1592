#include "text/byte_level.h"

#include <array>

#include "text/utf8.h"

namespace dq::text {
namespace {

struct Tables {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, 512> to_byte{};  // the alphabet lies below U+0144
  Tables() {
    to_byte.fill(-1);
    // Printable Latin-1 bytes stand for themselves; the rest map to U+0100, U+0101, ... in order.
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      char32_t c = printable(b) ? char32_t(b) : char32_t(256 + n++);
      to_char[size_t(b)] = c;
      to_byte[size_t(c)] = int16_t(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

char32_t byte_to_char(uint8_t b) { return tables().to_char[b]; }

int char_to_byte(char32_t c) { return c < 512 ? tables().to_byte[c] : -1; }

bool byte_level_decode(std::string_view token, std::string& out) {
  // The alphabet is ASCII and two-byte UTF-8 (U+00A1..U+0143), so a longer sequence (or an
  // invalid byte) means the token is not byte-level text.
  const Tables& t = tables();
  char buf[256];
  size_t n = token.size(), k = 0, i = 0;
  auto p = reinterpret_cast<const uint8_t*>(token.data());
  bool ok = n <= sizeof buf;
  while (ok && i < n) {
    uint8_t c = p[i];
    char32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < n && (p[i + 1] & 0xC0) == 0x80) {
      cp = char32_t(c & 0x1F) << 6 | (p[i + 1] & 0x3F);
      i += 2;
    } else {
      ok = false;
      break;
    }
    int b = cp < 512 ? t.to_byte[cp] : -1;
    if (b < 0) ok = false;
    buf[k++] = char(b);
  }
  if (!ok) {
    out.append(token);
    return false;
  }
  out.append(buf, k);
  return true;
}

}  // namespace dq::text
