#pragma once
// BlendedDataset: the sources of a weighted blend (data.train or data.val as a list of
// {path, weight, name} tables), each a TokenDataset, and where each sample of the blended
// stream comes from. Which source a stream position draws is io/blend_schedule.h (a function of
// the sources' counts alone); which of its samples is that source's own affair: for training,
// each source shuffles its own stream exactly as a one-source run would (io/sampler.h, keyed by
// run.seed), epoch after epoch; for validation, each source is read in order. It knows nothing
// of ranks: every rank computes the same draws. (Here, not in io/, because it reads the deck's
// Config: the sources, the model's vocabulary and seq_len, the seed.)

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/io/blend_schedule.h"
#include "meshtrain/io/sampler.h"
#include "meshtrain/io/token_dataset.h"

namespace meshtrain {

class BlendedDataset {
 public:
  // Opens every source's shards. `key` ("data.train") and `role` ("training") name the data in
  // errors: a DataError names the source by index and name (a missing file, an empty glob, too
  // few tokens), and a DeckError the deck's key for a source whose vocabulary (shard header)
  // exceeds model.vocab_size or differs from another source's.
  BlendedDataset(const Config& config, const std::vector<DataSource>& sources, const std::string& key,
                 const std::string& role);

  int sources() const { return static_cast<int>(data_.size()); }
  const TokenDataset& source(int k) const { return *data_[k]; }
  const std::string& name(int k) const { return names_[k]; }
  const BlendSchedule& schedule() const { return schedule_; }
  // "2 sources: web 0.7 (3 shards, ...), code 0.3 (...)": one line for logs.
  std::string describe() const;

  // Writes the sample of a draw: training order (shuffled per source, per epoch) or validation
  // order (in order, wrapping).
  void train_sample(const BlendDraw& d, int32_t* inputs, int32_t* targets) const;
  void val_sample(const BlendDraw& d, int32_t* inputs, int32_t* targets) const;

  // "data.train source 1 (name \"code\")": how messages name source k.
  std::string label(int k) const;

 private:
  void check_vocabularies(const Config& config) const;

  std::string key_;
  std::vector<std::unique_ptr<TokenDataset>> data_;
  std::vector<std::string> names_;
  std::vector<double> weights_;
  std::vector<Sampler> samplers_;
  BlendSchedule schedule_;
};

// Where a training run's blend stands: the sources' counts at a step, recomputed forward from
// the run's origin (step 0 with no draws, or the step and counts a checkpoint recorded) and
// remembered for the next step.
class BlendCursor {
 public:
  BlendCursor(const BlendSchedule& schedule, int64_t global_batch);
  // The run starts at `step` with these counts (one per source).
  void start_at(int step, std::vector<int64_t> drawn);
  // The counts before step `step` (>= the origin's step).
  std::vector<int64_t> counts_at(int step);
  // The global_batch draws of step `step`, in batch order.
  std::vector<BlendDraw> draws_of(int step);

 private:
  const BlendSchedule* schedule_;
  int64_t global_batch_;
  int origin_step_ = 0;
  std::vector<int64_t> origin_;
  int memo_step_ = 0;  // the counts before memo_step_ are memo_
  std::vector<int64_t> memo_;
};

}  // namespace meshtrain
