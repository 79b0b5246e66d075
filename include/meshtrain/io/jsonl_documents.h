#pragma once
// JSON Lines corpora, the form most public pretraining sets come in: one JSON object per line,
// the document's text at a field ("text" by default). Read line by line from a plain, .gz or
// .zst file (io/compressed_reader.h), so that only one line is in memory at a time. A line
// that holds no document (invalid UTF-8 or JSON, not an object, no such field, a field that is
// not a string) is returned as a bad line with its reason, for `prepare` to count and name;
// blank lines are skipped, as JSON Lines readers do.

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/io/compressed_reader.h"

namespace meshtrain {

// A name ending in .jsonl, .jsonl.gz or .jsonl.zst.
bool is_jsonl_path(const std::string& path);

struct JsonlLine {
  enum class Kind { Document, Bad, End };
  Kind kind = Kind::End;
  uint64_t number = 0;  // 1-based line number in the decompressed text
  uint64_t offset = 0;  // of the line's first byte in the decompressed text
  uint64_t bytes = 0;   // the line's length with its newline: what progress counts
  std::string text;     // Document: the field's string; Bad: what is wrong with the line
};

class JsonlDocuments {
 public:
  // text_field: a field name, or a dotted path into nested objects ("meta.body"). A field name
  // that itself holds a dot is found as it is before the path is tried.
  // refuse_nul: a document whose text holds U+0000 is a bad line (the subword tokenizers take
  // no NUL bytes; the byte tokenizer does).
  JsonlDocuments(const std::string& path, std::string text_field, bool refuse_nul);

  // The next document or bad line; Kind::End after the last line.
  JsonlLine next();

 private:
  bool next_raw_line(std::string& line);
  void classify(const std::string& line, JsonlLine& out) const;

  CompressedReader reader_;
  std::string field_;
  std::vector<std::string> field_path_;
  bool refuse_nul_;
  std::vector<char> buf_;
  size_t buf_pos_ = 0, buf_end_ = 0;
  uint64_t line_number_ = 0, offset_ = 0;
};

}  // namespace meshtrain
