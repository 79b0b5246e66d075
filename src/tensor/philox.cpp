#include "meshtrain/tensor/philox.h"

#include <cmath>

namespace meshtrain {

namespace {
constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}
}  // namespace

uint64_t hash_name(std::string_view s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return mix64(h);
}

Philox::Philox(uint64_t seed, std::string_view name) : Philox(mix64(seed ^ hash_name(name))) {}

Philox::Block Philox::operator()(uint64_t counter, Stream stream) const {
  return philox4x32_10({static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32),
                        static_cast<uint32_t>(stream), 0u},
                       key_);
}

Philox::Block Philox::philox4x32_10(Block c, std::array<uint32_t, 2> key) {
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kMul0, c[0], hi0, lo0);
    mulhilo(kMul1, c[2], hi1, lo1);
    c = {hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0};
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return c;
}

double Philox::normal(uint64_t index, Stream stream) const {
  const Block b = (*this)(index, stream);
  const double u1 = (static_cast<double>(b[0]) + 0.5) * 0x1p-32;  // (0, 1): log is finite
  const double u2 = static_cast<double>(b[1]) * 0x1p-32;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

double Philox::uniform(uint64_t index, Stream stream) const {
  const Block b = (*this)(index, stream);
  const uint64_t bits = (static_cast<uint64_t>(b[0]) << 21) ^ (b[1] >> 11);
  return static_cast<double>(bits & ((1ull << 53) - 1)) * 0x1p-53;
}

}  // namespace meshtrain
