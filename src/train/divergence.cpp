#include "meshtrain/train/divergence.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

namespace meshtrain {

namespace {
// "nan" rather than the "-nan" a sign bit gives: the sign of a NaN means nothing here.
std::string show(double v) {
  if (std::isnan(v)) return "nan";
  std::ostringstream os;
  os << v;
  return os.str();
}
}  // namespace

RunDiverged diverged(const Config& config, int step, double loss, double grad_norm) {
  const TrainOptions& t = config.train;
  std::vector<std::string> advice;
  std::ostringstream lr;
  lr << "lower train.lr (now " << t.lr << ", e.g. " << t.lr / 4 << ")";
  advice.push_back(lr.str());
  // Warm-up matters when the blow-up comes early: in it, or soon after it.
  if (t.warmup_steps == 0) {
    advice.push_back("warm up: train.warmup_steps = " +
                     std::to_string(std::clamp(t.steps / 20, 10, 2000)) + " (now 0)");
  } else if (step <= 2 * t.warmup_steps) {
    advice.push_back("raise train.warmup_steps (now " + std::to_string(t.warmup_steps) + ", e.g. " +
                     std::to_string(2 * t.warmup_steps) + ")");
  }
  if (t.grad_clip == 0) {
    advice.push_back("clip gradients: train.grad_clip = 1.0 (now 0: off)");
  } else if (t.grad_clip > 1.0) {
    std::ostringstream clip;
    clip << "clip harder: train.grad_clip = 1.0 (now " << t.grad_clip << ")";
    advice.push_back(clip.str());
  }
  std::ostringstream msg;
  msg << config.deck_path << ": the run diverged at step " << step << " (loss " << show(loss)
      << ", gradient norm " << show(grad_norm) << "): ";
  for (size_t i = 0; i < advice.size(); ++i)
    msg << (i == 0 ? "" : i + 1 == advice.size() ? ", or " : ", ") << advice[i];
  msg << "; then train again (a checkpoint written before this step, if any, is intact)";
  return RunDiverged(msg.str());
}

}  // namespace meshtrain
