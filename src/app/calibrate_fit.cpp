// The alpha-beta fit of calibrate (app/calibrate.h): weighted linear least squares in the two
// unknowns alpha and 1 / bandwidth, solved from its 2x2 normal equations.

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "meshtrain/app/calibrate.h"

namespace meshtrain {

namespace {

// The ring's multipliers of alpha and of bytes / bandwidth (config/machine_profile.h), read off
// the model itself so that the fit and the prediction can never disagree.
void ring_terms(CollectiveKind kind, int ranks, double& steps, double& factor) {
  const AlphaBeta unit_alpha{1, 1e300}, unit_beta{0, 1};
  steps = unit_alpha.seconds(kind, 1, ranks);
  factor = unit_beta.seconds(kind, 1, ranks);
}

}  // namespace

AlphaBetaFit fit_alpha_beta(CollectiveKind kind, int ranks, const std::vector<LinkSample>& samples) {
  if (samples.size() < 2) throw std::invalid_argument("fit_alpha_beta: needs 2 or more samples");
  double steps = 0, factor = 0;
  ring_terms(kind, ranks, steps, factor);
  if (steps <= 0 || factor <= 0) throw std::invalid_argument("fit_alpha_beta: a group of 1 rank moves nothing");
  // Each row: u alpha + v inv_bw = 1 with u = steps / t, v = factor bytes / t.
  double uu = 0, uv = 0, vv = 0, u1 = 0, v1 = 0;
  for (const LinkSample& s : samples) {
    const double u = steps / s.seconds, v = factor * s.bytes / s.seconds;
    uu += u * u;
    uv += u * v;
    vv += v * v;
    u1 += u;
    v1 += v;
  }
  const double det = uu * vv - uv * uv;
  double alpha = det > 0 ? (u1 * vv - v1 * uv) / det : 0;
  double inv_bw = det > 0 ? (uu * v1 - uv * u1) / det : 0;
  if (alpha < 0 || det <= 0) {  // latency below resolution: the bandwidth alone
    alpha = 0;
    inv_bw = v1 / vv;
  }
  if (inv_bw <= 0) {
    // Time that does not grow with bytes (noise over a flat curve): the bandwidth of the
    // largest message, and alpha refitted under it.
    const auto largest = std::max_element(samples.begin(), samples.end(),
                                          [](const LinkSample& a, const LinkSample& b) { return a.bytes < b.bytes; });
    inv_bw = largest->seconds / (factor * largest->bytes);
    double num = 0;
    for (const LinkSample& s : samples) num += (steps / s.seconds) * (1 - factor * s.bytes * inv_bw / s.seconds);
    alpha = std::max(0.0, num / uu);
  }
  // The bandwidth again, from the larger half of the sizes in absolute time under that alpha:
  // what training moves in bulk is gradient buckets (25 MiB by default), and a machine whose
  // large messages fall off a cliff (shared-memory transports on oversubscribed cores) must be
  // priced by them, not by the small messages the relative weighting favours.
  std::vector<LinkSample> large(samples);
  std::sort(large.begin(), large.end(), [](const LinkSample& a, const LinkSample& b) { return a.bytes < b.bytes; });
  large.erase(large.begin(), large.begin() + static_cast<std::ptrdiff_t>(large.size() / 2));
  double bt = 0, bb = 0;
  for (const LinkSample& s : large) {
    const double b = factor * s.bytes;
    bt += b * std::max(0.0, s.seconds - steps * alpha);
    bb += b * b;
  }
  if (bt > 0 && bb > 0) inv_bw = bt / bb;
  AlphaBetaFit fit;
  fit.model = AlphaBeta{alpha, 1 / inv_bw};
  for (const LinkSample& s : samples)
    fit.max_relative_error = std::max(
        fit.max_relative_error, std::abs(fit.model.seconds(kind, s.bytes, ranks) / s.seconds - 1));
  return fit;
}

}  // namespace meshtrain
