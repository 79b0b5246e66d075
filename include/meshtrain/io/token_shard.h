#pragma once
// Token shards: the on-disk form of a tokenized corpus, and a read-only view of one (read with
// pread). This file is the format and its reader/writer; it is not a dataset (how tokens become
// training windows is io/token_dataset.h) and not a tokenizer.
//
// Format, version 1. Every integer is little-endian.
//
//   | offset | bytes   | type          | field                                             |
//   |--------|---------|---------------|---------------------------------------------------|
//   | 0      | 8       | char[8]       | magic "MTTOKENS"                                  |
//   | 8      | 4       | uint32        | format version = 1                                |
//   | 12     | 4       | uint32        | bytes per token: 2 (uint16) or 4 (uint32)         |
//   | 16     | 8       | uint64        | token count n                                     |
//   | 24     | 4       | uint32        | vocab_size (every token is < vocab_size)          |
//   | 28     | 4       | uint32        | header bytes = 64 (offset of the first token)     |
//   | 32     | 8       | uint64        | FNV-1a 64 checksum of the n * bytes token bytes   |
//   | 40     | 24      | -             | zero (reserved)                                   |
//   | 64     | n*bytes | uint16/uint32 | the tokens                                        |
//
// The file size is exactly 64 + n * bytes_per_token. Writers pick 2 bytes per token when
// vocab_size <= 65536 (every GPT-2/Llama-2 sized vocabulary), else 4.
//
// llm.c's token shards (karpathy/llm.c dev/data/data_common.py) are read as they are: a header
// of 256 little-endian int32 — [0] magic, [1] version, [2] token count — and the tokens from
// byte 1024: magic 20240520 version 1 holds uint16 tokens (GPT-2), magic 20240801 version 7
// uint32 tokens (LLaMA 3). They record no vocabulary size (vocab_size() is 0, "unknown") and no
// checksum: verify() checks the tokens against the bound the caller gives (the model's
// model.vocab_size) and nothing else.
//
// Opening a shard checks the header and the file size but not the tokens: a shard can be
// terabytes and opening must be cheap on every rank. verify() reads every byte once: every
// token below vocab_size, and the checksum. Training verifies each shard once at start-up,
// the shards split over the ranks (TokenDataset::verify_shards).

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace meshtrain {

inline constexpr char kTokenShardMagic[8] = {'M', 'T', 'T', 'O', 'K', 'E', 'N', 'S'};
inline constexpr uint32_t kTokenShardVersion = 1;
inline constexpr uint32_t kTokenShardHeaderBytes = 64;
inline constexpr int32_t kLlmcMagicGpt2 = 20240520, kLlmcVersionGpt2 = 1;
inline constexpr int32_t kLlmcMagicLlama3 = 20240801, kLlmcVersionLlama3 = 7;
inline constexpr uint32_t kLlmcHeaderBytes = 1024;

enum class ShardFormat { Meshtrain, Llmc };

// 64-bit FNV-1a (offset basis 0xcbf29ce484222325, prime 0x100000001b3), the shard checksum.
// `h` continues a running hash, so a writer can checksum its tokens chunk by chunk.
uint64_t fnv1a64(const void* data, size_t bytes, uint64_t h = 0xCBF29CE484222325ull);

class TokenShard {
 public:
  // Opens `path` read-only (posix_fadvise(RANDOM): training reads windows at random
  // positions). Throws DataError, starting with the path, when the file is
  // missing or unreadable, smaller than a header, has a bad magic, an unsupported version,
  // bytes per token other than 2 or 4, a header size other than 64, or a size that does not
  // match the token count the header promises.
  static TokenShard open(const std::string& path);

  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;
  ~TokenShard();

  int64_t size() const { return count_; }  // tokens
  // The header's vocabulary; 0 for an llm.c shard, which records none.
  uint32_t vocab_size() const { return vocab_size_; }
  ShardFormat format() const { return format_; }
  uint32_t bytes_per_token() const { return bytes_per_token_; }
  uint64_t stored_checksum() const { return checksum_; }
  const std::string& path() const { return path_; }

  uint32_t token(int64_t i) const;  // 0 <= i < size(), else std::out_of_range
  // Copies tokens [begin, begin + count) into out[0, count) as int32 (what the embedding
  // kernels take). The range must lie inside the shard, else std::out_of_range.
  void read(int64_t begin, int64_t count, int32_t* out) const;

  // Recomputes the FNV-1a checksum over every token byte and compares it with the header's.
  bool verify_checksum() const;
  // One pass over every token: throws DataError naming the file and the byte offset of the
  // first token >= vocab_size, or, when the checksum does not match, the byte range it covers
  // and both values. FNV-1a is sequential: one thread verifies one shard. An llm.c shard has
  // neither a vocabulary nor a checksum: its tokens must lie below `model_vocab` (the model's
  // model.vocab_size; 0: unchecked), and the error says so.
  void verify(uint32_t model_vocab = 0) const;

 private:
  TokenShard() = default;
  void release() noexcept;
  static TokenShard open_llmc(const std::string& path, int fd, uint64_t file_bytes,
                              const unsigned char* header);
  // Keeps a descriptor of the file and fills what every format has; the caller sets the rest.
  static TokenShard opened(const std::string& path, int fd, uint64_t file_bytes,
                           ShardFormat format, uint64_t header_bytes, int64_t count,
                           uint32_t bytes_per_token);
  // Reads tokens [first, first + count) as stored into `out` (pread: thread-safe). Throws
  // DataError naming the file where it has been truncated since it was opened.
  void read_tokens(int64_t first, int64_t count, void* out) const;

  std::string path_;
  // Read with pread, not mapped: a mapped file truncated under a run (a shard rewritten in
  // place) kills every rank reading it with SIGBUS, without a word; a read past the new end is
  // an error that names the file. A SIGBUS handler could only jump out of the fault (a process-
  // wide handler, per-thread jump buffers, and code between that must not hold locks); a
  // system call per sample window costs a microsecond or two more than copying from a warm
  // mapping, nothing beside a step, and the sequential verification pass is as fast either way.
  int fd_ = -1;
  uint64_t file_bytes_ = 0;    // when opened
  uint64_t header_bytes_ = 0;  // where the tokens start
  ShardFormat format_ = ShardFormat::Meshtrain;
  int64_t count_ = 0;
  uint32_t bytes_per_token_ = 0;
  uint32_t vocab_size_ = 0;
  uint64_t checksum_ = 0;
};

// Writes `tokens` as a version-1 shard. The bytes go to `path` + ".tmp", which is renamed to
// `path` only once complete, so a crash never leaves a half-written shard under the final
// name. Throws DataError if a token is >= vocab_size or the file cannot be written.
void write_token_shard(const std::string& path, const std::vector<uint32_t>& tokens,
                       uint32_t vocab_size);

// The same, streamed: tokens arrive in pieces (append), the FNV-1a checksum runs along, and
// finish() patches count and checksum into the header, flushes and renames `path` + ".tmp" to
// `path`. Destroyed unfinished (an error on the way), it removes the .tmp file: a shard exists
// under its final name only complete.
class TokenShardWriter {
 public:
  TokenShardWriter(std::string path, uint32_t vocab_size);
  ~TokenShardWriter();
  TokenShardWriter(const TokenShardWriter&) = delete;
  TokenShardWriter& operator=(const TokenShardWriter&) = delete;

  // DataError if a token is >= vocab_size (naming its position in the shard) or on a write error.
  void append(const uint32_t* tokens, size_t n);
  void finish();  // seal() then publish()
  // The two halves of finish(), for writers of several shards that belong together (train and
  // validation): seal every one (header, flush, fsync, close: what can fail on a full disk), then
  // publish each (the rename), so that a failure leaves none of them under its final name.
  void seal();
  void publish();
  int64_t tokens() const { return count_; }
  const std::string& path() const { return path_; }

 private:
  [[noreturn]] void fail(const std::string& what);
  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
  uint32_t vocab_size_, bytes_per_token_;
  int64_t count_ = 0;
  uint64_t hash_;
  std::vector<unsigned char> buf_;
  bool published_ = false;
};

}  // namespace meshtrain
