#pragma once
// Reads a file as a stream of its bytes, decompressing .gz (zlib) and .zst (libzstd) on the
// way, so that `prepare` can stream a compressed corpus without unpacking it to disk or
// memory. A compressed stream that ends early or fails its checksum is a DataError naming the
// file: a damaged download must not pass for a shorter corpus.

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace meshtrain {

enum class Compression { None, Gzip, Zstd };

// Told from the name: ".gz" is gzip, ".zst" zstd, anything else is read as it is. The name,
// not the content, decides, so that plain text that happens to start with a magic number is
// never decompressed; a name that lies is refused when its bytes do not decompress.
Compression compression_of(const std::string& path);

class CompressedReader {
 public:
  explicit CompressedReader(const std::string& path);
  ~CompressedReader();
  CompressedReader(const CompressedReader&) = delete;
  CompressedReader& operator=(const CompressedReader&) = delete;

  // Up to n decompressed bytes into out; 0 only at the end of the data. DataError naming the
  // file on a read error, corrupt data, or data cut short.
  size_t read(char* out, size_t n);

  const std::string& path() const { return path_; }

 private:
  struct Decoder;
  size_t fill_input();  // raw bytes from the file into in_; 0 at its end

  std::string path_;
  Compression kind_;
  std::ifstream file_;
  std::vector<char> in_;
  size_t in_pos_ = 0, in_end_ = 0;
  bool file_done_ = false, data_done_ = false;
  std::unique_ptr<Decoder> decoder_;
};

// Reads the whole file through a CompressedReader and returns how many bytes it decompresses
// to: checks a compressed input end to end before anything is written, and gives `prepare`
// the size its validation split and progress line need.
uint64_t decompressed_size(const std::string& path);

}  // namespace meshtrain
