// TokenDataset: the exact tokens of each window, windows across several shards, glob
// expansion, the errors for too little data, and shard verification split over workers.

#include "meshtrain/io/token_dataset.h"

#include <gtest/gtest.h>

#include <fstream>

#include "meshtrain/io/data_error.h"
#include "support/temp_dir.h"

namespace meshtrain {
namespace {

using meshtrain::testing::TempDir;

// Tokens whose value tells where they came from: source s, position i -> 100 * s + i.
std::vector<uint32_t> labelled(uint32_t source, uint32_t n) {
  std::vector<uint32_t> t(n);
  for (uint32_t i = 0; i < n; ++i) t[i] = 100 * source + i;
  return t;
}

std::pair<std::vector<int32_t>, std::vector<int32_t>> get(const TokenDataset& d, int64_t i) {
  std::vector<int32_t> in(d.seq_len(), -1), tg(d.seq_len(), -1);
  d.sample(i, in.data(), tg.data());
  return {in, tg};
}

using V = std::vector<int32_t>;

TEST(TokenDataset, WindowsMatchTheHeaderExample) {
  // n = 10, seq_len = 3: (10 - 1) / 3 = 3 windows starting at 0, 3, 6; token 9 is the last
  // target. Values are scrambled so that an off-by-one cannot pass by accident.
  const std::vector<uint32_t> t = {50, 41, 32, 23, 14, 5, 96, 87, 78, 69};
  const TokenDataset d = TokenDataset::from_tokens(t, 100, 3, "hand-made");
  ASSERT_EQ(d.samples(), 3);
  EXPECT_EQ(d.seq_len(), 3);
  EXPECT_EQ(d.vocab_size(), 100u);
  EXPECT_EQ(get(d, 0), std::make_pair(V{50, 41, 32}, V{41, 32, 23}));
  EXPECT_EQ(get(d, 1), std::make_pair(V{23, 14, 5}, V{14, 5, 96}));
  EXPECT_EQ(get(d, 2), std::make_pair(V{96, 87, 78}, V{87, 78, 69}));
  EXPECT_THROW(get(d, 3), std::out_of_range);
  EXPECT_THROW(get(d, -1), std::out_of_range);
}

TEST(TokenDataset, TailShorterThanAWindowIsUnused) {
  // 9 tokens: (9 - 1) / 4 = 2 windows, the second ending exactly on the last token.
  const TokenDataset d = TokenDataset::from_tokens(labelled(0, 9), 100, 4, "nine");
  ASSERT_EQ(d.samples(), 2);
  EXPECT_EQ(get(d, 1), std::make_pair(V{4, 5, 6, 7}, V{5, 6, 7, 8}));
}

TEST(TokenDataset, ShardsAreConcatenatedInOrderAndWindowsStayInside) {
  TempDir dir;
  write_token_shard(dir.file("a.bin"), labelled(1, 10), 1000);  // 3 windows of 3
  write_token_shard(dir.file("b.bin"), labelled(2, 3), 2000);   // 0 windows: skipped
  write_token_shard(dir.file("c.bin"), labelled(3, 8), 500);    // 2 windows
  const TokenDataset d =
      TokenDataset::from_shards({dir.file("a.bin"), dir.file("b.bin"), dir.file("c.bin")}, 3);
  ASSERT_EQ(d.samples(), 5);
  EXPECT_EQ(d.tokens(), 21);
  EXPECT_EQ(d.vocab_size(), 2000u);  // the largest over sources
  EXPECT_EQ(get(d, 2), std::make_pair(V{106, 107, 108}, V{107, 108, 109}));
  EXPECT_EQ(get(d, 3), std::make_pair(V{300, 301, 302}, V{301, 302, 303}));
  EXPECT_EQ(get(d, 4), std::make_pair(V{303, 304, 305}, V{304, 305, 306}));
  EXPECT_NE(d.describe().find("3 shards"), std::string::npos) << d.describe();
  EXPECT_NE(d.describe().find("5 samples of 3+1 tokens"), std::string::npos) << d.describe();
}

TEST(TokenDataset, GlobIsExpandedInSortedOrder) {
  TempDir dir;
  // Written out of order: the dataset order must come from the names, not creation time.
  write_token_shard(dir.file("train_002.bin"), labelled(2, 5), 1000);
  write_token_shard(dir.file("train_000.bin"), labelled(0, 5), 1000);
  write_token_shard(dir.file("train_001.bin"), labelled(1, 5), 1000);
  write_token_shard(dir.file("val_000.bin"), labelled(9, 5), 1000);
  const TokenDataset d = TokenDataset::from_shards({dir.file("train_*.bin")}, 4);
  ASSERT_EQ(d.samples(), 3);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(get(d, s).first[0], 100 * s) << "sample " << s;
}

TEST(TokenDataset, GlobMatchingNothingNamesThePattern) {
  TempDir dir;
  const std::string pattern = dir.file("train_*.bin");
  try {
    TokenDataset::from_shards({pattern}, 4);
    FAIL() << "expected a DataError";
  } catch (const DataError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(pattern + ": ", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("matches no files"), std::string::npos) << e.what();
  }
}

TEST(TokenDataset, MissingShardIsADataErrorNamingIt) {
  TempDir dir;
  try {
    TokenDataset::from_shards({dir.file("gone.bin")}, 4);
    FAIL() << "expected a DataError";
  } catch (const DataError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(dir.file("gone.bin"), 0), 0u) << e.what();
  }
}

TEST(TokenDataset, TooShortForOneWindowSaysWhatIsNeeded) {
  TempDir dir;
  write_token_shard(dir.file("short.bin"), labelled(0, 1024), 2000);
  try {
    TokenDataset::from_shards({dir.file("short.bin")}, 1024);
    FAIL() << "expected a DataError";
  } catch (const DataError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(dir.file("short.bin"), 0), 0u) << msg;
    EXPECT_NE(msg.find("seq_len = 1024"), std::string::npos) << msg;
    EXPECT_NE(msg.find("at least 1025 tokens"), std::string::npos) << msg;
    EXPECT_NE(msg.find("holds 1024"), std::string::npos) << msg;
  }
  // One more token makes exactly one window.
  write_token_shard(dir.file("enough.bin"), labelled(0, 1025), 2000);
  EXPECT_EQ(TokenDataset::from_shards({dir.file("enough.bin")}, 1024).samples(), 1);
}

