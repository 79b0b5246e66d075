#include "meshtrain/io/token_shard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "meshtrain/io/data_error.h"
#include "meshtrain/io/regular_file.h"

namespace meshtrain {

// Tokens are read as stored; the format is little-endian and so is every host meshtrain
// targets (x86-64, aarch64). A big-endian port would byte-swap in read().
static_assert(std::endian::native == std::endian::little,
              "token shards are little-endian; this reader assumes a little-endian host");

namespace {

uint32_t load_u32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t load_u64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
void store_u32(unsigned char* p, uint32_t v) { std::memcpy(p, &v, 4); }
void store_u64(unsigned char* p, uint64_t v) { std::memcpy(p, &v, 8); }

std::string errno_text() { return std::strerror(errno); }

// The magic as the user would want to see it: printable characters as-is, others as \xNN.
std::string show_bytes(const unsigned char* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    if (p[i] >= 0x20 && p[i] < 0x7F && p[i] != '"' && p[i] != '\\') {
      s += static_cast<char>(p[i]);
    } else {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", p[i]);
      s += buf;
    }
  }
  return s;
}

// Closes a file descriptor on every exit path of open().
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

uint64_t fnv1a64(const void* data, size_t bytes, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 0x100000001B3ull;
  }
  return h;
}

TokenShard TokenShard::open(const std::string& path) {
  Fd f{open_regular_file(path, "a token shard", "a shard written by `meshtrain prepare`")};
  if (f.fd < 0) throw DataError(path, "cannot open token shard: " + errno_text());
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw DataError(path, "cannot stat token shard: " + errno_text());
  if (!S_ISREG(st.st_mode)) throw DataError(path, "is not a regular file");
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < kTokenShardHeaderBytes) {
    throw DataError(path, "file holds " + std::to_string(file_bytes) +
                              " bytes, less than the 64-byte token shard header (write shards "
                              "with `meshtrain prepare`)");
  }

  unsigned char h[kTokenShardHeaderBytes];
  if (::pread(f.fd, h, sizeof h, 0) != static_cast<ssize_t>(sizeof h)) {
    throw DataError(path, "cannot read token shard header: " + errno_text());
  }
  int32_t llmc_magic;
  std::memcpy(&llmc_magic, h, 4);
  if (llmc_magic == kLlmcMagicGpt2 || llmc_magic == kLlmcMagicLlama3)
    return open_llmc(path, f.fd, file_bytes, h);
  if (std::memcmp(h, kTokenShardMagic, 8) != 0) {
    throw DataError(path, "bad magic \"" + show_bytes(h, 8) +
                              "\", expected \"MTTOKENS\" (a meshtrain token shard) or the int32 "
                              "20240520 / 20240801 of an llm.c shard");
  }
  const uint32_t version = load_u32(h + 8);
  if (version != kTokenShardVersion) {
    throw DataError(path, "unsupported token shard format version " + std::to_string(version) +
                              " (this build reads version " + std::to_string(kTokenShardVersion) +
                              ")");
  }
  const uint32_t bytes_per_token = load_u32(h + 12);
  if (bytes_per_token != 2 && bytes_per_token != 4) {
    throw DataError(path, "bytes per token is " + std::to_string(bytes_per_token) +
                              ", expected 2 (uint16) or 4 (uint32)");
  }
  const uint64_t count = load_u64(h + 16);
  const uint32_t vocab_size = load_u32(h + 24);
  const uint32_t header_bytes = load_u32(h + 28);
  if (header_bytes != kTokenShardHeaderBytes) {
    throw DataError(path, "header bytes is " + std::to_string(header_bytes) +
                              ", version 1 "
                              "headers are 64 bytes");
  }
  if (vocab_size == 0) throw DataError(path, "vocab_size is 0 in the token shard header");
  if (bytes_per_token == 2 && vocab_size > 65536) {
    throw DataError(path, "vocab_size " + std::to_string(vocab_size) +
                              " does not fit 2-byte tokens (at most 65536)");
  }

  // 64 + count * bytes, saturating: a corrupt count must read as "truncated", not wrap around.
  const uint64_t max_count = (std::numeric_limits<uint64_t>::max() - 64) / bytes_per_token;
  const uint64_t expected =
      count > max_count ? std::numeric_limits<uint64_t>::max() : 64 + count * bytes_per_token;
  if (file_bytes != expected) {
    const std::string promise =
        "header promises " + std::to_string(count) + " tokens (" + std::to_string(expected) +
        " bytes), file holds " + std::to_string(file_bytes) + " bytes (" +
        std::to_string((file_bytes - 64) / bytes_per_token) + " whole tokens)";
    if (file_bytes < expected) throw DataError(path, "truncated token shard: " + promise);
    throw DataError(path, "token shard has " + std::to_string(file_bytes - expected) +
                              " extra bytes: " + promise);
  }
  if (count > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    throw DataError(path, "token count " + std::to_string(count) + " exceeds int64");
  }

  TokenShard s = opened(path, f.fd, file_bytes, ShardFormat::Meshtrain, kTokenShardHeaderBytes,
                        static_cast<int64_t>(count), bytes_per_token);
  s.vocab_size_ = vocab_size;
  s.checksum_ = load_u64(h + 32);
  return s;
}

