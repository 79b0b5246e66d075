#include "meshtrain/io/blend_schedule.h"

#include <charconv>
#include <sstream>
#include <stdexcept>

namespace meshtrain {

BlendSchedule::BlendSchedule(const std::vector<double>& weights) : weights_(weights) {
  double total = 0;
  for (double w : weights_) total += w;
  for (double& w : weights_) w /= total;
}

int BlendSchedule::next(const std::vector<int64_t>& drawn) const {
  int64_t n = 0;
  for (int64_t c : drawn) n += c;
  const double next_count = static_cast<double>(n + 1);
  int best = 0;
  double best_deficit = 0;
  for (int k = 0; k < sources(); ++k) {
    const double deficit = weights_[k] * next_count - static_cast<double>(drawn[k]);
    if (k == 0 || deficit > best_deficit) {
      best = k;
      best_deficit = deficit;
    }
  }
  return best;
}

void BlendSchedule::draw(std::vector<int64_t>& drawn, int64_t count, std::vector<BlendDraw>* out) const {
  for (int64_t i = 0; i < count; ++i) {
    const int k = next(drawn);
    if (out) out->push_back({k, drawn[k]});
    ++drawn[k];
  }
}

namespace {
constexpr const char* kPositionHeader = "blend_position 1\n";
}

std::string blend_position_text(const std::vector<int64_t>& drawn) {
  std::string s = kPositionHeader;
  for (size_t k = 0; k < drawn.size(); ++k) s += (k ? " " : "") + std::to_string(drawn[k]);
  return s + "\n";
}

std::vector<int64_t> parse_blend_position(const std::string& text, int sources) {
  const std::string header = kPositionHeader;
  if (text.compare(0, header.size(), header) != 0)
    throw std::runtime_error("does not start with \"blend_position 1\" (the only format this "
                             "meshtrain reads)");
  std::vector<int64_t> drawn;
  const char* at = text.data() + header.size();
  const char* end = text.data() + text.size();
  while (at < end && *at != '\n') {
    int64_t c = -1;
    const auto [stop, ec] = std::from_chars(at, end, c);
    if (ec != std::errc() || c < 0)
      throw std::runtime_error("holds a count that is not an integer >= 0 (source " +
                               std::to_string(drawn.size()) + ")");
    drawn.push_back(c);
    at = stop;
    if (at < end && *at == ' ') ++at;
  }
  if (at + 1 != end)
    throw std::runtime_error("has text after the counts' line");
  if (static_cast<int>(drawn.size()) != sources)
    throw std::runtime_error("records the positions of " + std::to_string(drawn.size()) +
                             " sources, but the deck's blend has " + std::to_string(sources));
  int64_t total = 0;
  for (int64_t c : drawn) {
    if (c > INT64_MAX / 2 - total) throw std::runtime_error("holds counts whose sum overflows");
    total += c;
  }
  return drawn;
}

}  // namespace meshtrain
