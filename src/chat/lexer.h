// The template lexer: jinja2's lexer.py rules with trim_blocks=True, lstrip_blocks=True,
// keep_trailing_newline=False, default delimiters, no line statements.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dq::chat {

// The template text after jinja2's newline normalisation, with a position -> line:col map.
struct Source {
  std::string text;
  std::vector<uint32_t> line_starts;
  explicit Source(std::string_view raw);
  std::pair<int, int> line_col(uint32_t pos) const;  // 1-based; column counts code points
};

// Throws TemplateError(Kind::Syntax) "chat template:LINE:COL: msg".
[[noreturn]] void syntax_error(const Source& src, uint32_t pos, const std::string& msg);

enum class Tok : uint8_t { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type;
  uint32_t pos;      // byte offset in Source::text
  std::string text;  // Data text, Name, String value (unescaped), Op symbol
  int64_t ival = 0;
  double fval = 0;
};

std::vector<Token> lex(const Source& src);

}  // namespace dq::chat
