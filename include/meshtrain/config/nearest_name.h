#pragma once
// "Did you mean" hints: the known name closest to a misspelt one (deck sections and keys,
// sub-commands). Not a general fuzzy matcher: it only suggests names one typo away.

#include <string>
#include <vector>

namespace meshtrain {

// Levenshtein distance between a and b.
size_t edit_distance(const std::string& a, const std::string& b);

// The candidate within two edits of `word` (or that `word` extends with "_..." or "....", e.g.
// "lr_max" -> "lr"), the closest first; "" when none is that close.
std::string nearest_name(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace meshtrain
