#pragma once
// Checks of a deck against the job it runs in: the world size and the parallel layout. Every
// rank runs them on the same deck text and reaches the same verdict, so a bad layout is refused
// at start-up on all ranks, before any collective could leave one waiting.

#include "meshtrain/config/config.h"
#include "meshtrain/config/deck_error.h"

namespace meshtrain {

// Resolves parallel.dp = "auto" and refuses impossible layouts with a DeckError naming the keys,
// their values and what would work. `job_size` counts every rank of the job, parameter servers
// included (parallel.data_sync = "async").
void check_layout(Config& config, int job_size);

}  // namespace meshtrain
