// Token shard format: round trips for 2- and 4-byte tokens, the header laid out as documented,
// the checksum, every error open() promises and what verify() finds, each with the message a
// user would need.

#include "meshtrain/io/token_shard.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "meshtrain/io/data_error.h"
#include "support/temp_dir.h"

namespace meshtrain {
namespace {

using meshtrain::testing::TempDir;

std::vector<uint32_t> some_tokens(size_t n, uint32_t vocab) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint32_t>((i * 2654435761u + 17) % vocab);
  return t;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void patch(const std::string& path, std::streamoff offset, const void* bytes, size_t n) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(offset);
  f.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(n));
}

// The DataError message of open(path), or "" when it did not throw.
std::string open_error(const std::string& path) {
  try {
    TokenShard::open(path);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

void expect_round_trip(const std::string& path, const std::vector<uint32_t>& tokens, uint32_t vocab,
                       uint32_t expected_bytes) {
  write_token_shard(path, tokens, vocab);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_EQ(std::filesystem::file_size(path), 64 + tokens.size() * expected_bytes);

  const TokenShard s = TokenShard::open(path);
  EXPECT_EQ(s.path(), path);
  EXPECT_EQ(s.size(), static_cast<int64_t>(tokens.size()));
  EXPECT_EQ(s.vocab_size(), vocab);
  EXPECT_EQ(s.bytes_per_token(), expected_bytes);
  for (size_t i = 0; i < tokens.size(); ++i) ASSERT_EQ(s.token(static_cast<int64_t>(i)), tokens[i]);

  std::vector<int32_t> out(tokens.size() - 7, -1);
  s.read(3, static_cast<int64_t>(out.size()), out.data());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], static_cast<int32_t>(tokens[3 + i]));
  EXPECT_TRUE(s.verify_checksum());
}

TEST(TokenShard, RoundTripTwoByteTokens) {
  TempDir dir;
  auto tokens = some_tokens(1000, 50257);
  tokens[10] = 50256;  // the largest token of a GPT-2 vocabulary
  expect_round_trip(dir.file("a.bin"), tokens, 50257, 2);
}

TEST(TokenShard, RoundTripFourByteTokens) {
  TempDir dir;
  auto tokens = some_tokens(1000, 128256);
  tokens[0] = 128255;
  tokens[1] = 65536;  // would wrap to 0 in a uint16
  expect_round_trip(dir.file("a.bin"), tokens, 128256, 4);
}

// A shard truncated (rewritten in place) while a run reads it: each way of reading what is no
// longer there is an error naming the file and what happened, never a SIGBUS (which killed
// every rank of a run reading a mapped shard, exit 135, without a word).
TEST(TokenShard, TruncatedWhileOpenIsAnErrorNamingTheFile) {
  TempDir dir;
  for (const uint32_t vocab : {50257u, 128256u}) {
    const std::string path = dir.file("shrinks_" + std::to_string(vocab) + ".bin");
    write_token_shard(path, some_tokens(100000, vocab), vocab);
    const TokenShard s = TokenShard::open(path);
    std::filesystem::resize_file(path, 64 + 100);
    const auto expect_named = [&](const std::function<void()>& read, const char* what) {
      try {
        read();
        ADD_FAILURE() << what << ": no error after the truncation";
      } catch (const DataError& e) {
        const std::string m = e.what();
        EXPECT_EQ(m.rfind(path + ": the token shard was truncated while this run used it", 0), 0u)
            << what << ": " << m;
        EXPECT_NE(m.find("bytes when opened"), std::string::npos) << what << ": " << m;
      }
    };
    std::vector<int32_t> out(1025);
    expect_named([&] { s.read(90000, 1025, out.data()); }, "read");
    expect_named([&] { (void)s.token(99999); }, "token");
    expect_named([&] { (void)s.verify_checksum(); }, "verify_checksum");
    expect_named([&] { s.verify(); }, "verify");
    // What is still there reads as before.
    EXPECT_NO_THROW(s.read(0, 10, out.data()));
  }
}

