#include "meshtrain/io/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "meshtrain/io/regular_file.h"
#include "meshtrain/io/terminal_text.h"
#include "meshtrain/tensor/bf16.h"

namespace meshtrain {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this build copies bytes as they are");

namespace {

using nlohmann::json;

// The reference implementation refuses headers above 100 MB: a corrupt length must not make
// the reader allocate gigabytes.
constexpr uint64_t kMaxHeader = uint64_t{100} << 20;
constexpr const char* kAccepted = "F32, F16, BF16 or F8_E4M3";

// The header's names and values come from whoever made the file: escaped whole, so that a NUL
// does not cut the message short and an escape sequence is shown, not obeyed.
[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw SafetensorsError(terminal_safe(path + ": " + what));
}

bool parse_dtype(const std::string& s, SafeDType& out) {
  if (s == "F32")
    out = SafeDType::F32;
  else if (s == "F16")
    out = SafeDType::F16;
  else if (s == "BF16")
    out = SafeDType::BF16;
  else if (s == "F8_E4M3")
    out = SafeDType::F8_E4M3;
  else
    return false;
  return true;
}

// numel x size, refusing overflow (a hostile shape must not wrap around to a small size).
uint64_t byte_size(const std::vector<int64_t>& shape, size_t element, bool& overflow) {
  uint64_t n = element;
  overflow = false;
  for (int64_t d : shape) {
    if (d != 0 && n > UINT64_MAX / static_cast<uint64_t>(d)) overflow = true;
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const json& v) {
  const std::string where = "tensor '" + name + "'";
  if (!v.is_object())
    fail(path, where + " is " + std::string(v.type_name()) +
                   " in the header (expected an object with dtype, shape and data_offsets)");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key))
      fail(path, where + " has no '" + key + "' (expected dtype, shape and data_offsets)");
  SafetensorsEntry e;
  e.name = name;
  const json& dt = v["dtype"];
  if (!dt.is_string() || !parse_dtype(dt.get<std::string>(), e.dtype))
    fail(path, where + " has dtype " + dt.dump() +
                   ", which this reader does not accept (accepted: " + kAccepted + ")");
  const json& shape = v["shape"];
  if (!shape.is_array())
    fail(path, where + " has shape " + shape.dump() + " (expected an array of integers >= 0)");
  for (const json& d : shape) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      fail(path, where + " has shape " + shape.dump() + " (expected an array of integers >= 0)");
    e.shape.push_back(d.get<int64_t>());
  }
  const json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned() ||
      off[0].get<uint64_t>() > off[1].get<uint64_t>())
    fail(path, where + " has data_offsets " + off.dump() + " (expected [begin, end], 0 <= begin <= end)");
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  bool overflow = false;
  const uint64_t want = byte_size(e.shape, safetensors_dtype_size(e.dtype), overflow);
  if (overflow || e.end - e.begin != want)
    fail(path, where + " spans " + std::to_string(e.end - e.begin) + " bytes (data_offsets " + off.dump() +
                   ") but shape " + e.shape_string() + " of " + std::string(safetensors_dtype_name(e.dtype)) +
                   " needs " + (overflow ? "more than 2^64" : std::to_string(want)));
  return e;
}

std::vector<char> read_bytes(const std::string& path, uint64_t offset, uint64_t n) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, std::string("cannot open: ") + std::strerror(errno));
  std::vector<char> out(n);
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(out.data(), static_cast<std::streamsize>(n));
  if (!in || static_cast<uint64_t>(in.gcount()) != n)
    fail(path, "cannot read " + std::to_string(n) + " bytes at offset " + std::to_string(offset) +
                   " (the file changed or is damaged)");
  return out;
}

}  // namespace

std::string_view safetensors_dtype_name(SafeDType t) {
  switch (t) {
    case SafeDType::F32:
      return "F32";
    case SafeDType::F16:
      return "F16";
    case SafeDType::BF16:
      return "BF16";
    case SafeDType::F8_E4M3:
      return "F8_E4M3";
  }
  return "?";
}

