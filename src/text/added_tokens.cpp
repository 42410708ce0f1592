#include "text/added_tokens.h"

#include <utf8proc.h>

#include <algorithm>

#include "text/utf8.h"

namespace dq::text {
namespace {

// Rust regex's Unicode \w: alphabetic, marks, decimal digits, connector punctuation, joiners.
bool is_word_char(char32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  }
  if (c == 0x200C || c == 0x200D) return true;
  switch (utf8proc_category(utf8proc_int32_t(c))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace

void AddedTokenMatcher::add(std::string_view pattern, const AddedToken& token) {
  if (pattern.empty()) return;
  int32_t node = 0;
  for (char ch : pattern) {
    auto b = uint8_t(ch);
    auto& next = nodes_[size_t(node)].next;
    auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(b, int32_t(-1)));
    if (it != next.end() && it->first == b) {
      node = it->second;
    } else {
      int32_t child = int32_t(nodes_.size());
      next.insert(it, {b, child});
      nodes_.emplace_back();
      node = child;
    }
  }
  if (nodes_[size_t(node)].info >= 0) return;  // same text twice: the first one wins
  nodes_[size_t(node)].info = int32_t(infos_.size());
  infos_.push_back({token.id, token.special, token.lstrip, token.rstrip, token.single_word});
  first_byte_[uint8_t(pattern[0])] = true;
}

int AddedTokenMatcher::longest_match(std::string_view text, size_t pos, int& len) const {
  int best = -1;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto& next = nodes_[size_t(node)].next;
    auto b = uint8_t(text[i]);
    auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(b, int32_t(-1)));
    if (it == next.end() || it->first != b) break;
    node = it->second;
    if (nodes_[size_t(node)].info >= 0) {
      best = nodes_[size_t(node)].info;
      len = int(i + 1 - pos);
    }
  }
  return best;
}

bool AddedTokenMatcher::is_single_word(std::string_view text, size_t start, size_t stop) {
  if (start > 0) {
    size_t j = prev_code_point_start(text, start);
    if (is_word_char(next_code_point(text, j))) return false;
  }
  if (stop < text.size()) {
    size_t j = stop;
    if (is_word_char(next_code_point(text, j))) return false;
  }
  return true;
}

size_t AddedTokenMatcher::strip_left(std::string_view text, size_t start) {
  while (start > 0) {
    size_t j = prev_code_point_start(text, start), k = j;
    if (!is_white_space(next_code_point(text, k))) break;
    start = j;
  }
  return start;
}

size_t AddedTokenMatcher::strip_right(std::string_view text, size_t stop) {
  while (stop < text.size()) {
    size_t j = stop;
    if (!is_white_space(next_code_point(text, j))) break;
    stop = j;
  }
  return stop;
}

}  // namespace dq::text
