#include "meshtrain/io/text_normalizer.h"

#include <nlohmann/json.hpp>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/ustring.h>
#include <unicode/utf8.h>

#include "hf_regex.h"
#include "json_fields.h"
#include "meshtrain/io/data_error.h"

namespace meshtrain {

struct TextNormalizer::Step {
  virtual ~Step() = default;
  virtual std::string apply(std::string_view text) const = 0;
};

namespace {

const char* const kAccepted =
    "meshtrain applies the normalizers NFC, NFD, NFKC, NFKD, Lowercase, Strip, Replace, Prepend "
    "and a Sequence of them";

class UnicodeForm final : public TextNormalizer::Step {
 public:
  explicit UnicodeForm(const icu::Normalizer2& form) : form_(form) {}
  std::string apply(std::string_view text) const override {
    UErrorCode status = U_ZERO_ERROR;
    const icu::UnicodeString in = icu::UnicodeString::fromUTF8(
        icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
    if (form_.isNormalized(in, status) && U_SUCCESS(status)) return std::string(text);
    status = U_ZERO_ERROR;
    const icu::UnicodeString out = form_.normalize(in, status);
    if (U_FAILURE(status))
      throw std::runtime_error(std::string("Unicode normalization failed: ") + u_errorName(status));
    std::string bytes;
    return out.toUTF8String(bytes);
  }

 private:
  const icu::Normalizer2& form_;
};

// Rust's char::to_lowercase, one character at a time: ICU's full case mapping of the character
// alone (no context, root locale), so 'İ' becomes "i̇" and 'Σ' is always 'σ'.
class Lowercase final : public TextNormalizer::Step {
 public:
  std::string apply(std::string_view text) const override {
    std::string out;
    out.reserve(text.size());
    const auto* s = reinterpret_cast<const uint8_t*>(text.data());
    const auto n = static_cast<int32_t>(text.size());
    for (int32_t i = 0; i < n;) {
      if (s[i] < 0x80) {
        out += static_cast<char>(s[i] >= 'A' && s[i] <= 'Z' ? s[i] + 32 : s[i]);
        ++i;
        continue;
      }
      const int32_t start = i;
      UChar32 c;
      U8_NEXT(s, i, n, c);
      UChar in[2], lower[8];
      int32_t len = 0;
      U16_APPEND_UNSAFE(in, len, c);
      UErrorCode status = U_ZERO_ERROR;
      const int32_t got = u_strToLower(lower, 8, in, len, "", &status);
      if (U_FAILURE(status)) {
        out.append(text.substr(static_cast<size_t>(start), static_cast<size_t>(i - start)));
        continue;
      }
      icu::UnicodeString(lower, got).toUTF8String(out);
    }
    return out;
  }
};

size_t utf8_length_at(std::string_view text, size_t i) {
  const auto c = static_cast<unsigned char>(text[i]);
  return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

// Unicode White_Space (Rust's char::is_whitespace) removed from either end.
class Strip final : public TextNormalizer::Step {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  std::string apply(std::string_view text) const override {
    const auto* s = reinterpret_cast<const uint8_t*>(text.data());
    const auto n = static_cast<int32_t>(text.size());
    int32_t begin = 0, end = n;
    while (left_ && begin < end) {
      int32_t next = begin;
      UChar32 c;
      U8_NEXT(s, next, n, c);
      if (!u_isUWhiteSpace(c)) break;
      begin = next;
    }
    while (right_ && end > begin) {
      int32_t prev = end;
      UChar32 c;
      U8_PREV(s, 0, prev, c);
      if (!u_isUWhiteSpace(c)) break;
      end = prev;
    }
    return std::string(text.substr(static_cast<size_t>(begin), static_cast<size_t>(end - begin)));
  }

 private:
  bool left_, right_;
};

class Prepend final : public TextNormalizer::Step {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string apply(std::string_view text) const override {
    return text.empty() ? std::string() : prefix_ + std::string(text);
  }

 private:
  std::string prefix_;
};

// HF compiles a String pattern as its escaped regex (Replace::new), so both forms are a regex
// here; PCRE2's \Q...\E quotes the string. Matches go left to right and do not overlap.
class Replace final : public TextNormalizer::Step {
 public:
  Replace(const std::string& regex, std::string content, const std::string& file,
          const std::string& path, const nlohmann::json& pattern)
      : content_(std::move(content)) {
    code_ = compile_hf_regex(regex, file, path + " = " + short_json(pattern));
    // A pattern that matches empty text has no one meaning for "every match" (the libraries
    // disagree on where the empty matches are); none of the models' tokenizers has one.
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(""), 0, 0, 0, md, nullptr);
    pcre2_match_data_free(md);
    if (rc >= 0) {
      pcre2_code_free(code_);
      throw DataError(file, path + " = " + short_json(pattern) +
                                " matches empty text; expected a pattern that matches at least "
                                "one character");
    }
  }
  ~Replace() override { pcre2_code_free(code_); }
  Replace(const Replace&) = delete;
  Replace& operator=(const Replace&) = delete;

  std::string apply(std::string_view text) const override {
    std::string out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t at = 0;
    while (at < text.size()) {
      const int rc = pcre2_match(code_, subject, text.size(), at, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      out.append(text.substr(at, ov[0] - at));
      if (ov[1] == ov[0]) {  // an empty match inside the text (a lookaround): keep a character
        const size_t len = ov[0] < text.size() ? utf8_length_at(text, ov[0]) : 0;
        out.append(text.substr(ov[0], len));
        at = ov[0] + std::max<size_t>(len, 1);
        continue;
      }
      out += content_;
      at = ov[1];
    }
    pcre2_match_data_free(md);
    if (at < text.size()) out.append(text.substr(at));
    return out;
  }

 private:
  pcre2_code* code_ = nullptr;
  std::string content_;
};

std::string quoted_regex(const std::string& s) {
  std::string out = "\\Q";
  for (size_t at = 0;;) {  // "\E" inside the string ends the quote: quote around it
    const size_t e = s.find("\\E", at);
    if (e == std::string::npos) return out + s.substr(at) + "\\E";
    out += s.substr(at, e - at) + "\\E\\\\E\\Q";
    at = e + 2;
  }
}

const icu::Normalizer2& unicode_form(const std::string& type) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* form = type == "NFC"    ? icu::Normalizer2::getNFCInstance(status)
                                 : type == "NFD"  ? icu::Normalizer2::getNFDInstance(status)
                                 : type == "NFKC" ? icu::Normalizer2::getNFKCInstance(status)
                                                  : icu::Normalizer2::getNFKDInstance(status);
  if (U_FAILURE(status) || form == nullptr)
    throw std::runtime_error("ICU has no " + type + " data: " + u_errorName(status));
  return *form;
}

}  // namespace

namespace {
using Steps = std::vector<std::unique_ptr<TextNormalizer::Step>>;

// One normalizer object at `path`, appended to `steps`; returns whether it needs the whole text.
bool read_step(const nlohmann::json& spec, const std::string& file, const std::string& path,
               int depth, Steps& steps) {
  JsonFields f(spec, file, path);
  const std::optional<std::string> type = f.string("type");
  if (!type) throw DataError(file, path + ".type is missing; " + kAccepted);
  bool whole = false;
  if (*type == "NFC" || *type == "NFD" || *type == "NFKC" || *type == "NFKD") {
    steps.push_back(std::make_unique<UnicodeForm>(unicode_form(*type)));
  } else if (*type == "Lowercase") {
    steps.push_back(std::make_unique<Lowercase>());
  } else if (*type == "Strip") {
    f.required("strip_left", "true or false");  // HF has no default for either
    f.required("strip_right", "true or false");
    const bool left = *f.boolean("strip_left"), right = *f.boolean("strip_right");
    steps.push_back(std::make_unique<Strip>(left, right));
    whole = left || right;
  } else if (*type == "Prepend") {
    const std::optional<std::string> prefix = f.string("prepend");
    if (!prefix) throw DataError(file, path + ".prepend is missing; expected a string");
    steps.push_back(std::make_unique<Prepend>(*prefix));
    whole = !prefix->empty();
  } else if (*type == "Replace") {
    const nlohmann::json& pattern = f.required("pattern", "{\"String\": ...} or {\"Regex\": ...}");
    JsonFields p(pattern, file, path + ".pattern");
    const std::optional<std::string> literal = p.string("String"), regex = p.string("Regex");
    if (literal.has_value() == regex.has_value())
      throw DataError(file, path + ".pattern = " + short_json(pattern) +
                                " is not one of {\"String\": \"...\"} and {\"Regex\": \"...\"}");
    p.refuse_unknown("a pattern is {\"String\": ...} or {\"Regex\": ...}");
    const std::optional<std::string> content = f.string("content");
    if (!content) throw DataError(file, path + ".content is missing; expected a string");
    steps.push_back(std::make_unique<Replace>(literal ? quoted_regex(*literal) : *regex, *content,
                                              file, path + ".pattern", pattern));
    whole = true;
  } else if (*type == "Sequence") {
    if (depth > 8) throw DataError(file, path + " nests Sequences more than 8 deep");
    const nlohmann::json& list = f.required("normalizers", "an array of normalizers");
    if (!list.is_array())
      f.fail("normalizers", list, "is not an array; expected an array of normalizers");
    for (size_t i = 0; i < list.size(); ++i)
      whole |= read_step(list[i], file, path + ".normalizers[" + std::to_string(i) + "]",
                         depth + 1, steps);
  } else {
    f.fail("type", spec["type"], "is a normalizer meshtrain does not apply; " +
                                     std::string(kAccepted));
  }
  f.refuse_unknown(std::string("a ") + *type + " normalizer has no such field");
  return whole;
}
}  // namespace

TextNormalizer::TextNormalizer(const nlohmann::json& spec, const std::string& file,
                               const std::string& json_path) {
  needs_whole_text_ = read_step(spec, file, json_path, 0, steps_);
  json_text_ = spec.dump();  // once read: every field checked, so not nested deep
}

TextNormalizer::~TextNormalizer() = default;

std::string TextNormalizer::apply(std::string_view text) const {
  std::string current(text);
  for (const auto& step : steps_) current = step->apply(current);
  return current;
}

}  // namespace meshtrain
