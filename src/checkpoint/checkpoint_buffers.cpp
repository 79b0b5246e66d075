#include "checkpoint_buffers.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "checkpoint_entries.h"
#include "checkpoint_transfer.h"

namespace meshtrain {

namespace {

std::vector<Box> whole(const Shape& s) {
  Box b;
  for (int k = 0; k < s.rank(); ++k) b.count[static_cast<size_t>(k)] = s[k];
  return {b};
}

}  // namespace

std::string buffer_dataset(const std::string& name) { return "/buffers/" + name; }

std::vector<BufferTensor> buffers_of(PipelineStage& stage) {
  std::vector<BufferTensor> out;
  for (const StageBuffer& b : stage.buffers()) out.push_back({b.name, b.shape, *b.values, b.what});
  return out;
}

void create_buffer_datasets(CheckpointFile& file, const std::vector<BufferTensor>& buffers) {
  for (const BufferTensor& b : buffers) file.create_dataset(buffer_dataset(b.name), b.global, DType::F64);
}

std::vector<uint64_t> write_buffers(CheckpointFile& file, const std::vector<BufferTensor>& buffers,
                                    Communicator& world, CheckpointFile::Transfer how) {
  const bool writer = world.rank() == 0;
  std::vector<uint64_t> sums(buffers.size(), 0);
  for (size_t i = 0; i < buffers.size(); ++i) {
    const BufferTensor& b = buffers[i];
    const std::vector<Box> boxes = writer ? whole(b.global) : std::vector<Box>{};
    if (writer) sums[i] = checksum_part(b.values.data(), DType::F64, b.global, boxes);
    if (how == CheckpointFile::Transfer::Collective || writer)
      file.write(buffer_dataset(b.name), boxes, b.values.data(), DType::F64, how);
  }
  return sums;
}

void set_buffer_checksums(CheckpointFile& file, const std::vector<BufferTensor>& buffers,
                          const std::vector<uint64_t>& sums) {
  for (size_t i = 0; i < buffers.size(); ++i) file.set_checksum(buffer_dataset(buffers[i].name), sums[i]);
}

void stored_buffer_parts(CheckpointFile& file, const std::vector<BufferTensor>& buffers, bool world_rank_0,
                         uint64_t* out) {
  for (size_t i = 0; i < buffers.size(); ++i)
    out[i] = world_rank_0 ? file.stored_checksum(buffer_dataset(buffers[i].name), whole(buffers[i].global)) : 0;
}

void check_buffer_sums(const CheckpointFile& file, const std::vector<BufferTensor>& buffers,
                       const uint64_t* read, const uint64_t* written) {
  for (size_t i = 0; i < buffers.size(); ++i) check_sum(file, buffer_dataset(buffers[i].name), read[i], &written[i]);
}

void read_buffers(CheckpointFile& file, std::vector<BufferTensor>& buffers, CheckpointFile::Transfer how) {
  for (BufferTensor& b : buffers) {
    const std::string name = buffer_dataset(b.name);
    b.values.assign(static_cast<size_t>(b.global.numel()), 0.0);
    file.read(name, whole(b.global), b.values.data(), DType::F64, how);
    check_sum(file, name, checksum_part(b.values.data(), DType::F64, b.global, whole(b.global)), nullptr);
    for (size_t j = 0; j < b.values.size(); ++j)
      if (!std::isfinite(b.values[j]))
        throw CheckpointFileError(file.path() + ": dataset " + name + " holds " + std::to_string(b.values[j]) +
                                  " at element " + std::to_string(j) + ", but " + b.what +
                                  " is finite: the file was not written by a healthy run (its checksums "
                                  "match what was stored); resume from another checkpoint");
  }
}

void apply_buffers(const std::vector<BufferTensor>& buffers, PipelineStage& stage) {
  std::vector<StageBuffer> own = stage.buffers();
  for (const BufferTensor& b : buffers) {
    const auto it = std::find_if(own.begin(), own.end(), [&](const StageBuffer& s) { return s.name == b.name; });
    if (it == own.end()) throw std::logic_error("checkpoint: the stage has no buffer " + b.name);
    *it->values = b.values;
  }
}

}  // namespace meshtrain
