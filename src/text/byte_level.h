// GPT-2's byte-level alphabet (bytes_to_unicode): each of the 256 byte values is shown as one
// printable code point, so a byte string becomes a text token ("Ġthe" is " the").
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace dq::text {

// The code point that stands for byte b.
char32_t byte_to_char(uint8_t b);

// The byte that code point c stands for, or -1 when c is not in the byte alphabet.
int char_to_byte(char32_t c);

// What the ByteLevel decoder makes of one token: when every character of `token` is in the
// byte alphabet, the bytes they stand for; otherwise the token's own UTF-8 text (as HF does).
// Appends to `out`; returns true in the first case.
bool byte_level_decode(std::string_view token, std::string& out);

}  // namespace dq::text
