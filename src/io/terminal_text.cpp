#include "meshtrain/io/terminal_text.h"

#include <cstdint>
#include <cstdio>

#include "meshtrain/io/utf8_text.h"

namespace meshtrain {

namespace {

// The code point of the valid UTF-8 sequence of `len` bytes at `p`.
uint32_t decode(const unsigned char* p, size_t len) {
  if (len == 1) return p[0];
  uint32_t cp = p[0] & (0xFF >> (len + 1));
  for (size_t k = 1; k < len; ++k) cp = cp << 6 | (p[k] & 0x3F);
  return cp;
}

size_t sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

// C1 controls (a raw 0x9b is CSI to an 8-bit terminal), and the characters that make a
// terminal show text in another order than it is stored (a "Trojan source" display).
bool is_hidden_control(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) || cp == 0x200E || cp == 0x200F || (cp >= 0x202A && cp <= 0x202E) ||
         (cp >= 0x2066 && cp <= 0x2069) || cp == 0x061C;
}

void append_byte_escape(std::string& out, unsigned char c) {
  switch (c) {
    case '\n': out += "\\n"; return;
    case '\t': out += "\\t"; return;
    case '\r': out += "\\r"; return;
    default: {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
}

}  // namespace

std::string terminal_safe(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t at = 0;
  while (at < text.size()) {
    // [at, valid_end) is valid UTF-8 without NUL (the tokenizers' rule); the byte at
    // valid_end, if any, is not.
    const size_t valid_end = at + first_non_text_byte(text.substr(at));
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    while (at < valid_end) {
      const size_t len = sequence_length(p[at]);
      const uint32_t cp = decode(p + at, len);
      if (cp < 0x20 || cp == 0x7F) {
        append_byte_escape(out, static_cast<unsigned char>(cp));
      } else if (is_hidden_control(cp)) {
        char buf[16];
        std::snprintf(buf, sizeof buf, "\\u{%04x}", static_cast<unsigned>(cp));
        out += buf;
      } else {
        out.append(text.substr(at, len));
      }
      at += len;
    }
    if (at < text.size()) append_byte_escape(out, p[at++]);
  }
  return out;
}

}  // namespace meshtrain
