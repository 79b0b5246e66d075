#pragma once
// The safetensors file format (Hugging Face, https://github.com/huggingface/safetensors): a
// writer and a validating reader. This file is the format only; which tensors a GPT-2, Llama or
// Qwen 3 has and how meshtrain's parameters map onto them is each family's HF format
// (families/gpt2/hf_gpt2.h, families/llama/hf_llama.h), a sharded directory app/hf_directory.h
// (reading) and app/hf_shards.h (writing).
//
//   | offset     | bytes | content                                                          |
//   |------------|-------|------------------------------------------------------------------|
//   | 0          | 8     | N, the header length: u64 little-endian                          |
//   | 8          | N     | JSON object, UTF-8, padded with spaces to make 8 + N a multiple of 8 |
//   | 8 + N      | rest  | the data: every tensor's bytes, little-endian, row-major         |
//
// The header maps each tensor name to {"dtype": "F32", "shape": [2, 3], "data_offsets":
// [begin, end]}, byte offsets relative to the start of the data; the optional key
// "__metadata__" holds a {string: string} object. The tensors tile the data exactly: sorted by
// begin, the first starts at 0, each starts where the previous ended, the last ends at the end of
// the file, and each spans numel x element size bytes. The reader refuses anything else (as the
// reference implementation does), so a truncated or overlapping file never yields tensors.

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

// The element types meshtrain reads and writes; the format knows more (F64, I64, F8_E5M2, ...),
// which the reader refuses by name. F8_E4M3 (OCP e4m3fn, one byte) is read only: its codes mean
// nothing without the block scales beside them (families/hf/hf_fp8.h), so read_f32 refuses it and
// the codes come from read_raw.
enum class SafeDType { F32, F16, BF16, F8_E4M3 };
std::string_view safetensors_dtype_name(SafeDType t);  // "F32"
size_t safetensors_dtype_size(SafeDType t);

// Every refusal: the message starts with the file's path and says what was found and what the
// format (or this reader) accepts.
class SafetensorsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct SafetensorsEntry {
  std::string name;
  SafeDType dtype = SafeDType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range in the data section

  int64_t numel() const;
  std::string shape_string() const;  // "(768, 2304)"
};

class SafetensorsWriter {
 public:
  // `bytes`: the tensor's elements, row-major, little-endian, numel x element size of them.
  // Tensors are laid out in the order added; names must be unique and not "__metadata__".
  void add(const std::string& name, SafeDType dtype, std::vector<int64_t> shape, std::vector<char> bytes);
  void set_metadata(std::map<std::string, std::string> metadata) { metadata_ = std::move(metadata); }

  // The 8-byte length and the padded JSON header, as written before the data.
  std::string header() const;
  // Writes the file under a temporary name beside `path` (<path>.tmp.<pid>), flushes it to the
  // device and renames it over `path`: a failure leaves `path` as it was. Throws
  // SafetensorsError naming the file and the reason.
  void write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    SafeDType dtype;
    std::vector<int64_t> shape;
    std::vector<char> bytes;
  };
  std::vector<Tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Element conversions (little-endian host; IEEE binary16 and bfloat16 widen exactly).
std::vector<float> f16_to_f32(const uint16_t* data, size_t n);
std::vector<float> bf16_to_f32(const uint16_t* data, size_t n);
std::vector<uint16_t> f32_to_bf16(const float* data, size_t n);  // round to nearest, ties to even

class SafetensorsFile {
 public:
  // Reads and validates the header (see the top of this file); throws SafetensorsError on a
  // file that is missing, too short, whose header length runs past the end, whose header is not
  // a JSON object of well-formed entries, with an unknown dtype, or whose offsets overlap, leave
  // gaps or run past the data.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return path_; }
  // Every tensor, in the order of their data (by begin).
  const std::vector<SafetensorsEntry>& tensors() const { return tensors_; }
  const SafetensorsEntry* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor's bytes as stored.
  std::vector<char> read_raw(const SafetensorsEntry& e) const;
  // The tensor's elements widened to float32 (exact for F32, F16 and BF16); throws
  // SafetensorsError naming the tensor for F8_E4M3, whose values need their scales.
  std::vector<float> read_f32(const SafetensorsEntry& e) const;

 private:
  std::string path_;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace meshtrain
