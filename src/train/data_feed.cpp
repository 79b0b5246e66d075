#include "meshtrain/train/data_feed.h"

#include <omp.h>

#include <algorithm>

#include "meshtrain/config/deck_error.h"
#include "meshtrain/io/byte_tokenizer.h"
#include "meshtrain/io/data_error.h"
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
  if (!d.train_blend.empty()) {
    train_blend_ = std::make_unique<BlendedDataset>(config, d.train_blend, "data.train", "training");
    cursor_ = std::make_unique<BlendCursor>(train_blend_->schedule(), config.train.global_batch);
  } else {
    train_ = open_dataset(d.train, kSyntheticTrainSeed, d.synthetic_bytes, config.model.seq_len, "training");
    if (!train_) return;  // interrupted()
    check_vocabulary(config, *train_, "data.train");
  }
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
  if (!d.val_blend.empty()) {
    val_blend_ = std::make_unique<BlendedDataset>(config, d.val_blend, "data.val", "validation");
  } else if (d.has_val()) {
    val_ = open_dataset({d.val}, kSyntheticValSeed, std::max<int64_t>(d.synthetic_bytes / 10, 65536),
                        config.model.seq_len, "validation");
    if (!val_) {
      train_.reset();
      train_blend_.reset();
      return;
    }
    check_vocabulary(config, *val_, "data.val");
  }
  if (train_) sampler_ = std::make_unique<Sampler>(train_->samples(), config.run.seed);
}

void DataFeed::start_at(int step, const std::string& recorded, const std::string& checkpoint) {
  if (mode_ == DataMode::ShapesOnly || interrupted()) return;
  if (train_blend_) {
    const int sources = train_blend_->sources();
    std::vector<int64_t> drawn(static_cast<size_t>(sources), 0);
    if (!recorded.empty()) {
      try {
        drawn = parse_blend_position(recorded, sources);
      } catch (const std::runtime_error& e) {
        throw DeckError(checkpoint + ": its data position (attribute data_blend) " + e.what() +
                        "; resume it with the blend it was written with (" + cfg_->deck_path +
                        " has data.train of " + std::to_string(sources) + " sources)");
      }
    } else if (step > 0 && sources == 1) {
      // A run on one source before blends: its position is the step's.
      drawn[0] = static_cast<int64_t>(step) * cfg_->train.global_batch;
    } else if (step > 0) {
      throw DeckError(checkpoint + ": records no blend position (written by a run on one "
                      "source, data.train as a path), but " + cfg_->deck_path + " has data.train "
                      "as a blend of " + std::to_string(sources) + " sources: resume it on its own "
                      "source, or as one weighted source ([{path = ...}])");
    }
    cursor_->start_at(step, std::move(drawn));
  } else if (!recorded.empty()) {
    throw DeckError(checkpoint + ": records a blend's data position (attribute data_blend), but " +
                    cfg_->deck_path + " has data.train as one source: resume it with its blend "
                    "(data.train as a list of {path, weight} tables)");
  }
  check_supply(step);
}

void DataFeed::check_supply(int step) const {
  if (cfg_->data.on_exhausted != OnExhausted::Stop) return;
  const int64_t G = cfg_->train.global_batch, steps = cfg_->train.steps;
  const std::string hint = "; add data, lower train.steps, or set data.on_exhausted = \"wrap\" "
                           "to start another epoch of it";
  if (train_) {
    if (steps * G > train_->samples())
      throw DeckError(cfg_->deck_path + ": data.on_exhausted = \"stop\": data.train has " +
                      std::to_string(train_->samples()) + " samples (" + train_->describe() +
                      "), but train.steps = " + std::to_string(steps) + " x train.global_batch = " +
                      std::to_string(G) + " draws " + std::to_string(steps * G) + hint);
    return;
  }
  // Step by step, so that the message says when the source runs out.
  std::vector<int64_t> drawn = cursor_->counts_at(step);
  for (int s = step; s < steps; ++s) {
    train_blend_->schedule().draw(drawn, G);
    for (int k = 0; k < train_blend_->sources(); ++k)
      if (drawn[k] > train_blend_->source(k).samples())
        throw DeckError(cfg_->deck_path + ": data.on_exhausted = \"stop\": " + train_blend_->label(k) +
                        " has " + std::to_string(train_blend_->source(k).samples()) + " samples (" +
                        train_blend_->source(k).describe() + "), but the blend draws more in step " +
                        std::to_string(s + 1) + " of train.steps = " + std::to_string(steps) + hint);
  }
}

