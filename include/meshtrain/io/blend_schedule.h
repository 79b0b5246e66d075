#pragma once
// BlendSchedule: which source of a weighted blend (data.train = [{path, weight}, ...]) each
// sample of the stream comes from. It is not a reader (io/token_dataset.h) nor the order of the
// samples inside a source (io/sampler.h: each source keeps its own stream position and
// shuffles as one dataset would).
//
// The rule is Megatron-LM's BlendedDataset (helpers.cpp, build_blending_indices), with n + 1
// where Megatron writes max(n, 1): with weights w_k normalised to sum 1 and c_k the samples
// drawn from source k among the first n of the stream, sample n comes from the source with the
// largest deficit w_k (n + 1) - c_k, the lowest index on a tie. The deficits sum to 1 before
// each draw, so the source drawn has a positive one and ends above -1; after the draw they sum
// to 0. So at every prefix n, for every source k:
//
//     c_k(n) - w_k n < 1         (no source is ever a whole sample ahead of its share)
//     w_k n - c_k(n) < K - 1     (behind by less than the others' lead, K sources)
//
// and with 2 or 3 sources |c_k(n) - w_k n| < 1. The greedy rule can fall behind by more than
// one sample with 4 or more sources (about 1.2 at worst in random trials up to 16 sources; a
// rule bounded by 1 for any K exists, Tijdeman's, but it is not Megatron's).
// tests/io/blend_schedule_test.cpp checks these over 10,000 samples for several weight vectors.
// A source of weight 0 is never drawn.
//
// The state is the counts c_k alone (n is their sum), so a checkpoint that records them
// (BlendPosition text, below) continues the same stream on any layout, and a run that resumes
// with other weights goes on from the recorded counts under the new weights.

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

// One draw: the source and the position in that source's own stream (its count before it).
struct BlendDraw {
  int source = 0;
  int64_t position = 0;
};

class BlendSchedule {
 public:
  // weights: finite, >= 0, sum > 0 (the deck checked them).
  explicit BlendSchedule(const std::vector<double>& weights);

  int sources() const { return static_cast<int>(weights_.size()); }
  // The source of the next sample after `drawn` (each source's count so far).
  int next(const std::vector<int64_t>& drawn) const;
  // Draws `count` samples after `drawn`, advancing it; appends each draw to `out` if set.
  void draw(std::vector<int64_t>& drawn, int64_t count, std::vector<BlendDraw>* out = nullptr) const;

 private:
  std::vector<double> weights_;  // normalised: sum 1
};

// The text a checkpoint records as a blend's data position (@data_blend):
//     "blend_position 1\n<c_0> <c_1> ... <c_{K-1}>\n"
// (format 1: the counts of the K sources at the checkpoint's step).
std::string blend_position_text(const std::vector<int64_t>& drawn);
// Reads it back for a blend of `sources` sources; throws std::runtime_error saying what is
// wrong (another format, another number of sources, a count that is not an integer >= 0)
// without echoing the text (it comes from a file someone else may have made).
std::vector<int64_t> parse_blend_position(const std::string& text, int sources);

}  // namespace meshtrain
