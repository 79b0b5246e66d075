#include "meshtrain/app/docs_page.h"

#include <cstdio>
#include <utility>
#include <vector>

namespace meshtrain {

namespace {

struct Topic {
  std::vector<const char*> words;  // any one of them in a message selects the page
  const char* page;
};

// Most specific first: a message about an expert-parallel checkpoint is a checkpoint's problem
// (the checkpoint page says how layouts resume), a message naming parallel.ep a mixture's.
const std::vector<Topic>& topics() {
  static const std::vector<Topic> table = {
      // An unknown key's message lists every key of its section, moe_* ones included.
      {{"unknown key", "unknown section"}, "docs/deck-reference.md"},
      {{"checkpoint", ".h5", "lineage", "resume"}, "docs/checkpoints.md"},
      {{"parallel.ep", "moe_", "feed_forward", "expert"}, "docs/mixtures-of-experts.md"},
      {{"parallel.balance", "parallel.speeds", "rebalance", "data_sync", "parallel.servers",
        "staleness", "train.precision", "run.device", "run.attention", "run.epilogues",
        "parallel.offload", "parallel.communicator", "CUDA", "GPU", "bf16", "binding",
        "threads"},
       "docs/hardware.md"},
      {{"config.json", "safetensors", "Hugging Face", "tokenizer", "token shard", "shard", "data.",
        "JSON Lines", ".jsonl", "--text-field", "--max-bad-lines", "--max-line-bytes",
        "--val-fraction", "prepare", "vocab", "UTF-8"},
       "docs/data-and-interop.md"},
      {{"machine profile", "profile", "--memory", "memory per rank", "out of memory", "plan"},
       "docs/memory-and-planning.md"},
      {{"parallel.", "schedule", "layout", "micro_batch", "global_batch", "divide"},
       "docs/parallelism-and-schedules.md"},
      {{"mpiexec", "mpirun", "srun", "launcher", "MPICH", "Slurm", "SLURM", "stop file",
        "MESHTRAIN_STOP_FILE"},
       "docs/clusters.md"},
      {{"run.", "model.", "train.", "[run]", "[model]", "[train]", "[data]", "[parallel]",
        "[checkpoint]", "deck"},
       "docs/deck-reference.md"},
  };
  return table;
}

}  // namespace

std::string docs_page_for(const std::string& message, const std::string& fallback) {
  for (const Topic& topic : topics())
    for (const char* word : topic.words)
      if (message.find(word) != std::string::npos) return topic.page;
  return fallback;
}

std::string docs_pointer_line(const std::string& page) {
  return "meshtrain: more in " + page + "\n";
}

void print_docs_pointer(const std::string& message, const std::string& fallback) {
  const std::string line = docs_pointer_line(docs_page_for(message, fallback));
  std::fputs(line.c_str(), stderr);
}

const std::vector<std::pair<const char*, const char*>>& footer_pages() {
  static const std::vector<std::pair<const char*, const char*>> pages = {
      {"train", "docs/running.md, docs/parallelism-and-schedules.md, docs/deck-reference.md"},
      {"prepare", "docs/data-and-interop.md"},
      {"bench", "docs/benchmarks.md"},
      {"inspect", "docs/checkpoints.md"},
      {"eval", "docs/checkpoints.md"},
      {"sample", "docs/running.md (Text generation)"},
      {"plan", "docs/memory-and-planning.md"},
      {"diagnose", "docs/troubleshooting.md"},
      {"export", "docs/data-and-interop.md (Hugging Face export and import)"},
      {"import", "docs/data-and-interop.md (Hugging Face export and import)"},
      {"keys", "docs/deck-reference.md"},
  };
  return pages;
}

std::string docs_footer(const std::string& subcommand) {
  for (const auto& [name, where] : footer_pages())
    if (subcommand == name) return std::string("Explained in ") + where + ".";
  return "Documentation: README.md, and docs/ by topic (docs/troubleshooting.md for messages "
         "and exit statuses).";
}

std::vector<std::string> docs_pages_named() {
  std::vector<std::string> out = {"docs/troubleshooting.md"};
  for (const Topic& topic : topics()) out.push_back(topic.page);
  for (const auto& [name, where] : footer_pages()) {
    // A footer may name several pages, each followed by a comma, a space or its end.
    const std::string text = where;
    for (size_t at = text.find("docs/"); at != std::string::npos; at = text.find("docs/", at + 1))
      out.push_back(text.substr(at, text.find(".md", at) + 3 - at));
  }
  return out;
}

}  // namespace meshtrain
