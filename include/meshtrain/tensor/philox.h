#pragma once
// Philox4x32-10, the counter-based generator of Salmon et al., "Parallel random numbers: as easy
// as 1, 2, 3" (SC'11). A value is a pure function of (key, counter): meshtrain keys by
// (seed, parameter name) and counts by global element index, so any shard of a tensor, on any
// rank of any layout, draws exactly the values the whole tensor would have.

#include <array>
#include <cstdint>
#include <string_view>

namespace meshtrain {

class Philox {
 public:
  using Block = std::array<uint32_t, 4>;

  // Streams keep different uses of one (seed, name) apart.
  enum class Stream : uint32_t { Init = 0, Data = 1, Dropout = 2 };

  Philox(uint64_t seed, std::string_view name);
  explicit Philox(uint64_t key) : key_{static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)} {}

  Block operator()(uint64_t counter, Stream stream = Stream::Init) const;

  // The bare generator, for known-answer tests against Random123.
  static Block philox4x32_10(Block counter, std::array<uint32_t, 2> key);

  // A standard normal draw for element `index` (Box-Muller on the first two words), computed in
  // double so that fp32 and fp64 models start from the same values up to rounding.
  double normal(uint64_t index, Stream stream = Stream::Init) const;
  // Uniform in [0, 1) with 53 bits.
  double uniform(uint64_t index, Stream stream = Stream::Init) const;

 private:
  std::array<uint32_t, 2> key_;
};

// 64-bit FNV-1a of a string, finished with a splitmix64 mix.
uint64_t hash_name(std::string_view s);
// The splitmix64 finaliser. Inline: checkpoint checksums hash every element with it, and the
// compiler vectorises the loop only when it sees the body.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace meshtrain
