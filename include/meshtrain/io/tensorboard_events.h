#pragma once
// The bytes of a TensorBoard event file: TFRecord framing around protobuf-encoded Event messages
// (tensorflow/core/util/event.proto, tensorflow/core/framework/summary.proto), with the CRC32C
// the framing checks. Encoding only; the writer that decides what to log is tensorboard_writer.h.
//
// The wire encoder is written here rather than taken from libprotobuf: three messages with
// five fields (Event{wall_time, step, file_version, summary}, Summary{value},
// Summary.Value{tag, simple_value}) are a few dozen lines, while the library would add a
// protoc step to the build and a dependency to every machine that runs meshtrain.
// CRC32C (Castagnoli) is table-driven here too: Debian ships no C library for it.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace meshtrain {

// CRC-32C (polynomial 0x1EDC6F41, reflected), as TFRecord and iSCSI use it:
// crc32c("123456789") == 0xE3069283.
uint32_t crc32c(std::string_view bytes);

// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8, so that a CRC stored inside
// the data it covers does not checksum to a fixed value.
uint32_t masked_crc32c(std::string_view bytes);

// One TFRecord: uint64 length, masked CRC of those 8 bytes, the payload, masked CRC of the
// payload (little-endian). A reader that finds a record cut short or a CRC that does not match
// stops there, keeping every whole record before it.
std::string tfrecord(std::string_view payload);

// An Event naming the file's format, the first record of every event file:
// Event{wall_time, file_version: "brain.Event:2"}.
std::string file_version_event(double wall_time);

// An Event of scalars: Event{wall_time, step, summary{value{tag, simple_value} ...}}.
// TensorBoard's scalars are float32; `scalars` are rounded to it.
std::string scalar_event(double wall_time, int64_t step,
                         const std::vector<std::pair<std::string, double>>& scalars);

}  // namespace meshtrain