size_t safetensors_dtype_size(SafeDType t) {
  switch (t) {
    case SafeDType::F32:
      return 4;
    case SafeDType::F16:
    case SafeDType::BF16:
      return 2;
    case SafeDType::F8_E4M3:
      return 1;
  }
  return 0;
}

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string SafetensorsEntry::shape_string() const {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

// ---- conversions ---------------------------------------------------------------------------

std::vector<float> f16_to_f32(const uint16_t* data, size_t n) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t h = data[i];
    const uint32_t sign = (h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, bits;
    if (exp == 0x1f) {
      bits = sign | 0x7f800000u | (mant << 13);  // inf, NaN (payload kept)
    } else if (exp != 0) {
      bits = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
    } else if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = 113;
      while (!(mant & 0x400u)) {
        mant <<= 1;
        --e;
      }
      bits = sign | (static_cast<uint32_t>(e) << 23) | ((mant & 0x3ffu) << 13);
    }
    out[i] = std::bit_cast<float>(bits);
  }
  return out;
}

std::vector<float> bf16_to_f32(const uint16_t* data, size_t n) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = bf16_bits_to_float(data[i]);
  return out;
}

std::vector<uint16_t> f32_to_bf16(const float* data, size_t n) {
  std::vector<uint16_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = float_to_bf16_bits(data[i]);
  return out;
}

// ---- writer --------------------------------------------------------------------------------

void SafetensorsWriter::add(const std::string& name, SafeDType dtype, std::vector<int64_t> shape,
                            std::vector<char> bytes) {
  if (name.empty() || name == "__metadata__")
    throw std::invalid_argument("safetensors: tensor name '" + name + "' is reserved");
  for (const Tensor& t : tensors_)
    if (t.name == name) throw std::invalid_argument("safetensors: tensor '" + name + "' added twice");
  bool overflow = false;
  if (byte_size(shape, safetensors_dtype_size(dtype), overflow) != bytes.size() || overflow)
    throw std::invalid_argument("safetensors: tensor '" + name + "' has " + std::to_string(bytes.size()) +
                                " bytes, not what its shape and dtype need");
  tensors_.push_back({name, dtype, std::move(shape), std::move(bytes)});
}

std::string SafetensorsWriter::header() const {
  json h = json::object();
  uint64_t at = 0;
  for (const Tensor& t : tensors_) {
    h[t.name] = {{"dtype", std::string(safetensors_dtype_name(t.dtype))},
                 {"shape", t.shape},
                 {"data_offsets", {at, at + t.bytes.size()}}};
    at += t.bytes.size();
  }
  if (!metadata_.empty()) h["__metadata__"] = metadata_;
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string out(8, '\0');
  const uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  return out + text;
}

void SafetensorsWriter::write(const std::string& path) const {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail(tmp, std::string("cannot create: ") + std::strerror(errno));
  auto put = [&](const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const std::string why = std::strerror(w < 0 ? errno : ENOSPC);
        ::close(fd);
        std::filesystem::remove(tmp);
        fail(tmp, "cannot write: " + why + " (" + path + " is left as it was)");
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
  };
  const std::string head = header();
  put(head.data(), head.size());
  for (const Tensor& t : tensors_) put(t.bytes.data(), t.bytes.size());
  const bool synced = ::fsync(fd) == 0;
  const std::string why = std::strerror(errno);
  ::close(fd);
  std::error_code ec;
  if (!synced) {
    std::filesystem::remove(tmp, ec);
    fail(tmp, "cannot flush to the device: " + why + " (" + path + " is left as it was)");
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    fail(path, "cannot rename " + tmp + " over it: " + ec.message());
  }
}

