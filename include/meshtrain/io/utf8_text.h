#pragma once
// The input rule of the subword tokenizers: text is UTF-8 (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF) without NUL bytes. A NUL or an invalid sequence is what
// binary junk (an image, a compressed file, UTF-16 text) looks like; the byte tokenizer takes
// such bytes as they are, the others refuse them rather than guess.

#include <cstddef>
#include <string>
#include <string_view>

namespace meshtrain {

// The offset of the first byte that breaks the rule, or text.size() when the text keeps it.
// A sequence cut off by the end of `text` counts as broken.
size_t first_non_text_byte(std::string_view text);

// What is wrong at `offset` (which first_non_text_byte returned), for an error message:
// "NUL byte" or "invalid UTF-8 byte 0xff".
std::string describe_non_text_byte(std::string_view text, size_t offset);

}  // namespace meshtrain
