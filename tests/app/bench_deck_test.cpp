// The deck every bench suite starts from times steps as training takes them, and nothing else:
// a step whose gradient norm spikes is not run twice inside a timed step (the hetero suite's dp
// runs spiked at step 7, doubling that step's time and work), while training keeps its default.
// device-independent: only builds and parses decks; nothing runs on a device.

#include <gtest/gtest.h>

#include "meshtrain/app/bench_suites.h"
#include "meshtrain/config/deck.h"

namespace meshtrain {
namespace {

TEST(BenchDeck, DoesNotReRunSpikingStepsInsideATimedStep) {
  const Config bench = bench_deck("hetero", gpt2_spec(4, 128, 4, 128, 256));
  EXPECT_EQ(bench.run.rerun_spike_factor, 0.0);
  // Training decks keep re-running spikes (run.rerun_spike_factor's default).
  EXPECT_GT(parse_deck("t.toml", "").run.rerun_spike_factor, 1.0);
}

}  // namespace
}  // namespace meshtrain
