#pragma once
// Feeds a data-parallel rank its micro-batches. The global batch of step s is the sampler's
// positions [0, global_batch) of that step — a function of (seed, step) only — and replica r
// takes its share of micro-batches (even: G / (dp x micro_batch) each; by speed:
// train/work_balance.h) from the positions after replicas 0..r-1's, micro-batch j the next
// micro_batch of those. So any dp, any shares and any micro-batch count see exactly the same
// global batch. Validation batches are read in order and split the same way.

#include <memory>
#include <vector>

#include "meshtrain/backend/backend.h"
#include "meshtrain/config/config.h"
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
  bool interrupted() const { return mode_ == DataMode::Load && !train_; }

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

  std::vector<MicroBatchData> train_batch(int step) const;
  std::vector<MicroBatchData> val_batch(int index) const;
  bool has_val() const { return val_ != nullptr; }
  const TokenDataset& train() const { return *train_; }  // Load mode only
  const TokenDataset* val() const { return val_.get(); }

 private:
  // data == null: shapes only.
  std::vector<MicroBatchData> assemble(const TokenDataset* data,
                                       const std::function<int64_t(int64_t)>& index_at) const;

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
};

// Seeds of the built-in corpus: fixed, so that every run (any run.seed) sees the same text.
inline constexpr uint64_t kSyntheticTrainSeed = 0x6d657368747261ull;
inline constexpr uint64_t kSyntheticValSeed = 0x76616c69646174ull;

}  // namespace meshtrain
