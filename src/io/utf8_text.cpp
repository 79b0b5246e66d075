#include "meshtrain/io/utf8_text.h"

#include <cstdint>
#include <cstdio>

namespace meshtrain {

size_t first_non_text_byte(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c >= 0x01 && c < 0x80) {  // the common case: ASCII other than NUL
      ++i;
      continue;
    }
    size_t len;
    uint32_t lo = 0x80, hi = 0xBF;  // the allowed range of the second byte (RFC 3629 table)
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // no overlong forms
      if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
    } else {
      return i;  // NUL, a continuation byte first, C0/C1, F5..FF
    }
    if (i + len > n || p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if ((p[i + k] & 0xC0) != 0x80) return i;
    i += len;
  }
  return n;
}

std::string describe_non_text_byte(std::string_view text, size_t offset) {
  if (offset >= text.size()) return "text";
  const auto c = static_cast<unsigned char>(text[offset]);
  if (c == 0) return "NUL byte";
  char buf[48];
  std::snprintf(buf, sizeof buf, "invalid UTF-8 byte 0x%02x", c);
  return buf;
}

}  // namespace meshtrain
