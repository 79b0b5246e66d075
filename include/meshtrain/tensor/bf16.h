#pragma once
// Host conversions between fp32 and bfloat16 (the upper half of an IEEE-754 binary32: 1 sign,
// 8 exponent and 7 mantissa bits). Narrowing rounds to nearest, ties to even, as the GPU's
// __float2bfloat16_rn does, so host and device produce the same bits. Not a number type: the
// backends do arithmetic; this only moves values across the precision boundary.

#include <bit>
#include <cstdint>

namespace meshtrain {

constexpr uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0)
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN stays NaN (quiet), sign kept
  // Add 0x7fff plus the lowest kept bit: rounds half-way cases to the even neighbour; overflow
  // carries into the exponent and yields infinity, as it should.
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

constexpr float bf16_bits_to_float(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

}  // namespace meshtrain
