#include "added_token_finder.h"

#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include <algorithm>

namespace meshtrain {

namespace {

// Rust's char::is_whitespace: the Unicode White_Space property.
bool is_whitespace(UChar32 c) { return u_isUWhiteSpace(c); }

// HF's "word" character for single_word: its test is the Rust regex crate's \w (Unicode
// TR18 annex C: Alphabetic, marks, decimal digits, connector punctuation, join controls), so a
// combining accent is part of a word and '½' (No) is not.
bool is_word_char(UChar32 c) {
  const int32_t mask = U_MASK(u_charType(c));
  return u_isUAlphabetic(c) || (mask & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0 ||
         u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL);
}

UChar32 char_before(std::string_view t, size_t at) {
  auto i = static_cast<int32_t>(at);
  UChar32 c;
  U8_PREV(reinterpret_cast<const uint8_t*>(t.data()), 0, i, c);
  return c;
}

UChar32 char_at(std::string_view t, size_t at) {
  auto i = static_cast<int32_t>(at);
  UChar32 c;
  U8_NEXT(reinterpret_cast<const uint8_t*>(t.data()), i, static_cast<int32_t>(t.size()), c);
  return c;
}

}  // namespace

AddedTokenFinder::AddedTokenFinder(const std::vector<AddedToken>& tokens, bool normalized) {
  for (const AddedToken& t : tokens) {
    if (t.normalized != normalized || t.content.empty()) continue;
    by_first_byte_[static_cast<unsigned char>(t.content[0])].push_back(t);
    finds_any_ |= !t.special;
  }
  for (auto& list : by_first_byte_)
    std::stable_sort(list.begin(), list.end(), [](const AddedToken& a, const AddedToken& b) {
      return a.content.size() > b.content.size();
    });
}

const AddedToken* AddedTokenFinder::longest_at(std::string_view text, size_t at) const {
  for (const AddedToken& t : by_first_byte_[static_cast<unsigned char>(text[at])])
    if (text.compare(at, t.content.size(), t.content) == 0) return &t;
  return nullptr;
}

std::vector<AddedTokenFinder::Piece> AddedTokenFinder::split(std::string_view s) const {
  std::vector<Piece> out;
  const auto push = [&](size_t begin, size_t end, std::optional<uint32_t> id) {
    if (end > begin) out.push_back({s.substr(begin, end - begin), id});
  };
  size_t start_offset = 0;  // the end of the last token taken
  for (size_t at = 0; at < s.size();) {
    const AddedToken* t = finds_any_ ? longest_at(s, at) : nullptr;
    if (t == nullptr) {
      ++at;
      continue;
    }
    size_t start = at, stop = at + t->content.size();
    at = stop;  // the next match starts after this one, whatever lstrip/rstrip take (as HF)
    if (t->special) continue;
    if (t->single_word) {
      const bool space_before = start == 0 || !is_word_char(char_before(s, start));
      const bool space_after = stop == s.size() || !is_word_char(char_at(s, stop));
      if (!space_before || !space_after) continue;
    }
    if (t->lstrip) {
      size_t new_start = start;
      while (new_start > 0 && is_whitespace(char_before(s, new_start))) {
        auto i = static_cast<int32_t>(new_start);
        U8_BACK_1(reinterpret_cast<const uint8_t*>(s.data()), 0, i);
        new_start = static_cast<size_t>(i);
      }
      start = std::max(new_start, start_offset);
    }
    if (t->rstrip) {
      while (stop < s.size() && is_whitespace(char_at(s, stop))) {
        auto i = static_cast<int32_t>(stop);
        U8_FWD_1(reinterpret_cast<const uint8_t*>(s.data()), i, static_cast<int32_t>(s.size()));
        stop = static_cast<size_t>(i);
      }
    }
    push(start_offset, start, std::nullopt);
    out.push_back({s.substr(start, stop - start), t->id});
    start_offset = stop;
  }
  push(start_offset, s.size(), std::nullopt);
  return out;
}

}  // namespace meshtrain
