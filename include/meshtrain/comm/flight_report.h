#pragma once
// Reading the flight records of every rank of a job together (flight_recorder.h) to find where
// the ranks of a group parted ways: the first collective that some members entered and others
// did not (naming the missing ranks, their nodes and what they did last), and messages one rank
// waits for that its peer never sent. Pure: the records in, the findings out.

#include <optional>
#include <string>
#include <vector>

#include "meshtrain/comm/flight_recorder.h"

namespace meshtrain {

struct FlightFinding {
  double when = 0;  // when the first rank entered the operation (wall clock)
  std::string text;
  // Every rank missing from the operation went quiet (none of its operations was pending, or its
  // process died: FlightRecorder's liveness stamp stopped), rather than being stuck in another
  // one: the likely cause, not a victim. Such findings come first.
  bool quiet = false;
  std::vector<std::string> quiet_ranks;  // "rank 1 (node a)"
};

struct FlightReport {
  int ranks = 0;                        // world size of the job the records belong to
  std::vector<std::string> notes;       // records skipped, ranks without a record
  std::vector<FlightFinding> findings;  // quiet ones first, then earliest first
  std::vector<std::string> pending;     // operations still pending, when nothing diverged
  // Ranks whose process died, earliest death first: when one death brings down others (a
  // transport that aborts its process when a peer vanishes), the first is the cause.
  std::vector<std::string> deaths;
  int records = 0;                      // records read
  // A job whose records all stopped together, unclosed and without a signal or abort: killed
  // whole, which no record can order. Printed as the last note.
  struct KilledWhole {
    double newest_sign = 0;  // when the newest record last showed life
    std::string text;
  };
  std::optional<KilledWhole> killed_whole;
  std::string text() const;
  // "likely cause: rank 1 (node a) stopped communicating ..." or "" when no rank went quiet; the
  // ranks that died come first, in the order they died.
  std::string likely_cause() const;
};

FlightReport analyse_flight(const std::vector<FlightRecord>& records);
// Reads every record of a run directory (flight_record_paths) and analyses them; records that
// cannot be read are noted in the report and skipped.
FlightReport analyse_run_dir(const std::string& run_dir);

}  // namespace meshtrain