TokenShard TokenShard::open_llmc(const std::string& path, int fd, uint64_t file_bytes,
                                 const unsigned char* h) {
  int32_t magic, version, count;
  std::memcpy(&magic, h, 4);
  std::memcpy(&version, h + 4, 4);
  std::memcpy(&count, h + 8, 4);
  const int32_t want = magic == kLlmcMagicGpt2 ? kLlmcVersionGpt2 : kLlmcVersionLlama3;
  if (version != want)
    throw DataError(path, "llm.c token shard (magic " + std::to_string(magic) + ") of version " +
                              std::to_string(version) + ", expected " + std::to_string(want) +
                              " (magic 20240520 goes with version 1, uint16 tokens; 20240801 "
                              "with version 7, uint32 tokens)");
  const uint32_t bytes_per_token = magic == kLlmcMagicGpt2 ? 2 : 4;
  if (count < 0) throw DataError(path, "llm.c token shard header holds a negative token count");
  const uint64_t expected = kLlmcHeaderBytes + uint64_t(count) * bytes_per_token;
  if (file_bytes != expected)
    throw DataError(path, std::string(file_bytes < expected ? "truncated" : "oversized") +
                              " llm.c token shard: header promises " + std::to_string(count) +
                              " tokens (" + std::to_string(expected) + " bytes), file holds " +
                              std::to_string(file_bytes) + " bytes");
  // No vocabulary and no checksum in the header: vocab_size_ and checksum_ stay 0.
  return opened(path, fd, file_bytes, ShardFormat::Llmc, kLlmcHeaderBytes, count, bytes_per_token);
}

TokenShard TokenShard::opened(const std::string& path, int fd, uint64_t file_bytes,
                              ShardFormat format, uint64_t header_bytes, int64_t count,
                              uint32_t bytes_per_token) {
  TokenShard s;
  s.fd_ = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);  // the caller closes its own
  if (s.fd_ < 0) throw DataError(path, "cannot keep the token shard open: " + errno_text());
  // Advice only: a failure changes speed, not results.
  (void)::posix_fadvise(s.fd_, 0, 0, POSIX_FADV_RANDOM);
  s.format_ = format;
  s.path_ = path;
  s.file_bytes_ = file_bytes;
  s.header_bytes_ = header_bytes;
  s.count_ = count;
  s.bytes_per_token_ = bytes_per_token;
  return s;
}

