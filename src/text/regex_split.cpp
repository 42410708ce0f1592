#include "text/regex_split.h"

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <algorithm>

#include "core/error.h"

namespace dq::text {
namespace {

// Unicode White_Space, written for a PCRE2 character class.
constexpr std::string_view kWhiteSpace =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  int n = pcre2_get_error_message(code, buf, sizeof buf);
  return n < 0 ? "unknown PCRE2 error " + std::to_string(code)
               : std::string(reinterpret_cast<const char*>(buf), size_t(n));
}

}  // namespace

std::string onig_to_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  int class_depth = 0;
  size_t i = 0;
  while (i < p.size()) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[i + 1];
      if (e == 'Q') {  // \Q...\E is literal text
        size_t stop = p.find("\\E", i + 2);
        stop = stop == std::string_view::npos ? p.size() : stop + 2;
        out.append(p.substr(i, stop - i));
        i = stop;
        continue;
      }
      if (e == 's') {
        if (class_depth > 0) {
          out.append(kWhiteSpace);
        } else {
          out.append("[").append(kWhiteSpace).append("]");
        }
        i += 2;
        continue;
      }
      if (e == 'S' && class_depth == 0) {
        out.append("[^").append(kWhiteSpace).append("]");
        i += 2;
        continue;
      }
      out.append(p.substr(i, 2));
      i += 2;
      continue;
    }
    if (c == '[') {
      if (class_depth > 0 && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
        size_t stop = p.find(":]", i + 2);
        if (stop != std::string_view::npos) {
          out.append(p.substr(i, stop + 2 - i));
          i = stop + 2;
          continue;
        }
      }
      ++class_depth;
      out.push_back(c);
      ++i;
      // A ']' right after '[' or '[^' is a literal.
      if (i < p.size() && p[i] == '^') out.push_back(p[i++]);
      if (i < p.size() && p[i] == ']') out.push_back(p[i++]);
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    out.push_back(c);
    ++i;
  }
  return out;
}

RegexSplit::RegexSplit(std::string_view pattern, std::string_view file, std::string_view field)
    : pattern_(pattern) {
  std::string translated = onig_to_pcre2(pattern);
  pcre2_compile_context* ctx = pcre2_compile_context_create(nullptr);
  if (!ctx) fail("{}: {}: out of memory compiling the regex", file, field);
  pcre2_set_newline(ctx, PCRE2_NEWLINE_LF);  // Oniguruma's only line end is \n
  int err = 0;
  PCRE2_SIZE err_off = 0;
  // UTF + UCP: \p{..}, \w, \d and case folding are Unicode-aware, as in Oniguruma. Oniguruma's
  // ^ and $ always match at line boundaries, hence MULTILINE.
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()),
                                   translated.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &err_off, ctx);
  pcre2_compile_context_free(ctx);
  if (!code) {
    // The offset refers to the translated pattern; only \s rewrites make it differ.
    fail("{}: {}: PCRE2 rejects the regex: {} (near offset {} of /{}/)", file, field,
         pcre2_message(err), size_t(err_off), translated.substr(0, 200));
  }
  // JIT when the platform has it; otherwise PCRE2's interpreter.
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  code_ = code;
}

RegexSplit::~RegexSplit() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

RegexSplit::RegexSplit(RegexSplit&& o) noexcept
    : pattern_(std::move(o.pattern_)), code_(o.code_), jit_(o.jit_) {
  o.code_ = nullptr;
}

RegexSplit& RegexSplit::operator=(RegexSplit&& o) noexcept {
  std::swap(pattern_, o.pattern_);
  std::swap(code_, o.code_);
  std::swap(jit_, o.jit_);
  return *this;
}

RegexSplit::Scratch::Scratch(const RegexSplit& re) {
  match_data_ = pcre2_match_data_create_from_pattern(static_cast<pcre2_code*>(re.code_), nullptr);
  if (!match_data_) fail("out of memory creating regex match data");
}

RegexSplit::Scratch::~Scratch() {
  pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data_));
  pcre2_match_context_free(static_cast<pcre2_match_context*>(context_));
  pcre2_jit_stack_free(static_cast<pcre2_jit_stack*>(jit_stack_));
}

bool RegexSplit::find(std::string_view text, size_t from, Scratch& scratch, size_t& start,
                      size_t& end) const {
  auto* md = static_cast<pcre2_match_data*>(scratch.match_data_);
  // The text was checked for valid UTF-8 once; without NO_UTF_CHECK PCRE2 would re-check the
  // whole subject on every call, which makes splitting quadratic. pcre2_jit_match skips
  // pcre2_match's per-call checks (~100 instructions a piece; it never checks UTF).
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  auto* code = static_cast<pcre2_code*>(code_);
  auto* ctx = static_cast<pcre2_match_context*>(scratch.context_);
  int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), from, 0, md, ctx)
                : pcre2_match(code, subject, text.size(), from, PCRE2_NO_UTF_CHECK, md, ctx);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !scratch.jit_stack_) {
    // The default 32 KB JIT stack is enough for the tokenizer regexes seen so far; a pattern
    // that backtracks deeply gets up to 64 MB, once per Scratch.
    scratch.context_ = ctx = pcre2_match_context_create(nullptr);
    scratch.jit_stack_ = pcre2_jit_stack_create(size_t(64) << 10, size_t(64) << 20, nullptr);
    if (!ctx || !scratch.jit_stack_) fail("out of memory for the regex JIT stack");
    pcre2_jit_stack_assign(ctx, nullptr, scratch.jit_stack_);
    rc = pcre2_jit_match(code, subject, text.size(), from, 0, md, ctx);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) fail("pre-tokenizer regex failed on a {}-byte text: {}", text.size(), pcre2_message(rc));
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
  start = ov[0];
  end = ov[1];
  // \K can report a match ending before its start; treat it as empty.
  if (end < start || end > text.size()) end = start;
  return true;
}

size_t RegexSplit::next_char(std::string_view text, size_t i) {
  ++i;
  while (i < text.size() && (uint8_t(text[i]) & 0xC0) == 0x80) ++i;
  return i;
}

}  // namespace dq::text
