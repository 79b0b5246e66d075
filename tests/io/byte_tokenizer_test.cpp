#include "meshtrain/io/byte_tokenizer.h"

#include <gtest/gtest.h>

namespace meshtrain {
namespace {

TEST(ByteTokenizer, EveryByteRoundTrips) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  const std::vector<uint32_t> tokens = tokenize_bytes(all);
  ASSERT_EQ(tokens.size(), 256u);
  for (uint32_t b = 0; b < 256; ++b) EXPECT_EQ(tokens[b], b);  // unsigned, even for 0x80..0xff
  EXPECT_EQ(detokenize_bytes(tokens), all);
}

TEST(ByteTokenizer, RefusesTokensAboveAByte) {
  EXPECT_THROW(detokenize_bytes({72, 105, 256}), std::out_of_range);
}

}  // namespace
}  // namespace meshtrain
