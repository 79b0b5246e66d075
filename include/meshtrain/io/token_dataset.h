#pragma once
// TokenDataset: a corpus of token sources (token shards read from their files, or one in-memory
// token list for generated corpora) seen as a numbered list of training samples. It is not the
// order in which samples are drawn (io/sampler.h) and knows nothing of ranks.
//
// A sample is a window of seq_len + 1 consecutive tokens: inputs are its first seq_len tokens,
// targets its last seq_len (the same tokens shifted by one). Windows are laid end to end,
// without overlap, inside each source, starting at the source's first token; a source of n
// tokens gives (n - 1) / seq_len windows, and its tail that does not fill a window is unused.
// Windows never cross from one source to the next (a shard boundary is usually a document
// boundary). Sources are numbered in the order given, so sample indices are stable for a
// fixed list of shards.
//
//   source of n = 10 tokens, seq_len = 3:  [t0 t1 t2 t3] t4 t5 t6 ... -> 3 samples
//   sample 0: inputs t0 t1 t2, targets t1 t2 t3
//   sample 1: inputs t3 t4 t5, targets t4 t5 t6
//   sample 2: inputs t6 t7 t8, targets t7 t8 t9

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/io/token_shard.h"

namespace meshtrain {

class TokenDataset {
 public:
  // Opens every shard in `paths`, in order. An entry containing *, ? or [ is a glob(3)
  // pattern, expanded in sorted order; a pattern matching nothing is a DataError naming it.
  // `role` ("training", "validation") names the samples in the error for too little data.
  static TokenDataset from_shards(const std::vector<std::string>& paths, int64_t seq_len,
                                  const std::string& role = "training");
  // One in-memory source (a synthetic corpus); `name` stands in for a path in messages.
  static TokenDataset from_tokens(std::vector<uint32_t> tokens, uint32_t vocab_size,
                                  int64_t seq_len, std::string name,
                                  const std::string& role = "training");

  // Verifies (TokenShard::verify) the shards that fall to `worker` of `workers`, with up to
  // `threads` threads; each distinct file once. Shards are dealt out largest first to the
  // least-loaded worker (by bytes, known from the headers, so every worker computes the same
  // deal): the ranks of a job together read every byte once, not once each. Throws the
  // DataError of the first bad shard, in list order. In-memory sources were checked when made.
  // `model_vocab` (the model's model.vocab_size) bounds the tokens of llm.c shards, which
  // record no vocabulary of their own.
  void verify_shards(int worker, int workers, int threads, uint32_t model_vocab = 0) const;

  int64_t samples() const { return samples_; }
  uint32_t vocab_size() const { return vocab_size_; }  // the largest over sources
  // The source whose header holds that largest vocabulary (for messages).
  const std::string& largest_vocab_source() const { return largest_vocab_source_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t tokens() const { return tokens_; }  // in all sources, used or not
  // One line for logs: "2 shards (data/a.bin, data/b.bin), 123456 tokens, vocab 50257,
  // 120 samples of 1024+1 tokens".
  const std::string& describe() const { return description_; }

  // Writes sample `index` (0 <= index < samples()): seq_len inputs and seq_len targets.
  void sample(int64_t index, int32_t* inputs, int32_t* targets) const;

 private:
  struct Source {
    std::string name;
    std::optional<TokenShard> shard;  // set for a file
    std::vector<uint32_t> memory;     // used when shard is empty
    int64_t tokens = 0;
    int64_t first_sample = 0;  // global index of this source's first window
    int64_t samples = 0;
  };

  TokenDataset() = default;
  // Numbers the windows, checks there is at least one (else a DataError about `role`
  // samples), builds the description.
  void finish(const std::string& kind, const std::string& role);

  std::vector<Source> sources_;
  int64_t seq_len_ = 0;
  int64_t samples_ = 0;
  int64_t tokens_ = 0;
  uint32_t vocab_size_ = 0;
  std::string largest_vocab_source_;
  std::string description_;
};

}  // namespace meshtrain
