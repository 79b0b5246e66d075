#include "meshtrain/io/choice_tasks.h"

#include <cctype>
#include <optional>
#include <nlohmann/json.hpp>

#include "meshtrain/io/data_error.h"
#include "meshtrain/io/terminal_text.h"

namespace meshtrain {

namespace {

using nlohmann::json;

std::string replace_all(const std::string& text, const std::string& from, const std::string& to) {
  std::string out;
  size_t at = 0;
  for (size_t hit; (hit = text.find(from, at)) != std::string::npos; at = hit + from.size())
    out += text.substr(at, hit - at) + to;
  return out + text.substr(at);
}

std::string strip(const std::string& text) {
  const char* space = " \t\n\r\f\v";
  const size_t begin = text.find_first_not_of(space);
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(space) - begin + 1);
}

// The task's name from its path: "tasks/hellaswag_val.jsonl.gz" -> "hellaswag_val".
std::string task_name(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  for (const char* suffix : {".gz", ".zst", ".jsonl", ".json"})
    if (name.size() > std::string(suffix).size() &&
        name.compare(name.size() - std::string(suffix).size(), std::string::npos, suffix) == 0)
      name.resize(name.size() - std::string(suffix).size());
  return name;
}

// Where a problem is: "<path>: line N".
struct LineAt {
  const std::string& path;
  uint64_t line;
  [[noreturn]] void fail(const std::string& what) const {
    throw DataError(path, "line " + std::to_string(line) + ": " + what);
  }
};

// A value for a message: its JSON text, cut to 60 bytes and made safe for a terminal.
std::string shown(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 60) text = text.substr(0, 60) + "...";
  return terminal_safe(text);
}

const json& field(const json& object, const char* key, json::value_t type, const char* type_name,
                  const LineAt& at) {
  const auto it = object.find(key);
  if (it == object.end())
    at.fail(std::string("no field \"") + key + "\" (expected " + type_name + ")");
  const bool number_ok = type == json::value_t::number_integer && it->is_number_unsigned();
  if (it->type() != type && !number_ok)
    at.fail(std::string("field \"") + key + "\" is " + shown(*it) + ", not " + type_name);
  return *it;
}

std::vector<std::string> string_array(const json& object, const char* key, const LineAt& at) {
  const json& array = field(object, key, json::value_t::array, "an array of strings", at);
  if (array.empty())
    at.fail(std::string("field \"") + key + "\" is empty (expected at least one choice)");
  std::vector<std::string> out;
  for (size_t i = 0; i < array.size(); ++i) {
    if (!array[i].is_string())
      at.fail(std::string("field \"") + key + "\"[" + std::to_string(i) + "] is " +
              shown(array[i]) + ", not a string");
    out.push_back(array[i].get<std::string>());
  }
  return out;
}

// The gold index from an integer, or (HellaSwag's label as some copies hold it) a string of
// digits; within [0, choices).
int gold_index(const json& object, const char* key, size_t choices, const LineAt& at) {
  const auto it = object.find(key);
  if (it == object.end())
    at.fail(std::string("no field \"") + key + "\" (expected the index of the right choice)");
  std::optional<long long> index;
  if (it->is_number_integer()) index = it->get<long long>();
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    if (!s.empty() && s.size() < 10 && s.find_first_not_of("0123456789") == std::string::npos)
      index = std::stoll(s);
  }
  if (!index || *index < 0 || *index >= static_cast<long long>(choices))
    at.fail(std::string("field \"") + key + "\" is " + shown(*it) + ", not a choice index (expected an integer from 0 to " + std::to_string(choices - 1) + ")");
  return static_cast<int>(*index);
}

ChoiceExample request_form(const json& object, const LineAt& at) {
  ChoiceExample e;
  e.context = field(object, "context", json::value_t::string, "a string", at).get<std::string>();
  e.continuations = string_array(object, "choices", at);
  for (const std::string& c : e.continuations) e.norm_bytes.push_back(static_cast<double>(c.size()));
  e.gold = gold_index(object, "gold", e.continuations.size(), at);
  return e;
}

// lm-evaluation-harness's hellaswag process_docs: query and choices; acc_norm divides by the
// preprocessed ending's length, without the space that joins it to the context.
ChoiceExample hellaswag_form(const json& object, const LineAt& at) {
  const auto text = [&](const char* key) {
    return field(object, key, json::value_t::string, "a string", at).get<std::string>();
  };
  const std::string ctx = text("ctx_a") + " " + capitalize_ascii(text("ctx_b"));
  ChoiceExample e;
  e.context = hellaswag_preprocess(text("activity_label") + ": " + ctx);
  for (const std::string& ending : string_array(object, "endings", at)) {
    const std::string choice = hellaswag_preprocess(ending);
    e.continuations.push_back(" " + choice);
    e.norm_bytes.push_back(static_cast<double>(choice.size()));
  }
  e.gold = gold_index(object, "label", e.continuations.size(), at);
  return e;
}

ChoiceExample parse_example(const std::string& text, const LineAt& at) {
  json object;
  try {
    object = json::parse(text);
  } catch (const json::exception& e) {
    std::string why = e.what();
    const size_t column = why.find("column ");
    if (column != std::string::npos) why = why.substr(column);
    if (why.size() > 160) why = why.substr(0, 160) + "...";
    at.fail("not JSON (" + terminal_safe(why) + ")");
  }
  if (!object.is_object())
    at.fail("a JSON " + std::string(object.type_name()) + ", not an object (expected {\"context\": "
            "\"...\", \"choices\": [...], \"gold\": k} or HellaSwag's {\"ctx_a\", \"ctx_b\", "
            "\"activity_label\", \"endings\", \"label\"})");
  return object.contains("endings") ? hellaswag_form(object, at) : request_form(object, at);
}

}  // namespace

std::string capitalize_ascii(const std::string& text) {
  std::string out = text;
  for (size_t i = 0; i < out.size(); ++i) {
    const auto c = static_cast<unsigned char>(out[i]);
    if (c < 0x80) out[i] = static_cast<char>(i == 0 ? std::toupper(c) : std::tolower(c));
  }
  return out;
}

std::string hellaswag_preprocess(const std::string& text) {
  const std::string titled = replace_all(strip(text), " [title]", ". ");
  // Python's re.sub("\\[.*?\\]", "", ...): each '[' to the first ']' after it on the same line.
  std::string unbracketed;
  for (size_t i = 0; i < titled.size(); ++i) {
    if (titled[i] == '[') {
      const size_t close = titled.find_first_of("]\n", i + 1);
      if (close != std::string::npos && titled[close] == ']') {
        i = close;
        continue;
      }
    }
    unbracketed += titled[i];
  }
  return replace_all(unbracketed, "  ", " ");
}

ChoiceTask read_choice_task(const std::string& path, uint64_t max_line_bytes) {
  ChoiceTask task;
  task.path = path;
  task.name = task_name(path);
  JsonlDocuments lines(path, "", false, max_line_bytes);
  for (JsonlLine line = lines.next_line(); line.kind != JsonlLine::Kind::End; line = lines.next_line()) {
    const LineAt at{path, line.number};
    if (line.kind == JsonlLine::Kind::Bad) at.fail(line.text);
    task.examples.push_back(parse_example(line.text, at));
    task.examples.back().line = line.number;
  }
  if (task.examples.empty())
    throw DataError(path, "no examples (expected one JSON object per line: {\"context\": \"...\", "
                          "\"choices\": [\" a\", \" b\"], \"gold\": 0})");
  return task;
}

}  // namespace meshtrain