// ---- reader --------------------------------------------------------------------------------

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  if (const std::string problem = regular_file_problem(path); !problem.empty())
    fail(path, problem + "; expected a safetensors file (an 8-byte header length, a JSON header, the tensors' "
                         "bytes)");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, std::string("cannot open: ") + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  if (size < 8)
    fail(path, "is " + std::to_string(size) +
                   " bytes long, shorter than the 8-byte header length "
                   "(not a safetensors file, or truncated)");
  in.seekg(0);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  if (n > size - 8)
    fail(path, "header length " + std::to_string(n) + " runs past the end of the file (" +
                   std::to_string(size) + " bytes: truncated, or not a safetensors file)");
  if (n > kMaxHeader)
    fail(path, "header length " + std::to_string(n) + " is above the format's limit of " +
                   std::to_string(kMaxHeader) + " bytes");
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  if (!in) fail(path, "cannot read the header");

  json h;
  try {
    h = json::parse(text);
  } catch (const json::exception& e) {  // syntax, and numbers beyond a double (out_of_range)
    fail(path, std::string("the header is not valid JSON (") + e.what() + ")");
  }
  if (!h.is_object())
    fail(path, "the header is JSON " + std::string(h.type_name()) + ", not an object of tensors");

  SafetensorsFile f;
  f.path_ = path;
  f.data_start_ = 8 + n;
  const uint64_t data_size = size - f.data_start_;
  for (const auto& [key, value] : h.items()) {
    if (key == "__metadata__") {
      if (!value.is_object())
        fail(path, "__metadata__ is " + std::string(value.type_name()) + " (expected an object of strings)");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string())
          fail(path, "__metadata__ key '" + k + "' is " + v.dump() + " (expected a string)");
        f.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    f.tensors_.push_back(parse_entry(path, key, value));
  }
  std::sort(f.tensors_.begin(), f.tensors_.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // The tensors must tile the data: no overlap, no gap, nothing past the end.
  uint64_t at = 0;
  for (const SafetensorsEntry& e : f.tensors_) {
    const std::string range = "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ")";
    if (e.end > data_size)
      fail(path, "tensor '" + e.name + "' has data_offsets " + range + " past the end of the data (" +
                     std::to_string(data_size) + " bytes: truncated?)");
    if (e.begin < at)
      fail(path, "tensor '" + e.name + "' has data_offsets " + range +
                     ", overlapping the tensor before it "
                     "(which ends at " +
                     std::to_string(at) + "); tensors must not share bytes");
    if (e.begin > at)
      fail(path, "tensor '" + e.name + "' has data_offsets " + range + ", leaving a gap after byte " +
                     std::to_string(at) + "; tensors must be contiguous");
    at = e.end;
  }
  if (at != data_size)
    fail(path, "the tensors cover " + std::to_string(at) + " bytes of data but the file has " +
                   std::to_string(data_size) + " after the header (trailing bytes: damaged?)");
  return f;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  for (const SafetensorsEntry& e : tensors_)
    if (e.name == name) return &e;
  return nullptr;
}

std::vector<char> SafetensorsFile::read_raw(const SafetensorsEntry& e) const {
  return read_bytes(path_, data_start_ + e.begin, e.end - e.begin);
}

std::vector<float> SafetensorsFile::read_f32(const SafetensorsEntry& e) const {
  if (e.dtype == SafeDType::F8_E4M3)
    fail(path_, "tensor '" + e.name + "' is F8_E4M3, whose codes are values only with the block scales "
                "config.json's quantization_config describes (read by a model import, not as plain floats)");
  const std::vector<char> raw = read_raw(e);
  const size_t n = static_cast<size_t>(e.numel());
  if (e.dtype == SafeDType::F32) {
    std::vector<float> out(n);
    std::memcpy(out.data(), raw.data(), raw.size());
    return out;
  }
  std::vector<uint16_t> half(n);
  std::memcpy(half.data(), raw.data(), raw.size());
  return e.dtype == SafeDType::F16 ? f16_to_f32(half.data(), n) : bf16_to_f32(half.data(), n);
}

}  // namespace meshtrain
