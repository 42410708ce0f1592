// Unicode NFC (via utf8proc) with a quick check in front: utf8proc_map runs at ~40 MB/s, but
// almost all input is already NFC, so only the short stretches that might change (a starter
// followed by marks that compose or are out of order, a character NFC replaces) are handed to
// utf8proc; everything else is copied or returned as is.
#pragma once
#include <string>
#include <string_view>

namespace dq::text {

// NFC of valid UTF-8 `s`: returns `s` itself when it is already NFC, else a view of `scratch`.
std::string_view nfc(std::string_view s, std::string& scratch);

// The plain version: utf8proc over the whole text (the reference the fast path is tested against).
std::string nfc_reference(std::string_view s);

}  // namespace dq::text
