// Fuzzes the token-shard reader: open() checks the header and size, verify() every token and the
// checksum. Each either accepts or throws DataError; an accepted shard's tokens must all read.
// An llm.c shard records no vocabulary, so it is checked against a model's (as training does);
// its seeds hold one token inside that bound (GPT-2) and one outside (LLaMA 3).

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
    constexpr uint32_t kModelVocab = 65536;
    (void)shard.verify_checksum();
    shard.verify(kModelVocab);
    // Verified: every token is readable and below the shard's vocabulary, or the model's where
    // the shard names none.
    const uint32_t bound = shard.vocab_size() != 0 ? shard.vocab_size() : kModelVocab;
    std::vector<int32_t> out(static_cast<size_t>(shard.size()));
    shard.read(0, shard.size(), out.data());
    for (int64_t i = 0; i < shard.size(); ++i)
      if (shard.token(i) >= bound) __builtin_trap();
  } catch (const meshtrain::DataError&) {
  }
  return 0;
}
