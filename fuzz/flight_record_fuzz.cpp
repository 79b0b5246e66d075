// Fuzzes the flight-record reader and the analysis of what it returns: read_flight_record either
// returns a record or throws std::runtime_error; analyse_flight must take any record it returns,
// alone and beside a copy of itself posing as the next rank, and print its report.

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "fuzz_file.h"
#include "meshtrain/comm/flight_recorder.h"
#include "meshtrain/comm/flight_report.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static meshtrain::fuzz::ScratchFile file("rank_00000.rec");
  const std::string& path = file.write(data, size);
  meshtrain::FlightRecord record;
  try {
    record = meshtrain::read_flight_record(path);
  } catch (const std::runtime_error&) {
    return 0;
  }
  std::vector<meshtrain::FlightRecord> records{record};
  (void)meshtrain::analyse_flight(records).text();
  meshtrain::FlightRecord peer = record;
  peer.header.world_rank = static_cast<int32_t>(
      (static_cast<uint32_t>(record.header.world_rank) + 1u) & 0x7fffffffu);
  if (!peer.entries.empty()) peer.entries.pop_back();  // the peer stopped one operation early
  records.push_back(peer);
  const meshtrain::FlightReport report = meshtrain::analyse_flight(records);
  (void)report.text();
  (void)report.likely_cause();
  return 0;
}
