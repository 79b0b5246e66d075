#pragma once
// Sampler: which dataset sample sits at each position of each global batch. The order is a
// pure function of (seed, samples, step, position): it never depends on the number of ranks,
// micro-batches or the parallel layout, which is what lets a run on any layout follow the
// loss curve of a run on one rank (DESIGN.md, layout invariance). It is not a data loader:
// reading the samples is io/token_dataset.h, and splitting a batch over data-parallel ranks is
// the trainer's (rank r of dp with micro-batch b reads positions r*G/dp + j*b + [0, b)).
//
// Positions form one infinite stream: position g = step * global_batch + i lies in epoch
// e = g / samples at offset g % samples, and each epoch visits every sample exactly once in
// its own pseudo-random order. A batch may straddle two epochs.
//
// The per-epoch order is a keyed pseudo-random permutation computed on the fly, with no
// O(samples) table: a Feistel network (Luby-Rackoff) over k = ceil(log2(samples)) bits, its
// round keys drawn from Philox keyed by (seed, epoch), and cycle walking (apply the network
// again until the value falls below `samples`; Black & Rogaway, "Ciphers with arbitrary
// finite domains", CT-RSA 2002). Since 2^k < 2 * samples, a lookup takes fewer than two
// passes on average.

#include <array>
#include <cstdint>

namespace meshtrain {

class Sampler {
 public:
  // samples >= 1 (the dataset refuses to exist otherwise).
  Sampler(int64_t samples, uint64_t seed);

  // The sample index at position i (0 <= i < global_batch) of the global batch of optimizer
  // step `step` (0-based).
  int64_t index(int64_t step, int64_t global_batch, int64_t i) const;
  // The epoch of the batch's first sample.
  int64_t epoch(int64_t step, int64_t global_batch) const;

  // The permutation itself: the sample at offset `position` (0 <= position < samples) of
  // epoch `epoch`.
  int64_t permute(int64_t position, int64_t epoch) const;

  int64_t samples() const { return samples_; }
  uint64_t seed() const { return seed_; }

 private:
  static constexpr int kRounds = 8;
  using RoundKeys = std::array<uint64_t, kRounds>;
  RoundKeys round_keys(int64_t epoch) const;
  uint64_t feistel(uint64_t x, const RoundKeys& keys) const;  // a bijection of [0, 2^bits_)

  int64_t samples_;
  uint64_t seed_;
  int bits_;  // ceil(log2(samples_)); 0 when samples_ == 1
};

}  // namespace meshtrain
