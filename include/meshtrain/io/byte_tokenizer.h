#pragma once
// The byte-level tokenizer: token = byte value, vocabulary 256. Any text round-trips
// exactly, with no vocabulary file; it is what `meshtrain prepare` uses for text files and
// the synthetic corpus. It is not a BPE tokenizer (shards from other tokenizers are read as
// they are, see io/token_shard.h).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

inline constexpr uint32_t kByteVocabSize = 256;

std::vector<uint32_t> tokenize_bytes(std::string_view text);
// Tokens must be < 256, else std::out_of_range naming the first bad one and its position.
std::string detokenize_bytes(const std::vector<uint32_t>& tokens);

}  // namespace meshtrain
