#include "meshtrain/io/jsonl_documents.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <optional>
#include <set>
#include <string_view>
#include <nlohmann/json.hpp>

#include "meshtrain/io/terminal_text.h"
#include "meshtrain/io/utf8_text.h"

namespace meshtrain {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::vector<std::string> split_dots(const std::string& field) {
  std::vector<std::string> parts;
  size_t begin = 0;
  for (;;) {
    const size_t dot = field.find('.', begin);
    parts.push_back(field.substr(begin, dot - begin));
    if (dot == std::string::npos) return parts;
    begin = dot + 1;
  }
}

bool blank(std::string_view line) {
  return std::all_of(line.begin(), line.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

// "5012 bytes", "1073741824 bytes (1.0 GiB)": a bound or a length as a user reads it.
std::string bytes_in_words(uint64_t n) {
  if (n < (uint64_t{1} << 20)) return std::to_string(n) + " bytes";
  char mib[32];
  std::snprintf(mib, sizeof mib, n >= (uint64_t{1} << 30) ? "%.1f GiB" : "%.1f MiB",
                static_cast<double>(n) / (n >= (uint64_t{1} << 30) ? 1073741824.0 : 1048576.0));
  return std::to_string(n) + " bytes (" + mib + ")";
}


// nlohmann's message quotes the token it read last ("...; last read: '\"aaaa...'"), which is
// the whole rest of the line for an unterminated string: a 60 MB message. Cut to its first 80
// bytes, and escaped (io/terminal_text.h): the line came from someone else.
std::string cut_last_read(const std::string& message) {
  constexpr std::string_view kLastRead = "last read: '";
  constexpr size_t kKept = 80;
  const size_t begin = message.find(kLastRead);
  if (begin == std::string::npos) return terminal_safe(message);
  const size_t token = begin + kLastRead.size();
  size_t end = message.rfind("'; expected");
  if (end == std::string::npos || end < token) end = message.size() - 1;
  if (end - token <= kKept) return terminal_safe(message);
  return terminal_safe(message.substr(0, token + kKept)) + "...(" +
         std::to_string(end - token - kKept) + " bytes more)" +
         terminal_safe(message.substr(end));
}

// "a number beyond the range of a double: 1e400" from nlohmann's "[json.exception.out_of_range.406]
// number overflow parsing '1e400'", the number cut to 40 characters (a line may hold a long one).
std::string number_out_of_range(const std::string& what) {
  const size_t open = what.find('\''), close = what.rfind('\'');
  std::string number =
      open != std::string::npos && close > open ? what.substr(open + 1, close - open - 1) : "";
  if (number.size() > 40) number = number.substr(0, 40) + "...";
  return "a number beyond the range of a double" + (number.empty() ? "" : ": " + number) +
         " (JSON numbers must lie within about +-1.8e308)";
}

// One line's JSON read through nlohmann's SAX interface, keeping only what classify() needs: the
// top-level value's type, the first top-level keys (for a message), and the value at the text
// field. A DOM of the line cost up to 40x its size (10 MB of nested arrays: 400 MB), so that a
// line within --max-line-bytes could still take GBs; this holds the line, one string and a bit
// per level of nesting. The lookup is the DOM's: the field as one top-level name first, else its
// dotted path through nested objects; of duplicate keys the last wins, as it did.
class FieldFinder final : public nlohmann::json_sax<nlohmann::json> {
 public:
  FieldFinder(const std::string& field, const std::vector<std::string>& path)
      : field_(field), path_(path) {}

  std::string top_type;                // the line's value: "object", "array", "number", ...
  std::set<std::string> first_keys;    // the 16 smallest top-level keys, each cut to 64 bytes
  std::optional<std::string> direct_type, path_type;  // the field's type, where found
  std::string direct_text, path_text;  // the field's string, where it is one
  std::string error;                   // nlohmann's message, and its exception's id
  int error_id = 0;

  bool null() override { return value("null"); }
  bool boolean(bool) override { return value("boolean"); }
  bool number_integer(number_integer_t) override { return value("number"); }
  bool number_unsigned(number_unsigned_t) override { return value("number"); }
  bool number_float(number_float_t, const string_t&) override { return value("number"); }
  bool binary(binary_t&) override { return value("binary"); }
  bool string(string_t& s) override {
    if (direct_next_) direct_text = std::move(s);
    else if (path_next_ == path_.size() && path_next_ > 0) path_text = std::move(s);
    return value("string");
  }
  bool start_object(std::size_t) override { return open(true); }
  bool start_array(std::size_t) override { return open(false); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    const size_t depth = on_path_.size();
    if (depth == 1) {
      first_keys.insert(k.substr(0, 64));
      if (first_keys.size() > 16) first_keys.erase(std::prev(first_keys.end()));
      direct_next_ = k == field_;
    }
    path_next_ = path_.size() > 1 && on_path_.back() && depth <= path_.size() &&
                         k == path_[depth - 1]
                     ? depth
                     : 0;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error = e.what();
    error_id = e.id;
    return false;
  }

 private:
  // A value (a container: its start) where the last key left off.
  bool value(const char* type) {
    if (on_path_.empty()) top_type = type;
    if (direct_next_) direct_type = type;
    // A later occurrence of a key on the path replaces what an earlier one led to.
    if (path_next_ > 0) path_type.reset();
    if (path_next_ == path_.size() && path_next_ > 0) path_type = type;
    return true;
  }
  bool open(bool object) {
    value(object ? "object" : "array");
    const bool on_path =
        object && (on_path_.empty() || (path_next_ > 0 && path_next_ < path_.size()));
    on_path_.push_back(on_path);
    direct_next_ = false;
    path_next_ = 0;
    return true;
  }
  bool close() {
    on_path_.pop_back();
    direct_next_ = false;
    path_next_ = 0;
    return true;
  }

  const std::string& field_;
  const std::vector<std::string>& path_;
  std::vector<bool> on_path_;  // per open container: an object reached along the path
  bool direct_next_ = false;   // the next value is the top-level field_
  size_t path_next_ = 0;       // the next value is at this depth of the path (0: not on it)
};

}  // namespace

bool is_jsonl_path(const std::string& path) {
  return ends_with(path, ".jsonl") || ends_with(path, ".jsonl.gz") ||
         ends_with(path, ".jsonl.zst");
}

JsonlDocuments::JsonlDocuments(const std::string& path, std::string text_field, bool refuse_nul,
                               uint64_t max_line_bytes)
    : reader_(path), field_(std::move(text_field)), field_path_(split_dots(field_)),
      refuse_nul_(refuse_nul), max_line_bytes_(max_line_bytes), buf_(1u << 20) {}

JsonlDocuments::RawLine JsonlDocuments::next_raw_line(std::string& line, uint64_t& skipped) {
  line.clear();
  skipped = 0;
  for (;;) {
    if (buf_pos_ == buf_end_) {
      buf_pos_ = 0;
      buf_end_ = reader_.read(buf_.data(), buf_.size());
      // A last line without its newline counts.
      if (buf_end_ == 0) return line.empty() ? RawLine::End : RawLine::Held;
    }
    const char* begin = buf_.data() + buf_pos_;
    const void* nl = std::memchr(begin, '\n', buf_end_ - buf_pos_);
    const size_t take = nl != nullptr ? static_cast<const char*>(nl) - begin : buf_end_ - buf_pos_;
    if (line.size() + take > max_line_bytes_) {
      // Held no further: a 1 GB line (or a compressed bomb of one) costs the bound, not 2-9x
      // its size, and is read through in linear time.
      skipped = line.size() + skip_rest_of_line();
      line.clear();
      return RawLine::TooLong;
    }
    line.append(begin, take);
    buf_pos_ += take;
    if (nl != nullptr) {
      ++buf_pos_;
      line.push_back('\n');
      return RawLine::Held;
    }
  }
}

uint64_t JsonlDocuments::skip_rest_of_line() {
  uint64_t skipped = 0;
  skipped_newline_ = false;
  for (;;) {
    if (buf_pos_ == buf_end_) {
      buf_pos_ = 0;
      buf_end_ = reader_.read(buf_.data(), buf_.size());
      if (buf_end_ == 0) return skipped;
    }
    const char* begin = buf_.data() + buf_pos_;
    const void* nl = std::memchr(begin, '\n', buf_end_ - buf_pos_);
    const size_t take =
        nl != nullptr ? static_cast<const char*>(nl) - begin + 1 : buf_end_ - buf_pos_;
    buf_pos_ += take;
    skipped += take;
    if (nl != nullptr) {
      skipped_newline_ = true;
      return skipped;
    }
  }
}

void JsonlDocuments::classify(const std::string& line, JsonlLine& out) const {
  out.kind = JsonlLine::Kind::Bad;
  // Before the parser: its message for a bad byte is about JSON, this one says which byte.
  const std::string_view body(line.data(), line.size() - (line.back() == '\n' ? 1 : 0));
  const size_t bad = first_non_text_byte(body);
  if (bad < body.size()) {
    out.text = describe_non_text_byte(body, bad) + " at column " + std::to_string(bad + 1);
    return;
  }
  FieldFinder found(field_, field_path_);
  if (!nlohmann::json::sax_parse(body, &found)) {
    if (found.error_id / 100 == 4) {
      // 1e400 is valid JSON that no double holds (out_of_range.406, "number overflow parsing
      // '1e400'"): a bad line like any other, not an error of the program.
      out.text = number_out_of_range(found.error);
    } else {
      // "[json.exception.parse_error.101] parse error at line 1, column 7: ..." without the
      // library's tag and the line that is always 1 here.
      const size_t at = found.error.find("column ");
      out.text = "invalid JSON at " +
                 cut_last_read(at != std::string::npos ? found.error.substr(at) : found.error);
    }
    return;
  }
  if (found.top_type != "object") {
    out.text = "a JSON " + found.top_type + ", not an object (expected one object per line, e.g. "
               "{\"" + field_ + "\": \"...\"})";
    return;
  }
  const bool direct = found.direct_type.has_value();
  const std::optional<std::string>& type = direct ? found.direct_type : found.path_type;
  if (!type) {
    std::string keys;
    for (const std::string& key : found.first_keys) {
      if (keys.size() > 60) {
        keys += ", ...";
        break;
      }
      keys += (keys.empty() ? "" : ", ") + ("\"" + terminal_safe(key) + "\"");
    }
    out.text = "no field \"" + field_ + "\" (the object has " +
               (keys.empty() ? std::string("no fields") : keys) +
               "; --text-field names the one holding the text)";
    return;
  }
  if (*type != "string") {
    out.text = "field \"" + field_ + "\" is a " + *type + ", not a string";
    return;
  }
  std::string text = std::move(direct ? found.direct_text : found.path_text);
  if (refuse_nul_ && text.find('\0') != std::string::npos) {
    out.text = "field \"" + field_ + "\" holds a NUL character (\\u0000), which subword "
               "tokenizers do not take";
    return;
  }
  out.kind = JsonlLine::Kind::Document;
  out.text = std::move(text);
}

bool JsonlDocuments::read_line(std::string& line, JsonlLine& out) {
  uint64_t long_line_bytes = 0;
  for (RawLine got; (got = next_raw_line(line, long_line_bytes)) != RawLine::End;) {
    out.number = ++line_number_;
    out.offset = offset_;
    out.bytes = got == RawLine::TooLong ? long_line_bytes : line.size();
    offset_ += out.bytes;
    if (got == RawLine::TooLong) {
      out.kind = JsonlLine::Kind::Bad;
      out.text = "the line is " + bytes_in_words(long_line_bytes - (skipped_newline_ ? 1 : 0)) +
                 " long, more than "
                 "--max-line-bytes " + bytes_in_words(max_line_bytes_) + " allows (raise "
                 "the bound for documents that long, or leave the line out)";
      return true;
    }
    if (blank(std::string_view(line).substr(0, line.size() - (line.back() == '\n' ? 1 : 0))))
      continue;
    out.kind = JsonlLine::Kind::Document;
    return true;
  }
  out.kind = JsonlLine::Kind::End;
  return false;
}

JsonlLine JsonlDocuments::next() {
  JsonlLine out;
  std::string line;
  if (read_line(line, out) && out.kind == JsonlLine::Kind::Document) classify(line, out);
  return out;
}

JsonlLine JsonlDocuments::next_line() {
  JsonlLine out;
  std::string line;
  if (read_line(line, out) && out.kind == JsonlLine::Kind::Document) {
    if (line.back() == '\n') line.pop_back();
    out.text = std::move(line);
  }
  return out;
}

}  // namespace meshtrain
