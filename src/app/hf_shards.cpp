#include "meshtrain/app/hf_shards.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace meshtrain {

namespace fs = std::filesystem;

uint64_t parse_shard_size(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0 || digits > 18) return 0;
  const uint64_t n = std::stoull(text.substr(0, digits));
  const std::string unit = text.substr(digits);
  static const std::map<std::string, uint64_t> units = {
      {"", 1},         {"B", 1},           {"KB", 1000},         {"MB", 1000000},
      {"GB", 1000000000}, {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30}};
  const auto it = units.find(unit);
  if (it == units.end() || n == 0 || n > UINT64_MAX / it->second) return 0;
  return n * it->second;
}

uint64_t HfWeightSpec::bytes() const {
  uint64_t n = safetensors_dtype_size(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

std::vector<std::string> write_hf_weights(const std::string& dir, const std::vector<HfWeightSpec>& tensors,
                                          const std::function<std::vector<char>(size_t)>& bytes,
                                          const std::map<std::string, std::string>& metadata,
                                          uint64_t max_shard_bytes) {
  // Shards as transformers fills them: in order, a new one where the next tensor would pass
  // the limit.
  std::vector<std::vector<size_t>> shards;
  uint64_t size = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t b = tensors[i].bytes();
    if (shards.empty() || (size + b > max_shard_bytes && !shards.back().empty())) {
      shards.emplace_back();
      size = 0;
    }
    shards.back().push_back(i);
    size += b;
    total += b;
  }
  auto write_shard = [&](const std::vector<size_t>& members, const std::string& name) {
    SafetensorsWriter writer;
    for (size_t i : members) writer.add(tensors[i].name, tensors[i].dtype, tensors[i].shape, bytes(i));
    writer.set_metadata(metadata);
    writer.write((fs::path(dir) / name).string());
  };
  if (shards.size() <= 1) {
    write_shard(shards.empty() ? std::vector<size_t>{} : shards[0], "model.safetensors");
    return {"model.safetensors"};
  }
  std::vector<std::string> files;
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
    write_shard(shards[k], name);
    files.push_back(name);
    for (size_t i : shards[k]) weight_map[tensors[i].name] = name;
  }
  // As transformers writes it: sorted keys, two-space indent, a trailing newline.
  const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_text_file((fs::path(dir) / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  files.push_back("model.safetensors.index.json");
  return files;
}

void write_text_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw std::runtime_error(tmp + ": cannot write");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw std::runtime_error(path + ": cannot rename " + tmp + " over it: " + ec.message());
}

namespace {

constexpr const char* kStagingPrefix = ".meshtrain-export.";

std::string this_host() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "localhost";
  return host;
}

// The pid of `name` when it is this host's staging directory name, ".meshtrain-export.<host>.<pid>";
// -1 otherwise (another host's, an older meshtrain's ".meshtrain-export.<pid>", anything else).
long staging_pid(const std::string& name, const std::string& host) {
  const std::string mine = kStagingPrefix + host + ".";
  if (name.rfind(mine, 0) != 0 || name.size() == mine.size() || name.size() - mine.size() > 9) return -1;
  long pid = 0;
  for (size_t i = mine.size(); i < name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return -1;
    pid = pid * 10 + (name[i] - '0');
  }
  return pid;
}

// An interrupted export (SIGKILL, a lost node) leaves its staging directory behind; the next
// export into OUT removes it, but only where it can prove it is one: this host's name, a process
// that no longer exists (a live one, whatever it is, keeps its directory), a directory itself
// (not a link, which is never followed) owned by this user. remove_all removes the links inside,
// not what they name.
void remove_stale_staging(const fs::path& out, const std::string& host) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    const long pid = staging_pid(e.path().filename().string(), host);
    if (pid <= 0) continue;
    struct stat st {};
    if (::lstat(e.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    std::error_code removed;
    fs::remove_all(e.path(), removed);
  }
}

}  // namespace

std::string make_staging_directory(const std::string& out) {
  const std::string host = this_host();
  remove_stale_staging(out, host);
  const fs::path staging = fs::path(out) / (kStagingPrefix + host + "." + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(staging, ec);  // this pid's: a process before this one, gone (a link: the link)
  fs::create_directory(staging, ec);
  if (ec) throw std::runtime_error(staging.string() + ": cannot create the export's staging directory: " + ec.message());
  return staging.string();
}

namespace {

bool is_weight_file(const std::string& name) {
  static const std::regex shard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return name == "model.safetensors" || name == "model.safetensors.index.json" || std::regex_match(name, shard);
}

}  // namespace

void publish_staged(const std::string& staging, const std::string& out) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(staging)) names.push_back(e.path().filename().string());
  // What a reader opens first goes in last: until then it names the previous export's files.
  auto last = [](const std::string& n) { return n == "model.safetensors.index.json" || n == "model.safetensors"; };
  std::stable_partition(names.begin(), names.end(), [&](const std::string& n) { return !last(n); });
  std::error_code ec;
  for (const std::string& n : names) {
    fs::rename(fs::path(staging) / n, fs::path(out) / n, ec);
    if (ec)
      throw std::runtime_error((fs::path(out) / n).string() + ": cannot move the exported file in from " + staging +
                               ": " + ec.message());
  }
  const std::set<std::string> mine(names.begin(), names.end());
  for (const auto& e : fs::directory_iterator(out, ec)) {
    const std::string n = e.path().filename().string();
    if (is_weight_file(n) && !mine.count(n)) fs::remove(e.path(), ec);
  }
  fs::remove_all(staging, ec);
}

}  // namespace meshtrain
