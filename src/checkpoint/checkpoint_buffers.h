#pragma once
// A model's state that training changes but does not train, beside the parameters in a
// checkpoint: the stage's buffers (model/pipeline_stage.h; the sigmoid router's expert bias,
// h.{i}.mlp.router.expert_bias, today), taken by name without knowing what they are.
// They have no moments and no shards: the same on every rank, so world rank 0 writes each tensor
// whole and every rank reads each whole, as /buffers/<name> (PyTorch's word for such state),
// stored in fp64 whatever the run's precision, with a checksum as every dataset has. A model
// without any (a dense one, a softmax mixture) writes none: its checkpoints stay as they were.
// Private to src/checkpoint.

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/io/checkpoint_file.h"
#include "meshtrain/model/pipeline_stage.h"

namespace meshtrain {

struct BufferTensor {
  std::string name;  // as the model names it: "h.1.mlp.router.expert_bias"
  Shape global;
  std::vector<double> values;
  std::string what;  // in messages: "the router's expert bias"
};

std::string buffer_dataset(const std::string& name);  // "/buffers/<name>"

// A copy of the stage's buffers, taken when a save is planned: an asynchronous save writes them
// while training moves them on.
std::vector<BufferTensor> buffers_of(PipelineStage& stage);

// Collective: creates the datasets (with the parameters', before any data is written).
void create_buffer_datasets(CheckpointFile& file, const std::vector<BufferTensor>& buffers);
// Collective (or world rank 0 alone when `how` is Independent): writes every tensor from world
// rank 0; returns this rank's parts of their checksums (world rank 0's are whole, the others'
// zero), to be summed over the world (sum_over) as the parameters' are.
std::vector<uint64_t> write_buffers(CheckpointFile& file, const std::vector<BufferTensor>& buffers,
                                    Communicator& world, CheckpointFile::Transfer how);
// Collective: sets the checksums write_buffers returned.
void set_buffer_checksums(CheckpointFile& file, const std::vector<BufferTensor>& buffers,
                          const std::vector<uint64_t>& sums);
// Verifying a save: this rank's parts of the checksums of the tensors as stored, into `out`
// (world rank 0 hashes them whole, the others give zeros; summed over the world they are the
// checksums); then check_buffer_sums throws CheckpointFileError unless those equal the file's
// attributes and what was `written`. Not collective.
void stored_buffer_parts(CheckpointFile& file, const std::vector<BufferTensor>& buffers, bool world_rank_0,
                         uint64_t* out);
void check_buffer_sums(const CheckpointFile& file, const std::vector<BufferTensor>& buffers,
                       const uint64_t* read, const uint64_t* written);
// Collective (or each rank alone when Independent): reads every tensor of `buffers` (their
// names and shapes given; the values filled) whole on every rank, then checks each against
// its checksum and refuses a value that is not finite (CheckpointFileError naming the dataset).
void read_buffers(CheckpointFile& file, std::vector<BufferTensor>& buffers, CheckpointFile::Transfer how);
// Copies the read tensors into the stage's buffers of the same names.
void apply_buffers(const std::vector<BufferTensor>& buffers, PipelineStage& stage);

}  // namespace meshtrain
