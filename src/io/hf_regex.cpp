#include "hf_regex.h"

#include "meshtrain/io/data_error.h"

namespace meshtrain {

namespace {

// The first construct Oniguruma and PCRE2 read differently, or "".
std::string dialect_difference(const std::string& r) {
  for (size_t i = 0; i < r.size(); ++i) {
    if (r[i] == '\\' && i + 1 < r.size()) {
      if (r[i + 1] == 'h' || r[i + 1] == 'H')
        return std::string("\\") + r[i + 1] + " at offset " + std::to_string(i) +
               " (a hex digit to Oniguruma, horizontal space to PCRE2)";
      ++i;  // an escaped character is not a group's start
      continue;
    }
    if (r.compare(i, 2, "(?") != 0) continue;
    size_t j = i + 2;
    while (j < r.size() && (r[j] == 'i' || r[j] == 'm' || r[j] == 's' || r[j] == 'x' || r[j] == '-'))
      ++j;
    if (j < r.size() && (r[j] == ')' || r[j] == ':')) {
      const std::string flags = r.substr(i + 2, j - i - 2);
      if (flags.find_first_of("ms") != std::string::npos)
        return "the inline option (?" + flags + " at offset " + std::to_string(i) +
               " (m and s mean other things to Oniguruma and PCRE2)";
    }
  }
  return "";
}

}  // namespace

pcre2_code* compile_hf_regex(const std::string& regex, const std::string& file,
                             const std::string& what) {
  if (const std::string difference = dialect_difference(regex); !difference.empty())
    throw DataError(file, what + " holds " + difference + "; HF's tokenizers runs it with "
                              "Oniguruma, meshtrain with PCRE2: expected a regex both read alike");
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(regex.data()), regex.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(err, message, sizeof message);
    throw DataError(file, what + " does not compile at offset " + std::to_string(offset) + ": " +
                              reinterpret_cast<const char*>(message));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // speed only: without JIT it interprets
  return code;
}

}  // namespace meshtrain
