#pragma once
// Writing a Hugging Face model directory's weights as save_pretrained does, whatever the model:
// one `model.safetensors` when every tensor fits in one shard, else
// `model-0000k-of-0000n.safetensors` and `model.safetensors.index.json` ({"metadata":
// {"total_size": bytes}, "weight_map": {tensor: file}}), filled in order, a new shard begun
// where the next tensor would pass the limit (a tensor above it alone in a shard of its own).
// And publishing the directory: written beside it first, then moved in, so an interrupted
// export never leaves a mix of two exports' weights under one index.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "meshtrain/io/safetensors.h"

namespace meshtrain {

// "5GB", "500MB", "10KB" (powers of 10, as transformers reads them), "2GiB", "512MiB" (powers
// of 2) or a number of bytes; 0 for anything else, or below 1.
uint64_t parse_shard_size(const std::string& text);

struct HfWeightSpec {
  std::string name;
  SafeDType dtype = SafeDType::F32;
  std::vector<int64_t> shape;
  uint64_t bytes() const;
};

// Writes `tensors` into `dir` (which exists), shard by shard: `bytes(i)` gives tensor i's
// elements when its shard is written, so one shard at a time is in memory. Every shard carries
// `metadata`. Returns the names of the files written (the index last).
std::vector<std::string> write_hf_weights(const std::string& dir, const std::vector<HfWeightSpec>& tensors,
                                          const std::function<std::vector<char>(size_t)>& bytes,
                                          const std::map<std::string, std::string>& metadata,
                                          uint64_t max_shard_bytes);

// Writes `text` to `path` under <path>.tmp first, then renamed over it: a failure leaves `path`
// as it was. Throws naming the file. (config.json, the index, a deck --deck-out writes.)
void write_text_file(const std::string& path, const std::string& text);

// A directory beside which an export is staged: <out>/.meshtrain-export.<host>.<pid>, created
// empty. First removes the staging directories of earlier exports into `out` that were
// interrupted (killed): only this host's, of processes that no longer exist, real directories
// (never a link) owned by this user.
std::string make_staging_directory(const std::string& out);

// Moves every file of `staging` into `out` (renames: the same file system), the weights' index
// or model.safetensors last, then removes the weight files of an earlier export that the new
// one does not have (model.safetensors beside a new index, another count of shards) and the
// staging directory. Throws naming the file that could not be moved.
void publish_staged(const std::string& staging, const std::string& out);

}  // namespace meshtrain
