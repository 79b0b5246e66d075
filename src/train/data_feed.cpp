#include "meshtrain/train/data_feed.h"

#include <omp.h>

#include <algorithm>

#include "meshtrain/config/deck_error.h"
#include "meshtrain/io/byte_tokenizer.h"
#include "meshtrain/io/synthetic_corpus.h"
#include "meshtrain/io/tokenizer.h"
#include "meshtrain/train/document_starts.h"
#include "meshtrain/train/stop_request.h"

namespace meshtrain {

namespace {
// Null when a stop signal cut the generation of a synthetic corpus short.
std::unique_ptr<TokenDataset> open_dataset(const std::vector<std::string>& sources, uint64_t seed,
                                           int64_t bytes, int64_t seq_len, const char* name) {
  if (sources.size() == 1 && sources[0] == "synthetic") {
    const std::string text =
        synthetic_text(seed, static_cast<size_t>(bytes), [] { return stop_request() == 0; });
    if (text.size() < static_cast<size_t>(bytes)) return nullptr;
    return std::make_unique<TokenDataset>(TokenDataset::from_tokens(
        tokenize_bytes(text), 256, seq_len, std::string("synthetic ") + name + " corpus", name));
  }
  return std::make_unique<TokenDataset>(TokenDataset::from_shards(sources, seq_len, name));
}

void check_vocabulary(const Config& c, const TokenDataset& d, const char* key) {
  if (d.vocab_size() > static_cast<uint64_t>(c.model.vocab_size))
    throw DeckError(c.deck_path + ": model.vocab_size = " + std::to_string(c.model.vocab_size) +
                    " is smaller than the vocabulary of " + key + ": " +
                    d.largest_vocab_source() + " holds tokens of a vocabulary of " +
                    std::to_string(d.vocab_size()) + " (" + d.describe() +
                    "); set model.vocab_size >= " + std::to_string(d.vocab_size()));
}
}  // namespace

DataFeed::DataFeed(const Config& config, Backend& backend, int dp_rank, int dp_size, DataMode mode)
    : cfg_(&config), be_(&backend), dp_rank_(dp_rank), dp_size_(dp_size), mode_(mode) {
  set_shares(std::vector<int>(dp_size, config.total_microbatches() / dp_size));
  if (mode == DataMode::ShapesOnly) return;
  const DataOptions& d = config.data;
  // Every rank opens the same tokenizer and so refuses alike, before any data is read.
  if (d.document_mask) end_of_text_ = document_end_token(config.deck_path, d.tokenizer);
  train_ = open_dataset(d.train, kSyntheticTrainSeed, d.synthetic_bytes, config.model.seq_len, "training");
  if (!train_) return;  // interrupted()
  check_vocabulary(config, *train_, "data.train");
  // A tokenizer file that cannot be read must stop the run now, not at its first checkpoint
  // (which records it) or sample.
  if (d.tokenizer != "bytes") {
    const uint32_t v = open_tokenizer(d.tokenizer)->vocab_size();
    if (v > static_cast<uint64_t>(config.model.vocab_size))
      throw DeckError(config.deck_path + ": model.vocab_size = " +
                      std::to_string(config.model.vocab_size) + " is smaller than the vocabulary "
                      "of data.tokenizer = \"" + d.tokenizer + "\" (" + std::to_string(v) +
                      " tokens); set model.vocab_size >= " + std::to_string(v));
  }
  if (d.has_val()) {
    val_ = open_dataset({d.val}, kSyntheticValSeed, std::max<int64_t>(d.synthetic_bytes / 10, 65536),
                        config.model.seq_len, "validation");
    if (!val_) {
      train_.reset();
      return;
    }
    check_vocabulary(config, *val_, "data.val");
  }
  sampler_ = std::make_unique<Sampler>(train_->samples(), config.run.seed);
}

void DataFeed::set_shares(const std::vector<int>& shares) {
  first_ = 0;
  for (int r = 0; r < dp_rank_; ++r) first_ += static_cast<int64_t>(shares[r]) * cfg_->train.micro_batch;
  share_ = shares[dp_rank_];
}

void DataFeed::set_replica(int replica) {
  dp_rank_ = replica;
  first_ = static_cast<int64_t>(replica) * share_ * cfg_->train.micro_batch;
}

void DataFeed::verify(int worker, int workers) const {
  if (mode_ == DataMode::ShapesOnly || interrupted()) return;
  const int threads = std::max(1, omp_get_max_threads());
  const auto vocab = static_cast<uint32_t>(cfg_->model.vocab_size);
  train_->verify_shards(worker, workers, threads, vocab);
  if (val_) val_->verify_shards(worker, workers, threads, vocab);
}

// The tokens and targets of all micro-batches of a step travel together (and, with
// data.document_mask, the tokens' document starts): one host buffer (pinned on GPUs,
// Backend::empty_host) filled here, one asynchronous copy into one device buffer, and each
// micro-batch a view of it. A synchronous copy per micro-batch and tensor
// drained the device 2 M times per step; this one returns at once and the kernels that read the
// tokens are queued behind it.
std::vector<MicroBatchData> DataFeed::assemble(
    const TokenDataset* data, const std::function<int64_t(int64_t)>& index_at) const {
  const int cp = cfg_->parallel.cp;
  const int64_t b = cfg_->train.micro_batch, T = cfg_->model.seq_len / cp, N = b * T;
  const int64_t M = share_, per_rank = M * b;
  // (parts, M, N): tokens of micro-batch j at [0, j], its targets at [1, j], its document
  // starts (document masking) at [2, j].
  const bool masked = cfg_->data.document_mask;
  const int64_t parts = masked ? 3 : 2;
  Tensor device = be_->empty({parts, M, N}, DType::I32, MemoryCategory::Activations);
  if (data) {
    Tensor host = be_->empty_host({parts, M, N}, DType::I32, MemoryCategory::Activations);
    int32_t* tokens = host.data<int32_t>();
    int32_t* targets = tokens + M * N;
    int32_t* starts = masked ? targets + M * N : nullptr;
    if (cp == 1) {
      for (int64_t i = 0; i < per_rank; ++i) {
        data->sample(index_at(first_ + i), tokens + i * T, targets + i * T);
        if (masked) document_starts(tokens + i * T, T, end_of_text_, starts + i * T);
      }
    } else {
      // Each chunk's starts come from the whole sequence, at the chunk's true positions: a
      // document may begin in a chunk another rank holds.
      const int64_t L = T / 2;
      const int64_t chunks[2] = {cp_rank_ * L, (2 * cp - 1 - cp_rank_) * L};
      std::vector<int32_t> whole(static_cast<size_t>(2 * cp * L)), whole_targets(whole.size()),
          whole_starts(masked ? whole.size() : 0);
      for (int64_t i = 0; i < per_rank; ++i) {
        data->sample(index_at(first_ + i), whole.data(), whole_targets.data());
        if (masked)
          document_starts(whole.data(), 2 * cp * L, end_of_text_, whole_starts.data());
        for (int c = 0; c < 2; ++c) {
          std::copy_n(whole.data() + chunks[c], L, tokens + i * T + c * L);
          std::copy_n(whole_targets.data() + chunks[c], L, targets + i * T + c * L);
          if (masked) std::copy_n(whole_starts.data() + chunks[c], L, starts + i * T + c * L);
        }
      }
    }
    be_->copy_from_host_async(device, std::move(host));
  }
  std::vector<MicroBatchData> out;
  for (int64_t j = 0; j < M; ++j) {
    MicroBatchData mb;
    mb.shape = TokenShape{b, T, {}};
    mb.tokens = device.view(j * N, {N});
    mb.targets = device.view((M + j) * N, {N});
    if (masked) mb.shape.document_starts = device.view((2 * M + j) * N, {N});
    out.push_back(std::move(mb));
  }
  return out;
}

std::vector<MicroBatchData> DataFeed::train_batch(int step) const {
  const int64_t G = cfg_->train.global_batch;
  if (mode_ == DataMode::ShapesOnly) return assemble(nullptr, [](int64_t) { return int64_t{0}; });
  return assemble(train_.get(), [&](int64_t p) { return sampler_->index(step, G, p); });
}

std::vector<MicroBatchData> DataFeed::val_batch(int index) const {
  const int64_t G = cfg_->train.global_batch, n = val_->samples();
  return assemble(val_.get(), [&](int64_t p) { return (index * G + p) % n; });
}

}  // namespace meshtrain
