#pragma once
// Preparation: turning text into train/validation token shards (what `meshtrain prepare`
// runs), with any tokenizer (io/tokenizer.h); the shards follow io/token_shard.h. Text files
// and JSON Lines corpora (io/jsonl_documents.h, plain or compressed) are streamed through the
// same tokenizing threads and shard writers: memory stays bounded (about 8 MiB of text in
// flight, plus its token ids) whatever the corpus size, and every core tokenizes. This file
// downloads nothing and trains no tokenizer (io/sentencepiece_tokenizer.h does).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/io/jsonl_documents.h"
#include "meshtrain/io/prepare_outputs.h"
#include "meshtrain/io/tokenizer.h"

namespace meshtrain {

struct PrepareResult {
  std::string train_path, val_path;  // val_path is empty when val_fraction = 0
  std::string tokenizer_path;        // the tokenizer file written beside them; "" for bytes
  int64_t train_tokens = 0, val_tokens = 0;
  uint32_t vocab_size = 0;
  int64_t bad_lines = 0;  // JSON Lines inputs: lines skipped (at most max_bad_lines)
};

struct PrepareOptions {
  double val_fraction = 0.1;
  int threads = 0;          // tokenizing threads; 0: available_cores()
  bool progress = false;    // a progress line on stderr (bytes done / total, MB/s)
  size_t chunk_bytes = 0;   // text per work item; 0: 8 MiB / (2 x threads), 64 KiB to 2 MiB
  // JSON Lines inputs (io/jsonl_documents.h): the field holding each document's text, and how
  // many bad lines may be skipped (each named on stderr, the first few) before they are an
  // error. 0 by default: a corpus that does not parse as its user thinks is refused rather
  // than silently shortened.
  std::string text_field = "text";
  int64_t max_bad_lines = 0;
  // JSON Lines inputs: a longer line (without its newline) is a bad line, read through without
  // being held, so that a line of a GB (a compressed bomb) costs this much memory, not 2-9x its
  // size. 64 MiB by default (kDefaultMaxLineBytes).
  uint64_t max_line_bytes = kDefaultMaxLineBytes;
  // A token placed after every document (the tokenizer's end_of_text(), --end-of-text), so
  // that the model sees where one text ends and an unrelated one begins, and
  // data.document_mask can cut packed sequences there; none by default, as shards have always
  // been. A document is a text file (its training part and its validation part each end with
  // the token) or a JSON Lines document.
  std::optional<uint32_t> end_of_text;
  // Outputs that exist already are refused unless Replace (--force); see io/prepare_outputs.h.
  ExistingOutputs existing = ExistingOutputs::Refuse;
  // The files the tokenizer was read from: an output may no more be one of them than an input.
  std::vector<std::string> tokenizer_files;
};

// The files a prepare to `out_prefix` writes: <prefix>_train.bin, <prefix>_val.bin when
// val_fraction > 0, <prefix>_tokenizer<tokenizer_suffix> when the suffix is not "".
std::vector<std::string> prepare_output_names(const std::string& out_prefix, double val_fraction,
                                              const std::string& tokenizer_suffix);

// Tokenizes each text file and writes <out_prefix>_train.bin and <out_prefix>_val.bin
// (creating the prefix's directory if needed), and the tokenizer as
// <out_prefix>_tokenizer<suffix> (Tokenizer::save; nothing for bytes). The last val_fraction
// of each file goes to validation, so validation text comes from every file but never overlaps
// training text: for the byte tokenizer exactly round(bytes x val_fraction) bytes; for the
// others the split moves back to the nearest text boundary (io/text_cut.h) before that byte.
// 0 <= val_fraction < 1, else std::invalid_argument; 0 writes no validation shard (and leaves
// an existing <out_prefix>_val.bin alone). An out_prefix that is a directory ("data/") is
// std::invalid_argument too. A missing, unreadable, empty or directory input, or text that
// breaks the tokenizer's input rule (Tokenizer::takes_any_bytes), is a DataError naming the
// file (and the byte offset). The outputs are checked first (check_prepare_outputs: none may be
// an input or the tokenizer's file, none may exist unless options.existing is Replace), written
// under .tmp names and renamed together only when all is done, so that no error leaves any of
// them under a final name, and SIGINT/SIGTERM remove the .tmp files (io/prepare_outputs.h).
// Inputs named *.jsonl, *.jsonl.gz or *.jsonl.zst are JSON Lines: each line's text field is
// one document, tokenized on its own exactly as the same text given as its own file would be,
// the documents' tokens concatenated in order. Their validation part is the documents whose
// lines start in the file's last val_fraction of (decompressed) bytes: no document is split.
// Compressed inputs are read through once before anything is written (a truncated or corrupt
// one is a DataError naming it). More than options.max_bad_lines bad lines is a DataError
// naming the file and line; so is a JSON Lines file without a single document (blank lines
// only, or bad lines only).
PrepareResult prepare_text_files(const std::vector<std::string>& inputs,
                                 const std::string& out_prefix, const Tokenizer& tokenizer,
                                 const PrepareOptions& options);

// The size of an input `prepare` can read (decompressed, for a compressed JSON Lines file); else a DataError naming it: missing,
// unreadable, a directory, not a regular file, or empty.
uint64_t check_text_file(const std::string& path);

// The cores this process may run on (its affinity mask: what Slurm or taskset gave it, not
// the whole machine): the default number of tokenizing threads.
int available_cores();

// The byte tokenizer, default options but the fraction.
PrepareResult prepare_text_files(const std::vector<std::string>& inputs,
                                 const std::string& out_prefix, double val_fraction);

// synthetic_text(seed, bytes), byte-level: train_tokens + val_tokens == bytes. The outputs
// as prepare_text_files treats them.
PrepareResult prepare_synthetic(uint64_t seed, size_t bytes, const std::string& out_prefix,
                                double val_fraction,
                                ExistingOutputs existing = ExistingOutputs::Refuse);

}  // namespace meshtrain
