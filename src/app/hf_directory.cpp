#include "meshtrain/app/hf_directory.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>
#include <stdexcept>

#include "meshtrain/config/deck.h"
#include "meshtrain/io/regular_file.h"
#include "meshtrain/io/terminal_text.h"

namespace meshtrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Names and values from config.json, the index and the shards come from whoever published the
// model: each message is escaped whole (io/terminal_text.h), so that a NUL does not cut it short
// and an escape sequence or a bidirectional control is shown, not obeyed.
[[noreturn]] void fail(const std::string& message) { throw std::runtime_error(terminal_safe(message)); }

}  // namespace

json read_json_object(const std::string& path, const std::string& what) {
  std::string text;
  if (const std::string problem = read_regular_file(path, text); !problem.empty())
    fail(path + ": " + (problem.rfind("cannot open", 0) == 0 ? "cannot read" : problem +
         "; expected a JSON file") + " (" + what + ")");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(path + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) fail(path + ": not a JSON object (" + what + ")");
  return j;
}

DeckKeyRange deck_key_range(const std::string& deck_key) {
  const size_t dot = deck_key.find('.');
  const IntegerRange range = deck_integer_range(deck_key.substr(0, dot), deck_key.substr(dot + 1));
  return {range.min, range.max};
}

namespace {

// The shard `name` of `index` (in `dir`) as a path, refusing one that leads out of `dir`.
std::string shard_path(const std::string& dir, const std::string& index, const std::string& tensor,
                       const std::string& name) {
  const fs::path rel(name);
  const std::string refused = index + ": weight_map places " + tensor + " in \"" + name + "\", ";
  const std::string rule =
      " (a shard must be a file inside " + dir + ", named relative to it, as save_pretrained writes "
      "model-00001-of-00002.safetensors; meshtrain reads no file elsewhere)";
  if (name.empty() || rel.is_absolute() || rel.has_root_name())
    fail(refused + "which is not a relative path" + rule);
  // A NUL would end the name where open(2) reads it, and a control character is no file name
  // save_pretrained writes.
  if (std::any_of(name.begin(), name.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
    fail(refused + "which holds a control character" + rule);
  for (const fs::path& part : rel)
    if (part == "..") fail(refused + "which climbs out with \"..\"" + rule);
  const fs::path full = fs::path(dir) / rel;
  if (const std::string target = hf_link_outside(dir, full.string()); !target.empty())
    fail(refused + "which is a symbolic link leading to " + target + ", outside " + dir + rule +
         "; copy the file into the directory, e.g. download with --local-dir");
  return full.string();
}

}  // namespace

std::string hf_link_outside(const std::string& dir, const std::string& path) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return "";
  // A link may lead anywhere (each part of the path may be one): where it ends must still be
  // inside the directory.
  const fs::path root = fs::canonical(dir, ec);
  const fs::path target = fs::canonical(path, ec);
  if (ec) return "nowhere";
  return target.string().rfind(root.string() + "/", 0) == 0 ? "" : target.string();
}

HfWeights HfWeights::open(const std::string& dir) {
  HfWeights w;
  const std::string single = (fs::path(dir) / "model.safetensors").string();
  const std::string index = (fs::path(dir) / "model.safetensors.index.json").string();
  std::error_code ec;
  const bool has_single = fs::exists(single, ec), has_index = fs::exists(index, ec);
  if (has_single || !has_index) {
    w.source_ = single;
    w.files_.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(single)));
    for (const SafetensorsEntry& e : w.files_[0]->tensors()) w.tensors_[e.name] = {w.files_[0].get(), &e};
    return w;
  }
  w.source_ = index;
  const json j = read_json_object(index, "the index of a sharded model: {\"weight_map\": {tensor: shard file}}");
  if (!j.contains("weight_map") || !j["weight_map"].is_object() || j["weight_map"].empty())
    fail(index + ": weight_map is " +
         (j.contains("weight_map") ? j["weight_map"].dump().substr(0, 80) : "absent") +
         " (expected an object {tensor name: shard file}, as save_pretrained writes)");
  std::map<std::string, SafetensorsFile*> shards;  // by the name the index gives
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    if (!file.is_string())
      fail(index + ": weight_map gives " + tensor + " the shard " + file.dump() +
           " (expected a file name)");
    const std::string name = file.get<std::string>();
    auto it = shards.find(name);
    if (it == shards.end()) {
      const std::string path = shard_path(dir, index, tensor, name);
      w.files_.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(path)));
      it = shards.emplace(name, w.files_.back().get()).first;
    }
    const SafetensorsEntry* e = it->second->find(tensor);
    if (!e)
      fail(index + ": weight_map places " + tensor + " in " + it->second->path() +
           ", which has no such tensor (an index of another download?)");
    w.tensors_[tensor] = {it->second, e};
  }
  for (const auto& f : w.files_)
    for (const SafetensorsEntry& e : f->tensors())
      if (!w.tensors_.count(e.name) || w.tensors_[e.name].file != f.get())
        fail(f->path() + ": tensor " + e.name + " is not where " + index +
             "'s weight_map places it (the index and its shards disagree)");
  return w;
}

}  // namespace meshtrain