TokenShard::TokenShard(TokenShard&& o) noexcept
    : path_(std::move(o.path_)),
      fd_(o.fd_),
      file_bytes_(o.file_bytes_),
      header_bytes_(o.header_bytes_),
      format_(o.format_),
      count_(o.count_),
      bytes_per_token_(o.bytes_per_token_),
      vocab_size_(o.vocab_size_),
      checksum_(o.checksum_) {
  o.fd_ = -1;
  o.count_ = 0;
}

TokenShard& TokenShard::operator=(TokenShard&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    file_bytes_ = o.file_bytes_;
    header_bytes_ = o.header_bytes_;
    format_ = o.format_;
    count_ = o.count_;
    bytes_per_token_ = o.bytes_per_token_;
    vocab_size_ = o.vocab_size_;
    checksum_ = o.checksum_;
    o.fd_ = -1;
    o.count_ = 0;
  }
  return *this;
}

TokenShard::~TokenShard() { release(); }

void TokenShard::release() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void TokenShard::read_tokens(int64_t first, int64_t count, void* out) const {
  const uint64_t offset = header_bytes_ + static_cast<uint64_t>(first) * bytes_per_token_;
  const size_t bytes = static_cast<size_t>(count) * bytes_per_token_;
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd_, static_cast<char*>(out) + done, bytes - done,
                              static_cast<off_t>(offset + done));
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    struct stat st {};
    const std::string now = ::fstat(fd_, &st) == 0 ? std::to_string(st.st_size) + " bytes" : "unknown";
    throw DataError(path_, n < 0 ? "cannot read tokens at byte offset " + std::to_string(offset + done) +
                                       ": " + errno_text()
                                 : "the token shard was truncated while this run used it: it held " +
                                       std::to_string(file_bytes_) + " bytes when opened, " + now +
                                       " now (byte offset " + std::to_string(offset + done) +
                                       " is past its end); a shard must not change while a run reads "
                                       "it: write new shards under new names and rename them into "
                                       "place (the run keeps reading the file it opened)");
  }
}

uint32_t TokenShard::token(int64_t i) const {
  if (i < 0 || i >= count_) {
    throw std::out_of_range(path_ + ": token " + std::to_string(i) + " out of range [0, " +
                            std::to_string(count_) + ")");
  }
  unsigned char b[4] = {};
  read_tokens(i, 1, b);
  if (bytes_per_token_ == 2) {
    uint16_t v;
    std::memcpy(&v, b, 2);
    return v;
  }
  return load_u32(b);
}

void TokenShard::read(int64_t begin, int64_t count, int32_t* out) const {
  if (begin < 0 || count < 0 || begin > count_ - count) {
    throw std::out_of_range(path_ + ": tokens [" + std::to_string(begin) + ", " +
                            std::to_string(begin + count) + ") out of range [0, " +
                            std::to_string(count_) + ")");
  }
  if (count == 0) return;  // `out` may be an empty vector's null data()
  if (bytes_per_token_ == 2) {
    // Read into the upper half of `out`, then widen from the front: each int32 written lies at
    // or below the uint16 it comes from (4i <= 2(count + i)), so nothing is overwritten unread.
    auto* bytes = reinterpret_cast<unsigned char*>(out);
    unsigned char* half = bytes + 2 * static_cast<size_t>(count);
    read_tokens(begin, count, half);
    for (int64_t i = 0; i < count; ++i) {
      uint16_t v;
      std::memcpy(&v, half + 2 * i, 2);
      out[i] = v;
    }
  } else {
    // Tokens are < vocab_size <= 2^32; int32 holds every vocabulary a model can embed.
    read_tokens(begin, count, out);
  }
}

