#pragma once
// A checkpoint made from weights trained elsewhere (meshtrain import): the same format as the
// Checkpointer writes (io/checkpoint_file.h), at step 0 with zero AdamW moments, the deck's
// @config, @deck and @model, and a lineage of its own, so that `train` with
// checkpoint.resume = "<path>" continues from it on any layout as from any checkpoint — a
// fine-tune is then an ordinary run that starts at step 0 from these weights.

#include <map>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"

namespace meshtrain {

// The parameter tensors of `config`'s model as a checkpoint stores them: name ("wte",
// "h.0.attn.qkv.weight") -> global shape, sorted by name. The same list the trainer's model
// holds (checked when a checkpoint is loaded).
std::map<std::string, std::vector<int64_t>> checkpoint_parameters(const GptConfig& m);

// Writes `path` from `values` (every parameter of checkpoint_parameters(config.model), each its
// elements row-major, fp32; stored in the run's precision: float64 for fp64 runs, else float32)
// on this rank alone (MPI_COMM_SELF): under <path>.tmp, then renamed, so a failure leaves no
// file at `path`. Throws std::runtime_error naming the file.
void write_imported_checkpoint(const std::string& path, const Config& config,
                               const std::map<std::string, std::vector<float>>& values);

}  // namespace meshtrain
