// UTF-8 and Python string semantics for the template engine.
// Strings stay UTF-8 everywhere; where Python works on code points (len, indexing, slicing,
// strip chars, find offsets) we decode. Invalid bytes decode to U+DC80..U+DCFF and encode back
// to the same byte (like Python's surrogateescape), so nothing is ever lost or rejected.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace dq::chat::text {

// Decodes the code point at s[i] and advances i past it.
char32_t next_cp(std::string_view s, size_t& i);
void append_cp(std::string& out, char32_t c);
std::u32string decode(std::string_view s);
std::string encode(std::u32string_view s);
bool is_ascii(std::string_view s);
size_t cp_count(std::string_view s);
// Byte offset of code point number `cp` (clamped to s.size()).
size_t byte_offset(std::string_view s, size_t cp);

// Python str predicates for one code point.
bool is_space(char32_t c);      // str.isspace and re's \s
bool is_printable(char32_t c);  // str.isprintable (repr escapes the others)
bool is_alpha(char32_t c);
bool is_decimal(char32_t c);
bool is_digit(char32_t c);
bool is_numeric(char32_t c);
bool is_alnum(char32_t c);
bool is_word(char32_t c);  // re's \w
bool is_cased(char32_t c);
bool is_upper_cp(char32_t c);
bool is_lower_cp(char32_t c);
bool is_linebreak(char32_t c);  // str.splitlines boundaries
bool is_ident_start(char32_t c);  // Python identifiers (XID_Start / XID_Continue, approximately)
bool is_ident_char(char32_t c);

// Python str methods (simple case mappings; see README for the exotic differences).
std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string title(std::string_view s);       // str.title
std::string capitalize(std::string_view s);  // str.capitalize
std::string swapcase(std::string_view s);
std::string strip(std::string_view s, const std::u32string* chars, bool left, bool right);

// Python repr of a str (quotes chosen as Python does).
void repr_str(std::string& out, std::string_view s);
// HTML escaping as markupsafe.escape does.
std::string html_escape(std::string_view s);

}  // namespace dq::chat::text
