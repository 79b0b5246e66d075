#include "meshtrain/io/jsonl_documents.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
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

// "string", "number", ...: what a field held instead of the text.
std::string type_of(const nlohmann::json& j) {
  return j.is_null() ? "null" : std::string(j.type_name());
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
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(body);
  } catch (const nlohmann::json::parse_error& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 7: ..." without the
    // library's tag and the line that is always 1 here.
    std::string what = e.what();
    const size_t at = what.find("column ");
    out.text = "invalid JSON at " + cut_last_read(at != std::string::npos ? what.substr(at) : what);
    return;
  } catch (const nlohmann::json::out_of_range& e) {
    // 1e400 is valid JSON that no double holds (out_of_range.406, "number overflow parsing
    // '1e400'"): a bad line like any other, not an error of the program.
    out.text = number_out_of_range(e.what());
    return;
  }
  if (!j.is_object()) {
    out.text = "a JSON " + type_of(j) + ", not an object (expected one object per line, e.g. "
               "{\"" + field_ + "\": \"...\"})";
    return;
  }
  nlohmann::json* at = nullptr;
  if (const auto it = j.find(field_); it != j.end()) {
    at = &*it;
  } else if (field_path_.size() > 1) {
    at = &j;
    for (const std::string& part : field_path_) {
      const auto sub = at->is_object() ? at->find(part) : at->end();
      if (!at->is_object() || sub == at->end()) {
        at = nullptr;
        break;
      }
      at = &*sub;
    }
  }
  if (at == nullptr) {
    std::string keys;
    for (const auto& [key, value] : j.items()) {
      if (keys.size() > 60) {
        keys += ", ...";
        break;
      }
      keys += (keys.empty() ? "" : ", ") + ("\"" + key + "\"");
    }
    out.text = "no field \"" + field_ + "\" (the object has " +
               (keys.empty() ? std::string("no fields") : keys) +
               "; --text-field names the one holding the text)";
    return;
  }
  if (!at->is_string()) {
    out.text = "field \"" + field_ + "\" is a " + type_of(*at) + ", not a string";
    return;
  }
  // Moved out, not copied: a long document is not held twice more.
  std::string text = std::move(at->get_ref<std::string&>());
  if (refuse_nul_ && text.find('\0') != std::string::npos) {
    out.text = "field \"" + field_ + "\" holds a NUL character (\\u0000), which subword "
               "tokenizers do not take";
    return;
  }
  out.kind = JsonlLine::Kind::Document;
  out.text = std::move(text);
}

JsonlLine JsonlDocuments::next() {
  JsonlLine out;
  std::string line;
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
      return out;
    }
    if (blank(std::string_view(line).substr(0, line.size() - (line.back() == '\n' ? 1 : 0))))
      continue;
    classify(line, out);
    return out;
  }
  out.kind = JsonlLine::Kind::End;
  return out;
}

}  // namespace meshtrain
