#pragma once
// The pieces of `meshtrain bench --suite calibrate` (app/bench_calibrate.cpp) that stand alone:
// timing one collective over message sizes on a communicator, and fitting the ring alpha-beta
// model of config/machine_profile.h to those times. Not the suite itself (bench_suites.h).

#include <mpi.h>

#include <vector>

#include "meshtrain/app/bench_report.h"
#include "meshtrain/config/machine_profile.h"

namespace meshtrain {

// One measured point: `bytes` as AlphaBeta::seconds counts them (all_gather, reduce_scatter:
// the whole gathered buffer; p2p: one message), and the median seconds of one operation.
struct LinkSample {
  double bytes = 0;
  double seconds = 0;
};

struct AlphaBetaFit {
  AlphaBeta model;
  double max_relative_error = 0;  // max over samples of |model / measured - 1|
};

// Least squares of time = steps x alpha + factor x bytes / bus_bytes_per_s with the ring step
// counts of `kind` on `ranks` ranks, each sample weighted by 1 / its time: relative errors count,
// so the small messages set alpha and the large ones the bandwidth. alpha is clamped at 0 (then
// the bandwidth is refitted alone). Needs 2+ samples of distinct sizes.
AlphaBetaFit fit_alpha_beta(CollectiveKind kind, int ranks, const std::vector<LinkSample>& samples);

// Collective over `comm` (2+ ranks): times `kind` at each size in `bytes` (fp32 elements; the
// gathered buffers rounded down to a multiple of the rank count), the median of `repeats`
// samples, each sample as many back-to-back operations as fill about 2 ms, timed by the slowest
// rank. p2p is a ping-pong between ranks 2i and 2i+1 of `comm` (all pairs at once), half a
// round trip. Results are checked; each wrong one adds to `wrong`.
std::vector<LinkSample> measure_link(MPI_Comm comm, CollectiveKind kind,
                                     const std::vector<double>& bytes, int repeats, int& wrong);

// Collective over MPI_COMM_WORLD: the calibrate suite's measurement of this machine (GEMM rates,
// memory bandwidth, links inside and across nodes) with `threads` per rank and `repeats`
// samples each, every point measured in each of `passes` interleaved passes (all points, then
// all again) and its median over them kept, its tables printed through `report` (a quiet one
// prints nothing). Every rank returns the same profile (path ""), not written anywhere.
MachineProfile measure_machine_profile(int threads, int repeats, int passes, BenchReport& report);

}  // namespace meshtrain
