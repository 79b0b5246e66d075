// meshtrain diagnose RUNDIR: the flight records of every rank, read together (comm/flight_report.h).

#include <cstdio>
#include <exception>

#include "meshtrain/app/commands.h"
#include "meshtrain/comm/flight_report.h"

namespace meshtrain {

int diagnose_command(const DiagnoseArgs& args) {
  const std::vector<std::string> paths = flight_record_paths(args.run_dir);
  if (paths.empty()) {
    std::fprintf(stderr,
                 "meshtrain diagnose: error: %s/flight/ holds no flight records (rank_*.rec): give "
                 "the run directory (run.dir) of a `meshtrain train` job that ran with "
                 "run.flight_records > 0\n",
                 args.run_dir.c_str());
    return kExitInput;
  }
  std::vector<FlightRecord> records;
  for (const std::string& path : paths) {
    try {
      records.push_back(read_flight_record(path));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "meshtrain diagnose: warning: skipped %s\n", e.what());
    }
  }
  const FlightReport report = analyse_flight(records);
  std::printf("flight records of %zu rank(s) in %s/flight (job of %d ranks)\n%s", records.size(),
              args.run_dir.c_str(), report.ranks, report.text().c_str());
  return kExitOk;
}

}  // namespace meshtrain
