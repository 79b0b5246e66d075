#pragma once
// Reading the parts of GPT-2 BPE files that vocab.json + merges.txt and tokenizer.json share
// (private to src/io: gpt2_bpe_tokenizer.cpp and hf_tokenizer_json.cpp).

#include <nlohmann/json.hpp>

#include <string>

#include "meshtrain/io/gpt2_bpe_tokenizer.h"

namespace meshtrain {

// DataError naming `path` and `what` it should be where the file is over 1 GiB: parsed JSON
// takes several times its size in memory, and the largest tokenizer.json files published are
// tens of megabytes.
void check_json_file_size(const std::string& path, const std::string& what);
// The JSON file at `path` (a regular file, checked as above); DataError naming it and `what` it
// should be.
nlohmann::json parse_json_file(const std::string& path, const std::string& what);
// `v`, an object of token -> id at `json_path` ("model.vocab"; "" for a vocab.json), into
// f.vocab. Ids are checked against their bound when the tokenizer is built.
void read_gpt2_vocab(const nlohmann::json& v, const std::string& where,
                     const std::string& json_path, Gpt2BpeFiles& f);
// Merge number `n` (from 1), "a b", into f.merges.
void add_gpt2_merge(const std::string& line, const std::string& where, size_t n, Gpt2BpeFiles& f);

}  // namespace meshtrain
