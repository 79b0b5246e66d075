#pragma once
// Multiple-choice tasks for downstream evaluation (`eval --task`, train.eval_tasks), read from
// JSON Lines in either of two forms, told apart per line by its fields:
//   the harness's request form  {"context": "...", "choices": [" a", " b"], "gold": 1}: each
//     choice is appended to the context as it is (it usually starts with its space);
//   HellaSwag's published form  {"activity_label", "ctx_a", "ctx_b", "endings", "label"}:
//     lm-evaluation-harness's preprocessing (lm_eval/tasks/hellaswag/utils.py): context
//     preprocess(activity_label + ": " + ctx_a + " " + capitalize(ctx_b)), choices
//     " " + preprocess(ending).
// What is read, not how it is scored (train/choice_scoring.h). Lines are read with the JSON
// Lines reader of `prepare` (io/jsonl_documents.h) and its line bound.

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/io/jsonl_documents.h"

namespace meshtrain {

struct ChoiceExample {
  uint64_t line = 0;                       // 1-based line of the file
  std::string context;                     // the text every choice continues
  std::vector<std::string> continuations;  // appended to the context as they are
  std::vector<double> norm_bytes;          // acc_norm's divisor: each choice's length in bytes
  int gold = 0;                            // the right choice's index
};

struct ChoiceTask {
  std::string name;  // the file's name without its folder and .jsonl (.gz, .zst)
  std::string path;
  std::vector<ChoiceExample> examples;
};

// Reads every line; DataError "<path>: line N: <field>: <problem> (<what is accepted>)" for the
// first bad one (not JSON, a field missing or of the wrong type, no choices, gold out of range,
// a line over max_line_bytes), and for a file without examples.
ChoiceTask read_choice_task(const std::string& path,
                            uint64_t max_line_bytes = kDefaultMaxLineBytes);

// HellaSwag's text clean-up as the harness does it: strip, " [title]" -> ". ", every "[...]"
// removed, each double space made one.
std::string hellaswag_preprocess(const std::string& text);
// Python's str.capitalize() on ASCII: the first letter upper case, the rest lower case (bytes
// outside ASCII stay as they are).
std::string capitalize_ascii(const std::string& text);

}  // namespace meshtrain
