#include "meshtrain/io/tensorboard_events.h"

#include <array>
#include <cstring>

namespace meshtrain {

namespace {

// The byte-at-a-time table of the reflected Castagnoli polynomial 0x82F63B78.
std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? 0x82F63B78u : 0u);
    table[i] = crc;
  }
  return table;
}

void put_little_endian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((value >> (8 * i)) & 0xFF);
}

// Protobuf wire format (protobuf.dev/programming-guides/encoding): a key is
// (field number << 3) | wire type, then the value.
enum class WireType : uint32_t { Varint = 0, Fixed64 = 1, LengthDelimited = 2, Fixed32 = 5 };

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out += static_cast<char>((value & 0x7F) | 0x80);
    value >>= 7;
  }
  out += static_cast<char>(value);
}

void put_key(std::string& out, uint32_t field, WireType type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | static_cast<uint32_t>(type));
}

void put_double(std::string& out, uint32_t field, double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(out, field, WireType::Fixed64);
  put_little_endian(out, bits, 8);
}

void put_float(std::string& out, uint32_t field, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(out, field, WireType::Fixed32);
  put_little_endian(out, bits, 4);
}

void put_int64(std::string& out, uint32_t field, int64_t value) {
  put_key(out, field, WireType::Varint);
  put_varint(out, static_cast<uint64_t>(value));  // int64: two's complement, 10 bytes if negative
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, WireType::LengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// Field numbers of event.proto's Event and summary.proto's Summary and Summary.Value.
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5;
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1, kValueSimpleValue = 2;

}  // namespace

uint32_t crc32c(std::string_view bytes) {
  static const std::array<uint32_t, 256> table = make_crc32c_table();
  uint32_t crc = 0xFFFFFFFFu;
  for (const char c : bytes) crc = table[(crc ^ static_cast<unsigned char>(c)) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view payload) {
  std::string length;
  put_little_endian(length, payload.size(), 8);
  std::string record = length;
  put_little_endian(record, masked_crc32c(length), 4);
  record.append(payload);
  put_little_endian(record, masked_crc32c(payload), 4);
  return record;
}

std::string file_version_event(double wall_time) {
  std::string event;
  put_double(event, kEventWallTime, wall_time);
  put_bytes(event, kEventFileVersion, "brain.Event:2");
  return event;
}

std::string scalar_event(double wall_time, int64_t step,
                         const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string entry;
    put_bytes(entry, kValueTag, tag);
    put_float(entry, kValueSimpleValue, static_cast<float>(value));
    put_bytes(summary, kSummaryValue, entry);
  }
  std::string event;
  put_double(event, kEventWallTime, wall_time);
  put_int64(event, kEventStep, step);
  put_bytes(event, kEventSummary, summary);
  return event;
}

}  // namespace meshtrain
