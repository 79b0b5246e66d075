#pragma once
// Feeds a data-parallel rank its micro-batches. The global batch of step s is the sampler's
// positions [0, global_batch) of that step — a function of (seed, step) only — and replica r
// takes its share of micro-batches (even: G / (dp x micro_batch) each; by speed:
// train/work_balance.h) from the positions after replicas 0..r-1's, micro-batch j the next
// micro_batch of those. So any dp, any shares and any micro-batch count see exactly the same
// global batch. Validation batches are read in order and split the same way.
//
// A blend (data.train as weighted sources, train/blended_dataset.h) changes only which sample sits
// at each position: the step's draws follow from the sources' counts before it, which the feed
// keeps (from the run's first step, or from the counts a checkpoint recorded: start_at) and a
// checkpoint records (blend_position).

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/backend/backend.h"
#include "meshtrain/config/config.h"
#include "meshtrain/train/blended_dataset.h"
#include "meshtrain/io/sampler.h"
#include "meshtrain/io/token_dataset.h"
#include "meshtrain/model/micro_batch.h"

namespace meshtrain {

// Load reads the data; ShapesOnly (the planner's dry run) only makes tensors of the right shapes.
enum class DataMode { Load, ShapesOnly };

class DataFeed {
 public:
  // Opens (or generates) the training and validation data; throws DataError/DeckError naming
  // the files and keys on bad data. A stop signal (train/stop_request.h) during the generation
  // of a synthetic corpus leaves the feed interrupted(): the caller agrees on the stop with the
  // other ranks and ends the run, using nothing of the feed.
  DataFeed(const Config& config, Backend& backend, int dp_rank, int dp_size,
           DataMode mode = DataMode::Load);
  bool interrupted() const { return mode_ == DataMode::Load && !train_ && !train_blend_; }

  // Reads every token of the shards that fall to `worker` of `workers` (the world's ranks:
  // together they read each shard once) and throws the DataError of a corrupt one: a token
  // outside the shard's vocabulary, or a checksum mismatch (TokenShard::verify).
  void verify(int worker, int workers) const;

  // Micro-batches of each data-parallel replica (train/work_balance.h), summing to
  // global_batch / micro_batch; even shares until set.
  void set_shares(const std::vector<int>& shares);
  int microbatches() const { return share_; }
  // Context parallelism (parallel.cp > 1): this rank takes chunks r and 2 cp - 1 - r of every
  // sequence (model/ring_attention.h), micro-batches of seq_len / cp tokens per sequence.
  void set_context_rank(int rank) { cp_rank_ = rank; }
  // Asynchronous data parallelism (even shares): from now on this replica takes the samples of
  // replica `replica`, whichever share of a step the parameter servers handed it.
  void set_replica(int replica);

  // The run's first step is `step`, and `recorded` the blend position its checkpoint recorded
  // ("" for a fresh run, or a checkpoint of a run on one source). Throws DeckError, on every
  // rank alike, when data.on_exhausted = "stop" and train.steps would draw a sample twice, and
  // when a recorded position does not fit the deck's blend (`checkpoint` names the file).
  void start_at(int step, const std::string& recorded, const std::string& checkpoint);
  // The text a checkpoint at `step` records for the blend (io/blend_schedule.h); "" when
  // data.train is one source (whose position the step alone gives).
  std::string blend_position(int step) const;

  std::vector<MicroBatchData> train_batch(int step) const;
  std::vector<MicroBatchData> val_batch(int index) const;
  bool has_val() const { return val_ != nullptr || val_blend_ != nullptr; }
  // One line each for the log (Load mode only).
  std::string describe_train() const;
  std::string describe_val() const;

 private:
  // Writes the sample at position p of this step's global batch into inputs / targets.
  using SampleReader = std::function<void(int64_t p, int32_t* inputs, int32_t* targets)>;
  // read == null: shapes only.
  std::vector<MicroBatchData> assemble(const SampleReader& read) const;
  // data.on_exhausted = "stop": refuses a run from `step` to train.steps that draws a sample twice.
  void check_supply(int step) const;

  const Config* cfg_;
  Backend* be_;
  int dp_rank_, dp_size_;
  int64_t first_ = 0;  // this replica's first position in the global batch
  int share_ = 0;      // its micro-batches
  int cp_rank_ = 0;
  int32_t end_of_text_ = -1;  // data.document_mask: data.tokenizer's end-of-text token
  DataMode mode_;
  std::unique_ptr<TokenDataset> train_, val_;
  std::unique_ptr<Sampler> sampler_;
  std::unique_ptr<BlendedDataset> train_blend_, val_blend_;  // set instead of train_, val_
  std::unique_ptr<BlendCursor> cursor_;  // with train_blend_; moves as steps are asked for
};

// Seeds of the built-in corpus: fixed, so that every run (any run.seed) sees the same text.
inline constexpr uint64_t kSyntheticTrainSeed = 0x6d657368747261ull;
inline constexpr uint64_t kSyntheticValSeed = 0x76616c69646174ull;

}  // namespace meshtrain
