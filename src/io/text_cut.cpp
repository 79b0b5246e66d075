#include "meshtrain/io/text_cut.h"

namespace meshtrain {

namespace {
bool graphic(char c) { return c > ' ' && c < 0x7F; }  // printable ASCII, not space
}  // namespace

size_t last_cut(std::string_view t, CutRule rule, size_t min_pos) {
  const size_t n = t.size();
  if (rule == CutRule::Anywhere || n < 3) return n;
  if (min_pos < 2) min_pos = 2;
  for (size_t p = n - 1; p >= min_pos; --p)
    if (t[p - 1] == '\n' && graphic(t[p - 2]) && graphic(t[p])) return p;
  for (size_t p = n - 2; p >= min_pos; --p)
    if (t[p] == ' ' && graphic(t[p - 1]) && graphic(t[p + 1])) return p;
  for (size_t p = n - 1; p >= min_pos; --p)
    if ((static_cast<unsigned char>(t[p]) & 0xC0) != 0x80) return p;
  return n;
}

}  // namespace meshtrain
