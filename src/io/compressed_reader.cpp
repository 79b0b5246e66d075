#include "meshtrain/io/compressed_reader.h"

#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <cstring>

#include "meshtrain/io/data_error.h"

namespace meshtrain {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

constexpr size_t kInputBytes = 1u << 18;

}  // namespace

Compression compression_of(const std::string& path) {
  if (ends_with(path, ".gz")) return Compression::Gzip;
  if (ends_with(path, ".zst")) return Compression::Zstd;
  return Compression::None;
}

// One of zlib's or libzstd's stream states, whichever the file needs.
struct CompressedReader::Decoder {
  z_stream z{};
  bool z_open = false;
  ZSTD_DStream* zstd = nullptr;
  // libzstd's last ZSTD_decompressStream hint: 0 once a frame is complete. Data that ends
  // while it is not 0 was cut short (an empty file, no frame at all, too).
  size_t zstd_hint = 1;
  // zlib: true between a member's end and the start of the next (gzip files may hold several
  // members, as `cat a.gz b.gz` makes; gzip -d reads them all).
  bool z_between_members = false;

  ~Decoder() {
    if (z_open) inflateEnd(&z);
    if (zstd != nullptr) ZSTD_freeDStream(zstd);
  }
};

CompressedReader::CompressedReader(const std::string& path)
    : path_(path), kind_(compression_of(path)), file_(path, std::ios::binary),
      decoder_(std::make_unique<Decoder>()) {
  if (!file_) throw DataError(path, std::string("cannot open: ") + std::strerror(errno));
  if (kind_ == Compression::None) return;
  in_.resize(kInputBytes);
  if (kind_ == Compression::Gzip) {
    // 16 + MAX_WBITS: a gzip header and trailer (CRC-32 and length checked), not raw zlib.
    if (inflateInit2(&decoder_->z, 16 + MAX_WBITS) != Z_OK)
      throw DataError(path, "cannot start the gzip decoder (out of memory?)");
    decoder_->z_open = true;
  } else {
    decoder_->zstd = ZSTD_createDStream();
    if (decoder_->zstd == nullptr || ZSTD_isError(ZSTD_initDStream(decoder_->zstd)))
      throw DataError(path, "cannot start the zstd decoder (out of memory?)");
  }
}

CompressedReader::~CompressedReader() = default;

size_t CompressedReader::fill_input() {
  if (file_done_) return 0;
  file_.read(in_.data(), static_cast<std::streamsize>(in_.size()));
  const auto got = static_cast<size_t>(file_.gcount());
  if (got < in_.size()) {
    if (file_.bad()) throw DataError(path_, "error while reading the file");
    file_done_ = true;
  }
  in_pos_ = 0;
  in_end_ = got;
  return got;
}

size_t CompressedReader::read(char* out, size_t n) {
  if (n == 0 || data_done_) return 0;
  if (kind_ == Compression::None) {
    file_.read(out, static_cast<std::streamsize>(n));
    const auto got = static_cast<size_t>(file_.gcount());
    if (got < n && file_.bad()) throw DataError(path_, "error while reading the file");
    if (got == 0) data_done_ = true;
    return got;
  }
  const char* what = kind_ == Compression::Gzip ? "gzip" : "zstd";
  const std::string hint = std::string(" (a damaged or partial download? `") +
                           (kind_ == Compression::Gzip ? "gzip -t " : "zstd -t ") + path_ +
                           "` checks the file)";
  size_t produced = 0;
  while (produced == 0) {
    if (in_pos_ == in_end_ && fill_input() == 0) {
      const bool complete = kind_ == Compression::Gzip ? decoder_->z_between_members
                                                       : decoder_->zstd_hint == 0;
      if (!complete)
        throw DataError(path_, std::string("the ") + what + " data ends before its stream does: "
                               "the file is truncated" + hint);
      data_done_ = true;
      return 0;
    }
    if (kind_ == Compression::Gzip) {
      z_stream& z = decoder_->z;
      if (decoder_->z_between_members) {
        if (inflateReset(&z) != Z_OK) throw DataError(path_, "cannot reset the gzip decoder");
        decoder_->z_between_members = false;
      }
      z.next_in = reinterpret_cast<Bytef*>(in_.data() + in_pos_);
      z.avail_in = static_cast<uInt>(in_end_ - in_pos_);
      z.next_out = reinterpret_cast<Bytef*>(out);
      z.avail_out = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
      const int rc = inflate(&z, Z_NO_FLUSH);
      in_pos_ = in_end_ - z.avail_in;
      produced = static_cast<size_t>(reinterpret_cast<char*>(z.next_out) - out);
      if (rc == Z_STREAM_END) {
        decoder_->z_between_members = true;
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        throw DataError(path_, std::string("corrupt gzip data: ") +
                                   (z.msg != nullptr ? z.msg : "inflate failed") + hint);
      }
    } else {
      ZSTD_inBuffer zin{in_.data() + in_pos_, in_end_ - in_pos_, 0};
      ZSTD_outBuffer zout{out, n, 0};
      const size_t rc = ZSTD_decompressStream(decoder_->zstd, &zout, &zin);
      if (ZSTD_isError(rc))
        throw DataError(path_, std::string("corrupt zstd data: ") + ZSTD_getErrorName(rc) + hint);
      decoder_->zstd_hint = rc;
      in_pos_ += zin.pos;
      produced = zout.pos;
    }
  }
  return produced;
}

uint64_t decompressed_size(const std::string& path) {
  CompressedReader r(path);
  std::vector<char> buf(1u << 20);
  uint64_t total = 0;
  while (const size_t got = r.read(buf.data(), buf.size())) total += got;
  return total;
}

}  // namespace meshtrain
