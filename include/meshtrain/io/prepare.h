#pragma once
// Preparation: turning text into train/validation token shards (what `meshtrain prepare`
// runs). Text is tokenized byte-level (io/byte_tokenizer.h); the shards follow
// io/token_shard.h. This file does not download anything and knows no other tokenizer.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

struct PrepareResult {
  std::string train_path, val_path;  // val_path is empty when val_fraction = 0
  int64_t train_tokens = 0, val_tokens = 0;
};

// Tokenizes each text file and writes <out_prefix>_train.bin and <out_prefix>_val.bin
// (creating the prefix's directory if needed). The last val_fraction of each file's tokens
// goes to validation, so validation text comes from every file but never overlaps training
// text. 0 <= val_fraction < 1, else std::invalid_argument; 0 writes no validation shard (and
// leaves an existing <out_prefix>_val.bin alone). An out_prefix that is a directory ("data/")
// is std::invalid_argument too. A missing, unreadable, empty or directory input is a DataError
// naming the file.
PrepareResult prepare_text_files(const std::vector<std::string>& inputs,
                                 const std::string& out_prefix, double val_fraction);

// The same for synthetic_text(seed, bytes): train_tokens + val_tokens == bytes.
PrepareResult prepare_synthetic(uint64_t seed, size_t bytes, const std::string& out_prefix,
                                double val_fraction);

}  // namespace meshtrain
