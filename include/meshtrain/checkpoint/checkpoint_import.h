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
#include "meshtrain/model/pipeline_stage.h"

namespace meshtrain {

// The parameter tensors of `config`'s model as a checkpoint stores them: name ("wte",
// "h.0.attn.qkv.weight") -> global shape, sorted by name: the model's parameter table
// (model/parameter_table.h), read off the same layers the trainer builds.
std::map<std::string, std::vector<int64_t>> checkpoint_parameters(const ModelSpec& m);

// Throws unless an import may write `path`, naming it and what to do instead: it must not exist
// (unless `replace`: then it may be a file, which is replaced), nor may <path>.tmp (the name it is
// written under first), and its directory must hold no
// complete checkpoint (step_<digits>.h5), `path` included. An import starts a lineage of
// its own, and a run refuses to resume in a directory holding another lineage's checkpoints (it
// would overwrite or prune them): an import written beside a run's checkpoints would stop that
// run from resuming.
void check_import_destination(const std::string& path, bool replace);

// Writes `path` from `values` (every parameter of checkpoint_parameters(config.model), each its
// elements row-major, fp32; stored in the run's precision: float64 for fp64 runs, else float32)
// and `buffers` (the model's state beside them, as its stage's buffers: every one the model
// has, model/pipeline_stage.h; stored float64 as /buffers/<name>, as a run stores them)
// on this rank alone (MPI_COMM_SELF): under <path>.tmp, then renamed, so a failure leaves no
// file at `path`; checks the destination first (check_import_destination), and without `replace`
// the rename refuses a file that appeared at `path` meanwhile. Throws std::runtime_error naming
// the file.
void write_imported_checkpoint(const std::string& path, const Config& config,
                               const std::map<std::string, std::vector<float>>& values,
                               const std::vector<StageBuffer>& buffers, bool replace = false);

}  // namespace meshtrain
