// Checkpoint policy: what checkpoints are called, which one a run resumes from, and which ones
// checkpoint.keep drops (checkpoint/checkpointer.h).

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <stdexcept>

#include "meshtrain/checkpoint/checkpointer.h"
#include "meshtrain/config/deck_error.h"
#include "meshtrain/io/regular_file.h"
#include "meshtrain/parallel/schedule.h"
#include "save_protocol.h"

namespace meshtrain {

namespace fs = std::filesystem;

std::string describe_layout(const Config& c) {
  const ParallelOptions& p = c.parallel;
  return "dp=" + std::to_string(p.dp) + " tp=" + std::to_string(p.tp) + " pp=" + std::to_string(p.pp) +
         (p.cp > 1 ? " cp=" + std::to_string(p.cp) : std::string()) +
         (p.ep > 1 ? " ep=" + std::to_string(p.ep) : std::string()) + " zero=" + std::to_string(p.zero) + " schedule=" + std::string(schedule_name(p.schedule)) +
         " virtual_stages=" + std::to_string(p.virtual_stages) +
         " micro_batch=" + std::to_string(c.train.micro_batch);
}

std::string Checkpointer::file_name(int64_t step) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "step_%08lld.h5", static_cast<long long>(step));
  return buf;
}

std::vector<std::pair<int64_t, std::string>> Checkpointer::complete_checkpoints(const std::string& dir) {
  static const std::regex pattern("step_([0-9]+)\\.h5");
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::smatch m;
    const std::string name = it->path().filename().string();
    if (std::regex_match(name, m, pattern) && it->is_regular_file())
      out.emplace_back(std::stoll(m[1].str()), dir + "/" + name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string Checkpointer::choose_resume() const {
  const std::string& r = cfg_.checkpoint.resume;
  if (r == "none") return "";
  if (r == "auto") {
    const auto all = complete_checkpoints(cfg_.checkpoint.dir);
    return all.empty() ? "" : all.back().second;
  }
  // A FIFO or a directory is there, but is no checkpoint: say what it is.
  const std::string not_regular = non_regular_file_problem(
      r, "a checkpoint file", "the path of a step_*.h5, \"auto\" or \"none\"");
  if (!not_regular.empty())
    throw DeckError(cfg_.deck_path + ": checkpoint.resume = \"" + r + "\": " + not_regular);
  std::error_code ec;
  if (!fs::is_regular_file(r, ec))
    throw DeckError(cfg_.deck_path + ": checkpoint.resume = \"" + r + "\": no such checkpoint "
                    "file (give the path of a step_*.h5, \"auto\" or \"none\")");
  return r;
}

void prune_checkpoints(const Config& cfg, int64_t step, const std::vector<std::pair<int64_t, std::string>>& all,
                       const KillHook& kill) {
  const size_t keep = static_cast<size_t>(std::max(1, cfg.checkpoint.keep));
  bool deleted = false;
  for (size_t i = 0; i + keep < all.size(); ++i) {
    if (all[i].first == step) continue;  // never the one just written
    std::error_code ec;
    fs::remove(all[i].second, ec);
    if (ec)
      throw std::runtime_error(all[i].second + ": cannot delete an old checkpoint (checkpoint.keep = " +
                               std::to_string(cfg.checkpoint.keep) + "): " + ec.message());
    if (!deleted) kill.at(CheckpointPhase::Prune, step);
    deleted = true;
  }
  // .tmp files of other steps are left by a job that died while writing; nothing reads them.
  static const std::regex stale("step_([0-9]+)\\.h5\\.tmp");
  std::error_code ec;
  for (fs::directory_iterator it(cfg.checkpoint.dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::smatch m;
    const std::string name = it->path().filename().string();
    if (std::regex_match(name, m, stale) && std::stoll(m[1].str()) != step) {
      std::error_code rm;
      fs::remove(it->path(), rm);
    }
  }
  if (!deleted) kill.at(CheckpointPhase::Prune, step);
}

}  // namespace meshtrain
