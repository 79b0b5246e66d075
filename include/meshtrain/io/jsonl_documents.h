#pragma once
// JSON Lines corpora, the form most public pretraining sets come in: one JSON object per line,
// the document's text at a field ("text" by default). Read line by line from a plain, .gz or
// .zst file (io/compressed_reader.h), so that only one line is in memory at a time, and at most
// max_line_bytes of it: a longer line is read through in the reader's 1 MiB pieces and never
// held whole, so memory stays flat whatever a (decompressed) line's length. A line that holds
// no document (longer than the bound, invalid UTF-8 or JSON, a number beyond a double, not an
// object, no such field, a field that is not a string) is returned as a bad line with its
// reason, for `prepare` to count and name; blank lines are skipped, as JSON Lines readers do.

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/io/compressed_reader.h"

namespace meshtrain {

// A name ending in .jsonl, .jsonl.gz or .jsonl.zst.
bool is_jsonl_path(const std::string& path);

// The longest line (without its newline) read by default: 64 MiB, far above a document of any
// public pretraining set (a long book is a few MB), and about 5x that in memory while parsed.
inline constexpr uint64_t kDefaultMaxLineBytes = uint64_t{64} << 20;
// The most --max-line-bytes takes: 4 GiB, a line that already costs about 20 GiB to parse.
inline constexpr long long kMaxLineBytesLimit = 4ll << 30;

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
  // max_line_bytes: a longer line is a bad line (read through, not held).
  JsonlDocuments(const std::string& path, std::string text_field, bool refuse_nul,
                 uint64_t max_line_bytes = kDefaultMaxLineBytes);

  // The next document or bad line; Kind::End after the last line.
  JsonlLine next();
  // The next non-blank line as it is (Kind::Document, text without its newline), for readers
  // that parse each object themselves (io/choice_tasks.h), or a bad line longer than the bound;
  // Kind::End after the last line. The text field is not looked at.
  JsonlLine next_line();

  uint64_t lines() const { return line_number_; }  // read so far, blank ones too

 private:
  enum class RawLine { Held, TooLong, End };
  // The next line into `line`, its newline kept; TooLong: the line's first bytes only, and
  // `skipped` the bytes read past them (the rest of the line, its newline too).
  RawLine next_raw_line(std::string& line, uint64_t& skipped);
  // Bytes up to and including the next newline (or the end), read and dropped;
  // skipped_newline_ says whether a newline ended them.
  uint64_t skip_rest_of_line();
  void classify(const std::string& line, JsonlLine& out) const;
  // The next non-blank line into `line` (its newline kept) and out's number, offset and bytes;
  // a line over the bound as out's bad line. False at the end.
  bool read_line(std::string& line, JsonlLine& out);

  CompressedReader reader_;
  std::string field_;
  std::vector<std::string> field_path_;
  bool refuse_nul_;
  uint64_t max_line_bytes_;
  std::vector<char> buf_;
  size_t buf_pos_ = 0, buf_end_ = 0;
  uint64_t line_number_ = 0, offset_ = 0;
  bool skipped_newline_ = false;
};

}  // namespace meshtrain
