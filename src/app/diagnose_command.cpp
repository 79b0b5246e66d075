// meshtrain diagnose RUNDIR: the flight records of every rank, read together (comm/flight_report.h).

#include <cstdio>

#include "meshtrain/app/commands.h"
#include "meshtrain/comm/flight_report.h"

namespace meshtrain {

int diagnose_command(const DiagnoseArgs& args) {
  const FlightReport report = analyse_run_dir(args.run_dir);
  if (report.records == 0) {
    std::fprintf(stderr,
                 "meshtrain diagnose: error: %s/flight/ holds no readable flight records "
                 "(rank_*.rec): give the run directory (run.dir) of a `meshtrain train` job that "
                 "ran with run.flight_records > 0\n",
                 args.run_dir.c_str());
    for (const std::string& n : report.notes) std::fprintf(stderr, "  %s\n", n.c_str());
    return kExitInput;
  }
  std::printf("flight records of %d rank(s) in %s/flight (job of %d ranks)\n%s", report.records,
              args.run_dir.c_str(), report.ranks, report.text().c_str());
  return kExitOk;
}

}  // namespace meshtrain
