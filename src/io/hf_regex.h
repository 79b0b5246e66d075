#pragma once
// A regex from a tokenizer.json (a Split pre-tokenizer's, a Replace normalizer's) compiled with
// PCRE2 to mean what it means to Hugging Face's tokenizers, which runs it with Oniguruma in Ruby
// syntax (private to src/io). UTF and UCP: \s, \w and \d are Unicode classes in both; MULTILINE:
// Oniguruma's ^ and $ match at every line's start and end. What the two dialects read
// differently is refused: \h and \H (a hex digit to Oniguruma, horizontal space to PCRE2), and
// the inline options m and s ((?m) is "dot matches newline" to Oniguruma).

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <string>

namespace meshtrain {

// The compiled regex (the caller frees it with pcre2_code_free). DataError "<file>: <what>
// <problem>", where `what` names the regex ("the pre-tokenizer regex").
pcre2_code* compile_hf_regex(const std::string& regex, const std::string& file,
                             const std::string& what);

}  // namespace meshtrain