// Replaced by a rename (how shards should be rewritten): the run goes on reading the file it
// opened, whole and unchanged.
TEST(TokenShard, ReplacedByARenameKeepsReadingTheOpenedFile) {
  TempDir dir;
  const std::string path = dir.file("a.bin"), other = dir.file("b.bin");
  const auto tokens = some_tokens(5000, 50257);
  write_token_shard(path, tokens, 50257);
  write_token_shard(other, some_tokens(10, 50257), 50257);
  const TokenShard s = TokenShard::open(path);
  std::filesystem::rename(other, path);
  std::vector<int32_t> out(tokens.size());
  s.read(0, static_cast<int64_t>(out.size()), out.data());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], static_cast<int32_t>(tokens[i]));
  EXPECT_TRUE(s.verify_checksum());
}

TEST(TokenShard, WidthBoundaryIs65536) {
  TempDir dir;
  expect_round_trip(dir.file("two.bin"), {0, 65535, 1, 2, 3, 4, 5, 6, 7, 8}, 65536, 2);
  expect_round_trip(dir.file("four.bin"), {0, 65536, 1, 2, 3, 4, 5, 6, 7, 8}, 65537, 4);
}

TEST(TokenShard, EmptyShardOpens) {
  TempDir dir;
  write_token_shard(dir.file("e.bin"), {}, 256);
  const TokenShard s = TokenShard::open(dir.file("e.bin"));
  EXPECT_EQ(s.size(), 0);
  EXPECT_TRUE(s.verify_checksum());
  // Reading none of them into an empty vector's data() (null) copies nothing, at either width
  // (the four-byte path once passed the null pointer to memcpy: UBSan, found by fuzzing).
  write_token_shard(dir.file("e4.bin"), {}, 128256);
  const TokenShard wide = TokenShard::open(dir.file("e4.bin"));
  std::vector<int32_t> none;
  s.read(0, 0, none.data());
  wide.read(0, 0, none.data());
  EXPECT_EQ(wide.size(), 0);
}

TEST(TokenShard, HeaderIsLaidOutAsDocumented) {
  TempDir dir;
  const std::vector<uint32_t> tokens = {1, 2, 300, 4};
  write_token_shard(dir.file("h.bin"), tokens, 1000);
  const std::string b = slurp(dir.file("h.bin"));
  ASSERT_EQ(b.size(), 64u + 8u);
  auto u32 = [&](size_t at) {
    uint32_t v;
    std::memcpy(&v, b.data() + at, 4);
    return v;
  };
  auto u64 = [&](size_t at) {
    uint64_t v;
    std::memcpy(&v, b.data() + at, 8);
    return v;
  };
  EXPECT_EQ(b.substr(0, 8), "MTTOKENS");
  EXPECT_EQ(u32(8), 1u);
  EXPECT_EQ(u32(12), 2u);
  EXPECT_EQ(u64(16), 4u);
  EXPECT_EQ(u32(24), 1000u);
  EXPECT_EQ(u32(28), 64u);
  EXPECT_EQ(u64(32), fnv1a64(b.data() + 64, 8));
  EXPECT_EQ(b.substr(40, 24), std::string(24, '\0'));
  // Little-endian uint16 tokens: 300 = 0x012C.
  EXPECT_EQ(static_cast<unsigned char>(b[64 + 4]), 0x2C);
  EXPECT_EQ(static_cast<unsigned char>(b[64 + 5]), 0x01);
}

