#include "text/nfc.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "text/utf8.h"

namespace dq::text {
namespace {

constexpr uint16_t kNotYes = 0x100;  // NFC_QC is No or Maybe: the character may change or compose
// Assigned after Unicode 9.0 and not inert for utf8proc: HF's NFC sees an unassigned starter,
// so it is kept as is and never handed to utf8proc.
constexpr uint16_t kNewer = 0x200;
constexpr char32_t kLastDecomposable = 0x30000;  // no code point at or above has a decomposition

// Code points assigned by Unicode 9.0 (gen_unicode9.pl).
constexpr std::pair<char32_t, char32_t> kUnicode9[] = {
#include "text/unicode9.inc"
};

bool in_unicode9(char32_t cp) {
  auto it = std::upper_bound(std::begin(kUnicode9), std::end(kUnicode9), cp,
                             [](char32_t c, const std::pair<char32_t, char32_t>& r) { return c < r.first; });
  return it != std::begin(kUnicode9) && cp <= (it - 1)->second;
}

void utf8proc_nfc_append(std::string_view s, std::string& out) {
  if (s.empty()) return;
  utf8proc_uint8_t* buf = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    utf8proc_ssize_t(s.size()), &buf,
                                    utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) {
    std::free(buf);
    fail("NFC normalization failed: {}", utf8proc_errmsg(n));
  }
  out.append(reinterpret_cast<const char*>(buf), size_t(n));
  std::free(buf);
}

bool has_canonical_decomposition(const utf8proc_property_t* p) {
  return p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0;
}

// The NFC quick-check data, derived once from utf8proc's own tables so that the fast path and
// utf8proc never disagree: a character is "not Yes" when NFC changes it on its own (it has a
// canonical decomposition that does not compose back) or when it can be the second half of a
// composition (then it may merge into the character before it).
//
// HF tokenizers normalizes with Unicode 9.0 tables (unicode-normalization-alignments 0.1.12):
// found by a differential test against tokenizers 0.23.2, where U+0D3B (Unicode 10, combining
// class 9) was not reordered. Characters assigned later that utf8proc would touch are kNewer.
struct QuickCheck {
  std::vector<uint16_t> bmp;            // [0x10000]: combining class | kNotYes
  std::vector<char32_t> astral_not_yes;  // sorted, code points >= 0x10000

  QuickCheck() : bmp(0x10000, 0) {
    std::vector<char32_t> not_yes;
    std::string one, norm;
    for (char32_t cp = 0; cp < kLastDecomposable; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      const utf8proc_property_t* p = utf8proc_get_property(utf8proc_int32_t(cp));
      if (!has_canonical_decomposition(p)) continue;
      one.clear();
      append_utf8(one, cp);
      norm.clear();
      utf8proc_nfc_append(one, norm);
      if (norm != one) {
        not_yes.push_back(cp);  // NFC replaces it
        continue;
      }
      // A primary composite: the last character of its decomposition composes into it.
      utf8proc_int32_t dec[32];
      int bound = 0;
      utf8proc_ssize_t k = utf8proc_decompose_char(utf8proc_int32_t(cp), dec, 32,
                                                   utf8proc_option_t(UTF8PROC_DECOMPOSE), &bound);
      if (k >= 2 && k <= 32) not_yes.push_back(char32_t(dec[k - 1]));
    }
    for (char32_t cp = 0x1161; cp <= 0x1175; ++cp) not_yes.push_back(cp);  // Hangul V jamo
    for (char32_t cp = 0x11A8; cp <= 0x11C2; ++cp) not_yes.push_back(cp);  // Hangul T jamo
    for (char32_t cp = 0; cp < 0x10000; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      bmp[cp] = uint16_t(utf8proc_get_property(utf8proc_int32_t(cp))->combining_class);
    }
    for (char32_t cp : not_yes) {
      if (cp < 0x10000)
        bmp[cp] |= kNotYes;
      else
        astral_not_yes.push_back(cp);
    }
    std::sort(astral_not_yes.begin(), astral_not_yes.end());
    for (char32_t cp = 0; cp < 0x10000; ++cp) {
      if (bmp[cp] != 0 && !in_unicode9(cp)) bmp[cp] = kNewer;
    }
  }

  uint16_t info(char32_t cp) const {
    if (cp < 0x10000) return bmp[cp];
    uint16_t v = uint16_t(utf8proc_get_property(utf8proc_int32_t(cp))->combining_class);
    if (cp < kLastDecomposable &&
        std::binary_search(astral_not_yes.begin(), astral_not_yes.end(), cp))
      v |= kNotYes;
    if (v != 0 && !in_unicode9(cp)) v = kNewer;
    return v;
  }
};

const QuickCheck& quick_check() {
  static const QuickCheck qc;
  return qc;
}

}  // namespace

std::string nfc_reference(std::string_view s) {
  // utf8proc on the stretches between characters HF's Unicode 9.0 tables do not know.
  const QuickCheck& qc = quick_check();
  std::string out;
  size_t start = 0, i = 0;
  while (i < s.size()) {
    size_t at = i;
    if (qc.info(next_code_point(s, i)) & kNewer) {
      utf8proc_nfc_append(s.substr(start, at - start), out);
      out.append(s.substr(at, i - at));
      start = i;
    }
  }
  utf8proc_nfc_append(s.substr(start), out);
  return out;
}

std::string_view nfc(std::string_view s, std::string& scratch) {
  const QuickCheck& qc = quick_check();
  const size_t n = s.size();
  bool changed = false;
  size_t copied = 0;     // s[0, copied) has been written to scratch (when changed)
  size_t boundary = 0;   // start of the last stable starter: nothing before it can change
  uint16_t last_ccc = 0;
  size_t i = 0;
  while (i < n) {
    if (uint8_t(s[i]) < 0x80) {
      boundary = i++;
      last_ccc = 0;
      continue;
    }
    size_t at = i;
    uint16_t info = qc.info(next_code_point(s, i));
    if (info & kNewer) {  // composes with nothing: the next stretch starts after it
      boundary = i;
      last_ccc = 0;
      continue;
    }
    uint16_t ccc = info & 0xFF;
    bool problem = (info & kNotYes) || (ccc != 0 && last_ccc > ccc);
    if (!problem) {
      if (ccc == 0) boundary = at;
      last_ccc = ccc;
      continue;
    }
    // Normalize from the last stable starter up to the next one (or the end): a stable
    // starter never composes with what precedes it and stops reordering, so the stretch
    // can be normalized on its own.
    size_t end = i;
    while (end < n) {
      if (uint8_t(s[end]) < 0x80) break;
      size_t j = end;
      uint16_t v = qc.info(next_code_point(s, j));
      if ((v & 0xFF) == 0 && !(v & kNotYes)) break;
      end = j;
    }
    if (!changed) {
      scratch.clear();
      scratch.reserve(n + 16);
      changed = true;
    }
    scratch.append(s.data() + copied, boundary - copied);
    utf8proc_nfc_append(s.substr(boundary, end - boundary), scratch);
    copied = end;
    boundary = end;
    last_ccc = 0;
    i = end;
  }
  if (!changed) return s;
  scratch.append(s.data() + copied, n - copied);
  return scratch;
}

}  // namespace dq::text