bool TokenShard::verify_checksum() const {
  // One sequential pass: let the kernel read ahead, then go back to random-access advice.
  (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
  constexpr int64_t kChunkTokens = 1 << 18;
  std::vector<unsigned char> chunk(static_cast<size_t>(std::min<int64_t>(count_, kChunkTokens)) * bytes_per_token_);
  uint64_t h = fnv1a64(nullptr, 0);
  for (int64_t start = 0; start < count_; start += kChunkTokens) {
    const int64_t len = std::min(kChunkTokens, count_ - start);
    read_tokens(start, len, chunk.data());
    h = fnv1a64(chunk.data(), static_cast<size_t>(len) * bytes_per_token_, h);
  }
  (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_RANDOM);
  return h == checksum_;
}

namespace {

// The index of the first token in [p, p + n) that is >= vocab, or n. The maximum is taken
// first, in a loop the compiler vectorises; only a chunk holding a bad token is searched.
template <class T>
size_t first_out_of_vocabulary(const unsigned char* p, size_t n, uint32_t vocab) {
  T largest = 0;
  for (size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    largest = std::max(largest, v);
  }
  if (largest < vocab) return n;
  for (size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    if (v >= vocab) return i;
  }
  return n;
}

std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

void TokenShard::verify(uint32_t model_vocab) const {
  const bool llmc = format_ == ShardFormat::Llmc;
  const uint32_t bound = llmc ? model_vocab : vocab_size_;
  const size_t header = llmc ? kLlmcHeaderBytes : kTokenShardHeaderBytes;
  // Chunks small enough to stay in cache between the vocabulary scan and the hash, so that
  // the file is read from memory (or disk) once.
  constexpr size_t kChunkTokens = 1 << 15;
  const size_t n = static_cast<size_t>(count_);
  (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<unsigned char> chunk(std::min(kChunkTokens, n) * bytes_per_token_);
  uint64_t h = fnv1a64(nullptr, 0);
  for (size_t start = 0; start < n; start += kChunkTokens) {
    const size_t len = std::min(kChunkTokens, n - start);
    read_tokens(static_cast<int64_t>(start), static_cast<int64_t>(len), chunk.data());
    const unsigned char* p = chunk.data();
    const size_t bad = bound == 0 ? len
                       : bytes_per_token_ == 2 ? first_out_of_vocabulary<uint16_t>(p, len, bound)
                                               : first_out_of_vocabulary<uint32_t>(p, len, bound);
    if (bad < len) {
      (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_RANDOM);
      const int64_t index = static_cast<int64_t>(start + bad);
      const std::string where = "token " + std::to_string(token(index)) + " at byte offset " +
                                std::to_string(header + index * bytes_per_token_) + " (token " +
                                std::to_string(index) + ")";
      if (llmc)
        throw DataError(path_, where + " is not below model.vocab_size " + std::to_string(bound) +
                                   " (an llm.c shard records no vocabulary size, so the model's "
                                   "bounds its tokens): set model.vocab_size to the vocabulary "
                                   "the shard was tokenized with (GPT-2: 50257)");
      throw DataError(path_, where + " is not below the header's vocab_size " +
                                 std::to_string(vocab_size_) +
                                 ": the shard is corrupt or was written for another vocabulary");
    }
    if (!llmc) h = fnv1a64(p, len * bytes_per_token_, h);
  }
  (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_RANDOM);
  if (!llmc && h != checksum_) {
    throw DataError(path_, "checksum mismatch: the token bytes at offsets 64 to " +
                               std::to_string(file_bytes_) + " hash to " + hex64(h) +
                               ", the header (offset 32) says " + hex64(checksum_) +
                               ": the shard is corrupt (write it again with `meshtrain prepare`)");
  }
}

TokenShardWriter::TokenShardWriter(std::string path, uint32_t vocab_size)
    : path_(std::move(path)),
      tmp_(path_ + ".tmp"),
      vocab_size_(vocab_size),
      bytes_per_token_(vocab_size <= 65536 ? 2 : 4),
      hash_(fnv1a64(nullptr, 0)) {
  if (vocab_size == 0) throw DataError(path_, "cannot write a token shard with vocab_size 0");
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (f_ == nullptr) throw DataError(tmp_, "cannot create token shard: " + errno_text());
  unsigned char header[kTokenShardHeaderBytes] = {};
  std::memcpy(header, kTokenShardMagic, 8);
  store_u32(header + 8, kTokenShardVersion);
  store_u32(header + 12, bytes_per_token_);
  store_u32(header + 24, vocab_size_);
  store_u32(header + 28, kTokenShardHeaderBytes);
  // Count and checksum are patched in by finish().
  if (std::fwrite(header, 1, sizeof header, f_) != sizeof header) fail("cannot write header");
}

TokenShardWriter::~TokenShardWriter() {
  if (f_ != nullptr) std::fclose(f_);
  if (!published_) std::remove(tmp_.c_str());
}

void TokenShardWriter::fail(const std::string& what) {
  const std::string why = errno_text();
  std::fclose(f_);
  f_ = nullptr;
  std::remove(tmp_.c_str());
  throw DataError(tmp_, what + ": " + why);
}

void TokenShardWriter::append(const uint32_t* tokens, size_t n) {
  constexpr size_t kChunk = 1 << 16;
  buf_.resize(kChunk * bytes_per_token_);
  for (size_t start = 0; start < n; start += kChunk) {
    const size_t m = std::min(kChunk, n - start);
    for (size_t i = 0; i < m; ++i) {
      const uint32_t t = tokens[start + i];
      if (t >= vocab_size_)
        throw DataError(path_, "token " + std::to_string(t) + " at position " +
                                   std::to_string(count_ + static_cast<int64_t>(start + i)) +
                                   " is not below vocab_size " + std::to_string(vocab_size_));
      if (bytes_per_token_ == 2) {
        const uint16_t v = static_cast<uint16_t>(t);
        std::memcpy(buf_.data() + 2 * i, &v, 2);
      } else {
        store_u32(buf_.data() + 4 * i, t);
      }
    }
    const size_t bytes = m * bytes_per_token_;
    hash_ = fnv1a64(buf_.data(), bytes, hash_);
    if (std::fwrite(buf_.data(), 1, bytes, f_) != bytes) fail("cannot write tokens");
  }
  count_ += static_cast<int64_t>(n);
}

void TokenShardWriter::finish() {
  seal();
  publish();
}

void TokenShardWriter::seal() {
  unsigned char v[8];
  store_u64(v, static_cast<uint64_t>(count_));
  if (std::fseek(f_, 16, SEEK_SET) != 0 || std::fwrite(v, 1, 8, f_) != 8)
    fail("cannot write token count");
  store_u64(v, hash_);
  if (std::fseek(f_, 32, SEEK_SET) != 0 || std::fwrite(v, 1, 8, f_) != 8)
    fail("cannot write checksum");
  if (std::fflush(f_) != 0 || ::fsync(::fileno(f_)) != 0) fail("cannot flush token shard");
  const int rc = std::fclose(f_);
  f_ = nullptr;
  if (rc != 0) {
    const std::string why = errno_text();
    std::remove(tmp_.c_str());
    throw DataError(tmp_, "cannot close token shard: " + why);
  }
}

void TokenShardWriter::publish() {
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string why = errno_text();
    std::remove(tmp_.c_str());
    throw DataError(path_, "cannot rename " + tmp_ + " to the final name: " + why);
  }
  published_ = true;
}

void write_token_shard(const std::string& path, const std::vector<uint32_t>& tokens,
                       uint32_t vocab_size) {
  if (vocab_size == 0) throw DataError(path, "cannot write a token shard with vocab_size 0");
  // Checked before the file is created, as before: a bad token leaves no .tmp behind.
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= vocab_size) {
      throw DataError(path, "token " + std::to_string(tokens[i]) + " at position " +
                                std::to_string(i) + " is not below vocab_size " +
                                std::to_string(vocab_size));
    }
  }
  TokenShardWriter w(path, vocab_size);
  w.append(tokens.data(), tokens.size());
  w.finish();
}

}  // namespace meshtrain