TEST(TokenShard, Fnv1aKnownAnswers) {
  // Reference values of 64-bit FNV-1a (Fowler, Noll, Vo).
  EXPECT_EQ(fnv1a64("", 0), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a", 1), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a64("foobar", 6), 0x85944171f73967e8ull);
  // Chunked hashing continues the running value.
  EXPECT_EQ(fnv1a64("bar", 3, fnv1a64("foo", 3)), fnv1a64("foobar", 6));
}

TEST(TokenShard, ChecksumDetectsAFlippedByte) {
  TempDir dir;
  const std::string path = dir.file("c.bin");
  write_token_shard(path, some_tokens(500, 256), 256);
  const unsigned char x = 0x40;
  std::string b = slurp(path);
  const unsigned char flipped = static_cast<unsigned char>(b[64 + 123]) ^ x;
  patch(path, 64 + 123, &flipped, 1);
  const TokenShard s = TokenShard::open(path);  // open does not read the tokens
  EXPECT_FALSE(s.verify_checksum());
}

// The DataError message of verify() on the shard at path, or "" when it did not throw.
std::string verify_error(const std::string& path) {
  try {
    TokenShard::open(path).verify();
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

TEST(TokenShard, VerifyPassesGoodShardsOfBothWidths) {
  TempDir dir;
  write_token_shard(dir.file("two.bin"), some_tokens(100000, 50257), 50257);
  write_token_shard(dir.file("four.bin"), some_tokens(100000, 128256), 128256);
  write_token_shard(dir.file("empty.bin"), {}, 256);
  for (const char* name : {"two.bin", "four.bin", "empty.bin"})
    EXPECT_EQ(verify_error(dir.file(name)), "") << name;
}

// A token the header's vocabulary does not hold (what a shard written for another tokenizer,
// or a corrupt one, looks like) is named with its byte offset, in every chunk of the scan.
TEST(TokenShard, VerifyNamesTheOffsetOfATokenBeyondTheVocabulary) {
  TempDir dir;
  const std::string path = dir.file("v.bin");
  for (const int64_t index : {int64_t{0}, int64_t{700}, int64_t{32768}, int64_t{99999}}) {
    write_token_shard(path, some_tokens(100000, 256), 256);
    const uint16_t bad = 60000;
    patch(path, 64 + 2 * index, &bad, 2);
    const std::string msg = verify_error(path);
    EXPECT_EQ(msg, path + ": token 60000 at byte offset " + std::to_string(64 + 2 * index) +
                       " (token " + std::to_string(index) +
                       ") is not below the header's vocab_size 256: the shard is corrupt or was "
                       "written for another vocabulary");
  }
  // Four-byte tokens: the first token at or above vocab_size, exactly at the boundary.
  write_token_shard(path, some_tokens(5000, 70000), 70000);
  const uint32_t bad = 70000;
  patch(path, 64 + 4 * 4321, &bad, 4);
  EXPECT_NE(verify_error(path).find("token 70000 at byte offset " + std::to_string(64 + 4 * 4321)),
            std::string::npos);
}

TEST(TokenShard, VerifyNamesAChecksumMismatch) {
  TempDir dir;
  const std::string path = dir.file("c.bin");
  write_token_shard(path, some_tokens(500, 256), 256);
  // The low byte of a token: it changes, but stays inside the vocabulary.
  const unsigned char flipped = static_cast<unsigned char>(slurp(path)[64 + 124] ^ 0x01);
  patch(path, 64 + 124, &flipped, 1);
  const std::string msg = verify_error(path);
  EXPECT_EQ(msg.rfind(path + ": checksum mismatch: the token bytes at offsets 64 to 1064 hash to 0x", 0), 0u) << msg;
  EXPECT_NE(msg.find(", the header (offset 32) says 0x"), std::string::npos) << msg;
}

TEST(TokenShard, MissingFile) {
  TempDir dir;
  const std::string path = dir.file("nope.bin");
  const std::string msg = open_error(path);
  EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
  EXPECT_NE(msg.find("No such file"), std::string::npos) << msg;
}

TEST(TokenShard, FileSmallerThanHeader) {
  TempDir dir;
  const std::string path = dir.file("tiny.bin");
  std::ofstream(path) << "MTTOKENS";
  const std::string msg = open_error(path);
  EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
  EXPECT_NE(msg.find("8 bytes"), std::string::npos) << msg;
}

TEST(TokenShard, BadMagic) {
  TempDir dir;
  const std::string path = dir.file("m.bin");
  write_token_shard(path, some_tokens(10, 256), 256);
  patch(path, 0, "GPT2DATA", 8);
  const std::string msg = open_error(path);
  EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
  EXPECT_NE(msg.find("bad magic \"GPT2DATA\""), std::string::npos) << msg;
}

TEST(TokenShard, UnknownVersionIsNamed) {
  TempDir dir;
  const std::string path = dir.file("v.bin");
  write_token_shard(path, some_tokens(10, 256), 256);
  const uint32_t version = 7;
  patch(path, 8, &version, 4);
  const std::string msg = open_error(path);
  EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
  EXPECT_NE(msg.find("version 7"), std::string::npos) << msg;
  EXPECT_NE(msg.find("reads version 1"), std::string::npos) << msg;
}

TEST(TokenShard, BadBytesPerToken) {
  TempDir dir;
  const std::string path = dir.file("w.bin");
  write_token_shard(path, some_tokens(12, 256), 256);
  const uint32_t three = 3;
  patch(path, 12, &three, 4);
  EXPECT_NE(open_error(path).find("bytes per token is 3"), std::string::npos);
}

TEST(TokenShard, TruncatedFileSaysBothCounts) {
  TempDir dir;
  const std::string path = dir.file("t.bin");
  write_token_shard(path, some_tokens(1000, 256), 256);
  std::filesystem::resize_file(path, 64 + 2000 - 3);
  const std::string msg = open_error(path);
  EXPECT_EQ(msg.rfind(path + ": truncated token shard", 0), 0u) << msg;
  EXPECT_NE(msg.find("header promises 1000 tokens (2064 bytes)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("file holds 2061 bytes (998 whole tokens)"), std::string::npos) << msg;
}

TEST(TokenShard, ExtraBytesAreRefused) {
  TempDir dir;
  const std::string path = dir.file("x.bin");
  write_token_shard(path, some_tokens(100, 256), 256);
  std::ofstream(path, std::ios::binary | std::ios::app) << "junk!";
  const std::string msg = open_error(path);
  EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
  EXPECT_NE(msg.find("5 extra bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("header promises 100 tokens (264 bytes), file holds 269 bytes"),
            std::string::npos)
      << msg;
}

TEST(TokenShard, HugeCountReadsAsTruncatedNotOverflow) {
  TempDir dir;
  const std::string path = dir.file("o.bin");
  write_token_shard(path, some_tokens(4, 256), 256);
  const uint64_t huge = ~0ull / 2 + 5;  // 64 + huge * 2 wraps around in uint64
  patch(path, 16, &huge, 8);
  EXPECT_NE(open_error(path).find("truncated"), std::string::npos);
}

TEST(TokenShard, OutOfRangeAccessThrows) {
  TempDir dir;
  write_token_shard(dir.file("r.bin"), some_tokens(10, 256), 256);
  const TokenShard s = TokenShard::open(dir.file("r.bin"));
  int32_t buf[4];
  EXPECT_THROW(s.token(10), std::out_of_range);
  EXPECT_THROW(s.token(-1), std::out_of_range);
  EXPECT_THROW(s.read(8, 3, buf), std::out_of_range);
  EXPECT_NO_THROW(s.read(7, 3, buf));
}

TEST(TokenShard, WriterRefusesTokensOutsideTheVocabulary) {
  TempDir dir;
  const std::string path = dir.file("bad.bin");
  EXPECT_THROW(write_token_shard(path, {1, 2, 256}, 256), DataError);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(TokenShard, WriterFailsIntoAMissingDirectoryWithThePath) {
  TempDir dir;
  const std::string path = dir.file("no/such/dir/a.bin");
  try {
    write_token_shard(path, {1, 2, 3}, 256);
    FAIL() << "expected a DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(TokenShard, MovedShardStaysReadable) {
  TempDir dir;
  write_token_shard(dir.file("mv.bin"), {5, 6, 7}, 256);
  TokenShard a = TokenShard::open(dir.file("mv.bin"));
  TokenShard b = std::move(a);
  EXPECT_EQ(b.token(2), 7u);
  write_token_shard(dir.file("mv2.bin"), {9}, 256);
  b = TokenShard::open(dir.file("mv2.bin"));
  EXPECT_EQ(b.size(), 1);
  EXPECT_EQ(b.token(0), 9u);
}

// llm.c's format (dev/data/data_common.py write_datafile): 256 int32 header, tokens at 1024.
template <class T>
void write_llmc(const std::string& path, int32_t magic, int32_t version, const std::vector<T>& t) {
  int32_t header[256] = {};
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(t.size());
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(header), sizeof header);
  f.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.size() * sizeof(T)));
}

TEST(TokenShard, ReadsLlmcGpt2Shards) {
  TempDir dir;
  const std::vector<uint16_t> t = {50256, 15496, 11, 995, 0, 50256};
  write_llmc(dir.file("gpt2.bin"), kLlmcMagicGpt2, kLlmcVersionGpt2, t);
  const TokenShard s = TokenShard::open(dir.file("gpt2.bin"));
  EXPECT_EQ(s.format(), ShardFormat::Llmc);
  EXPECT_EQ(s.size(), 6);
  EXPECT_EQ(s.bytes_per_token(), 2u);
  EXPECT_EQ(s.vocab_size(), 0u);  // llm.c records none
  std::vector<int32_t> out(6);
  s.read(0, 6, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{50256, 15496, 11, 995, 0, 50256}));
  EXPECT_NO_THROW(s.verify(50257));
  try {
    s.verify(50000);
    FAIL() << "expected a DataError";
  } catch (const DataError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(dir.file("gpt2.bin") + ": token 50256 at byte offset 1024 (token 0) is not "
                        "below model.vocab_size 50000", 0), 0u) << msg;
    EXPECT_NE(msg.find("records no vocabulary size"), std::string::npos) << msg;
  }
}

TEST(TokenShard, ReadsLlmcLlama3Shards) {
  TempDir dir;
  const std::vector<uint32_t> t = {128000, 9906, 1917, 128001};
  write_llmc(dir.file("llama.bin"), kLlmcMagicLlama3, kLlmcVersionLlama3, t);
  const TokenShard s = TokenShard::open(dir.file("llama.bin"));
  EXPECT_EQ(s.bytes_per_token(), 4u);
  EXPECT_EQ(s.token(0), 128000u);
  EXPECT_EQ(s.token(3), 128001u);
  EXPECT_NO_THROW(s.verify(128256));
  EXPECT_THROW(s.verify(128001), DataError);
}

TEST(TokenShard, RefusesLlmcShardsWithAWrongVersionOrSize) {
  TempDir dir;
  write_llmc(dir.file("v.bin"), kLlmcMagicGpt2, 7, std::vector<uint16_t>{1, 2});
  EXPECT_NE(open_error(dir.file("v.bin")).find("of version 7, expected 1"), std::string::npos)
      << open_error(dir.file("v.bin"));
  write_llmc(dir.file("t.bin"), kLlmcMagicGpt2, 1, std::vector<uint16_t>{1, 2, 3});
  std::filesystem::resize_file(dir.file("t.bin"), 1024 + 4);
  EXPECT_NE(open_error(dir.file("t.bin")).find("truncated llm.c token shard"), std::string::npos)
      << open_error(dir.file("t.bin"));
}

TEST(TokenShardWriter, StreamedPiecesMakeTheSameFile) {
  TempDir dir;
  const std::vector<uint32_t> t = some_tokens(200000, 70000);
  write_token_shard(dir.file("whole.bin"), t, 70000);
  {
    TokenShardWriter w(dir.file("pieces.bin"), 70000);
    w.append(t.data(), 7);
    w.append(t.data() + 7, 100000);
    w.append(t.data() + 100007, t.size() - 100007);
    EXPECT_FALSE(std::filesystem::exists(dir.file("pieces.bin")));  // only .tmp until finish()
    w.finish();
  }
  EXPECT_EQ(slurp(dir.file("pieces.bin")), slurp(dir.file("whole.bin")));
  EXPECT_NO_THROW(TokenShard::open(dir.file("pieces.bin")).verify());
}

TEST(TokenShardWriter, UnfinishedLeavesNothing) {
  TempDir dir;
  {
    TokenShardWriter w(dir.file("x.bin"), 256);
    const uint32_t t[] = {1, 2, 3};
    w.append(t, 3);
    const uint32_t bad[] = {4, 300};
    EXPECT_THROW(w.append(bad, 2), DataError);
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("x.bin")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("x.bin.tmp")));
}

}  // namespace
}  // namespace meshtrain