std::string DataFeed::blend_position(int step) const {
  if (!train_blend_) return "";
  return blend_position_text(cursor_->counts_at(step));
}

std::string DataFeed::describe_train() const {
  return train_blend_ ? train_blend_->describe() : train_->describe();
}

std::string DataFeed::describe_val() const {
  if (val_blend_) return val_blend_->describe();
  return val_ ? val_->describe() : "none";
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
  if (train_) train_->verify_shards(worker, workers, threads, vocab);
  if (val_) val_->verify_shards(worker, workers, threads, vocab);
  for (const BlendedDataset* blend : {train_blend_.get(), val_blend_.get()}) {
    if (!blend) continue;
    for (int k = 0; k < blend->sources(); ++k) {
      try {
        blend->source(k).verify_shards(worker, workers, threads, vocab);
      } catch (const DataError& e) {
        throw DataError(blend->label(k), e.what());
      }
    }
  }
}

// The tokens and targets of all micro-batches of a step travel together (and, with
// data.document_mask, the tokens' document starts): one host buffer (pinned on GPUs,
// Backend::empty_host) filled here, one asynchronous copy into one device buffer, and each
// micro-batch a view of it. A synchronous copy per micro-batch and tensor
// drained the device 2 M times per step; this one returns at once and the kernels that read the
// tokens are queued behind it.
std::vector<MicroBatchData> DataFeed::assemble(const SampleReader& read) const {
  const int cp = cfg_->parallel.cp;
  const int64_t b = cfg_->train.micro_batch, T = cfg_->model.seq_len / cp, N = b * T;
  const int64_t M = share_, per_rank = M * b;
  // (parts, M, N): tokens of micro-batch j at [0, j], its targets at [1, j], its document
  // starts (document masking) at [2, j].
  const bool masked = cfg_->data.document_mask;
  const int64_t parts = masked ? 3 : 2;
  Tensor device = be_->empty({parts, M, N}, DType::I32, MemoryCategory::Activations);
  if (read) {
    Tensor host = be_->empty_host({parts, M, N}, DType::I32, MemoryCategory::Activations);
    int32_t* tokens = host.data<int32_t>();
    int32_t* targets = tokens + M * N;
    int32_t* starts = masked ? targets + M * N : nullptr;
    if (cp == 1) {
      for (int64_t i = 0; i < per_rank; ++i) {
        read(first_ + i, tokens + i * T, targets + i * T);
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
        read(first_ + i, whole.data(), whole_targets.data());
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
  if (mode_ == DataMode::ShapesOnly) return assemble(nullptr);
  if (train_blend_) {
    const std::vector<BlendDraw> draws = cursor_->draws_of(step);
    return assemble([&](int64_t p, int32_t* in, int32_t* tg) { train_blend_->train_sample(draws[p], in, tg); });
  }
  return assemble([&](int64_t p, int32_t* in, int32_t* tg) { train_->sample(sampler_->index(step, G, p), in, tg); });
}

std::vector<MicroBatchData> DataFeed::val_batch(int index) const {
  const int64_t G = cfg_->train.global_batch;
  if (val_blend_) {
    // Validation batches start from no draws at batch 0, so every evaluation reads the same.
    std::vector<int64_t> drawn(static_cast<size_t>(val_blend_->sources()), 0);
    std::vector<BlendDraw> draws;
    val_blend_->schedule().draw(drawn, static_cast<int64_t>(index) * G);
    val_blend_->schedule().draw(drawn, G, &draws);
    return assemble([&](int64_t p, int32_t* in, int32_t* tg) { val_blend_->val_sample(draws[p], in, tg); });
  }
  const int64_t n = val_->samples();
  return assemble([&](int64_t p, int32_t* in, int32_t* tg) { val_->sample((index * G + p) % n, in, tg); });
}

}  // namespace meshtrain
