// Fuzzes the token-shard reader: open() checks the header and size, verify() every token and the
// checksum. Each either accepts or throws DataError; an accepted shard's tokens must all read.

#include <cstdint>
#include <vector>

#include "fuzz_file.h"
#include "meshtrain/io/data_error.h"
#include "meshtrain/io/token_shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static meshtrain::fuzz::ScratchFile file("shard.bin");
  const std::string& path = file.write(data, size);
  try {
    const meshtrain::TokenShard shard = meshtrain::TokenShard::open(path);
    (void)shard.verify_checksum();
    shard.verify();
    // Verified: every token is readable and below the vocabulary.
    std::vector<int32_t> out(static_cast<size_t>(shard.size()));
    shard.read(0, shard.size(), out.data());
    for (int64_t i = 0; i < shard.size(); ++i)
      if (shard.token(i) >= shard.vocab_size()) __builtin_trap();
  } catch (const meshtrain::DataError&) {
  }
  return 0;
}
