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
  const Tables& t = tables();
  size_t start = out.size();
  auto p = reinterpret_cast<const uint8_t*>(token.data());
  size_t i = 0, n = token.size();
  while (i < n) {
    char32_t cp;
    int bad;
    int len = utf8_step(p + i, n - i, cp, bad);
    int b = len > 0 && cp < 512 ? t.to_byte[cp] : -1;
    if (b < 0) {
      out.resize(start);
      out.append(token);
      return false;
    }
    out.push_back(char(b));
    i += size_t(len);
  }
  return true;
}

}  // namespace dq::text
