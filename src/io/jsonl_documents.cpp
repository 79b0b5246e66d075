#include "meshtrain/io/jsonl_documents.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

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

bool blank(const std::string& line) {
  return std::all_of(line.begin(), line.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

// "string", "number", ...: what a field held instead of the text.
std::string type_of(const nlohmann::json& j) {
  return j.is_null() ? "null" : std::string(j.type_name());
}

}  // namespace

bool is_jsonl_path(const std::string& path) {
  return ends_with(path, ".jsonl") || ends_with(path, ".jsonl.gz") ||
         ends_with(path, ".jsonl.zst");
}

JsonlDocuments::JsonlDocuments(const std::string& path, std::string text_field, bool refuse_nul)
    : reader_(path), field_(std::move(text_field)), field_path_(split_dots(field_)),
      refuse_nul_(refuse_nul), buf_(1u << 20) {}

bool JsonlDocuments::next_raw_line(std::string& line) {
  line.clear();
  for (;;) {
    if (buf_pos_ == buf_end_) {
      buf_pos_ = 0;
      buf_end_ = reader_.read(buf_.data(), buf_.size());
      if (buf_end_ == 0) return !line.empty();  // a last line without its newline counts
    }
    const char* begin = buf_.data() + buf_pos_;
    const void* nl = std::memchr(begin, '\n', buf_end_ - buf_pos_);
    const size_t take = nl != nullptr ? static_cast<const char*>(nl) - begin : buf_end_ - buf_pos_;
    line.append(begin, take);
    buf_pos_ += take;
    if (nl != nullptr) {
      ++buf_pos_;
      line.push_back('\n');
      return true;
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
    out.text = "invalid JSON at " + (at != std::string::npos ? what.substr(at) : what);
    return;
  }
  if (!j.is_object()) {
    out.text = "a JSON " + type_of(j) + ", not an object (expected one object per line, e.g. "
               "{\"" + field_ + "\": \"...\"})";
    return;
  }
  const nlohmann::json* at = nullptr;
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
  std::string text = at->get<std::string>();
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
  while (next_raw_line(line)) {
    out.number = ++line_number_;
    out.offset = offset_;
    out.bytes = line.size();
    offset_ += line.size();
    if (blank(line.back() == '\n' ? line.substr(0, line.size() - 1) : line)) continue;
    classify(line, out);
    return out;
  }
  out.kind = JsonlLine::Kind::End;
  return out;
}

}  // namespace meshtrain