TEST(TokenDataset, TooLittleValidationDataSaysValidation) {
  TempDir dir;
  write_token_shard(dir.file("val.bin"), labelled(0, 10), 2000);
  try {
    TokenDataset::from_shards({dir.file("val.bin")}, 16, "validation");
    FAIL() << "expected a DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("no validation samples: seq_len = 16"), std::string::npos)
        << e.what();
  }
}

// Every shard is verified by exactly one of the workers, whatever their number: a corrupt shard
// is reported by one worker only, and by one worker alone when it is the only one.
TEST(TokenDataset, VerifyShardsDealsEveryShardToOneWorker) {
  TempDir dir;
  std::vector<std::string> paths;
  for (uint32_t s = 0; s < 5; ++s) {
    paths.push_back(dir.file("s" + std::to_string(s) + ".bin"));
    write_token_shard(paths.back(), labelled(s, 20 + 10 * s), 1000);
  }
  for (size_t corrupt = 0; corrupt < paths.size(); ++corrupt) {
    std::fstream f(paths[corrupt], std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(64 + 2 * 7);
    const uint16_t bad = 4000;
    f.write(reinterpret_cast<const char*>(&bad), 2);
    f.close();
    const TokenDataset d = TokenDataset::from_shards(paths, 4);
    for (int workers : {1, 2, 3, 7}) {
      int reported = 0;
      for (int w = 0; w < workers; ++w) {
        try {
          d.verify_shards(w, workers, 3);
        } catch (const DataError& e) {
          ++reported;
          EXPECT_EQ(std::string(e.what()).rfind(paths[corrupt] + ": token 4000 at byte offset 78", 0), 0u)
              << e.what();
        }
      }
      EXPECT_EQ(reported, 1) << "corrupt shard " << corrupt << ", " << workers << " workers";
    }
    write_token_shard(paths[corrupt], labelled(static_cast<uint32_t>(corrupt), 20 + 10 * static_cast<uint32_t>(corrupt)), 1000);
  }
  EXPECT_THROW(TokenDataset::from_shards(paths, 4).verify_shards(2, 2, 1), std::invalid_argument);
}

TEST(TokenDataset, InMemoryChecksItsArguments) {
  EXPECT_THROW(TokenDataset::from_tokens({1, 2, 3}, 256, 3, "mem"), DataError);
  EXPECT_THROW(TokenDataset::from_tokens({1, 2, 300, 4, 5}, 256, 2, "mem"), DataError);
  EXPECT_THROW(TokenDataset::from_tokens({1, 2, 3, 4, 5}, 256, 0, "mem"), std::invalid_argument);
  EXPECT_THROW(TokenDataset::from_shards({}, 4), DataError);
}

}  // namespace
}  // namespace meshtrain
