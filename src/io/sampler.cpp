#include "meshtrain/io/sampler.h"

#include <bit>
#include <stdexcept>
#include <string>

#include "meshtrain/tensor/philox.h"

namespace meshtrain {

namespace {
uint64_t low_mask(int bits) { return bits >= 64 ? ~0ull : (1ull << bits) - 1; }
}  // namespace

Sampler::Sampler(int64_t samples, uint64_t seed) : samples_(samples), seed_(seed) {
  if (samples < 1) {
    throw std::invalid_argument("Sampler: samples = " + std::to_string(samples) +
                                " must be at least 1");
  }
  bits_ = static_cast<int>(std::bit_width(static_cast<uint64_t>(samples - 1)));
}

Sampler::RoundKeys Sampler::round_keys(int64_t epoch) const {
  // Philox keyed by the seed and a name of its own, counted by epoch: the data order shares
  // nothing with parameter initialisation or dropout drawn from the same seed.
  const Philox rng(seed_, "sampler");
  RoundKeys keys{};
  for (int r = 0; r < kRounds; r += 2) {
    const uint64_t counter = static_cast<uint64_t>(epoch) * (kRounds / 2) + r / 2;
    const Philox::Block b = rng(counter, Philox::Stream::Data);
    keys[r] = (static_cast<uint64_t>(b[1]) << 32) | b[0];
    keys[r + 1] = (static_cast<uint64_t>(b[3]) << 32) | b[2];
  }
  return keys;
}

uint64_t Sampler::feistel(uint64_t x, const RoundKeys& keys) const {
  // An unbalanced Feistel network on bits_ bits. The value is (hi, lo) with lo the low
  // lo_bits; one round maps it to (lo, hi ^ F(lo)), where F(lo) is cut to hi's width. Each
  // round is a bijection whatever F is (from (lo, y) one recovers hi = y ^ F(lo)), and the
  // halves swap widths every round, so an odd bits_ needs no padding to an even width.
  int lo_bits = bits_ / 2;
  for (int r = 0; r < kRounds; ++r) {
    const int hi_bits = bits_ - lo_bits;
    const uint64_t lo = x & low_mask(lo_bits);
    const uint64_t hi = x >> lo_bits;
    const uint64_t f = mix64(keys[r] ^ lo) & low_mask(hi_bits);
    x = (lo << hi_bits) | (hi ^ f);
    lo_bits = hi_bits;
  }
  return x;
}

int64_t Sampler::permute(int64_t position, int64_t epoch) const {
  if (position < 0 || position >= samples_) {
    throw std::out_of_range("Sampler: position " + std::to_string(position) + " out of range [0, " +
                            std::to_string(samples_) + ")");
  }
  if (bits_ == 0) return 0;
  const RoundKeys keys = round_keys(epoch);
  // Cycle walking: the network permutes [0, 2^bits_); following the cycle from `position`
  // until it re-enters [0, samples) restricts it to a permutation of [0, samples).
  uint64_t x = static_cast<uint64_t>(position);
  do {
    x = feistel(x, keys);
  } while (x >= static_cast<uint64_t>(samples_));
  return static_cast<int64_t>(x);
}

int64_t Sampler::index(int64_t step, int64_t global_batch, int64_t i) const {
  if (step < 0 || global_batch < 1 || i < 0 || i >= global_batch) {
    throw std::out_of_range("Sampler: position " + std::to_string(i) + " of step " +
                            std::to_string(step) + " with global batch " +
                            std::to_string(global_batch) +
                            " (need step >= 0, global_batch >= 1, 0 <= i < global_batch)");
  }
  const int64_t g = step * global_batch + i;
  return permute(g % samples_, g / samples_);
}

int64_t Sampler::epoch(int64_t step, int64_t global_batch) const {
  if (step < 0 || global_batch < 1) {
    throw std::out_of_range("Sampler: step " + std::to_string(step) + " with global batch " +
                            std::to_string(global_batch) + " (need step >= 0, global_batch >= 1)");
  }
  return step * global_batch / samples_;
}

}  // namespace meshtrain
