// The [data] keys: sources (one, or a weighted blend of several), tokenizer, masks.

#include <algorithm>
#include <cmath>
#include <set>

#include "deck_keys.h"
#include "meshtrain/config/config.h"

namespace meshtrain {

using namespace deck_keys;

namespace {

// A source's paths: one string, or an array of strings. Returns a problem, or "".
std::string read_paths(const toml::node& n, std::vector<std::string>& out) {
  if (auto s = n.as_string()) {
    out.push_back(s->get());
  } else if (auto a = n.as_array()) {
    for (const toml::node& e : *a) {
      if (!e.is_string()) return "holds " + toml_type_of(e);
      out.push_back(e.as_string()->get());
    }
  } else {
    return "is " + toml_type_of(n);
  }
  if (out.empty() || std::any_of(out.begin(), out.end(), [](const std::string& s) { return s.empty(); }))
    return "is empty";
  return "";
}

// "source 1 (path \"b/*.bin\")": how messages name a blend's source.
std::string source_label(size_t index, const toml::table& t) {
  std::string label = "source " + std::to_string(index);
  if (const toml::node* p = t.get("path")) label += " (path " + repr(*p) + ")";
  return label;
}

// One {path = ..., weight = ..., name = ...} table of a blend. Returns a problem, or "".
std::string read_source(size_t index, const toml::node& n, DataSource& out) {
  const toml::table* t = n.as_table();
  if (!t) return "holds " + toml_type_of(n) + " at source " + std::to_string(index);
  const std::string label = "at " + source_label(index, *t);
  for (const auto& [key, value] : *t) {
    const std::string k(key.str());
    if (k != "path" && k != "weight" && k != "name")
      return label + ": has an unknown key '" + escape_control(k) + "' (a source has path, weight, name)";
  }
  const toml::node* path = t->get("path");
  if (!path) return label + ": has no path";
  if (std::string p = read_paths(*path, out.paths); !p.empty()) return label + ": path " + p;
  if (std::find(out.paths.begin(), out.paths.end(), "synthetic") != out.paths.end() ||
      std::find(out.paths.begin(), out.paths.end(), "none") != out.paths.end())
    return label + ": a blend's sources are token shards, not \"synthetic\" or \"none\"";
  if (const toml::node* w = t->get("weight")) {
    if (auto f = w->as_floating_point()) out.weight = f->get();
    else if (auto i = w->as_integer()) out.weight = static_cast<double>(i->get());
    else return label + ": weight is " + toml_type_of(*w);
    if (!std::isfinite(out.weight) || out.weight < 0)
      return label + ": weight = " + repr(*w) + " is not a finite number >= 0";
  }
  out.name = out.paths.front();
  if (const toml::node* name = t->get("name")) {
    if (!name->is_string() || name->as_string()->get().empty())
      return label + ": name = " + repr(*name) + " is not a non-empty string";
    out.name = name->as_string()->get();
  }
  return "";
}

// A blend: an array of source tables. Returns a problem, or "".
std::string read_blend(const toml::array& a, std::vector<DataSource>& out) {
  double total = 0;
  std::set<std::string> names;
  for (size_t i = 0; i < a.size(); ++i) {
    DataSource s;
    if (std::string p = read_source(i, a[i], s); !p.empty()) return p;
    if (!names.insert(s.name).second)
      return "at source " + std::to_string(i) + " (path \"" + escape_control(s.paths.front()) +
             "\"): name \"" + escape_control(s.name) + "\" is an earlier source's too; give each a distinct name";
    total += s.weight;
    out.push_back(std::move(s));
  }
  if (!(total > 0) || !std::isfinite(total))
    return "has weights summing to " + std::to_string(total) + ": at least one weight must be > 0, and the sum finite";
  return "";
}

// data.train and data.val: one source (a string or an array of strings: its paths, or
// "synthetic") or a blend (an array of tables). Stores into `one` or `blend`.
std::string read_data_sources(const toml::node& n, std::vector<std::string>& one,
                              std::vector<DataSource>& blend) {
  if (auto a = n.as_array(); a && !a->empty() && a->front().is_table()) {
    blend.clear();
    if (std::string p = read_blend(*a, blend); !p.empty()) return p;
    one.clear();
    return "";
  }
  std::vector<std::string> out;
  if (std::string p = read_paths(n, out); !p.empty()) return p;
  if (out.size() > 1 && std::find(out.begin(), out.end(), "synthetic") != out.end())
    return "mixes \"synthetic\" with files";
  one = out;
  blend.clear();
  return "";
}

OnExhausted exhaustion_named(const std::string& name) {
  return name == "stop" ? OnExhausted::Stop : OnExhausted::Wrap;
}

const char* const kBlendAccepted =
    "or a blend: an array of tables {path = \"<path or glob>\" (or an array of them), weight = "
    "<finite number >= 0> (default 1, weights summing to more than 0), name = \"<unique name>\" "
    "(default: the path)}";

}  // namespace

void add_data_keys(std::vector<KeySpec>& k) {
  k.push_back({"data", "train", "string, array of strings, or array of tables", "\"synthetic\"",
               std::string("\"synthetic\", or token-shard paths / glob patterns, ") + kBlendAccepted,
               "Training data: the built-in generated corpus, or token shards written by "
               "`meshtrain prepare`, or a weighted blend of shard sources (each sample's source "
               "follows Megatron's blending rule: every source's count stays within 1 sample of "
               "its weight's share at every prefix; docs/data-and-interop.md).",
               [](const toml::node& n, Config& c) -> std::string {
                 return read_data_sources(n, c.data.train, c.data.train_blend);
               }});
  k.push_back({"data", "val", "string or array of tables", "\"synthetic\"",
               std::string("\"synthetic\", \"none\", or a token-shard path / glob pattern, ") + kBlendAccepted,
               "Validation data (a blend is read in order within each source).",
               [](const toml::node& n, Config& c) -> std::string {
                 if (n.is_array() && !(n.as_array()->size() > 0 && n.as_array()->front().is_table()))
                   return "is " + toml_type_of(n) + " (one path or glob, or a blend of tables)";
                 std::vector<std::string> one;
                 if (std::string p = read_data_sources(n, one, c.data.val_blend); !p.empty()) return p;
                 c.data.val = one.empty() ? "" : one.front();
                 return "";
               }});
  k.push_back(choice_key("data", "on_exhausted", "wrap", {"wrap", "stop"},
                         "A training source whose every sample has been drawn: \"wrap\" starts "
                         "its next epoch (a new order of the same samples); \"stop\" refuses, "
                         "before the first step, a run whose train.steps would draw a sample "
                         "of a source (or of data.train's one source) a second time.",
                         [](Config& c, const std::string& v) { c.data.on_exhausted = exhaustion_named(v); }));
  k.push_back(string_key("data", "tokenizer", "\"bytes\"",
                         "\"bytes\", or a tokenizer file: the one `meshtrain prepare` wrote "
                         "beside the shards, a SentencePiece .model, a GPT-2 BPE directory "
                         "(vocab.json + merges.txt) or a tokenizer.json",
                         "The tokenizer the shards were made with: `sample` and "
                         "train.sample_every decode with it, and a checkpoint records it.",
                         nonempty,
                         [](Config& c, const std::string& v) { c.data.tokenizer = v; }));
  k.push_back(bool_key("data", "document_mask", false,
                       "Block-causal attention (as Llama 3 was trained): a token attends only "
                       "to earlier tokens of its own document, the documents of a sequence "
                       "being separated by data.tokenizer's end-of-text token, which belongs "
                       "to the document it ends. Positions stay those of the packed sequence. "
                       "Needs a tokenizer with an end-of-text token (not \"bytes\") and the "
                       "CPU backend.",
                       [](Config& c, bool v) { c.data.document_mask = v; }));
  k.push_back(int_key("data", "synthetic_bytes", 4000000, 4096, int64_t{1} << 34,
                      "Size of the generated training corpus (bytes = tokens); validation "
                      "gets a tenth, generated from another seed.",
                      [](Config& c) -> auto& { return c.data.synthetic_bytes; }));
}

}  // namespace meshtrain
